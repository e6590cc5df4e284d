// Kernels of every shape nvcc names differently, launched a known number of times.
//   kernels ROUNDS [WAIT_FILE]
// Each round: plain<<<>>>, ns::scale<float><<<>>>, apply<lambda><<<>>>, apply<Scale><<<>>>
// (4 x cudaLaunchKernel, through nvcc 13's __cudaLaunchKernel) and one cudaLaunchKernelEx
// (cudaLaunchKernelExC). With WAIT_FILE, prints "ready" and waits for the file before
// launching (so an agent can attach late). Prints one JSON line; runs to the end with or
// without a GPU (without a driver every call returns an error, and the launches still happen).
#include <cstdio>
#include <cstdlib>
#include <unistd.h>

__global__ void plain(float *p) { p[threadIdx.x] = 1.0f; }

namespace ns {
template <typename T> __global__ void scale(T *p, T f) { p[threadIdx.x] *= f; }
}  // namespace ns

template <typename F> __global__ void apply(float *p, F f) { p[threadIdx.x] = f(p[threadIdx.x]); }

struct Scale {
    float k;
    __device__ float operator()(float x) const { return k * x; }
};

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 1;
    if (argc > 2) {
        printf("ready\n");
        fflush(stdout);
        while (access(argv[2], F_OK) != 0) usleep(10000);
    }
    float *d = nullptr;
    int malloc_rc = cudaMalloc(&d, 4096);
    int last = 0;
    auto twice = [] __device__(float x) { return 2.0f * x; };
    for (int i = 0; i < rounds; i++) {
        plain<<<1, 32>>>(d);
        ns::scale<float><<<2, 64>>>(d, 2.0f);
        apply<<<3, 96>>>(d, twice);
        apply<<<4, 128>>>(d, Scale{3.0f});
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(5);
        cfg.blockDim = dim3(160);
        last = cudaLaunchKernelEx(&cfg, plain, d);
    }
    int sync_rc = cudaDeviceSynchronize();
    int free_rc = cudaFree(d);
    printf("{\"rounds\": %d, \"cudaLaunchKernel\": %d, \"cudaLaunchKernelExC\": %d, \"malloc\": %d, "
           "\"launch_ex\": %d, \"sync\": %d, \"free\": %d, \"pid\": %d}\n",
           rounds, 4 * rounds, rounds, malloc_rc, last, sync_rc, free_rc, (int)getpid());
    return 0;
}
