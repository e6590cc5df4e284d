"""What a probe family is: its BPF source, the libraries it looks for, and
which BPF function goes on which symbol.

Each family (CUDA now; NCCL, ibverbs later) is one of these plus a C file in
``bpf/`` (top of the repository). The sensor treats them all alike.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from otelbpf.sensor.elf import SymbolSite

#: A counting map's entries as the sensor reads them: (key, value) pairs. The key is the ctypes
#: struct BCC builds from the program's C at load time, so no static type names its fields; the
#: value is an int for scalar values, the (copied) struct otherwise.
MapEntries = list[tuple[Any, Any]]
#: Reads a counting map by name (the sensor's ``read_map``, late-bound for the correlators).
MapReader = Callable[[str], MapEntries]


@dataclass(frozen=True)
class ProbeSpec:
    """Attach ``entry`` (uprobe) and/or ``ret`` (uretprobe) to ``symbol``.

    By default every version of the symbol is probed (elf.resolve returns one
    site per address). ``newest_version_only`` keeps only the site exported
    under the highest version: where a library's older versions are compat
    wrappers taking older struct layouts (libibverbs' ``@IBVERBS_1.0``), the
    newest is the default version callers link to.
    """

    symbol: str
    entry: str | None
    ret: str | None = None
    newest_version_only: bool = False

    def select(self, sites: list[SymbolSite]) -> list[SymbolSite]:
        if not self.newest_version_only or len(sites) < 2:
            return sites
        newest = max(sites, key=lambda s: _version_key(s.version))
        return [newest]


def _version_key(version: str | None) -> tuple[int, ...]:
    """ "IBVERBS_1.12" -> (1, 12): numeric, so 1.12 sorts above 1.8."""
    return tuple(int(n) for n in re.findall(r"[0-9]+", version or ""))


@dataclass(frozen=True)
class ProbeAt:
    """One program on one address of a library, for kinds whose probe sites are found by
    reading the file rather than named (torch: operators chosen by pattern, and the ``ret``
    instructions of each). ``label`` names the site in errors."""

    vaddr: int
    program: str
    label: str
    ret: bool = False  # a uretprobe, not a uprobe


@dataclass(frozen=True)
class LibraryKind:
    """A library a family probes, recognised by its file name."""

    name: str  # e.g. "cudart"
    file_pattern: re.Pattern[str]  # matched against the basename
    open_prefix: str  # basename prefix the in-kernel openat filter looks for ("" : none)
    probes: tuple[ProbeSpec, ...]
    #: Files of any name that define this symbol in their ``.symtab`` (local symbols
    #: included) are of this kind too: a runtime linked statically into an executable
    #: (nvcc's default ``-cudart static``), found among executables, not by file name.
    content_symbol: str | None = None
    #: Resolve probe symbols from ``.symtab`` as well as ``.dynsym``: a static runtime's
    #: functions are local symbols of the executable.
    symtab: bool = False
    #: Probe sites read from the file itself (called with a path the agent can open, on the
    #: sensor's discovery thread), in place of ``probes``.
    find_probes: Callable[[str], list[ProbeAt]] | None = None
    #: Whether a process that opens or maps this library is a library user (``lib_users``):
    #: the processes ``processes: gpu`` traces and profiles. A GPU stack's libraries are; a
    #: library nearly every process loads (libssl) is probed in those processes but does not
    #: make one of them worth tracing.
    marks_user: bool = True
    #: In host mode, probe a file of this kind only once a library user maps it. A uprobe traps
    #: in every process that maps its file, traced or not (~9 us a call on this VM for OpenSSL's
    #: functions), and the filter on traced processes runs in BPF, after the trap: a libssl file
    #: that only processes not traced map is left alone, so they pay nothing.
    users_only: bool = False

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
    #: Records of any length (a header plus a payload): ``dtype`` ends with an object
    #: field ``data`` for the payload (sensor/ringbuf.py VariableRingReader).
    variable: bool = False
    #: Delivered in cuts (sensor.py ``TICK``): ``dtype`` has ``ts_ns`` and ``duration_ns``, a
    #: record written at their sum, and those written after a tick's mark wait for the next.
    cut: bool = False


class Attacher(Protocol):
    """What the sensor offers a family that finds probe targets at run time."""

    def attach_at(self, path: str, shown_path: str, vaddr: int, entry: str | None, ret: str | None) -> int:
        """Probe the function at ``vaddr`` (an ELF address) of the file ``path``
        with program ``entry`` and/or return program ``ret``; the number of
        probes attached (0 when these already are). Raises when one fails."""
        ...


@dataclass(frozen=True)
class RuntimeTargets:
    """Probe targets only a running process can tell (ibverbs: the provider
    functions in a live context's ops table). ``handle`` gets, on the sensor's
    discovery thread, every string record of ``kinds`` (a numpy array) and the
    sensor as ``Attacher``; processes the kernel paused for these records are
    resumed after it returns."""

    kinds: tuple[int, ...]
    handle: Callable[[np.ndarray, Attacher], None]


@dataclass(frozen=True)
class TailCall:
    """A program the family's probes tail-call: ``program`` (a function of the family's C,
    of the same BPF program type as its callers: ``prog_type``, "tracepoint", or "kprobe" for
    uprobes) loaded after the compile and put in slot ``index`` of the ``BPF_PROG_ARRAY``
    named ``array``. Code shared by several probes is compiled and verified once this way
    instead of once per inlined copy (bpf/sockets.c, bpf/cuda.c)."""

    array: str
    index: int
    program: str
    prog_type: Literal["tracepoint", "kprobe"] = "tracepoint"


@dataclass(frozen=True)
class ProbeFamily:
    name: str
    c_file: str  # in bpf/; "" for a family with no C (gpu: a poller started by on_load)
    libraries: tuple[LibraryKind, ...]
    generated_c: str = ""  # per-symbol entry points
    counting_maps: tuple[str, ...] = ()  # in-kernel aggregates read for metrics
    cflags: tuple[str, ...] = field(default_factory=tuple)
    rings: tuple[RingSpec, ...] = ()
    runtime: RuntimeTargets | None = None
    #: Programs the family's probes tail-call; until one is in place its callers
    #: find an empty slot (and count what they lose).
    tail_calls: tuple[TailCall, ...] = ()
    #: Called with the loaded BCC object once every probe is attached (e.g. to
    #: attach perf events), and before it is unloaded, after the last drain
    #: (e.g. for a final read of the family's maps). Both under the sensor's lock.
    on_load: Callable[[object], None] | None = None
    on_unload: Callable[[object], None] | None = None
    #: Families whose C this one's uses (maps, functions): their source comes first in the
    #: program whatever order the config names the receivers in (sensor/program.py).
    after: tuple[str, ...] = ()

    def library_kind(self, basename: str) -> LibraryKind | None:
        return next((k for k in self.libraries if k.matches(basename)), None)
