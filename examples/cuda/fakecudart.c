/*
 * Stand-in for NVIDIA's CUDA runtime (libcudart.so.12) on machines without a GPU.
 *
 * Exports the runtime calls the agent probes, with CUDA's exact C signatures, so the same
 * uprobes read the same arguments as on the real library. Unlike the real library without a
 * driver (which fails every call with 35), calls here succeed and behave plausibly:
 *   - "device" memory is real host memory (devmem.c), so cudaMemcpy really copies;
 *   - each stream keeps a "busy until" time that every launch pushes out by
 *     FAKECUDA_KERNEL_US microseconds (default 50), and synchronising sleeps until then,
 *     so sync calls take as long as the queued "kernels" would;
 *   - cudaLaunchHostFunc queues a host function on a stream: it runs on a worker thread once
 *     the work queued before it is done, and the stream is busy until it returns, so another
 *     stand-in (the fake NCCL) can make a stream wait for an event outside this library.
 * Nothing runs on a device; kernel arguments are accepted and ignored.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "devmem.h"

typedef int cudaError_t;
typedef void *cudaStream_t;
typedef struct {
    unsigned x, y, z;
} dim3;
typedef struct {
    dim3 gridDim;
    dim3 blockDim;
    size_t dynamicSmemBytes;
    cudaStream_t stream;
    void *attrs;
    unsigned numAttrs;
} cudaLaunchConfig_t;

enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInsufficientDriver = 35,
    cudaErrorInvalidDeviceFunction = 98,
};
enum { HostToHost, HostToDevice, DeviceToHost, DeviceToDevice, Default };

#define PER_THREAD_STREAM ((cudaStream_t)0x2) /* cudaStreamPerThread: what a _ptsz call's NULL stream means */
#define GRAPH_KERNELS 4                       /* a graph launch queues as much work as this many kernels */

struct stream {
    cudaStream_t handle;
    uint64_t busy_until_ns; /* CLOCK_MONOTONIC time its queued work finishes */
    unsigned held;          /* host functions queued and not yet returned */
    uint64_t behind_ns;     /* work queued behind the last of them: starts when it returns */
};

/* A queued cudaLaunchHostFunc call. Host functions run one at a time, in launch order. */
struct hostfn {
    struct hostfn *next;
    cudaStream_t stream;
    void (*fn)(void *);
    void *data;
    uint64_t start_ns; /* run at this time; 0: when the previous one returns, plus delay_ns */
    uint64_t delay_ns;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct stream *streams;
static size_t nstreams, capacity;
static uint64_t kernel_ns = 50000;
static __thread cudaError_t last_error;
static struct hostfn *hostfn_head, **hostfn_tail = &hostfn_head;
static int hostfn_worker_running;
static pthread_cond_t hostfn_queued = PTHREAD_COND_INITIALIZER; /* worker: a host function arrived */
static pthread_cond_t hostfn_done = PTHREAD_COND_INITIALIZER;   /* waiters: one returned */

__attribute__((constructor)) static void read_settings(void)
{
    const char *v = getenv("FAKECUDA_KERNEL_US");
    if (!v || !*v)
        return;
    char *end;
    errno = 0;
    unsigned long long us = strtoull(v, &end, 10);
    if (errno || *end || *v == '-' || us > 3600ULL * 1000000)
        fprintf(stderr, "fake libcudart: ignoring FAKECUDA_KERNEL_US=%s (want whole microseconds, at most 3600000000); using 50\n", v);
    else
        kernel_ns = us * 1000;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void sleep_until(uint64_t t_ns)
{
    struct timespec ts = {(time_t)(t_ns / 1000000000), (long)(t_ns % 1000000000)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

static cudaError_t fail(cudaError_t rc)
{
    last_error = rc;
    return rc;
}

/* The stream's record, added on first use; NULL only if out of memory. Caller holds lock. */
static struct stream *find_stream(cudaStream_t handle)
{
    for (size_t i = 0; i < nstreams; i++)
        if (streams[i].handle == handle)
            return &streams[i];
    if (nstreams == capacity) {
        size_t grown = capacity ? capacity * 2 : 16;
        struct stream *s = realloc(streams, grown * sizeof *s);
        if (!s)
            return NULL;
        streams = s;
        capacity = grown;
    }
    streams[nstreams] = (struct stream){handle, 0, 0, 0};
    return &streams[nstreams++];
}

/* Queues kernels * kernel_ns of work behind what the stream already has. */
static cudaError_t enqueue(cudaStream_t handle, unsigned kernels)
{
    uint64_t now = now_ns();
    pthread_mutex_lock(&lock);
    struct stream *s = find_stream(handle);
    if (s && s->held)
        s->behind_ns += kernels * kernel_ns;
    else if (s)
        s->busy_until_ns = (s->busy_until_ns > now ? s->busy_until_ns : now) + kernels * kernel_ns;
    pthread_mutex_unlock(&lock);
    return s ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}

/* True while a host function queued on the stream (any stream if all is set) has not returned.
 * Caller holds lock. */
static int any_held(cudaStream_t handle, int all)
{
    for (size_t i = 0; i < nstreams; i++)
        if ((all || streams[i].handle == handle) && streams[i].held)
            return 1;
    return 0;
}

/* Sleeps until one stream (all streams if all is set) has finished its queued work. */
static void drain(cudaStream_t handle, int all)
{
    uint64_t until = 0;
    pthread_mutex_lock(&lock);
    while (any_held(handle, all))
        pthread_cond_wait(&hostfn_done, &lock);
    for (size_t i = 0; i < nstreams; i++)
        if ((all || streams[i].handle == handle) && streams[i].busy_until_ns > until)
            until = streams[i].busy_until_ns;
    pthread_mutex_unlock(&lock);
    if (until > now_ns())
        sleep_until(until);
}

/* Runs queued host functions in order; a stream is released, and the work queued behind its
 * host functions starts, when the last of them returns. */
static void *hostfn_worker(void *arg)
{
    (void)arg;
    uint64_t previous_end = 0;
    for (;;) {
        pthread_mutex_lock(&lock);
        while (!hostfn_head)
            pthread_cond_wait(&hostfn_queued, &lock);
        struct hostfn *h = hostfn_head;
        hostfn_head = h->next;
        if (!hostfn_head)
            hostfn_tail = &hostfn_head;
        pthread_mutex_unlock(&lock);
        sleep_until(h->start_ns ? h->start_ns : previous_end + h->delay_ns);
        h->fn(h->data);
        pthread_mutex_lock(&lock);
        previous_end = now_ns();
        struct stream *s = find_stream(h->stream); /* exists: it was added at launch */
        if (s && --s->held == 0) {
            s->busy_until_ns = previous_end + s->behind_ns;
            s->behind_ns = 0;
        }
        pthread_cond_broadcast(&hostfn_done);
        pthread_mutex_unlock(&lock);
        free(h);
    }
    return NULL;
}

/* A forked child has no worker thread and none of its parent's queued host functions. */
static void hostfn_after_fork(void)
{
    hostfn_head = NULL;
    hostfn_tail = &hostfn_head;
    hostfn_worker_running = 0;
    for (size_t i = 0; i < nstreams; i++) {
        streams[i].held = 0;
        streams[i].behind_ns = 0;
    }
}

__attribute__((constructor)) static void register_fork_handler(void)
{
    pthread_atfork(NULL, NULL, hostfn_after_fork);
}

static cudaError_t launch(const void *func, dim3 grid, dim3 block, cudaStream_t stream)
{
    if (!func)
        return fail(cudaErrorInvalidDeviceFunction);
    if (!grid.x || !grid.y || !grid.z || !block.x || !block.y || !block.z || grid.y > 65535 ||
        grid.z > 65535 || grid.x > 0x7fffffffU || (uint64_t)block.x * block.y * block.z > 1024)
        return fail(cudaErrorInvalidConfiguration);
    return enqueue(stream, 1);
}

/* Checks the pointers against the direction, then copies at once. */
static cudaError_t copy(void *dst, const void *src, size_t count, int kind)
{
    if (kind < HostToHost || kind > Default)
        return fail(cudaErrorInvalidValue);
    if (count == 0)
        return cudaSuccess;
    if (!dst || !src)
        return fail(cudaErrorInvalidValue);
    int dst_on_device = devmem_contains(dst, count), src_on_device = devmem_contains(src, count);
    if ((kind == HostToDevice && !dst_on_device) || (kind == DeviceToHost && !src_on_device) ||
        (kind == DeviceToDevice && !(dst_on_device && src_on_device)))
        return fail(cudaErrorInvalidValue);
    memmove(dst, src, count);
    return cudaSuccess;
}

cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem,
                             cudaStream_t stream)
{
    (void)args, (void)sharedMem;
    return launch(func, gridDim, blockDim, stream);
}

cudaError_t cudaLaunchKernel_ptsz(const void *func, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem,
                                  cudaStream_t stream)
{
    (void)args, (void)sharedMem;
    return launch(func, gridDim, blockDim, stream ? stream : PER_THREAD_STREAM);
}

cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args)
{
    (void)args;
    if (!config)
        return fail(cudaErrorInvalidValue);
    return launch(func, config->gridDim, config->blockDim, config->stream);
}

cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    if (!devPtr)
        return fail(cudaErrorInvalidValue);
    *devPtr = devmem_alloc(size);
    return *devPtr ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}

cudaError_t cudaFree(void *devPtr)
{
    if (!devPtr)
        return cudaSuccess; /* like CUDA: freeing NULL is allowed */
    drain(NULL, 1);         /* cudaFree waits for the device, as CUDA's does */
    return devmem_free(devPtr) ? fail(cudaErrorInvalidValue) : cudaSuccess;
}

/* A synchronous copy waits for all queued work first, as on CUDA's legacy default stream. */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, int kind)
{
    drain(NULL, 1);
    return copy(dst, src, count, kind);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, int kind, cudaStream_t stream)
{
    (void)stream;
    return copy(dst, src, count, kind);
}

cudaError_t cudaMemcpyAsync_ptsz(void *dst, const void *src, size_t count, int kind, cudaStream_t stream)
{
    (void)stream;
    return copy(dst, src, count, kind);
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    drain(stream, 0);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t stream)
{
    drain(stream ? stream : PER_THREAD_STREAM, 0);
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    drain(NULL, 1);
    return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, void (*fn)(void *), void *userData)
{
    if (!fn)
        return fail(cudaErrorInvalidValue);
    struct hostfn *h = calloc(1, sizeof *h);
    if (!h)
        return fail(cudaErrorMemoryAllocation);
    h->stream = stream;
    h->fn = fn;
    h->data = userData;
    uint64_t now = now_ns();
    pthread_mutex_lock(&lock);
    struct stream *s = find_stream(stream);
    if (!s) {
        pthread_mutex_unlock(&lock);
        free(h);
        return fail(cudaErrorMemoryAllocation);
    }
    if (s->held) { /* after the previous host function, and the work queued since */
        h->delay_ns = s->behind_ns;
        s->behind_ns = 0;
    } else {
        h->start_ns = s->busy_until_ns > now ? s->busy_until_ns : now;
    }
    if (!hostfn_worker_running) {
        pthread_t worker;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&worker, &attr, hostfn_worker, NULL);
        pthread_attr_destroy(&attr);
        if (rc) {
            pthread_mutex_unlock(&lock);
            free(h);
            return fail(cudaErrorMemoryAllocation);
        }
        hostfn_worker_running = 1;
    }
    s->held++;
    *hostfn_tail = h;
    hostfn_tail = &h->next;
    pthread_cond_signal(&hostfn_queued);
    pthread_mutex_unlock(&lock);
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(void *graphExec, cudaStream_t stream)
{
    if (!graphExec)
        return fail(cudaErrorInvalidValue);
    return enqueue(stream, GRAPH_KERNELS);
}

const char *cudaGetErrorString(cudaError_t error)
{
    switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorInvalidDeviceFunction: return "invalid device function";
    default: return "unrecognized error code";
    }
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t rc = last_error;
    last_error = cudaSuccess;
    return rc;
}
