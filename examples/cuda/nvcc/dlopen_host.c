/*
 * nvcc_dlopen_host: loads an nvcc-built library (libnvcc_kernels.so) late with dlopen, as
 * PyTorch loads its CUDA libraries on first use, and launches through it.
 *
 *   nvcc_dlopen_host --lib PATH [--launches N] [--sleep-ms N] [--wait-for-file PATH]
 *
 * Sleeps / waits first (before the dlopen, so an agent can be attached before the library's
 * constructors register its kernels), then prints one JSON line.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    const char *lib = NULL, *wait_for = NULL;
    long launches = 10, sleep_ms = 0;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--lib") && v)
            lib = argv[++i];
        else if (!strcmp(argv[i], "--launches") && v)
            launches = atol(argv[++i]);
        else if (!strcmp(argv[i], "--sleep-ms") && v)
            sleep_ms = atol(argv[++i]);
        else if (!strcmp(argv[i], "--wait-for-file") && v)
            wait_for = argv[++i];
        else {
            fprintf(stderr, "usage: %s --lib PATH [--launches N] [--sleep-ms N] [--wait-for-file PATH]\n", argv[0]);
            return 2;
        }
    }
    if (!lib) {
        fprintf(stderr, "nvcc_dlopen_host: --lib PATH is required\n");
        return 2;
    }
    if (sleep_ms > 0)
        usleep(sleep_ms * 1000);
    if (wait_for) {
        fprintf(stderr, "pid %d waiting for %s\n", getpid(), wait_for);
        struct stat st;
        while (stat(wait_for, &st) != 0)
            usleep(1000);
    }
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "nvcc_dlopen_host: cannot load %s: %s\n", lib, dlerror());
        return 1;
    }
    int (*launch)(long, const char *) = (int (*)(long, const char *))dlsym(h, "nvcc_lib_launch");
    if (!launch) {
        fprintf(stderr, "nvcc_dlopen_host: %s does not export nvcc_lib_launch\n", lib);
        return 1;
    }
    char prefix[256];
    snprintf(prefix, sizeof prefix, "{\"program\": \"nvcc_dlopen_host\", \"pid\": %d, \"lib\": \"%s\", \"launches\": %ld, ",
             getpid(), lib, launches);
    launch(launches, prefix);
    printf("}\n");
    fflush(stdout);
    return 0;
}
