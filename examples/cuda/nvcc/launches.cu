// nvcc_launches: a real nvcc 13 program with kernels of every shape the agent must name, launched
// a known number of times. Built three ways by examples/build.sh: -cudart shared, the same
// stripped, and the default static runtime. Prints one JSON line: what it launched and what each
// call returned (35 on the real runtime without a driver, 0 on the stand-in libcudart.so.13).
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "report.h"

__global__ void vector_add(float *a, float *b, float *c, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        c[i] = a[i] + b[i];
}

namespace ml {
__global__ void softmax_forward(float *out, const float *in, int rows)
{
    if (threadIdx.x < rows)
        out[threadIdx.x] = in[threadIdx.x];
}
} // namespace ml

namespace at::native {
template <int block_threads, int items_per_thread> __global__ void elementwise_kernel(int n, float *data)
{
    if (threadIdx.x * items_per_thread < n)
        data[threadIdx.x] *= block_threads;
}
} // namespace at::native

struct Scale {
    float by;
    __device__ float operator()(float x) const { return x * by; }
};

template <typename F> __global__ void apply(F f, float *data, int n)
{
    if (threadIdx.x < n)
        data[threadIdx.x] = f(data[threadIdx.x]);
}

static const char *const kinds[] = {"plain", "namespaced", "templated", "functor", "lambda"};

int main(int argc, char **argv)
{
    long launches = 10, ex_launches = 0, sleep_ms = 0, alloc_bytes = 4096;
    const char *wait_for = nullptr;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : nullptr;
        if (a == "--launches" && v)
            launches = atol(argv[++i]);
        else if (a == "--ex-launches" && v)
            ex_launches = atol(argv[++i]);
        else if (a == "--sleep-ms" && v)
            sleep_ms = atol(argv[++i]);
        else if (a == "--alloc-bytes" && v)
            alloc_bytes = atol(argv[++i]);
        else if (a == "--wait-for-file" && v)
            wait_for = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--launches N] [--ex-launches N] [--alloc-bytes N] [--sleep-ms N] "
                            "[--wait-for-file PATH]\n", argv[0]);
            return 2;
        }
    }
    wait_before_launching(sleep_ms, wait_for);

    Report r;
    float *dev = nullptr;
    r.rc("cudaMalloc", cudaMalloc(&dev, alloc_bytes));
    int n = (int)(alloc_bytes / sizeof(float));
    long per_kind[5] = {};
    auto lambda = [] __device__(float x) { return x + 1.0f; };
    for (long j = 0; j < launches; j++) {
        switch (j % 5) {
        case 0: vector_add<<<(n + 255) / 256, 256>>>(dev, dev, dev, n); break;
        case 1: ml::softmax_forward<<<dim3(2, 4), 128, 1024>>>(dev, dev, n); break;
        case 2: at::native::elementwise_kernel<128, 4><<<4, 128>>>(n, dev); break;
        case 3: apply<<<1, 64>>>(Scale{2.0f}, dev, n); break;
        case 4: apply<<<1, 64>>>(lambda, dev, n); break;
        }
        per_kind[j % 5]++;
        r.rc("launch", cudaGetLastError()); // what the <<<>>> launch returned
    }
    for (long j = 0; j < ex_launches; j++) {
        cudaLaunchConfig_t config = {};
        config.gridDim = dim3((n + 255) / 256);
        config.blockDim = dim3(256);
        r.rc("cudaLaunchKernelEx", cudaLaunchKernelEx(&config, vector_add, dev, dev, dev, n));
    }
    r.rc("cudaDeviceSynchronize", cudaDeviceSynchronize());
    r.rc("cudaFree", cudaFree(dev));

    printf("{\"program\": \"nvcc_launches\", \"pid\": %d, \"launches\": %ld, \"ex_launches\": %ld, \"per_kind\": {",
           getpid(), launches, ex_launches);
    for (int k = 0; k < 5; k++)
        printf("%s\"%s\": %ld", k ? ", " : "", kinds[k], per_kind[k]);
    printf("}, ");
    r.print();
    printf("}\n");
    return 0;
}
