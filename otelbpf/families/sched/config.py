"""The ``sched`` receiver's options: off-CPU time and run-queue latency of the traced threads
(scheduler tracepoints, bpf/sched.c)."""

from __future__ import annotations

from pydantic import Field

from otelbpf.config.receivers.base import ReceiverConfig
from otelbpf.config.units import Duration, PositiveDuration, RingSize


class SchedReceiverConfig(ReceiverConfig):
    """Why the traced threads are off the CPU (waiting for a lock, a queue, a pipe, I/O, the
    GPU) and how long they wait for a CPU once runnable; aggregated in the kernel. Traced: the
    ``--pid``/``run --`` targets, or in host mode the processes that use a library another
    receiver probes (CUDA, NCCL, ibverbs) and their children."""

    #: Off-CPU intervals at least this long become ``off_cpu`` spans (the diagnosis reads
    #: them); shorter ones are only counted in the metrics.
    span_threshold: PositiveDuration = 1_000_000
    #: Shorter off-CPU intervals (a 0.3 ms fsync, pipe and futex waits) are summed per thread
    #: over windows this long in the kernel and become one ``off_cpu`` span per thread and
    #: window (``otelbpf.sched.intervals``: how many), so that the diagnosis charges them
    #: without a record per context switch. 0: not summed (only counted in the metrics).
    aggregate_window: Duration = Field(1_000_000, ge=0, le=1_000_000_000)
    #: Intervals shorter than this open no window (only counted in the metrics): a thread
    #: handing work back and forth switches every few us, and would make a span per window.
    #: Inside a window one of them opened they are summed (no record more): an fsync's few-us
    #: waits beside its long one belong to its time.
    aggregate_min: Duration = Field(50_000, ge=0, le=1_000_000_000)
    max_spans_per_second: int = Field(2000, ge=0, le=1_000_000)
    ring_buffer_size: RingSize = 1 << 20
    #: Kernel map sizes (LRU): threads off the CPU at once, (thread, state, kernel stack)
    #: series, (thread, run-queue bucket) series, distinct kernel stacks.
    max_threads: int = Field(16384, ge=1024, le=1 << 20)
    max_series: int = Field(16384, ge=1024, le=1 << 20)
    max_runqueue_series: int = Field(65536, ge=1024, le=1 << 22)
    stack_map_entries: int = Field(8192, ge=1024, le=1 << 20)
