"""What a probe family is: its BPF source, the libraries it looks for, and
which BPF function goes on which symbol.

Each family (CUDA now; NCCL, ibverbs later) is one of these plus a C file in
``otelbpf/bpf/``. The sensor treats them all alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class ProbeSpec:
    """Attach ``entry`` (uprobe) and/or ``ret`` (uretprobe) to ``symbol``."""

    symbol: str
    entry: str | None
    ret: str | None = None


@dataclass(frozen=True)
class LibraryKind:
    """A library a family probes, recognised by its file name."""

    name: str              # e.g. "cudart"
    file_pattern: re.Pattern[str]  # matched against the basename
    open_prefix: str       # basename prefix the in-kernel openat filter looks for
    probes: tuple[ProbeSpec, ...]

    def matches(self, basename: str) -> bool:
        return bool(self.file_pattern.match(basename))

    @property
    def symbols(self) -> list[str]:
        return [p.symbol for p in self.probes]


@dataclass(frozen=True)
class RingSpec:
    """A ring buffer of the family's own, declared in its C file as
    ``BPF_RINGBUF_OUTPUT(name, ...)`` with ``size_bytes``, whose records all
    have ``dtype``. The sensor drains it with ``events`` and hands each batch
    to the family's correlator as ``on_ring(name, array)``; for records too
    big or too many for the shared 64-byte ``events`` ring (socket payloads)."""

    name: str
    dtype: np.dtype
    size_bytes: int


@dataclass(frozen=True)
class ProbeFamily:
    name: str
    c_file: str                      # in otelbpf/bpf/
    libraries: tuple[LibraryKind, ...]
    generated_c: str = ""            # per-symbol entry points
    counting_maps: tuple[str, ...] = ()  # in-kernel aggregates read for metrics
    cflags: tuple[str, ...] = field(default_factory=tuple)
    rings: tuple[RingSpec, ...] = ()

    def library_kind(self, basename: str) -> LibraryKind | None:
        return next((k for k in self.libraries if k.matches(basename)), None)
