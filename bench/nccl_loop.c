/*
 * nccl_loop: the cost of one ncclAllReduce call, for measuring what probes add to it.
 *
 *   nccl_loop --lib LIBNCCL [--cudart LIBCUDART] [--mode comm|null] [--calls N] [--runs R] [--batch B]
 *
 * mode comm (the stand-in, examples/nccl/): a one-rank communicator, so nothing waits for a
 *   peer; calls ncclAllReduce(256 floats, sum) on one stream in batches of B, synchronizing the
 *   stream between batches (untimed: it drains the stand-in's queued completions).
 * mode null (any libnccl, the real one included): ncclAllReduce on a NULL communicator, which
 *   NCCL rejects at once (4, ncclInvalidArgument) before touching a GPU.
 * Prints one JSON line: ns per call of each run (only the ncclAllReduce calls are timed), their
 * median, and the last return code.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int (*allreduce_fn)(const void *, void *, size_t, int, int, void *, void *);
typedef struct {
    char internal[128];
} ncclUniqueId;

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static void *need(void *lib, const char *name)
{
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "nccl_loop: %s not found\n", name);
        exit(2);
    }
    return p;
}

static int compare(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    const char *lib_path = NULL, *cudart_path = NULL, *mode = "comm";
    long calls = 100000, runs = 3, batch = 100;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--lib")) lib_path = argv[i + 1];
        else if (!strcmp(argv[i], "--cudart")) cudart_path = argv[i + 1];
        else if (!strcmp(argv[i], "--mode")) mode = argv[i + 1];
        else if (!strcmp(argv[i], "--calls")) calls = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--runs")) runs = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch")) batch = atol(argv[i + 1]);
        else {
            fprintf(stderr, "nccl_loop: unknown option %s (see the comment at the top of nccl_loop.c)\n", argv[i]);
            return 2;
        }
    }
    int with_comm = !strcmp(mode, "comm");
    if (!lib_path || (!with_comm && strcmp(mode, "null")) || calls < 1 || runs < 1 || runs > 100 || batch < 1 ||
        (with_comm && !cudart_path)) {
        fprintf(stderr, "nccl_loop: give --lib, --mode comm (with --cudart) or null, and positive counts\n");
        return 2;
    }
    void *cudart = NULL;
    if (with_comm && !(cudart = dlopen(cudart_path, RTLD_NOW | RTLD_GLOBAL))) {
        fprintf(stderr, "nccl_loop: %s\n", dlerror());
        return 2;
    }
    void *lib = dlopen(lib_path, RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "nccl_loop: %s\n", dlerror());
        return 2;
    }
    allreduce_fn allreduce = (allreduce_fn)need(lib, "ncclAllReduce");
    void *comm = NULL, *stream = (void *)0x6000;
    int (*sync)(void *) = NULL;
    static float buf[256];
    if (with_comm) {
        ncclUniqueId uid;
        int (*get_id)(ncclUniqueId *);
        int (*init)(void **, int, ncclUniqueId, int);
        *(void **)&get_id = need(lib, "ncclGetUniqueId");
        *(void **)&init = need(lib, "ncclCommInitRank");
        *(void **)&sync = need(cudart, "cudaStreamSynchronize");
        if (get_id(&uid) != 0 || init(&comm, 1, uid, 0) != 0) {
            fprintf(stderr, "nccl_loop: cannot make a one-rank communicator with %s\n", lib_path);
            return 1;
        }
    }
    double per_call[100];
    int rc = 0;
    for (long r = 0; r < runs; r++) {
        double spent = 0;
        for (long done = 0; done < calls;) {
            long n = calls - done < batch ? calls - done : batch;
            double t0 = now_ns();
            for (long i = 0; i < n; i++)
                rc = allreduce(buf, buf, 256, 7, 0, comm, stream);
            spent += now_ns() - t0;
            done += n;
            if (sync)
                sync(stream);
        }
        per_call[r] = spent / calls;
    }
    printf("{\"mode\":\"%s\",\"calls\":%ld,\"return_code\":%d,\"ns_per_call\":[", mode, calls, rc);
    for (long r = 0; r < runs; r++)
        printf("%s%.1f", r ? "," : "", per_call[r]);
    qsort(per_call, (size_t)runs, sizeof per_call[0], compare);
    printf("],\"median_ns_per_call\":%.1f}\n", per_call[runs / 2]);
    return 0;
}
