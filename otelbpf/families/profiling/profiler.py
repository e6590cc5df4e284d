"""The profiler: reads the kernel's profile maps every interval and turns them into one
pprof per process and kind (CPU; CUDA memory; CUDA copies and synchronizes), with merged Python + native stacks.

Threads: the family's ``on_load`` (sensor start) attaches the perf event (``probes.py``, where every
kernel map and program operation lives) and starts the collection thread; ``on_events`` (the agent's
processing thread) learns of new processes, execs and exits; ``on_unload`` (sensor stop, after the
last drain) makes the final collection. Only kernel map operations happen under the sensor's lock
(``run_locked``), in three short holds a round: taking the aggregates and stacks, looking up the
code objects they name, deleting what went stale. Caching, decoding, symbolization and encoding
happen outside it: the agent's processing thread needs that lock too, and waited behind whole rounds
(0.4-2.3 s on a busy host, issue 14). Every cache is bounded (``CacheSizes``), evictions counted.

Kernel maps are emptied as they are read: sample counts and allocation counts are
lookup-and-deleted, stacks are copied into caches here and deleted there (the kernel
stores a stack again when it sees it again). Bytes in use are read without deleting: they
are a running balance.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import socket
import threading
import time
from array import array
from collections import defaultdict
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from otelbpf.base.events import CudaFunc, Kind, StrKind
from otelbpf.base.health import Health
from otelbpf.correlate.kallsyms import KernelSymbols
from otelbpf.correlate.process_info import ProcessInfo
from otelbpf.correlate.profile_record import (
    CALL_SAMPLE_TYPES,
    CPU_SAMPLE_TYPES,
    MEMORY_SAMPLE_TYPES,
    SCOPE,
    CpuTimeline,
    Profile,
    Sample,
)
from otelbpf.correlate.stacks import Frame, PythonFrame, kernel, merge, native
from otelbpf.correlate.symbolizer import Symbolizer
from otelbpf.families.profiling import pylines, python_offsets
from otelbpf.families.profiling.probes import (
    Arrays,
    CodeKey,
    ProfileMaps,
    Taken,
    delete_stale,
    forget_process,
    lookup_codes,
    pending_pids,
)
from otelbpf.families.profiling.profile_cache import Interned, Lru
from otelbpf.families.profiling.python_offsets import PythonLayoutError, PythonProcess

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import Metric
    from opentelemetry.sdk.resources import Resource

log = logging.getLogger(__name__)


# bpf/profile.c
PYF_ENTRY, PYF_SHIM = 1, 2
STACKF_TRUNCATED = 1
PY_CHUNK_LEN = 256
TIME_BUCKET_SHIFT = 16  # bpf/profile.c

RunLocked = Callable[[Callable[[Any], Any]], Any]
Sink = Callable[[list[Profile]], None]


@dataclass(slots=True)
class CodeInfo:
    """A code object as the kernel copied it; its line table decoded on first use (``index``,
    which then replaces ``table``)."""

    name: str
    filename: str
    firstlineno: int
    table: bytes
    table_size: int
    table_addr: int
    captured_ns: int
    index: pylines.LineIndex | None = None


@dataclass(frozen=True)
class CacheSizes:
    """Entries each of the profiler's caches holds at most (``receivers.profiling.cached_*``)."""

    stacks: int = 16384  # native stacks copied from the kernel, by hash
    python_stacks: int = 16384  # Python stacks, the kernel's bytes
    resolved_stacks: int = 16384  # (process, stacks) -> merged frames
    frames: int = 16384  # distinct frames, shared by the resolved stacks
    code_objects: int = 8192  # Python code objects, by process


@dataclass
class _Proc:
    python: PythonProcess | None = None
    exited: bool = False
    codes: set[CodeKey] = field(default_factory=set)  # code objects whose info is cached
    latest: dict[int, CodeKey] = field(default_factory=dict)  # address -> the code object living there
    superseded: set[CodeKey] = field(default_factory=set)  # freed, another at their address: dropped after the emit


@dataclass
class _Raw:
    """One read of the kernel maps."""

    start_ns: int
    end_ns: int
    read_mono_ns: int  # CLOCK_MONOTONIC before the read: maps read since hold every sampled library
    samples: list[tuple[int, int, int, int, int]]  # pid, user, kernel, py, count
    times: list[tuple[int, int, int, int, int, int, int]]  # pid, tid, bucket, user, kernel, py, count
    allocs: list[tuple[int, int, int, int, int, int]]  # pid, func, user, py, bytes, count
    inuse: list[tuple[int, int, int, int, int, int]]
    calls: list[
        tuple[int, int, int, int, int, int, int, int, int]
    ]  # pid, func, user, py, kernel, calls, ns, bytes, launches
    stats: dict[str, int]
    gone: dict[int, _Proc]  # processes that exited before this read: forgotten once it is emitted


_Steps = Generator[bool, Any, None]  # a round: yields whether its next step needs the kernel


_T = TypeVar("_T")


def _mark_used(cache: Lru[int, tuple[_T, int, int]], hashes: set[int], round_: int) -> int:
    """Mark the cached stacks a read's samples refer to as used this round; how many are not cached."""
    missing = 0
    for h in hashes:
        hit = cache.get(h)
        if hit is None:
            missing += 1
        elif hit[2] != round_:
            cache.put(h, (hit[0], hit[1], round_))
    return missing


def _mem_rows(keys: np.ndarray, values: np.ndarray) -> list[tuple[int, int, int, int, int, int]]:
    return list(
        zip(
            keys["pid"].tolist(),
            keys["func"].tolist(),
            keys["user"].tolist(),
            keys["py"].tolist(),
            values["bytes"].tolist(),
            values["count"].tolist(),
        )
    )


def _call_rows(keys: np.ndarray, values: np.ndarray) -> list[tuple[int, int, int, int, int, int, int, int, int]]:
    """cuda_calls rows (struct call_key: the stacks' mem_key in ``k``, and the kernel)."""
    k = keys["k"]
    return list(
        zip(
            k["pid"].tolist(),
            k["func"].tolist(),
            k["user"].tolist(),
            k["py"].tolist(),
            keys["kernel"].tolist(),
            values["calls"].tolist(),
            values["ns"].tolist(),
            values["bytes"].tolist(),
            values["launches"].tolist(),
        )
    )


def _decode_str(raw: bytes, kind: int) -> str:
    codec = {0: "ascii", 1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}.get(kind, "latin-1")
    return raw.decode(codec, errors="replace")


def _field(leaf: Any, name: str, size: int) -> bytes:
    """Raw bytes of a char-array field (ctypes would stop at the first NUL)."""
    return ctypes.string_at(ctypes.addressof(leaf) + getattr(type(leaf), name).offset, size)


def sanitize_label(key: str) -> str:
    """Pyroscope label names are [a-zA-Z_][a-zA-Z0-9_]*: dots and the rest become '_'."""
    out = "".join(c if c.isalnum() or c == "_" else "_" for c in key)
    return out if out and not out[0].isdigit() else f"_{out}"


class Profiler:
    scope = SCOPE

    def __init__(
        self,
        process_info: ProcessInfo,
        health: Health,
        sink: Sink,
        *,
        sample_hz: int,
        interval_s: float,
        cuda_memory: bool,
        python: bool,
        labels: dict[str, Any] | None = None,
        caches: CacheSizes = CacheSizes(),
    ) -> None:
        self._info = process_info
        self._health = health
        self._sink = sink
        self.sample_hz = sample_hz
        self.interval_s = interval_s
        self.python = python
        self._labels = {sanitize_label(k): str(v) for k, v in (labels or {}).items()}
        self.run_locked: RunLocked = lambda fn: None
        self._kernel = ProfileMaps(cuda_memory=cuda_memory)
        self._sym = Symbolizer()
        self._ksyms: KernelSymbols | None = None
        self._host = socket.gethostname()
        self._lock = threading.Lock()
        self._procs: dict[int, _Proc] = {}
        # Stack hash -> (frames, flags, round last used), dropped when unused for two rounds.
        # Native stacks as 8 bytes a frame (array "Q"), Python ones as the kernel's 16-byte
        # frames (decoded when used): as tuples of Python ints (~40 bytes a value) they were
        # the profiler's largest structure on a busy host (issue 14).
        self._stacks: Lru[int, tuple[array[int], int, int]] = Lru("stacks", caches.stacks)
        self._py_stacks: Lru[int, tuple[bytes, int, int]] = Lru("python_stacks", caches.python_stacks)
        self._py_frame_dtype: np.dtype | None = None  # the kernel's Python frame layout, from the first drain
        # (pid, code, tag) -> what the kernel copied; an evicted one is deleted there too (recaptured)
        self._codes: Lru[tuple[int, int, int], CodeInfo] = Lru("code_objects", caches.code_objects, self._code_evicted)
        self._stale_codes: set[tuple[int, int, int]] = set()  # kernel entries to delete at the next round's end
        # line table chunks taken from the kernel, (pid, code, tag) -> (index -> bytes, round taken): kept
        # until their code's entry is read (the kernel writes chunks first), two rounds at most
        self._chunks: dict[tuple[int, int, int], tuple[dict[int, bytes], int]] = {}
        # (pid, user, kernel, Python stack hash) -> (frames, round last used): a stack seen
        # again is not symbolized again; dropped as the stacks above are, and with its process.
        self._resolved: Lru[tuple[int, int, int, int], tuple[list[Frame], int]] = Lru(
            "resolved_stacks", caches.resolved_stacks
        )
        self._frame = Interned[Frame]("frames", caches.frames)  # one object per distinct frame
        self._reimaged: set[int] = set()  # exec'd since the last emit: their stacks resolve anew
        self._round = 0
        self._last_ns = time.time_ns()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._collect_lock = threading.Lock()  # one step of a round at a time; taken after the sensor's lock
        self._current: _Steps | None = None  # the collection thread's round in progress
        self._reading_stopped = False
        self.lock_holds: list[float] = []  # the sensor's lock held by each kernel step of the round, s
        self.frames_symbolized = 0
        self.symbolize_seconds = 0.0

    # -- family hooks (sensor thread, sensor lock held) ---------------------

    def on_load(self, bpf: Any) -> None:
        self._kernel.attach(bpf, self.sample_hz)
        self._last_ns = time.time_ns()
        self._thread = threading.Thread(target=self._run, name="otelbpf-profiles", daemon=True)
        self._thread.start()

    def on_unload(self, bpf: Any) -> None:
        """The final read. The collection thread is not joined: it may be waiting for the
        sensor's lock, held here. A round it has begun is finished here first (what it took
        from the kernel is in no other read); then it finds its round gone and reading stopped."""
        self._stop.set()
        self._process_pending_inspections(bpf)
        with self._collect_lock:
            self._reading_stopped = True
            if self._current is not None:
                self._finish(self._current, bpf)
                self._current = None
            rnd = self._round_steps()
            next(rnd)
            self._finish(rnd, bpf)

    # -- correlator protocol (processing thread) ----------------------------

    def on_events(self, arr: np.ndarray) -> None:
        kinds = arr["kind"]
        for pid in np.unique(arr["pid"][kinds == Kind.PROFILE_PROC]).tolist():
            self._inspect(int(pid))
        for pid in np.unique(arr["pid"][kinds == Kind.PROC_EXEC]).tolist():
            self._forget_image(int(pid))
        for pid in np.unique(arr["pid"][kinds == Kind.PROC_EXIT]).tolist():
            with self._lock:
                if pid in self._procs:
                    self._procs[pid].exited = True

    def on_strings(self, arr: np.ndarray) -> None:
        """A process opening a probed library is certainly running its interpreter now."""
        for pid in np.unique(arr["pid"][arr["kind"] == StrKind.LIB_OPEN]).tolist():
            with self._lock:
                known = pid in self._procs and self._procs[pid].python is not None
            if not known:
                self._inspect(int(pid))

    def collect(self) -> list[tuple[Resource, list[Metric]]]:
        return []

    # -- processes -----------------------------------------------------------

    def _inspect(self, pid: int) -> None:
        """Is ``pid`` Python? Tell the kernel (loading that version's walker on first use)."""
        self._sym.remember(pid)
        proc = None
        if self.python:
            try:
                proc = python_offsets.inspect(pid)
            except PythonLayoutError as exc:
                log.info("pid %d: no Python stacks: %s", pid, exc)
                self._health.add("otelbpf.profile.python_unsupported", 1)
            except OSError as exc:  # it exited meanwhile
                log.debug("pid %d: %s", pid, exc)
        with self._lock:
            self._procs.setdefault(pid, _Proc()).python = proc
        self.run_locked(lambda bpf: self._kernel.tell_process(bpf, pid, proc))

    def _process_pending_inspections(self, bpf: Any) -> None:
        """At stop: processes the kernel announced but user space has not inspected yet
        still get their maps snapshot, for symbolization."""
        for pid in pending_pids(bpf):
            if pid not in self._procs:
                self._sym.remember(pid)

    def _forget_image(self, pid: int) -> None:
        """An exec: the pid runs another program, to be inspected anew."""
        with self._lock:
            self._reimaged.add(pid)
            old = self._procs.pop(pid, None)
            if old is not None:
                for code, tag in old.codes:
                    self._codes.pop((pid, code, tag))
        self._sym.forget(pid)

        codes = old.codes if old is not None else set()
        self.run_locked(lambda bpf: forget_process(bpf, pid, codes))

    # -- collection ----------------------------------------------------------

    def _run(self) -> None:
        from otelbpf.base.threadname import name_os_thread

        name_os_thread("otelbpf-profiles")
        while not self._stop.wait(self.interval_s):
            try:
                self.collect_once()
            except Exception:  # keep profiling whatever one round did
                log.exception("profile collection failed")
                self._health.add("otelbpf.profile.collection_errors", 1)

    def collect_once(self) -> None:
        """One round by the collection thread. Its kernel steps run under the sensor's lock, one
        short hold each (``run_locked``); copying, decoding, symbolizing and exporting outside
        it, under the collection lock only. A round the final read took over (``on_unload``)
        is left to it."""
        with self._collect_lock:
            if self._reading_stopped:
                return
            rnd = self._current = self._round_steps()
            locked: bool | None = next(rnd)
        while locked is not None:
            locked = self.run_locked(lambda bpf: self._advance(rnd, bpf)) if locked else self._advance(rnd, None)

    def _advance(self, rnd: _Steps, bpf: Any) -> bool | None:
        """The round's next step (``bpf`` for a kernel step, whose hold is timed): whether the one
        after needs the kernel, None when the round is over or no longer this thread's."""
        with self._collect_lock:
            if self._current is not rnd:
                return None
            t0 = time.perf_counter()
            try:
                return rnd.send(bpf)
            except StopIteration:
                self._current = None
                return None
            finally:
                if bpf is not None:
                    self.lock_holds.append(time.perf_counter() - t0)

    def _finish(self, rnd: _Steps, bpf: Any) -> None:
        """Every remaining step of a round, at once (the final read: the sensor's lock held)."""
        with contextlib.suppress(StopIteration):
            while True:
                rnd.send(bpf)

    def _round_steps(self) -> _Steps:
        """One round: take what the kernel aggregated (lock), cache and decode it; look up the
        code objects its Python stacks name (lock), decode them; delete what is stale in the
        kernel (lock); symbolize and export. Yields whether the next step needs the kernel
        (then it is sent the BPF object)."""
        self.lock_holds = []
        bpf = yield True
        taken = self._kernel.take(bpf)
        yield False
        raw, wanted = self._digest(taken)
        bpf = yield True
        leaves = lookup_codes(bpf, wanted)
        yield False
        self._name_codes(leaves)
        bpf = yield True
        self._delete_stale(bpf, raw)
        yield False
        log.debug(
            "profile round %d: sensor lock held %s ms",
            self._round,
            "/".join(f"{s * 1e3:.1f}" for s in self.lock_holds),
        )
        self._emit(raw)

    def _digest(self, t: Taken) -> tuple[_Raw, set[tuple[int, int, int]]]:
        """The read as rows, its stacks cached; and the code objects its Python stacks name that
        are not known yet (to look up in the kernel)."""
        keys, counts = t.samples
        samples = list(
            zip(
                keys["pid"].tolist(),
                keys["user"].tolist(),
                keys["kernel"].tolist(),
                keys["py"].tolist(),
                counts.tolist(),
            )
        )
        tkeys, tvals = t.times
        times = list(
            zip(
                tkeys["pid"].tolist(),
                tkeys["tid"].tolist(),
                tkeys["bucket"].tolist(),
                tvals["user"].tolist(),
                tvals["kernel"].tolist(),
                tvals["py"].tolist(),
                tvals["count"].tolist(),
            )
        )
        allocs = _mem_rows(*t.allocs) if t.allocs is not None else []
        inuse = _mem_rows(*t.inuse) if t.inuse is not None else []
        calls = _call_rows(*t.calls) if t.calls is not None else []
        self._round += 1
        natives = {h for s in samples for h in (s[1], s[2])} | {a[2] for a in [*allocs, *inuse, *calls]}
        pys = {s[3] for s in samples} | {a[3] for a in [*allocs, *inuse, *calls]}
        self._copy_stacks(t.stacks, t.py_stacks, natives - {0}, pys - {0})
        self._take_chunks(t.tables)
        wanted = set()
        for pid, h in {(s[0], s[3]) for s in samples} | {(a[0], a[3]) for a in [*allocs, *inuse, *calls]}:
            for code, _offset, _flags, tag in self._py_frames(h)[0]:
                if code and (pid, code, tag) not in self._codes:
                    wanted.add((pid, code, tag))
        with self._lock:
            sampled = {s[0] for s in samples}
            gone = {pid: p for pid, p in self._procs.items() if p.exited and pid not in sampled}
        start, self._last_ns = self._last_ns, t.end_ns
        return _Raw(start, t.end_ns, t.read_mono_ns, samples, times, allocs, inuse, calls, t.stats, gone), wanted

    def _copy_stacks(self, stacks: Arrays, py_stacks: Arrays, natives: set[int], pys: set[int]) -> None:
        """Cache every stack the kernel stored since the last read (its map was emptied: it
        stores a stack again when it sees it again; a stack that stayed cached here was never
        deleted there, and the map filled up with stacks long out of use). Native stacks as 8
        bytes a frame, Python ones as the kernel's bytes, decoded when used. ``natives`` and
        ``pys``: the hashes this read's samples refer to, kept two more rounds."""
        keys, leaves = stacks
        for h, n, flags, ips in zip(keys.tolist(), leaves["len"].tolist(), leaves["flags"].tolist(), leaves["ip"]):
            self._stacks.put(h, (array("Q", ips[:n].astype(np.uint64, copy=False).tobytes()), flags, self._round))
        keys, leaves = py_stacks
        if len(keys):
            self._py_frame_dtype = leaves.dtype["f"].base
        frames = leaves["f"]
        for i, (h, n, flags) in enumerate(zip(keys.tolist(), leaves["len"].tolist(), leaves["flags"].tolist())):
            self._py_stacks.put(h, (frames[i, :n].tobytes(), flags, self._round))
        missing = _mark_used(self._stacks, natives, self._round) + _mark_used(self._py_stacks, pys, self._round)
        if missing:
            self._health.add("otelbpf.profile.stacks_missing", missing)
        oldest = self._round - 2
        self._stacks.release(lambda _h, v: v[2] < oldest)
        self._py_stacks.release(lambda _h, v: v[2] < oldest)

    def _py_frames(self, h: int) -> tuple[list[tuple[int, int, int, int]], int]:
        """A cached Python stack's frames as (code, offset, flags, tag), and its flags."""
        hit = self._py_stacks.get(h) if h else None
        if hit is None or self._py_frame_dtype is None:
            return [], 0
        f = np.frombuffer(hit[0], dtype=self._py_frame_dtype)
        return list(zip(f["code"].tolist(), f["offset"].tolist(), f["flags"].tolist(), f["tag"].tolist())), hit[1]

    def _take_chunks(self, tables: Arrays) -> None:
        """The line table chunks the kernel wrote since the last read, by code object."""
        keys, leaves = tables
        code = keys["code"]
        for pid, tag, addr, index, chunk in zip(
            code["pid"].tolist(), code["tag"].tolist(), code["code"].tolist(), keys["index"].tolist(), leaves["b"]
        ):
            self._chunks.setdefault((pid, addr, tag), ({}, self._round))[0][index] = chunk.tobytes()
        self._chunks = {k: v for k, v in self._chunks.items() if v[1] >= self._round - 2}

    def _name_codes(self, leaves: list[tuple[tuple[int, int, int], Any]]) -> None:
        """Decode the code objects looked up, once their line tables are all taken."""
        for (pid, code, tag), leaf in leaves:
            line_table = self._line_table_copy(pid, code, tag, leaf.table_len)
            if line_table is None:
                continue  # its chunks were written after this read took them: next read
            info = CodeInfo(
                name=_decode_str(_field(leaf, "name", leaf.name_len), leaf.name_kind),
                filename=("…" if leaf.file_cut else "")
                + _decode_str(_field(leaf, "file", leaf.file_len), leaf.file_kind),
                firstlineno=leaf.firstlineno,
                table=line_table,
                table_size=leaf.table_size,
                table_addr=leaf.table_addr,
                captured_ns=leaf.captured_ns,
            )
            self._codes.put((pid, code, tag), info)
            self._supersede(pid, (code, tag), info)

    def _line_table_copy(self, pid: int, code: int, tag: int, length: int) -> bytes | None:
        """The ``length`` bytes of line table the kernel copied for a code object, from the
        chunks taken; None while some are still to be taken."""
        count = -(-length // PY_CHUNK_LEN)
        chunks = self._chunks.pop((pid, code, tag), ({}, 0))[0] if count else {}
        if len(chunks) < count or any(i not in chunks for i in range(count)):
            if chunks:
                self._chunks[(pid, code, tag)] = (chunks, self._round)
            return None
        return b"".join(chunks[i] for i in range(count))[:length]

    def _supersede(self, pid: int, key: CodeKey, info: CodeInfo) -> None:
        """Two code objects seen at one address: the one captured earlier was freed. Its
        kernel entry goes this round (code made again and again, by exec() or a module's
        import, would fill the map), its info here after this round's profiles are out."""
        with self._lock:
            proc = self._procs.setdefault(pid, _Proc())
            proc.codes.add(key)
            other = proc.latest.get(key[0])
            if other is None or other == key:
                proc.latest[key[0]] = key
                return
            known = self._codes.get((pid, *other))
            older = other if known is None or known.captured_ns <= info.captured_ns else key
            proc.latest[key[0]] = key if older == other else other
            proc.superseded.add(older)
            self._stale_codes.add((pid, *older))

    def _code_evicted(self, key: tuple[int, int, int], _info: CodeInfo) -> None:
        """A code object pushed out of the cache: its kernel entry goes too, so that the kernel
        captures it again (with its line table) when it is sampled again."""
        with self._lock:
            self._stale_codes.add(key)
            proc = self._procs.get(key[0])
            if proc is not None:
                proc.codes.discard(key[1:])

    def _delete_stale(self, bpf: Any, raw: _Raw) -> None:
        """Kernel deletions (the sensor's lock is held): code objects superseded or evicted, and
        what is kept for processes that exited before this read (their last samples are in
        it; what user space knows of them goes after the emit)."""
        with self._lock:
            stale, self._stale_codes = self._stale_codes, set()
        gone = {pid: p.codes for pid, p in raw.gone.items()}
        allocating = raw.gone.keys() & {a[0] for a in raw.inuse} if raw.gone else set()
        delete_stale(bpf, stale, gone, allocating)

    def _forget(self, procs: dict[int, _Proc]) -> None:
        with self._lock:
            for pid in procs:
                self._procs.pop(pid, None)
            superseded = {pid: p.superseded for pid, p in self._procs.items() if p.superseded}
            for p in self._procs.values():
                p.codes -= p.superseded
                p.superseded = set()
        for pid, codes in superseded.items():
            for code, tag in codes:
                self._codes.pop((pid, code, tag))
        for pid, p in procs.items():
            for code, tag in p.codes:
                self._codes.pop((pid, code, tag))
            self._sym.forget(pid)
        self._prune_resolved(set(procs))

    def _prune_resolved(self, pids: set[int]) -> None:
        """Resolved stacks go when unused for two rounds (as their hashes do), and with
        their process (an exit, or an exec: the same addresses are another program's)."""
        oldest = self._round - 2
        self._resolved.release(lambda k, v: v[1] < oldest or k[0] in pids)

    # -- symbolization -------------------------------------------------------

    def _python_frames(self, pid: int, h: int, version: tuple[int, int]) -> tuple[list[PythonFrame], bool, bool]:
        """The stack's frames, whether it was truncated, and whether every code object
        was named (one not captured yet will be, by a later sample)."""
        frames, flags = self._py_frames(h)
        out: list[PythonFrame] = []
        named = True
        for code, offset, fflags, tag in frames:
            if fflags & PYF_SHIM:
                if out:
                    out[-1] = PythonFrame(out[-1].function, out[-1].filename, out[-1].line, out[-1].start_line, True)
                continue
            if not code:
                continue
            info = self._codes.get((pid, code, tag))
            if info is None:
                out.append(PythonFrame(f"[python code {code:#x}]", "", 0, 0, bool(fflags & PYF_ENTRY)))
                named = False
                continue
            line = self._line_index(pid, info, version).line(offset)
            out.append(PythonFrame(info.name, info.filename, line or 0, info.firstlineno, bool(fflags & PYF_ENTRY)))
        return out, bool(flags & STACKF_TRUNCATED), named

    def _line_index(self, pid: int, info: CodeInfo, version: tuple[int, int]) -> pylines.LineIndex:
        """The code object's decoded line table, made on first use and kept with it in place of
        the copied bytes (nothing reads them again)."""
        if info.index is None:
            info.index = pylines.LineIndex(self._line_table(pid, info), info.firstlineno, version)
            info.table = b""
        return info.index

    @staticmethod
    def _line_table(pid: int, info: CodeInfo) -> bytes:
        """The copied line table, or the whole one from the live process when the copy is cut
        short (tables past PY_TABLE_CHUNKS KiB); the copy when the process is gone."""
        if info.table_size <= len(info.table):
            return info.table
        try:
            with open(f"/proc/{pid}/mem", "rb") as mem:
                mem.seek(info.table_addr)
                return mem.read(info.table_size)
        except OSError:
            return info.table

    def _frames(
        self, pid: int, user: int, kern: int, py: int, proc: PythonProcess | None, fresh_after_ns: int
    ) -> list[Frame]:
        """The sample's merged stack, resolved once while it keeps being sampled: a stack
        whose Python frames are not all named yet (code objects not captured, the process
        not inspected yet) is resolved again next time."""
        key = (pid, user, kern, py)
        hit = self._resolved.get(key)
        if hit is not None:
            if hit[1] != self._round:
                self._resolved.put(key, (hit[0], self._round))
            return hit[0]
        t0 = time.perf_counter()
        kframes: list[Frame] = []
        if kern:
            if self._ksyms is None:
                self._ksyms = KernelSymbols()
            kframes = [kernel(self._ksyms.lookup(ip), ip) for ip in self._native_ips(kern)[0]]
        ips, uflags = self._native_ips(user)
        # A return address is just past its call: look up the byte before it (not for the leaf).
        uframes = [
            native(self._sym.frame(pid, ip - 1 if i and ip else ip, fresh_after_ns), ip) for i, ip in enumerate(ips)
        ]
        pyframes, py_truncated, named = (
            self._python_frames(pid, py, proc.version) if py and proc else ([], False, not py)
        )
        merged = merge(
            uframes,
            pyframes,
            interpreter=proc.interpreter.rsplit("/", 1)[-1] if proc else None,
            interpreter_frame_pointers=proc.frame_pointers if proc else False,
            native_truncated=bool(uflags & STACKF_TRUNCATED) or (not ips and not pyframes and not kframes),
            python_truncated=py_truncated,
        )
        out = [self._frame(f) for f in kframes + merged]  # shared: frames repeat across stacks
        self.frames_symbolized += len(kframes) + len(uframes) + len(pyframes)
        self.symbolize_seconds += time.perf_counter() - t0
        if named:
            self._resolved.put(key, (out, self._round))
        return out

    def _native_ips(self, h: int) -> tuple[array[int], int]:
        hit = self._stacks.get(h) if h else None
        return (hit[0], hit[1]) if hit is not None else (array("Q"), 0)

    def _labels_for(self, pid: int) -> dict[str, str]:
        attrs = self._info.resource(pid).attributes
        labels = {
            "service_name": str(attrs.get("service.name", f"pid-{pid}")),
            "host_name": str(attrs.get("host.name", self._host)),
            "process_pid": str(pid),
        }
        labels.update(self._labels)
        if "service_name" in self._labels:
            labels["service_name"] = self._labels["service_name"]
        return labels

    def _proc(self, pid: int) -> PythonProcess | None:
        with self._lock:
            p = self._procs.get(pid)
            return p.python if p else None

    # -- profiles ------------------------------------------------------------

    def _emit(self, raw: _Raw) -> None:
        for name, value in raw.stats.items():
            self._health_gauge(name, value)
        records: list[Profile] = []
        period = 1_000_000_000 // max(self.sample_hz, 1)
        with self._lock:
            reimaged, self._reimaged = self._reimaged, set()
        self._prune_resolved(reimaged)
        by_pid: dict[int, list[tuple[int, int, int, int]]] = defaultdict(list)  # user, kernel, py, count
        for pid, user, kern, py, count in raw.samples:
            by_pid[pid].append((user, kern, py, count))
        times: dict[int, list[tuple[int, int, int, int, int, int]]] = defaultdict(list)
        for pid, tid, bucket, user, kern, py, count in raw.times:
            times[pid].append((tid, bucket, user, kern, py, count))
        for pid, rows in by_pid.items():
            proc, labels = self._proc(pid), self._labels_for(pid)
            records.append(
                Profile(
                    "process_cpu",
                    "cpu",
                    labels,
                    pid,
                    raw.start_ns,
                    raw.end_ns,
                    self.sample_hz,
                    CPU_SAMPLE_TYPES,
                    "cpu",
                    period_type=("cpu", "nanoseconds"),
                    period=period,
                    samples=[
                        Sample(
                            self._frames(pid, user, kern, py, proc, raw.read_mono_ns), (count, count * period), labels
                        )
                        for user, kern, py, count in rows
                    ],
                    timeline=self._timeline(pid, times.get(pid), proc, raw) if pid in times else None,
                )
            )
        records.extend(self._memory(raw))
        records.extend(self._calls(raw))
        self._health.add("otelbpf.profile.samples", sum(s[4] for s in raw.samples))
        self._forget(raw.gone)
        for pid in by_pid.keys() - raw.gone.keys():
            self._sym.remember(pid)  # libraries loaded since: named even if the process exits before the next read
        if records:
            self._sink(records)

    def _timeline(
        self, pid: int, rows: list[tuple[int, int, int, int, int, int]] | None, proc: PythonProcess | None, raw: _Raw
    ) -> CpuTimeline:
        """The process's samples in time (``cpu_times``): buckets on the wall clock (the kernel's
        are CLOCK_MONOTONIC; both clocks were read together before the maps), each bucket's
        code as its innermost Python frame and the native function it was in."""
        offset = raw.end_ns - raw.read_mono_ns
        where: dict[tuple[int, int, int], int] = {}
        stacks: dict[tuple[str, str, int, str], int] = {}
        threads: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
        for tid, bucket, user, kern, py, count in sorted(rows or ()):
            idx = where.get((user, kern, py))
            if idx is None:
                code = _code_of(self._frames(pid, user, kern, py, proc, raw.read_mono_ns))
                idx = where[(user, kern, py)] = stacks.setdefault(code, len(stacks))
            threads[tid].append(((bucket << TIME_BUCKET_SHIFT) + offset, count, idx))
        period = 1_000_000_000 // max(self.sample_hz, 1)
        return CpuTimeline(1 << TIME_BUCKET_SHIFT, period, list(stacks), dict(threads))

    def _memory(self, raw: _Raw) -> list[Profile]:
        rows: dict[int, dict[tuple[int, int, int], list[int]]] = defaultdict(dict)
        for pid, func, user, py, nbytes, count in raw.allocs:
            rows[pid].setdefault((func, user, py), [0, 0, 0, 0])[0:2] = [count, nbytes]
        for pid, func, user, py, nbytes, count in raw.inuse:
            if pid in raw.gone:
                continue  # an exited process holds no device memory
            v = rows[pid].setdefault((func, user, py), [0, 0, 0, 0])
            v[2], v[3] = max(_signed(count), 0), max(_signed(nbytes), 0)
        out = []
        for pid, stacks in rows.items():
            stacks = {k: v for k, v in stacks.items() if any(v)}
            if not stacks:
                continue
            proc, labels = self._proc(pid), {**self._labels_for(pid), "memory_device": "cuda"}
            samples = [
                Sample(
                    [Frame(_func_name(func), "native"), *self._frames(pid, user, 0, py, proc, raw.read_mono_ns)],
                    values,
                    labels,
                )
                for (func, user, py), values in stacks.items()
            ]
            out.append(
                Profile(
                    "memory",
                    "cuda_memory",
                    labels,
                    pid,
                    raw.start_ns,
                    raw.end_ns,
                    0,
                    MEMORY_SAMPLE_TYPES,
                    "inuse_space",
                    samples=samples,
                )
            )
        return out

    def _calls(self, raw: _Raw) -> list[Profile]:
        """The interval's CUDA copies and synchronizes per process, on the merged stacks that made
        them, the CUDA function on top (``CALL_SAMPLE_TYPES``; the AI flame graphs' code frames)."""
        rows: dict[int, list[tuple[int, int, int, int, list[int]]]] = defaultdict(list)
        for pid, func, user, py, kern, calls, ns, nbytes, launches in raw.calls:
            if calls:
                rows[pid].append((func, user, py, kern, [calls, ns, nbytes, launches]))
        out = []
        for pid, stacks in rows.items():
            proc, labels = self._proc(pid), self._labels_for(pid)
            samples = [
                Sample(
                    [
                        *([self._kernel_frame(pid, kern, raw.read_mono_ns)] if kern else []),
                        Frame(_func_name(func), "native"),
                        *self._frames(pid, user, 0, py, proc, raw.read_mono_ns),
                    ],
                    values,
                    labels,
                )
                for func, user, py, kern, values in stacks
            ]
            out.append(
                Profile(
                    "cuda",
                    "cuda_calls",
                    labels,
                    pid,
                    raw.start_ns,
                    raw.end_ns,
                    0,
                    CALL_SAMPLE_TYPES,
                    "cuda_wait",
                    samples=samples,
                )
            )
        return out

    def _kernel_frame(self, pid: int, handle: int, fresh_after_ns: int) -> Frame:
        """A launched kernel, by its handle: a runtime launch's is the host stub nvcc made for it,
        whose symbol is the kernel's name (``add(float*, int)``, its ``__device_stub__``); a
        driver handle (CUfunction) is no code address, and stays ``kernel 0x...``."""
        name = self._sym.frame(pid, handle, fresh_after_ns).function
        return self._frame(Frame(name or f"kernel {handle:#x}", "native"))

    def _health_gauge(self, name: str, total: int) -> None:
        """Kernel drop counters are cumulative per CPU: add what is new since last time."""
        seen = self._health.get("otelbpf.profile.kernel_drops", reason=name)
        if total > seen:
            self._health.add("otelbpf.profile.kernel_drops", total - seen, reason=name)


def _code_of(frames: list[Frame]) -> tuple[str, str, int, str]:
    """A sample's code location (leaf first frames): its innermost Python frame, and the native
    function that frame was in (the C function it called: ``write``, ``os_fsync``); without a
    Python frame, the innermost user-space native one."""
    for i, f in enumerate(frames):
        if f.kind == "python":
            below = frames[i - 1] if i and frames[i - 1].kind == "native" else None
            return (f.function, f.filename, f.line, below.function if below else "")
    leaf = next((f for f in frames if f.kind == "native"), None)
    return (leaf.function if leaf else "[unknown]", "", 0, "")


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _func_name(func: int) -> str:
    try:
        return CudaFunc(func).name
    except ValueError:
        return f"cuda function {func}"
