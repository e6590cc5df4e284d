// The CUDA runtime linked statically (nvcc's default): nothing CUDA in .dynsym.
//   static_runtime LAUNCHES [WAIT_FILE]
// A constructor calls cudaMalloc before main (only an agent that attached at exec sees
// it); main calls cudaMalloc, launches bump<<<>>> LAUNCHES times, calls cudaFree. With
// WAIT_FILE, prints "ready" and waits for the file before main's calls. Prints one JSON
// line; without a driver every call returns an error and the program runs to the end.
#include <cstdio>
#include <cstdlib>
#include <unistd.h>

__global__ void bump(int *p) { p[threadIdx.x] += 1; }

static int early_malloc = -1;

__attribute__((constructor)) static void early() {
    void *p = nullptr;
    early_malloc = cudaMalloc(&p, 111);
}

int main(int argc, char **argv) {
    int launches = argc > 1 ? atoi(argv[1]) : 1;
    if (argc > 2) {
        printf("ready\n");
        fflush(stdout);
        while (access(argv[2], F_OK) != 0) usleep(10000);
    }
    int *d = nullptr;
    int malloc_rc = cudaMalloc(&d, 4096);
    for (int i = 0; i < launches; i++) bump<<<1, 32>>>(d);
    int free_rc = cudaFree(d);
    printf("{\"pid\": %d, \"launches\": %d, \"early_malloc\": %d, \"malloc\": %d, \"free\": %d}\n",
           (int)getpid(), launches, early_malloc, malloc_rc, free_rc);
    return 0;
}
