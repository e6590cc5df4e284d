"""The profiling probe family: ``bpf/profile.c`` with its map sizes, and every operation on its
loaded programs and maps: attaching the cpu-clock perf event, loading a Python version's stack
walkers, telling the kernel which processes run Python, draining the aggregates and stacks,
looking up and deleting code objects. The profiler (``profiler.py``) calls these under the
sensor's lock and works on what they return; it touches no map itself.

It probes no library of its own: CPU samples come from a perf event on every CPU, and CUDA
allocations from the cuda family's malloc/free return probes, which call into profile.c
when this family is loaded with ``cuda_memory`` (``-DCUDA_MEMORY_PROFILE``).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from otelbpf.families.profiling import python_offsets
from otelbpf.families.profiling.python_offsets import LAYOUT_NAMES, PythonProcess
from otelbpf.sensor import btf
from otelbpf.sensor.family import ProbeFamily

log = logging.getLogger(__name__)

# bpf/profile.c
PY_PENDING, PY_NATIVE, PY_PYTHON = 0, 1, 2
PROG_TABLE, PROG_CAPTURE = 6, 7
#: profile_stats slots, in order.
PROFILE_STATS = (
    "samples_map_full",
    "stack_map_full",
    "code_map_full",
    "process_map_full",
    "memory_map_full",
    "live_map_full",
    "ring_full",
    "table_map_full",
    "times_map_full",
)

Arrays = tuple[np.ndarray, np.ndarray]  # a map's keys and values, as read
CodeKey = tuple[int, int]  # (address, tag): one code object (bpf/profile.c code_tag)


@dataclass
class Taken:
    """One read of the kernel maps, as it lay there (taken under the sensor's lock)."""

    end_ns: int
    read_mono_ns: int
    samples: Arrays
    times: Arrays
    allocs: Arrays | None
    inuse: Arrays | None
    calls: Arrays | None
    stacks: Arrays
    py_stacks: Arrays
    tables: Arrays
    stats: dict[str, int]


def fsbase_offset() -> int:
    """``task_struct.thread.fsbase`` in the running kernel; 0 (no Python stacks) without BTF."""
    try:
        return btf.task_fsbase_offset()
    except btf.BtfError as exc:
        log.warning("Python stacks are off: %s", exc)
        return 0


def profile_family(
    *,
    python: bool,
    cuda_memory: bool,
    max_python_frames: int,
    stack_entries: int,
    sample_entries: int,
    code_entries: int,
    live_entries: int,
    on_load: Callable[[object], None],
    on_unload: Callable[[object], None],
    launch_stack_every: int = 0,
) -> ProbeFamily:
    fsbase = fsbase_offset() if python else 0
    cflags = [
        f"-DSAMPLE_ENTRIES={sample_entries}",
        f"-DSTACK_ENTRIES={stack_entries}",
        f"-DCODE_ENTRIES={code_entries}",
        f"-DMEM_ENTRIES={stack_entries}",
        f"-DLIVE_ENTRIES={live_entries}",
        f"-DPY_MAX_FRAMES={max_python_frames}",
        f"-DTASK_FSBASE_OFFSET={fsbase}",
    ]
    if cuda_memory:
        cflags.append("-DCUDA_MEMORY_PROFILE=1")
        # one launch in N per kernel takes the launching code's stack, counted N times (cuda_calls)
        cflags.append(f"-DLAUNCH_STACK_EVERY={int(launch_stack_every)}")
    return ProbeFamily(
        name="profiling",
        c_file="profile.c",
        libraries=(),
        cflags=tuple(cflags),
        on_load=on_load,
        on_unload=on_unload,
    )


class ProfileMaps:
    """The loaded program's side the profiler drives, each call with the BCC object under the
    sensor's lock. It remembers only which Python versions' walkers are loaded."""

    def __init__(self, *, cuda_memory: bool) -> None:
        self.cuda_memory = cuda_memory
        self._loaded_layouts: set[int] = set()

    def attach(self, bpf: Any, sample_hz: int) -> None:
        """The walkers' tail-call slots, and the cpu-clock perf event on every CPU."""
        from bcc import BPF, PerfSWConfig, PerfType

        for slot, name in ((PROG_CAPTURE, "capture"), (PROG_TABLE, "table")):
            bpf["cpu_progs"][ctypes.c_int(slot)] = ctypes.c_int(bpf.load_func(f"py_sample_{name}", BPF.PERF_EVENT).fd)
            if self.cuda_memory:
                bpf["mem_progs"][ctypes.c_int(slot)] = ctypes.c_int(bpf.load_func(f"py_alloc_{name}", BPF.KPROBE).fd)
        try:
            bpf.attach_perf_event(
                ev_type=PerfType.SOFTWARE,
                ev_config=PerfSWConfig.CPU_CLOCK,
                fn_name="on_cpu_sample",
                sample_freq=sample_hz,
            )
        except Exception as exc:
            raise RuntimeError(
                f"cannot attach the cpu-clock perf event ({exc}): the kernel needs CONFIG_PERF_EVENTS, and the "
                "agent CAP_PERFMON (or CAP_SYS_ADMIN) with kernel.perf_event_paranoid <= 2"
            ) from exc

    def tell_process(self, bpf: Any, pid: int, proc: PythonProcess | None) -> None:
        """``pid`` runs Python ``proc`` (its version's walkers loaded on first use), or is native."""
        from bcc import BPF

        table = bpf["py_procs"]
        leaf = table.Leaf()
        if proc is None:
            leaf.state = PY_NATIVE
        else:
            if proc.layout not in self._loaded_layouts:
                name = LAYOUT_NAMES[proc.layout]
                fn = bpf.load_func(f"py_sample_{name}", BPF.PERF_EVENT)
                bpf["cpu_progs"][ctypes.c_int(proc.layout)] = ctypes.c_int(fn.fd)
                if self.cuda_memory:
                    fn = bpf.load_func(f"py_alloc_{name}", BPF.KPROBE)
                    bpf["mem_progs"][ctypes.c_int(proc.layout)] = ctypes.c_int(fn.fd)
                self._loaded_layouts.add(proc.layout)
            python_offsets.fill_leaf(leaf, proc, PY_PYTHON)
        table[table.Key(pid)] = leaf

    def take(self, bpf: Any) -> Taken:
        """Everything the kernel aggregated since the last read, as it lies in the maps."""
        end, mono = time.time_ns(), time.monotonic_ns()
        samples, times = drain(bpf["cpu_samples"]), drain(bpf["cpu_times"])
        allocs = inuse = calls = None
        if self.cuda_memory:
            allocs = drain(bpf["mem_alloc"])
            inuse = drain(bpf["mem_inuse"], keep=True)
            calls = drain(bpf["cuda_calls"])
        stacks, py_stacks, tables = drain(bpf["stacks"]), drain(bpf["py_stacks"]), drain(bpf["py_tables"])
        stats = bpf["profile_stats"]
        drops = {name: int(sum(stats[stats.Key(i)])) for i, name in enumerate(PROFILE_STATS)}
        return Taken(end, mono, samples, times, allocs, inuse, calls, stacks, py_stacks, tables, drops)


def pending_pids(bpf: Any) -> list[int]:
    """Processes the kernel announced that user space has not told it about yet."""
    return [k.value for k, v in bpf["py_procs"].items() if v.state == PY_PENDING]


def forget_process(bpf: Any, pid: int, codes: Iterable[CodeKey]) -> None:
    """``pid`` runs another program (an exec): its entry and its code objects go."""
    table = bpf["py_procs"]
    try:
        del table[table.Key(pid)]
    except KeyError:
        pass
    delete_codes(bpf, pid, codes)


def delete_codes(bpf: Any, pid: int, codes: Iterable[CodeKey]) -> None:
    table = bpf["py_codes"]
    for code, tag in codes:
        try:
            del table[table.Key(pid=pid, tag=tag, code=code)]
        except KeyError:
            pass


def lookup_codes(bpf: Any, wanted: set[tuple[int, int, int]]) -> list[tuple[tuple[int, int, int], Any]]:
    """The kernel's entries of these code objects, copied. One not captured yet is absent: a
    later sample will capture it."""
    table = bpf["py_codes"]
    out = []
    for pid, code, tag in wanted:
        try:
            out.append(((pid, code, tag), table[table.Key(pid=pid, tag=tag, code=code)]))
        except KeyError:
            continue
    return out


def delete_stale(
    bpf: Any, stale: Iterable[tuple[int, int, int]], gone: Mapping[int, Iterable[CodeKey]], allocating: set[int]
) -> None:
    """Code objects superseded or evicted (``stale``), and what is kept for processes that
    exited (``gone``: pid -> its code objects; ``allocating``: those of them with CUDA memory in use)."""
    codes = bpf["py_codes"]
    for pid, code, tag in stale:
        with contextlib.suppress(KeyError):
            del codes[codes.Key(pid=pid, tag=tag, code=code)]
    if not gone:
        return
    table = bpf["py_procs"]
    for pid, keys in gone.items():
        with contextlib.suppress(KeyError):
            del table[table.Key(pid)]
        delete_codes(bpf, pid, keys)
    if allocating:  # the live-allocation map is large: read only for processes that allocated
        for name in ("mem_inuse", "mem_live"):
            t = bpf[name]
            found, _ = drain(t, keep=True)
            for row in found[np.isin(found["pid"], list(allocating))]:
                with contextlib.suppress(KeyError):
                    del t[t.Key.from_buffer_copy(row.tobytes())]


def drain(table: Any, chunk: int = 1024, *, keep: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Every (key, value) of a BPF hash map, looked up and deleted in one pass (``keep``: only
    looked up), as numpy arrays of the map's own layouts. BCC's items_lookup_and_delete_batch
    allocates and zeroes buffers for the map's whole capacity on each call (17 MiB for a stack
    map) and hands back one ctypes object per entry; this reads ``chunk`` entries per syscall."""
    from bcc.libbcc import lib

    batch = lib.bpf_lookup_batch if keep else lib.bpf_lookup_and_delete_batch

    key_type, value_type = np.dtype(table.Key), np.dtype(table.Leaf)
    keys, values = [], []
    cursor, after, count = ctypes.c_uint32(0), ctypes.c_uint32(0), ctypes.c_uint32(0)
    started = False
    while True:
        kbuf, vbuf = np.empty(chunk, key_type), np.empty(chunk, value_type)
        count.value = chunk
        res = batch(
            table.map_fd,
            ctypes.byref(cursor) if started else None,
            ctypes.byref(after),
            kbuf.ctypes.data,
            vbuf.ctypes.data,
            ctypes.byref(count),
        )
        err = ctypes.get_errno() if res else 0
        if err == errno.ENOSPC:  # one hash bucket holds more than a chunk
            chunk *= 2
            continue
        if err not in (0, errno.ENOENT):
            raise OSError(err, f"BPF_MAP_LOOKUP{'' if keep else '_AND_DELETE'}_BATCH: {os.strerror(err)}")
        keys.append(kbuf[: count.value])
        values.append(vbuf[: count.value])
        if err == errno.ENOENT:  # the end of the map
            return np.concatenate(keys), np.concatenate(values)
        cursor.value, started = after.value, True
