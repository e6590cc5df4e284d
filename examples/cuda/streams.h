/*
 * streams: the stand-in driver's model of GPU time, shared by every stream handle.
 *
 * No kernel runs anywhere; instead each stream handle (any pointer; NULL is the legacy default
 * stream, STREAM_PER_THREAD stands for every thread's per-thread default stream) keeps the
 * CLOCK_MONOTONIC time its queued work would finish. Launches push that time out, synchronising
 * sleeps until it, so waits last as long as the queued "kernels" would. Host functions
 * (cuLaunchHostFunc) really run, one at a time on a worker thread, and hold their stream until
 * they return, so another stand-in (the fake NCCL) can make a stream wait on something outside.
 * Compiled into libcuda.so.1 only; the runtime stand-in reaches it through the driver API.
 */
#ifndef STREAMS_H
#define STREAMS_H

#include <stdint.h>

#define STREAM_LEGACY ((void *)0x1)     /* CU_STREAM_LEGACY: the legacy default stream, as NULL */
#define STREAM_PER_THREAD ((void *)0x2) /* CU_STREAM_PER_THREAD: what a _ptsz call's NULL stream means */

/* Microseconds one kernel takes: FAKECUDA_KERNEL_US (default 50), read when the driver loads. */
void streams_read_settings(void);

uint64_t streams_now_ns(void);
void streams_sleep_until(uint64_t t_ns);

/* Queues kernels kernel-times of work behind what the stream already has; -1 if out of memory. */
int streams_enqueue(void *stream, unsigned kernels);

/* Sleeps until one stream (every stream if all is set) has finished its queued work. */
void streams_drain(void *stream, int all);

/* Queues fn(data) on the stream; -1 if out of memory or no worker thread could start. */
int streams_host_func(void *stream, void (*fn)(void *), void *data);

/* When the work queued on the stream so far will be done (an event recorded now completes then);
 * work queued behind an unreturned host function counts as starting now. -1 if out of memory. */
int streams_ready_at(void *stream, uint64_t *t_ns);

/* Makes the stream's later work start no earlier than t_ns (cuStreamWaitEvent). */
int streams_wait_until(void *stream, uint64_t t_ns);

#endif
