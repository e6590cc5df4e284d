"""The profiler (otelbpf/families/profiling/profiler.py) without a kernel: its BPF maps are stood in for
by arrays laid out as the kernel's (samples, native and Python stacks, code objects and their
line tables, CUDA allocations), read by the real collection round, and what comes out is
checked: one ``Profile`` per process and kind, samples with their values and labels, native
frames symbolized from this process's own libraries and Python frames named and placed on
their lines (the lines as CPython's own ``dis`` reads them), merged into one stack.

The one stand-in on the code's side is ``probes.drain`` (BPF_MAP_LOOKUP_AND_DELETE_BATCH on a map's
file descriptor), replaced by the fake maps' own; ``run_locked`` is the sensor's seam."""

from __future__ import annotations

import ctypes
import dis
import os
from collections.abc import Callable
from types import CodeType

import numpy as np
import pytest

from otelbpf.base.events import EVENT_DTYPE, CudaFunc, Kind
from otelbpf.base.health import Health
from otelbpf.correlate.process_info import ProcessInfo
from otelbpf.correlate.profile_record import CALL_SAMPLE_TYPES, CPU_SAMPLE_TYPES, MEMORY_SAMPLE_TYPES, Profile
from otelbpf.correlate.stacks import TRUNCATED
from otelbpf.correlate.symbolizer import EVICTIONS
from otelbpf.families.profiling import probes
from otelbpf.families.profiling import profiler as profiles
from otelbpf.families.profiling.profiler import PY_CHUNK_LEN, CacheSizes, Profiler

PID = os.getpid()
HZ = 99
PERIOD = 1_000_000_000 // HZ
NATIVE_STACK, ONLY_NATIVE_STACK, PY_STACK, LOST_STACK = 0x1111, 0x2222, 0x3333, 0x4444

SAMPLE_KEY = np.dtype([("pid", "<u4"), ("user", "<u8"), ("kernel", "<u8"), ("py", "<u8")])
STACK_LEAF = np.dtype([("len", "<u4"), ("flags", "<u4"), ("ip", "<u8", (127,))])
PY_FRAME = np.dtype([("code", "<u8"), ("offset", "<u4"), ("flags", "<u2"), ("tag", "<u2")])
PY_STACK_LEAF = np.dtype([("len", "<u4"), ("flags", "<u4"), ("f", PY_FRAME, (16,))])
TABLE_KEY = np.dtype([("code", [("pid", "<u4"), ("tag", "<u4"), ("code", "<u8")]), ("index", "<u4")])
TABLE_LEAF = np.dtype([("b", "u1", (PY_CHUNK_LEN,))])
MEM_KEY = np.dtype([("pid", "<u4"), ("func", "<u4"), ("user", "<u8"), ("py", "<u8")])
MEM_VALUE = np.dtype([("bytes", "<u8"), ("count", "<u8")])
CALL_KEY = np.dtype([("k", MEM_KEY), ("kernel", "<u8")])  # struct call_key
CALL_VALUE = np.dtype([("calls", "<u8"), ("ns", "<u8"), ("bytes", "<u8"), ("launches", "<u8")])
TIME_KEY = np.dtype([("pid", "<u4"), ("tid", "<u4"), ("bucket", "<u8")])
TIME_VALUE = np.dtype([("user", "<u8"), ("kernel", "<u8"), ("py", "<u8"), ("count", "<u8")])


class CodeLeaf(ctypes.Structure):
    """A ``py_codes`` entry: what the kernel copied of a code object (bpf/profile.c)."""

    _fields_ = [
        ("name_len", ctypes.c_uint16),
        ("name_kind", ctypes.c_uint8),
        ("file_cut", ctypes.c_uint8),
        ("file_len", ctypes.c_uint16),
        ("file_kind", ctypes.c_uint8),
        ("firstlineno", ctypes.c_int32),
        ("table_len", ctypes.c_uint32),
        ("table_size", ctypes.c_uint32),
        ("table_addr", ctypes.c_uint64),
        ("captured_ns", ctypes.c_uint64),
        ("name", ctypes.c_char * 128),
        ("file", ctypes.c_char * 256),
    ]


#: Whether the sensor's lock is held (the fake ``run_locked`` sets it), and each map operation
#: with that state: only kernel map operations may run under the lock.
SENSOR_LOCK = {"held": False}
MAP_OPS: list[tuple[str, bool]] = []


class FakeMap:
    """A BPF map as the profiler uses one: drained whole (keys, values), or looked up or deleted by key."""

    def __init__(
        self, keys: np.ndarray | None = None, values: np.ndarray | None = None, entries: dict | None = None
    ) -> None:
        self.keys, self.values, self.entries = keys, values, entries or {}

    def drain(self, chunk: int = 1024, *, keep: bool = False) -> tuple[np.ndarray, np.ndarray]:
        MAP_OPS.append(("drain", SENSOR_LOCK["held"]))
        keys, values = self.keys, self.values
        if not keep:
            self.keys, self.values = keys[:0], values[:0]
        return keys, values

    @staticmethod
    def Key(*args: int, **fields: int) -> tuple:  # noqa: N802 (BCC's name)
        return args or tuple(sorted(fields.items()))

    def __getitem__(self, key: tuple) -> object:
        MAP_OPS.append(("lookup", SENSOR_LOCK["held"]))
        return self.entries[key]

    def __delitem__(self, key: tuple) -> None:
        MAP_OPS.append(("delete", SENSOR_LOCK["held"]))
        del self.entries[key]

    def items(self) -> list:
        MAP_OPS.append(("items", SENSOR_LOCK["held"]))
        return list(self.entries.items())


def rows(dtype: np.dtype, *values: tuple) -> np.ndarray:
    return np.array(list(values), dtype=dtype)


def native_stack(*ips: int) -> tuple:
    ip = np.zeros(127, dtype="<u8")
    ip[: len(ips)] = ips
    return (len(ips), 0, ip)


def address(fn: Callable) -> int:
    return ctypes.cast(fn, ctypes.c_void_p).value


# -- the Python code "sampled": two functions of this module -------------------------------------------------


def inner() -> int:
    return sum(range(3))


def outer() -> int:
    return inner()


def where(code: CodeType, opname: str) -> tuple[int, int]:
    """(byte offset, line) of the first ``opname`` instruction of ``code``, as CPython reads them."""
    instruction = next(i for i in dis.get_instructions(code) if i.opname == opname)
    return instruction.offset, instruction.positions.lineno


def code_maps(codes: dict[int, CodeType]) -> tuple[FakeMap, FakeMap]:
    """``py_codes`` and ``py_tables`` holding these code objects (by address), line tables in chunks."""
    entries, chunks = {}, []
    for addr, code in codes.items():
        leaf = CodeLeaf(
            name_len=len(code.co_name),
            name_kind=0,
            file_len=len(code.co_filename),
            file_kind=0,
            firstlineno=code.co_firstlineno,
            table_len=len(code.co_linetable),
            table_size=len(code.co_linetable),
            table_addr=0,
            captured_ns=1,
        )
        leaf.name, leaf.file = code.co_name.encode(), code.co_filename.encode()
        entries[FakeMap.Key(pid=PID, tag=7, code=addr)] = leaf
        table = code.co_linetable
        for index in range(0, len(table), PY_CHUNK_LEN):
            b = np.zeros(PY_CHUNK_LEN, dtype="u1")
            part = np.frombuffer(table[index : index + PY_CHUNK_LEN], dtype="u1")
            b[: len(part)] = part
            chunks.append(((PID, 7, addr), index // PY_CHUNK_LEN, b))
    tables = FakeMap(rows(TABLE_KEY, *((c, i) for c, i, _ in chunks)), rows(TABLE_LEAF, *((b,) for _, _, b in chunks)))
    return FakeMap(entries=entries), tables


LEAF_IP = address(ctypes.CDLL(None).getpid) + 4  # the leaf: inside getpid (libc)
CALLER_IP = address(ctypes.pythonapi.PyObject_GetAttr) + 8  # a return address inside the interpreter
INNER, OUTER = 0x7F00_0000_1000, 0x7F00_0000_2000  # the code objects' addresses "in the process"
INNER_AT, OUTER_AT = where(inner.__code__, "CALL"), where(outer.__code__, "CALL")


def maps(
    samples: list[tuple],
    allocs: list[tuple] = (),
    inuse: list[tuple] = (),
    times: list[tuple] = (),
    calls: list[tuple] = (),
) -> dict[str, FakeMap]:
    py_codes, py_tables = code_maps({INNER: inner.__code__, OUTER: outer.__code__})
    py_frames = np.zeros(16, dtype=PY_FRAME)
    py_frames[:2] = [(INNER, INNER_AT[0], 0, 7), (OUTER, OUTER_AT[0], 0, 7)]  # leaf first
    stacks = [(NATIVE_STACK, *native_stack(LEAF_IP, CALLER_IP)), (ONLY_NATIVE_STACK, *native_stack(LEAF_IP))]
    return {
        "cpu_samples": FakeMap(rows(SAMPLE_KEY, *(s[:4] for s in samples)), np.array([s[4] for s in samples], "<u8")),
        "stacks": FakeMap(np.array([s[0] for s in stacks], "<u8"), rows(STACK_LEAF, *(s[1:] for s in stacks))),
        "py_stacks": FakeMap(np.array([PY_STACK], "<u8"), rows(PY_STACK_LEAF, (2, 0, py_frames))),
        "py_tables": py_tables,
        "py_codes": py_codes,
        "cpu_times": FakeMap(rows(TIME_KEY, *(t[:3] for t in times)), rows(TIME_VALUE, *(t[3:] for t in times))),
        "profile_stats": FakeMap(entries={FakeMap.Key(i): [0, 0] for i in range(9)}),
        "mem_alloc": FakeMap(rows(MEM_KEY, *(a[:4] for a in allocs)), rows(MEM_VALUE, *(a[4:] for a in allocs))),
        "mem_inuse": FakeMap(rows(MEM_KEY, *(a[:4] for a in inuse)), rows(MEM_VALUE, *(a[4:] for a in inuse))),
        # calls: (pid, func, user, py, calls, ns, bytes[, launches, kernel])
        "cuda_calls": FakeMap(
            rows(CALL_KEY, *((c[:4], c[8] if len(c) > 8 else 0) for c in calls)),
            rows(CALL_VALUE, *((*c[4:7], c[7] if len(c) > 7 else 0) for c in calls)),
        ),
        "py_procs": FakeMap(),
    }


def locked(bpf: dict[str, FakeMap]) -> Callable[[Callable], object]:
    """The sensor's ``with_bpf``: ``fn(bpf)`` with the (fake) lock held."""

    def run(fn: Callable) -> object:
        SENSOR_LOCK["held"] = True
        try:
            return fn(bpf)
        finally:
            SENSOR_LOCK["held"] = False

    return run


def announced(out: list[Profile], health: Health, caches: CacheSizes | None = None) -> Profiler:
    """A profiler that was told of this process (its first sample): inspected, found to run CPython."""
    profiler = Profiler(
        ProcessInfo(),
        health,
        out.extend,
        sample_hz=HZ,
        interval_s=60,
        cuda_memory=True,
        python=True,
        labels={"team.name": "ml"},
        caches=caches or CacheSizes(),
    )
    announce = np.zeros(1, dtype=EVENT_DTYPE)
    announce["kind"], announce["pid"] = Kind.PROFILE_PROC, PID
    profiler.on_events(announce)
    return profiler


@pytest.fixture
def profiled(monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[list[Profile], Health]]:
    """One collection round over the given map contents: the profiles made and the health counters."""
    monkeypatch.setattr(probes, "drain", FakeMap.drain)

    def run(
        samples: list[tuple],
        allocs: list[tuple] = (),
        inuse: list[tuple] = (),
        times: list[tuple] = (),
        calls: list[tuple] = (),
    ) -> tuple[list[Profile], Health]:
        out: list[Profile] = []
        health = Health()
        profiler = announced(out, health)
        profiler.run_locked = locked(maps(samples, allocs, inuse, times, calls))
        profiler.collect_once()
        return out, health

    return run


def described(frames: list) -> list[tuple]:
    """Frames as (function, kind, module) for native ones, (function, kind, file, line, first line) for Python."""
    return [
        (f.function, f.kind, f.filename, f.line, f.start_line) if f.kind == "python" else (f.function, f.kind, f.module)
        for f in frames
    ]


def test_cpu_samples_become_one_profile_per_process_with_merged_python_and_native_frames(profiled) -> None:
    out, health = profiled([(PID, NATIVE_STACK, 0, PY_STACK, 3), (PID, ONLY_NATIVE_STACK, 0, 0, 2)])
    [profile] = out
    assert (profile.name, profile.kind, profile.pid, profile.sample_rate) == ("process_cpu", "cpu", PID, HZ)
    assert (profile.sample_types, profile.default_sample_type) == (CPU_SAMPLE_TYPES, "cpu")
    assert (profile.period_type, profile.period) == (("cpu", "nanoseconds"), PERIOD)
    assert profile.start_ns < profile.end_ns
    assert profile.labels["process_pid"] == str(PID) and profile.labels["team_name"] == "ml"
    merged, native = profile.samples
    assert (merged.values, native.values) == ((3, 3 * PERIOD), (2, 2 * PERIOD))
    assert merged.labels == profile.labels
    leaf = described(merged.frames)[0]
    assert leaf[1:] == ("native", "libc.so.6") and leaf[0].endswith("getpid")
    # The interpreter's own frames give way to the Python code it was running, leaf first.
    assert described(merged.frames)[1:] == [
        ("inner", "python", __file__, INNER_AT[1], inner.__code__.co_firstlineno),
        ("outer", "python", __file__, OUTER_AT[1], outer.__code__.co_firstlineno),
    ]
    # A native stack that does not reach a thread's root says it was cut.
    assert described(native.frames)[0] == leaf and native.frames[-1] == TRUNCATED
    assert health.get("otelbpf.profile.samples") == 5


def test_a_sample_whose_stack_the_kernel_lost_is_kept_and_the_loss_counted(profiled) -> None:
    out, health = profiled([(PID, LOST_STACK, 0, 0, 4)])
    [profile] = out
    [sample] = profile.samples
    assert sample.values == (4, 4 * PERIOD) and sample.frames == [TRUNCATED]
    assert health.get("otelbpf.profile.stacks_missing") == 1


def test_cuda_allocations_become_a_memory_profile_led_by_the_allocating_call(profiled) -> None:
    malloc = int(CudaFunc.cudaMalloc)
    out, _ = profiled(
        [],
        allocs=[(PID, malloc, NATIVE_STACK, PY_STACK, 4096, 2)],
        inuse=[(PID, malloc, NATIVE_STACK, PY_STACK, 1024, 1)],
    )
    [profile] = out
    assert (profile.name, profile.kind, profile.sample_rate) == ("memory", "cuda_memory", 0)
    assert profile.sample_types == MEMORY_SAMPLE_TYPES
    assert profile.labels["memory_device"] == "cuda"
    [sample] = profile.samples
    assert list(sample.values) == [2, 4096, 1, 1024]  # allocated objects, bytes; in use objects, bytes
    assert described(sample.frames)[0] == ("cudaMalloc", "native", "")
    assert [f.function for f in sample.frames[2:]] == ["inner", "outer"]


def test_cuda_copies_and_synchronizes_become_a_calls_profile_led_by_the_call(profiled) -> None:
    copy, sync = int(CudaFunc.cudaMemcpy), int(CudaFunc.cudaDeviceSynchronize)
    out, _ = profiled(
        [],
        calls=[(PID, copy, NATIVE_STACK, PY_STACK, 3, 900_000, 3 << 20), (PID, sync, NATIVE_STACK, 0, 5, 2_000_000, 0)],
    )
    [profile] = out
    assert (profile.name, profile.kind, profile.sample_rate) == ("cuda", "cuda_calls", 0)
    assert (profile.sample_types, profile.default_sample_type) == (CALL_SAMPLE_TYPES, "cuda_wait")
    by_leaf = {s.frames[0].function: s for s in profile.samples}
    assert list(by_leaf["cudaMemcpy"].values) == [3, 900_000, 3 << 20, 0]  # calls, ns in them, bytes copied
    assert list(by_leaf["cudaDeviceSynchronize"].values) == [5, 2_000_000, 0, 0]
    assert [f.function for f in by_leaf["cudaMemcpy"].frames[2:]] == ["inner", "outer"]  # the code that copied


def test_sampled_launches_are_on_the_calls_profile_with_the_kernel_on_top(profiled) -> None:
    """bpf/profile.c counts one launch in launch_stack_every (64) per kernel as 64, on the
    launching code's stack, with the kernel's handle: a runtime launch's host stub, named by its
    symbol (here a libc function stands in for it); a handle in no file stays an address."""
    launch = int(CudaFunc.cudaLaunchKernel)
    stub = address(ctypes.CDLL(None).getppid)
    out, _ = profiled(
        [],
        calls=[
            (PID, launch, NATIVE_STACK, PY_STACK, 128, 0, 0, 128, stub),
            (PID, launch, NATIVE_STACK, PY_STACK, 64, 0, 0, 64, 0x10),
        ],
    )
    [profile] = out
    by_top = {s.frames[0].function: s for s in profile.samples}
    assert set(by_top) == {"getppid", "kernel 0x10"}, list(by_top)
    s = by_top["getppid"]
    assert list(s.values) == [128, 0, 0, 128]  # calls, ns, bytes, launches
    assert s.frames[1].function == "cudaLaunchKernel"  # the kernel above the API call, above the code
    assert "inner" in [f.function for f in s.frames] and "outer" in [f.function for f in s.frames]


def test_nothing_sampled_makes_no_profile(profiled) -> None:
    out, health = profiled([])
    assert out == [] and health.get("otelbpf.profile.samples") == 0


# -- the sensor's lock: held for kernel map operations only ---------------------------------------------------


def test_a_round_holds_the_sensors_lock_only_for_map_operations_in_three_short_steps(monkeypatch) -> None:
    """Symbolizing and decoding under the sensor's lock kept the agent's processing thread waiting
    for whole rounds (0.4-2.3 s on a busy host, issue 14)."""
    monkeypatch.setattr(probes, "drain", FakeMap.drain)
    outside: list[tuple[str, bool]] = []
    frame, line_index = profiles.Symbolizer.frame, profiles.pylines.LineIndex

    def symbolize(self, *args, **kwargs):
        outside.append(("symbolize", SENSOR_LOCK["held"]))
        return frame(self, *args, **kwargs)

    def decode_lines(*args, **kwargs):
        outside.append(("line table", SENSOR_LOCK["held"]))
        return line_index(*args, **kwargs)

    monkeypatch.setattr(profiles.Symbolizer, "frame", symbolize)
    monkeypatch.setattr(profiles.pylines, "LineIndex", decode_lines)
    out: list[Profile] = []
    profiler = announced(out, Health())
    holds: list[int] = []
    run = locked(maps([(PID, NATIVE_STACK, 0, PY_STACK, 3)]))
    profiler.run_locked = lambda fn: holds.append(len(MAP_OPS)) or run(fn)
    MAP_OPS.clear()
    profiler.collect_once()
    [profile] = out
    assert [f.function for f in profile.samples[0].frames[1:3]] == ["inner", "outer"]
    assert MAP_OPS and all(held for _, held in MAP_OPS), MAP_OPS
    assert {"symbolize", "line table"} <= {what for what, _ in outside}
    assert not any(held for _, held in outside), outside
    assert len(holds) == len(profiler.lock_holds) == 3  # take; look code objects up; delete what is stale


def test_the_final_read_finishes_a_round_in_progress_and_no_sample_is_lost_or_doubled(monkeypatch) -> None:
    """The sensor stops (``on_unload``, its lock held) while the collection thread is between two
    steps of a round: what that round took from the kernel is in no other read."""
    monkeypatch.setattr(probes, "drain", FakeMap.drain)
    out: list[Profile] = []
    profiler = announced(out, Health())
    bpf = maps([(PID, NATIVE_STACK, 0, PY_STACK, 3)])
    run, calls = locked(bpf), []

    def sensor(fn: Callable) -> object:
        calls.append(fn)
        if len(calls) == 2:  # the round took the samples; the sensor stops before its next step
            run(profiler.on_unload)
        return run(fn)

    profiler.run_locked = sensor
    profiler.collect_once()
    assert len(calls) == 2  # the thread's round ended when the final read took it over
    assert [s.values for p in out for s in p.samples] == [(3, 3 * PERIOD)]
    assert [p.samples[0].frames[1].function for p in out] == ["inner"]
    profiler.collect_once()  # reading stopped: nothing more
    assert len(calls) == 2


# -- bounded caches -------------------------------------------------------------------------------------------


def test_a_named_code_object_keeps_its_decoded_lines_not_the_copied_table(monkeypatch) -> None:
    """Thousands of code objects are held on a busy host: once a stack has named one, its
    line table bytes are dropped and later samples are named from the index alone."""
    monkeypatch.setattr(probes, "drain", FakeMap.drain)
    out: list[Profile] = []
    profiler = announced(out, Health())
    bpf = maps([(PID, NATIVE_STACK, 0, PY_STACK, 3)])
    profiler.run_locked = locked(bpf)
    profiler.collect_once()
    infos = [profiler._codes.get((PID, code, 7)) for code in (INNER, OUTER)]
    assert all(i is not None and i.table == b"" and i.index is not None for i in infos)
    profiler._resolved.release(lambda k, v: True)  # named again from the kept index
    profiler.run_locked = locked(maps([(PID, NATIVE_STACK, 0, PY_STACK, 2)]))
    profiler.collect_once()
    assert [f.line for f in out[-1].samples[0].frames if f.kind == "python"] == [INNER_AT[1], OUTER_AT[1]]


def test_a_code_object_evicted_from_a_full_cache_is_counted_and_deleted_in_the_kernel(monkeypatch) -> None:
    """Its line table chunks were taken: only a fresh capture by the kernel can name it again."""
    monkeypatch.setattr(probes, "drain", FakeMap.drain)
    monkeypatch.setitem(EVICTIONS, "profile_code_objects", 0)
    out: list[Profile] = []
    profiler = announced(out, Health(), CacheSizes(code_objects=1))
    bpf = maps([(PID, NATIVE_STACK, 0, PY_STACK, 3)])
    profiler.run_locked = locked(bpf)
    profiler.collect_once()
    assert EVICTIONS["profile_code_objects"] == 1
    assert len(bpf["py_codes"].entries) == 1  # the evicted one's entry went: the kernel captures it again


def test_stacks_beyond_the_cache_bound_are_evicted_counted_and_their_samples_kept(monkeypatch) -> None:
    monkeypatch.setattr(probes, "drain", FakeMap.drain)
    monkeypatch.setitem(EVICTIONS, "profile_stacks", 0)
    out: list[Profile] = []
    health = Health()
    profiler = announced(out, health, CacheSizes(stacks=1))
    profiler.run_locked = locked(maps([(PID, NATIVE_STACK, 0, 0, 3), (PID, ONLY_NATIVE_STACK, 0, 0, 2)]))
    profiler.collect_once()
    [profile] = out
    assert sorted(s.values[0] for s in profile.samples) == [2, 3]
    assert EVICTIONS["profile_stacks"] == 1 and health.get("otelbpf.profile.stacks_missing") == 1


def test_equal_frames_of_different_stacks_are_one_object(profiled) -> None:
    out, _ = profiled([(PID, NATIVE_STACK, 0, PY_STACK, 3), (PID, ONLY_NATIVE_STACK, 0, 0, 2)])
    merged, native = out[0].samples
    assert merged.frames[0] == native.frames[0] and merged.frames[0] is native.frames[0]
