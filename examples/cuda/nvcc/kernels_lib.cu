// libnvcc_kernels.so: a shared library built with nvcc (-cudart shared, then stripped), as
// framework libraries are. Its kernels are registered by its static constructors when it is
// dlopened; nvcc_dlopen_host loads it late and launches through nvcc_lib_launch.
#include "report.h"

namespace lib {
template <typename T> __global__ void scale_kernel(T *data, T by, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        data[i] *= by;
}
} // namespace lib

// Mallocs, launches lib::scale_kernel<float> n times, frees; prints the program's JSON fields
// (without braces) after the given prefix.
extern "C" __attribute__((visibility("default"))) int nvcc_lib_launch(long n, const char *prefix)
{
    Report r;
    float *dev = nullptr;
    r.rc("cudaMalloc", cudaMalloc(&dev, 4096));
    for (long j = 0; j < n; j++) {
        lib::scale_kernel<<<4, 256>>>(dev, 2.0f, 1024);
        r.rc("launch", cudaGetLastError());
    }
    r.rc("cudaDeviceSynchronize", cudaDeviceSynchronize());
    r.rc("cudaFree", cudaFree(dev));
    printf("%s", prefix);
    r.print();
    return 0;
}
