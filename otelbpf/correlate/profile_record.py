"""What the profiler hands on: one profile per process, kind and interval, as merged
stacks with their values and labels. Encoding it (gzipped pprof for files and Pyroscope)
is the exporters' job (``otelbpf.export.pprof.encode``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from otelbpf.correlate.stacks import Frame

#: (type, unit) per sample value.
CPU_SAMPLE_TYPES = (("samples", "count"), ("cpu", "nanoseconds"))
MEMORY_SAMPLE_TYPES = (
    ("alloc_objects", "count"),
    ("alloc_space", "bytes"),
    ("inuse_objects", "count"),
    ("inuse_space", "bytes"),
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
    kind: str  # cpu | cuda_memory
    labels: dict[str, str]  # service_name, host_name, process_pid, configured ones
    pid: int
    start_ns: int  # wall clock, the interval it covers
    end_ns: int
    sample_rate: int  # Hz for CPU profiles, 0 otherwise


@dataclass(frozen=True)
class Profile(ProfileMeta):
    sample_types: Sequence[tuple[str, str]]
    default_sample_type: str
    period_type: tuple[str, str] | None = None
    period: int = 0
    samples: list[Sample] = field(default_factory=list)
