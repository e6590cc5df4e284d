"""What the profiler hands on: one profile per process, kind and interval, as merged
stacks with their values and labels. Encoding it (gzipped pprof for files and Pyroscope)
is the exporters' job (``otelbpf.export.pprof.encode``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from otelbpf.correlate.spans import scope
from otelbpf.correlate.stacks import Frame

#: The instrumentation scope profiles are made under (the OTLP profiles exporter names it).
SCOPE = scope("otelbpf.profiling")

#: (type, unit) per sample value.
CPU_SAMPLE_TYPES = (("samples", "count"), ("cpu", "nanoseconds"))
MEMORY_SAMPLE_TYPES = (
    ("alloc_objects", "count"),
    ("alloc_space", "bytes"),
    ("inuse_objects", "count"),
    ("inuse_space", "bytes"),
)
#: The CUDA copies, synchronizes and sampled launches by the merged stack that made them (bpf/profile.c
#: ``cuda_calls``): how many, the time the thread spent in them (blocked: waiting for the GPU, or staging a
#: copy), the bytes copied, and the launches (one in ``launch_stack_every`` per kernel, counted that many
#: times, the kernel on top). Pyroscope lists each beside the CPU profile (``cuda:cuda_wait:nanoseconds``, ...).
CALL_SAMPLE_TYPES = (
    ("cuda_calls", "count"),
    ("cuda_wait", "nanoseconds"),
    ("cuda_copy", "bytes"),
    ("cuda_launches", "count"),
)


@dataclass(frozen=True)
class Sample:
    frames: Sequence[Frame]  # leaf first
    values: Sequence[int]  # one per sample type
    labels: Mapping[str, str | int]


@dataclass(frozen=True)
class ProfileMeta:
    """What a profile is of: the process, the kind, the interval; the stacks and the encoded
    record (``export.profile_export.ProfileRecord``) both carry it."""

    name: str  # Pyroscope profile name (__name__): process_cpu, memory
    kind: str  # cpu | cuda_memory | cuda_calls
    labels: dict[str, str]  # service_name, host_name, process_pid, configured ones
    pid: int
    start_ns: int  # wall clock, the interval it covers
    end_ns: int
    sample_rate: int  # Hz for CPU profiles, 0 otherwise


@dataclass(frozen=True)
class CpuTimeline:
    """A process's CPU samples in time, per thread (bpf/profile.c ``cpu_times``), for the GPU-idle
    accounting to join with the thread's CUDA calls (analyze/idle.py). Not part of the pprof:
    the file exporter writes it beside the profile (``*.timeline.json.gz``).

    ``threads``: tid -> [(bucket start, wall-clock ns; samples in the bucket; index into
    ``stacks``)], a bucket's stacks being its first sample's; ``stacks``: (innermost Python
    function, its file, its line, the native function it was in) per distinct code location,
    "" and 0 where there is none."""

    bucket_ns: int
    period_ns: int
    stacks: Sequence[tuple[str, str, int, str]]
    threads: Mapping[int, Sequence[tuple[int, int, int]]]

    def to_json(self) -> dict[str, object]:
        return {
            "bucket_ns": self.bucket_ns,
            "period_ns": self.period_ns,
            "stacks": [list(s) for s in self.stacks],
            "threads": {str(tid): [list(r) for r in rows] for tid, rows in self.threads.items()},
        }


@dataclass(frozen=True)
class Profile(ProfileMeta):
    sample_types: Sequence[tuple[str, str]]
    default_sample_type: str
    period_type: tuple[str, str] | None = None
    period: int = 0
    samples: list[Sample] = field(default_factory=list)
    timeline: CpuTimeline | None = None  # CPU profiles of processes that use a probed library
