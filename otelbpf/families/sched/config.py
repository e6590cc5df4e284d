"""The ``sched`` receiver's options: off-CPU time and run-queue latency of the traced threads
(scheduler tracepoints, bpf/sched.c)."""

from __future__ import annotations

from pydantic import Field

from otelbpf.config.receivers.base import ReceiverConfig
from otelbpf.config.units import PositiveDuration, RingSize


class SchedReceiverConfig(ReceiverConfig):
    """Why the traced threads are off the CPU (waiting for a lock, a queue, a pipe, I/O, the
    GPU) and how long they wait for a CPU once runnable; aggregated in the kernel. Traced: the
    ``--pid``/``run --`` targets, or in host mode the processes that use a library another
    receiver probes (CUDA, NCCL, ibverbs) and their children."""

    #: Off-CPU intervals at least this long become ``off_cpu`` spans (the diagnosis reads
    #: them); shorter ones are only counted in the metrics.
    span_threshold: PositiveDuration = 1_000_000
    max_spans_per_second: int = Field(2000, ge=0, le=1_000_000)
    ring_buffer_size: RingSize = 1 << 20
    #: Kernel map sizes (LRU): threads off the CPU at once, (thread, state, kernel stack)
    #: series, (thread, run-queue bucket) series, distinct kernel stacks.
    max_threads: int = Field(16384, ge=1024, le=1 << 20)
    max_series: int = Field(16384, ge=1024, le=1 << 20)
    max_runqueue_series: int = Field(65536, ge=1024, le=1 << 22)
    stack_map_entries: int = Field(8192, ge=1024, le=1 << 20)
