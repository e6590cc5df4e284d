/* streams: see streams.h. One mutex guards the streams and the host-function queue; sleeping
 * happens outside it. */
#define _GNU_SOURCE
#include "streams.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

struct stream {
    void *handle;
    uint64_t busy_until_ns; /* CLOCK_MONOTONIC time its queued work finishes */
    unsigned held;          /* host functions queued and not yet returned */
    uint64_t behind_ns;     /* work queued behind the last of them: starts when it returns */
};

/* A queued host function. Host functions run one at a time, in launch order. */
struct hostfn {
    struct hostfn *next;
    void *stream;
    void (*fn)(void *);
    void *data;
    uint64_t start_ns; /* run at this time; 0: when the previous one returns, plus delay_ns */
    uint64_t delay_ns;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct stream *streams;
static size_t nstreams, capacity;
static uint64_t kernel_ns = 50000;
static struct hostfn *hostfn_head, **hostfn_tail = &hostfn_head;
static int hostfn_worker_running;
static pthread_cond_t hostfn_queued = PTHREAD_COND_INITIALIZER; /* worker: a host function arrived */
static pthread_cond_t hostfn_done = PTHREAD_COND_INITIALIZER;   /* waiters: one returned */

void streams_read_settings(void)
{
    const char *v = getenv("FAKECUDA_KERNEL_US");
    if (!v || !*v)
        return;
    char *end;
    errno = 0;
    unsigned long long us = strtoull(v, &end, 10);
    if (errno || *end || *v == '-' || us > 3600ULL * 1000000)
        fprintf(stderr, "fake libcuda: ignoring FAKECUDA_KERNEL_US=%s (want whole microseconds, at most 3600000000); using 50\n", v);
    else
        kernel_ns = us * 1000;
}

uint64_t streams_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void streams_sleep_until(uint64_t t_ns)
{
    struct timespec ts = {(time_t)(t_ns / 1000000000), (long)(t_ns % 1000000000)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

/* The stream's record, added on first use; NULL only if out of memory. Caller holds lock. */
static struct stream *find_stream(void *handle)
{
    if (handle == STREAM_LEGACY)
        handle = NULL;
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

int streams_enqueue(void *handle, unsigned kernels)
{
    uint64_t now = streams_now_ns();
    pthread_mutex_lock(&lock);
    struct stream *s = find_stream(handle);
    if (s && s->held)
        s->behind_ns += kernels * kernel_ns;
    else if (s)
        s->busy_until_ns = (s->busy_until_ns > now ? s->busy_until_ns : now) + kernels * kernel_ns;
    pthread_mutex_unlock(&lock);
    return s ? 0 : -1;
}

/* True while a host function queued on the stream (any stream if all is set) has not returned.
 * Caller holds lock. */
static int any_held(void *handle, int all)
{
    for (size_t i = 0; i < nstreams; i++)
        if ((all || streams[i].handle == handle) && streams[i].held)
            return 1;
    return 0;
}

void streams_drain(void *handle, int all)
{
    if (handle == STREAM_LEGACY)
        handle = NULL;
    uint64_t until = 0;
    pthread_mutex_lock(&lock);
    while (any_held(handle, all))
        pthread_cond_wait(&hostfn_done, &lock);
    for (size_t i = 0; i < nstreams; i++)
        if ((all || streams[i].handle == handle) && streams[i].busy_until_ns > until)
            until = streams[i].busy_until_ns;
    pthread_mutex_unlock(&lock);
    if (until > streams_now_ns())
        streams_sleep_until(until);
}

int streams_ready_at(void *handle, uint64_t *t_ns)
{
    uint64_t now = streams_now_ns();
    pthread_mutex_lock(&lock);
    struct stream *s = find_stream(handle);
    if (s)
        *t_ns = s->held ? now + s->behind_ns : (s->busy_until_ns > now ? s->busy_until_ns : now);
    pthread_mutex_unlock(&lock);
    return s ? 0 : -1;
}

int streams_wait_until(void *handle, uint64_t t_ns)
{
    pthread_mutex_lock(&lock);
    struct stream *s = find_stream(handle);
    if (s && s->busy_until_ns < t_ns)
        s->busy_until_ns = t_ns;
    pthread_mutex_unlock(&lock);
    return s ? 0 : -1;
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
        streams_sleep_until(h->start_ns ? h->start_ns : previous_end + h->delay_ns);
        h->fn(h->data);
        pthread_mutex_lock(&lock);
        previous_end = streams_now_ns();
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

int streams_host_func(void *stream, void (*fn)(void *), void *data)
{
    if (stream == STREAM_LEGACY)
        stream = NULL;
    struct hostfn *h = calloc(1, sizeof *h);
    if (!h)
        return -1;
    h->stream = stream;
    h->fn = fn;
    h->data = data;
    uint64_t now = streams_now_ns();
    pthread_mutex_lock(&lock);
    struct stream *s = find_stream(stream);
    if (!s) {
        pthread_mutex_unlock(&lock);
        free(h);
        return -1;
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
            return -1;
        }
        hostfn_worker_running = 1;
    }
    s->held++;
    *hostfn_tail = h;
    hostfn_tail = &h->next;
    pthread_cond_signal(&hostfn_queued);
    pthread_mutex_unlock(&lock);
    return 0;
}
