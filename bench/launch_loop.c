/*
 * launch_loop: calls one function of a shared library in a tight loop and reports its cost,
 * so uprobe overhead can be measured from a C caller with no interpreter noise.
 *
 * The function is called with cudaLaunchKernel's argument list (a kernel address, two dim3
 * by value, an argument array, shared memory bytes, a NULL stream); functions taking fewer
 * arguments, like those in libnopfunc.so, ignore the rest. Results are one JSON line.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    unsigned x, y, z;
} dim3;
typedef int (*launch_fn)(const void *func, dim3 grid, dim3 block, void **args, size_t shared_mem, void *stream);

static const char usage[] =
    "usage: launch_loop --lib PATH [--func NAME] [--calls N] [--runs N]\n"
    "       launch_loop --lib PATH [--func NAME] --rate CALLS_PER_S --seconds S\n"
    "\n"
    "Loads PATH with dlopen and calls NAME (default cudaLaunchKernel) with cudaLaunchKernel's\n"
    "arguments. Loop mode (default): after one warm-up call, --runs runs (default 5) of --calls\n"
    "calls (default 1000000), timed with CLOCK_MONOTONIC; prints ns per call of each run and\n"
    "their median. Rate mode: calls at --rate calls per second for --seconds seconds, pacing\n"
    "with a busy-wait on the clock (a late call goes at once, so lateness is caught up); prints\n"
    "calls made, the rate achieved and the worst lateness.\n";

/* Stands in for a kernel's host stub; only its address is passed. */
__attribute__((noinline)) void bench_kernel(float *data, int n)
{
    __asm__ volatile("" : : "r"(data), "r"(n) : "memory");
}

static float bench_data[256];

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static double parse_number(const char *opt, const char *text, double min)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !(v >= min)) {
        fprintf(stderr, "launch_loop: %s wants a number >= %g, got '%s'\n", opt, min, text);
        exit(2);
    }
    return v;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int call(launch_fn fn)
{
    float *data = bench_data;
    int n = 256;
    void *args[] = {&data, &n};
    return fn((const void *)bench_kernel, (dim3){1, 1, 1}, (dim3){256, 1, 1}, args, 0, NULL);
}

static void loop_mode(launch_fn fn, const char *lib, const char *name, long calls, int runs)
{
    double *ns = calloc(runs, sizeof *ns), *sorted = calloc(runs, sizeof *sorted);
    int rc = call(fn); /* warm-up: the real libcudart initialises on its first call */
    for (int r = 0; r < runs; r++) {
        uint64_t t0 = now_ns();
        for (long i = 0; i < calls; i++)
            rc = call(fn);
        ns[r] = (double)(now_ns() - t0) / calls;
    }
    memcpy(sorted, ns, runs * sizeof *ns);
    qsort(sorted, runs, sizeof *sorted, cmp_double);
    printf("{\"mode\": \"loop\", \"lib\": \"%s\", \"func\": \"%s\", \"calls_per_run\": %ld, \"runs\": %d, "
           "\"ns_per_call\": [",
           lib, name, calls, runs);
    for (int r = 0; r < runs; r++)
        printf("%s%.2f", r ? ", " : "", ns[r]);
    printf("], \"median_ns_per_call\": %.2f, \"return_code\": %d}\n", sorted[runs / 2], rc);
    free(ns);
    free(sorted);
}

static void rate_mode(launch_fn fn, const char *lib, const char *name, double rate, double seconds)
{
    double period = 1e9 / rate;
    int rc = call(fn);
    uint64_t start = now_ns(), end = start + (uint64_t)(seconds * 1e9), now = start, max_lag = 0;
    long calls = 0;
    while (now < end) {
        uint64_t due = start + (uint64_t)(calls * period);
        while ((now = now_ns()) < due)
            ;
        if (now - due > max_lag)
            max_lag = now - due;
        rc = call(fn);
        calls++;
    }
    double elapsed = (double)(now_ns() - start) / 1e9;
    printf("{\"mode\": \"rate\", \"lib\": \"%s\", \"func\": \"%s\", \"target_rate\": %.1f, \"seconds\": %.3f, "
           "\"calls\": %ld, \"achieved_rate\": %.1f, \"max_lag_ns\": %llu, \"return_code\": %d}\n",
           lib, name, rate, elapsed, calls, calls / elapsed, (unsigned long long)max_lag, rc);
}

int main(int argc, char **argv)
{
    static const struct option options[] = {
        {"lib", required_argument, 0, 'l'},     {"func", required_argument, 0, 'f'},
        {"calls", required_argument, 0, 'n'},   {"runs", required_argument, 0, 'r'},
        {"rate", required_argument, 0, 'R'},    {"seconds", required_argument, 0, 's'},
        {"help", no_argument, 0, 'h'},          {0, 0, 0, 0},
    };
    const char *lib = NULL, *name = "cudaLaunchKernel";
    long calls = 1000000;
    int runs = 5;
    double rate = 0, seconds = 0;
    int opt;
    while ((opt = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (opt) {
        case 'l': lib = optarg; break;
        case 'f': name = optarg; break;
        case 'n': calls = (long)parse_number("--calls", optarg, 1); break;
        case 'r': runs = (int)parse_number("--runs", optarg, 1); break;
        case 'R': rate = parse_number("--rate", optarg, 1); break;
        case 's': seconds = parse_number("--seconds", optarg, 0.001); break;
        case 'h': fputs(usage, stdout); return 0;
        default: fputs(usage, stderr); return 2;
        }
    }
    if (!lib || optind != argc || (rate > 0) != (seconds > 0)) {
        fprintf(stderr, "launch_loop: %s\n%s",
                !lib ? "--lib is required" : optind != argc ? "unexpected argument" : "--rate and --seconds go together",
                usage);
        return 2;
    }
    void *handle = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        fprintf(stderr, "launch_loop: cannot load --lib %s: %s\n", lib, dlerror());
        return 1;
    }
    launch_fn fn = (launch_fn)dlsym(handle, name);
    if (!fn) {
        fprintf(stderr, "launch_loop: %s does not export %s (check --func)\n", lib, name);
        return 1;
    }
    if (rate > 0)
        rate_mode(fn, lib, name, rate, seconds);
    else
        loop_mode(fn, lib, name, calls, runs);
    return 0;
}
