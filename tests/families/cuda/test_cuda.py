"""CudaCorrelator on synthetic event arrays (the exact records the BPF side writes).

The correlator's inputs are numpy arrays of EVENT_DTYPE and the kernel's counting maps;
here both are built by hand so every count is known. ProcessInfo and Symbolizer are the
real ones, pointed at real processes; kernel "host stubs" are real libc functions of this
process, so launch spans carry names the symbolizer found in libc's symbol table.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import pytest
from opentelemetry.sdk.metrics.export import Gauge, Histogram, Metric
from opentelemetry.trace import StatusCode

from otelbpf.base.events import (
    CUDA_DEVICE_SHIFT,
    EVENT_DTYPE,
    FLAG_DRIVER,
    FLAG_INCOMPLETE,
    FLAG_SHED,
    STREVENT_DTYPE,
    CudaFunc,
    Kind,
    StrKind,
    cuda_device,
)
from otelbpf.correlate.base import CorrelatorSettings
from otelbpf.correlate.causality import Causality
from otelbpf.correlate.clock import MonotonicClock
from otelbpf.correlate.process_info import ProcessInfo
from otelbpf.correlate.spans import new_context
from otelbpf.correlate.symbolizer import Symbolizer
from otelbpf.families.cuda.correlator import CudaCorrelator
from otelbpf.families.http.sampling import sampled_context

F = CudaFunc
ME = os.getpid()
LIBC = ctypes.CDLL(None)


def fn_address(name: str) -> int:
    return ctypes.cast(getattr(LIBC, name), ctypes.c_void_p).value


def pack_dim(x: int, y: int = 1, z: int = 1) -> int:
    return x | y << 32 | z << 48


def comm_words(comm: str) -> tuple[int, int]:
    raw = comm.encode().ljust(16, b"\0")
    return int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:], "little")


class Events:
    """Builds EVENT_DTYPE records the way cuda.c and discovery.c fill them."""

    def __init__(self, pid: int = ME, tid: int | None = None) -> None:
        self.pid, self.tid = pid, tid or pid
        self.rows: list[tuple] = []
        self.ts = time.monotonic_ns() - 10**9

    def add(
        self,
        kind: Kind,
        func: int,
        *,
        ret: int = 0,
        dur: int = 1000,
        flags: int = 0,
        a0: int = 0,
        a1: int = 0,
        a2: int = 0,
        a3: int = 0,
        pid: int | None = None,
    ) -> Events:
        self.ts += 10_000
        pid = self.pid if pid is None else pid
        self.rows.append((self.ts, dur, pid, self.tid, int(kind), int(func), flags, ret, a0, a1, a2, a3))
        return self

    def malloc(self, size: int, address: int, ret: int = 0, **kw) -> Events:
        return self.add(Kind.CUDA_MALLOC, F.cudaMalloc, a0=size, a1=address if ret == 0 else 0, ret=ret, **kw)

    def free(self, address: int, ret: int = 0, **kw) -> Events:
        return self.add(Kind.CUDA_FREE, F.cudaFree, a0=address, ret=ret, **kw)

    def memcpy(
        self, size: int, direction: int, ret: int = 0, func: int = F.cudaMemcpy, stream: int = 0, **kw
    ) -> Events:
        return self.add(Kind.CUDA_MEMCPY, func, a0=size, a1=direction, a2=stream, ret=ret, **kw)

    def sync(self, func: int = F.cudaStreamSynchronize, stream: int = 0, **kw) -> Events:
        return self.add(Kind.CUDA_SYNC, func, a0=stream, **kw)

    def launch(
        self,
        fn: int,
        func: int = F.cudaLaunchKernel,
        grid: int = pack_dim(1),
        block: int = pack_dim(1),
        stream: int = 0,
        **kw,
    ) -> Events:
        return self.add(Kind.CUDA_LAUNCH, func, a0=fn, a1=grid, a2=block, a3=stream, dur=0, **kw)

    def exit(self, comm: str = "job", **kw) -> Events:
        a0, a1 = comm_words(comm)
        return self.add(Kind.PROC_EXIT, 0, a0=a0, a1=a1, dur=0, **kw)

    def exec(self, comm: str = "job", **kw) -> Events:
        a0, a1 = comm_words(comm)
        return self.add(Kind.PROC_EXEC, 0, a0=a0, a1=a1, dur=0, **kw)

    def array(self) -> np.ndarray:
        arr = np.array(self.rows, dtype=EVENT_DTYPE)
        self.rows = []
        return arr


@dataclass(frozen=True)
class LaunchKey:
    """Mirrors cuda.c's ``struct launch_key`` as BCC hands it over."""

    pid: int
    func: int
    fn: int


@dataclass(frozen=True)
class ErrorKey:
    pid: int
    func: int
    ret: int


class Harness:
    """A correlator with real ProcessInfo/Symbolizer and in-memory kernel maps."""

    def __init__(self, **options) -> None:
        self.maps: dict[str, dict[object, int]] = defaultdict(dict)
        self.spans: list = []
        self.forgotten: list[tuple[str, list]] = []
        self.sampled_out: list[int] = []
        self.info = ProcessInfo()
        self.sym = Symbolizer()
        self.correlator = CudaCorrelator(
            CorrelatorSettings(self.info, MonotonicClock(), self.spans.extend),
            self.sym,
            read_map=lambda name: list(self.maps[name].items()),
            forget_keys=self._forget,
            on_sampled_out=self.sampled_out.append,
            **options,
        )

    def _forget(self, name: str, keys: list) -> None:
        self.forgotten.append((name, list(keys)))
        for k in keys:
            self.maps[name].pop(k, None)

    def collect(self) -> dict[int, dict[str, Metric]]:
        """pid -> metric name -> metric, from one collect()."""
        out = {}
        for resource, metrics in self.correlator.collect():
            pid = resource.attributes["process.pid"]
            assert pid not in out, "one entry per process"
            out[pid] = {m.name: m for m in metrics}
        return out


def points(metric: Metric) -> dict[tuple, float]:
    """Sorted attribute items -> value (count for histograms)."""
    out = {}
    for dp in metric.data.data_points:
        key = tuple(sorted(dp.attributes.items()))
        out[key] = dp.count if isinstance(metric.data, Histogram) else dp.value
    return out


def value(metric: Metric) -> float:
    [v] = points(metric).values()
    return v


@pytest.fixture
def exited_pid() -> int:
    """The pid of a process that has come and gone (its resource says so)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_memory_in_use_and_high_water() -> None:
    h = Harness()
    ev = Events()
    ev.malloc(1000, 0xA000).malloc(500, 0xB000).free(0xA000)
    ev.free(0xDEAD)  # allocated before the agent looked: untracked
    ev.malloc(1 << 30, 0, ret=2)  # failed: not memory
    ev.malloc(64, 0xC000, flags=FLAG_INCOMPLETE)  # never returned: not memory either
    ev.free(0xB000, ret=1)  # a failed free leaves the buffer allocated
    h.correlator.on_events(ev.array())
    assert h.correlator.memory_snapshot() == {ME: (500, 1500)}
    m = h.collect()[ME]
    assert value(m["cuda.memory.in_use"]) == 500
    assert value(m["cuda.memory.high_water"]) == 1500
    assert isinstance(m["cuda.memory.in_use"].data, Gauge)
    assert points(m["otelbpf.cuda.anomalies"]) == {(("reason", "incomplete"),): 1, (("reason", "untracked_free"),): 1}
    assert points(m["cuda.api.calls"]) == {
        (("cuda.api.function", "cudaMalloc"),): 3,
        (("cuda.api.function", "cudaFree"),): 3,
    }
    h.correlator.on_events(ev.free(0xB000).malloc(200, 0xD000).array())
    m = h.collect()[ME]
    assert (value(m["cuda.memory.in_use"]), value(m["cuda.memory.high_water"])) == (200, 1500)


def test_errors_are_counted_by_function_and_code() -> None:
    h = Harness()
    ev = Events()
    for _ in range(3):
        ev.memcpy(100, 1, ret=35)
    ev.malloc(8, 0, ret=2).malloc(8, 0, ret=35).sync(ret=35).sync(ret=0)
    ev.add(Kind.CUDA_MALLOC, F.cuMemAlloc_v2, a0=8, ret=2)
    h.correlator.on_events(ev.array())
    h.maps["launch_errors"][ErrorKey(ME, int(F.cudaLaunchKernel), 98)] = 4
    h.maps["launch_errors"][ErrorKey(ME, int(F.cudaMemcpy), 35)] = 2  # adds to the events' count
    errors = points(h.collect()[ME]["cuda.api.errors"])

    def key(function: str, code: int, name: str) -> tuple:
        return tuple(sorted({"cuda.api.function": function, "cuda.error.code": code, "cuda.error.name": name}.items()))

    assert errors == {
        key("cudaMemcpy", 35, "cudaErrorInsufficientDriver"): 5,
        key("cudaMalloc", 2, "cudaErrorMemoryAllocation"): 1,
        key("cudaMalloc", 35, "cudaErrorInsufficientDriver"): 1,
        key("cudaStreamSynchronize", 35, "cudaErrorInsufficientDriver"): 1,
        key("cuMemAlloc_v2", 2, "CUDA_ERROR_OUT_OF_MEMORY"): 1,
        key("cudaLaunchKernel", 98, "cudaErrorInvalidDeviceFunction"): 4,
    }


def test_memcpy_bytes_by_direction_count_only_successful_copies() -> None:
    h = Harness()
    ev = Events()
    ev.memcpy(4096, 1).memcpy(4096, 1).memcpy(100, 1, ret=35)
    ev.memcpy(2048, 2).memcpy(1024, 2, func=F.cudaMemcpyAsync, stream=0x5EED)
    ev.memcpy(512, 3).memcpy(7, 9)  # D2D and an unknown kind
    ev.memcpy(1 << 20, 1, flags=FLAG_INCOMPLETE)
    h.correlator.on_events(ev.array())
    assert points(h.collect()[ME]["cuda.memcpy.bytes"]) == {
        (("cuda.memcpy.direction", "H2D"),): 8192,
        (("cuda.memcpy.direction", "D2H"),): 3072,
        (("cuda.memcpy.direction", "D2D"),): 512,
        (("cuda.memcpy.direction", "kind9"),): 7,
    }


def test_sync_durations_become_a_histogram_per_function() -> None:
    h = Harness()
    ev = Events()
    ev.sync(dur=2_000).sync(dur=3_000_000).sync(func=F.cudaDeviceSynchronize, dur=1_000)
    h.correlator.on_events(ev.array())
    hist = h.collect()[ME]["cuda.sync.duration"]
    by_func = {dict(dp.attributes)["cuda.api.function"]: dp for dp in hist.data.data_points}
    stream = by_func["cudaStreamSynchronize"]
    assert (stream.count, stream.min, stream.max) == (2, 2e-6, 3e-3)
    assert stream.sum == pytest.approx(3.002e-3)
    assert sum(stream.bucket_counts) == 2
    assert by_func["cudaDeviceSynchronize"].count == 1


def test_spans_carry_the_call_and_errors_set_their_status() -> None:
    h = Harness()
    getppid = fn_address("getppid")
    ev = Events(tid=ME + 1)
    ev.memcpy(4096, 1, func=F.cudaMemcpyAsync, stream=0x5EED0001)
    ev.malloc(1 << 40, 0, ret=2)
    ev.launch(getppid, grid=pack_dim(4, 2, 1), block=pack_dim(256), stream=0x5EED0001)
    ev.sync(func=F.cudaDeviceSynchronize, dur=5_000)
    h.correlator.on_events(ev.array())
    copy, malloc, launch, sync = h.spans
    assert copy.name == "cudaMemcpyAsync"
    assert dict(copy.attributes) == {
        "cuda.api.function": "cudaMemcpyAsync",
        "cuda.api.layer": "runtime",
        "thread.id": ME + 1,
        "cuda.memcpy.bytes": 4096,
        "cuda.memcpy.direction": "H2D",
        "cuda.memcpy.async": True,
        "cuda.stream": "0x5eed0001",
        "cuda.api.return_code": 0,
    }
    assert copy.status.status_code == StatusCode.UNSET
    assert copy.end_time - copy.start_time == 1000
    assert copy.resource.attributes["process.pid"] == ME
    assert malloc.status.status_code == StatusCode.ERROR
    assert malloc.status.description == "cudaErrorMemoryAllocation (2)"
    assert malloc.attributes["cuda.error.name"] == "cudaErrorMemoryAllocation"
    assert "cuda.memory.address" not in malloc.attributes
    assert launch.attributes["cuda.kernel.name"] == "getppid"
    assert launch.attributes["cuda.kernel.name_source"] == "symbol"
    assert launch.attributes["cuda.kernel.function_address"] == f"{getppid:#x}"
    assert [launch.attributes[f"cuda.grid.{d}"] for d in "xyz"] == [4, 2, 1]
    assert [launch.attributes[f"cuda.block.{d}"] for d in "xyz"] == [256, 1, 1]
    assert "cuda.stream" not in sync.attributes
    assert h.correlator.spans_emitted == 4


def test_driver_launches_are_named_from_the_function_name_strings() -> None:
    h = Harness()
    names = np.zeros(2, dtype=STREVENT_DTYPE)
    names["pid"], names["kind"] = ME, StrKind.CUDA_FUNC_NAME
    names["a0"] = [0xF1, 0xF2]
    names["s"] = [b"_Z10vector_addPfS_S_i", b"triton_poi_fused_add_mul_0"]
    h.correlator.on_strings(names)
    ev = Events()
    ev.launch(0xF1, func=F.cuLaunchKernel).launch(0xF2, func=F.cuLaunchKernel).launch(0xF3, func=F.cuLaunchKernel)
    h.correlator.on_events(ev.array())
    assert [(s.attributes["cuda.kernel.name"], s.attributes["cuda.kernel.name_source"]) for s in h.spans] == [
        ("vector_add(float*, float*, float*, int)", "driver"),
        ("triton_poi_fused_add_mul_0", "driver"),
        ("[unresolved kernel 0xf3]", "unresolved"),
    ]


def test_incomplete_calls_become_error_spans_and_an_anomaly() -> None:
    h = Harness()
    ev = Events(tid=ME + 7)
    ev.sync(stream=0x5EEDFFFF, dur=0, flags=FLAG_INCOMPLETE)
    h.correlator.on_events(ev.array())
    [span] = h.spans
    assert span.status.status_code == StatusCode.ERROR
    assert span.status.description == f"thread {ME + 7} exited before cudaStreamSynchronize returned"
    assert span.attributes["otelbpf.incomplete"] is True
    assert "cuda.api.return_code" not in span.attributes
    m = h.collect()[ME]
    assert points(m["otelbpf.cuda.anomalies"]) == {(("reason", "incomplete"),): 1}
    assert "cuda.api.calls" not in m  # it never completed


def test_min_span_duration_drops_short_calls_but_not_launches_or_incomplete_ones() -> None:
    h = Harness(min_span_ns=10_000)
    ev = Events()
    ev.sync(dur=9_999).sync(dur=10_000).memcpy(8, 1, dur=50)
    ev.launch(fn_address("getpid"))
    ev.sync(dur=0, flags=FLAG_INCOMPLETE)
    h.correlator.on_events(ev.array())
    assert [(s.name, s.end_time - s.start_time) for s in h.spans] == [
        ("cudaStreamSynchronize", 10_000),
        ("cudaLaunchKernel", 0),
        ("cudaStreamSynchronize", 0),
    ]
    # Metrics still count every call.
    assert points(h.collect()[ME]["cuda.api.calls"])[(("cuda.api.function", "cudaStreamSynchronize"),)] == 2


def test_span_budget_caps_spans_and_reports_what_it_sampled_out() -> None:
    h = Harness(max_spans_per_second=5)
    ev = Events()
    for i in range(12):
        ev.memcpy(i + 1, 1)
    h.correlator.on_events(ev.array())
    assert [s.attributes["cuda.memcpy.bytes"] for s in h.spans] == [1, 2, 3, 4, 5]
    assert h.sampled_out == [7]
    # Sampling never touches the metrics.
    assert points(h.collect()[ME]["cuda.memcpy.bytes"]) == {(("cuda.memcpy.direction", "H2D"),): 78}


def test_launch_counts_and_a_bounded_top_n() -> None:
    h = Harness(top_kernels=3)
    names = ["getpid", "getppid", "getuid", "geteuid", "getgid"]
    for count, name in enumerate(names, start=1):
        h.maps["launches"][LaunchKey(ME, int(F.cudaLaunchKernel), fn_address(name))] = count * 10
    h.maps["launches"][LaunchKey(ME, int(F.cudaLaunchKernel_ptsz), fn_address("getpid"))] = 5
    h.maps["launches"][LaunchKey(ME, int(F.cudaGraphLaunch), 0x9999)] = 1000  # graphs are not kernels
    m = h.collect()[ME]
    assert points(m["cuda.kernel.launches"]) == {
        (("cuda.api.function", "cudaLaunchKernel"),): 150,
        (("cuda.api.function", "cudaLaunchKernel_ptsz"),): 5,
        (("cuda.api.function", "cudaGraphLaunch"),): 1000,
    }
    top = points(m["cuda.kernel.launches.top"])
    assert top == {
        (("cuda.api.function", "cudaLaunchKernel"), ("cuda.kernel.name", "getgid")): 50,
        (("cuda.api.function", "cudaLaunchKernel"), ("cuda.kernel.name", "geteuid")): 40,
        (("cuda.api.function", "cudaLaunchKernel"), ("cuda.kernel.name", "getuid")): 30,
    }


def test_exited_processes_are_finalized_once_and_their_keys_forgotten(exited_pid: int) -> None:
    h = Harness()
    other = Events(pid=ME)
    other.malloc(100, 0x100)
    ev = Events(pid=exited_pid)
    ev.malloc(4096, 0xA000).memcpy(4096, 1)
    keys = [
        LaunchKey(exited_pid, int(F.cudaLaunchKernel), 0x1234),
        LaunchKey(exited_pid, int(F.cudaLaunchKernel), 0x5678),
    ]
    for k in keys:
        h.maps["launches"][k] = 3
    error_key = ErrorKey(exited_pid, int(F.cudaLaunchKernel), 98)
    h.maps["launch_errors"][error_key] = 1
    mine = LaunchKey(ME, int(F.cudaLaunchKernel), fn_address("getpid"))
    h.maps["launches"][mine] = 1
    h.correlator.on_events(np.concatenate([other.array(), ev.array()]))
    h.correlator.on_events(Events(pid=exited_pid).exit("trainer").array())
    first = h.collect()
    assert set(first) == {ME, exited_pid}
    assert points(first[exited_pid]["cuda.kernel.launches"]) == {(("cuda.api.function", "cudaLaunchKernel"),): 6}
    assert value(first[exited_pid]["cuda.memory.in_use"]) == 4096
    assert sorted(h.forgotten, key=lambda f: f[0]) == [("launch_errors", [error_key]), ("launches", keys)]
    assert mine in h.maps["launches"]  # the live process keeps its keys
    # The final read of the maps may still hold the dead process's keys: they stay dead.
    for k in keys:
        h.maps["launches"][k] = 3
    second = h.collect()
    assert set(second) == {ME}
    assert h.correlator.memory_snapshot() == {ME: (100, 100)}
    assert len(h.forgotten) == 2


def test_a_reused_pid_starts_afresh_after_exec(exited_pid: int) -> None:
    h = Harness()
    h.correlator.on_events(Events(pid=exited_pid).malloc(4096, 0xA000).exit().array())
    assert h.collect()[exited_pid]["cuda.memory.in_use"] is not None
    key = LaunchKey(exited_pid, int(F.cudaLaunchKernel), 0x1234)
    h.maps["launches"][key] = 2
    assert exited_pid not in h.collect()
    # A new program under the same pid: counted from zero.
    h.correlator.on_events(Events(pid=exited_pid).exec("newjob").malloc(10, 0xB000).array())
    m = h.collect()[exited_pid]
    assert value(m["cuda.memory.in_use"]) == 10
    assert points(m["cuda.kernel.launches"]) == {(("cuda.api.function", "cudaLaunchKernel"),): 2}


def test_an_exited_process_is_named_by_its_comm(exited_pid: int) -> None:
    h = Harness()
    h.correlator.on_events(Events(pid=exited_pid).exit("trainer").array())
    h.correlator.on_events(Events(pid=exited_pid).sync(dur=5).array())
    [span] = h.spans
    assert span.resource.attributes["service.name"] == "trainer"
    assert span.resource.attributes["otelbpf.process.exited"] is True


def test_a_process_that_only_launched_kernels_is_finalized_after_its_exit(exited_pid: int) -> None:
    """No per-event records (launches are only counted in the kernel), then an exit:
    exported once from the launch map, then forgotten with its keys."""
    h = Harness()
    key = LaunchKey(exited_pid, int(F.cudaLaunchKernel), 0x1234)
    h.maps["launches"][key] = 7
    h.correlator.on_events(Events(pid=exited_pid).exit("launcher").array())
    first = h.collect()
    assert points(first[exited_pid]["cuda.kernel.launches"]) == {(("cuda.api.function", "cudaLaunchKernel"),): 7}
    assert ("launches", [key]) in h.forgotten
    assert exited_pid not in h.collect()


def test_late_events_of_a_finalized_process_are_exported_once_not_forever(exited_pid: int) -> None:
    h = Harness()
    h.correlator.on_events(Events(pid=exited_pid).malloc(4096, 0xA000).exit().array())
    assert exited_pid in h.collect()
    # Another thread's call cut short by the exit arrives after the process was finalized.
    late = Events(pid=exited_pid, tid=exited_pid + 1).sync(flags=FLAG_INCOMPLETE)
    h.correlator.on_events(late.array())
    again = h.collect()
    assert points(again[exited_pid]["otelbpf.cuda.anomalies"]) == {(("reason", "incomplete"),): 1}
    assert exited_pid not in h.collect()


# -- CUDA 13: handles, registration, launch sites ------------------------------------

NAMES = ctypes.create_string_buffer(b"_ZN2ns5scaleIfEEvPT_S1_\0_Z5plainPf\0")


def test_registered_device_names_name_the_kernels_behind_cuda13_handles() -> None:
    """nvcc 13: registration says host stub -> device name; __cudaGetKernel says handle ->
    host stub; launches pass the handle. The name is read from this process's memory."""
    h = Harness()
    base = ctypes.addressof(NAMES)
    stub_scale, stub_plain, handle = 0x401000, 0x402000, 0x5555_0000_1230  # a heap handle in no file
    ev = Events()
    ev.add(Kind.CUDA_KERNEL_NAME, F["__cudaRegisterFunction"], a0=stub_scale, a1=base, dur=0)
    ev.add(Kind.CUDA_KERNEL_NAME, F["__cudaRegisterFunction"], a0=stub_plain, a1=base + NAMES.raw.index(b"_Z5"), dur=0)
    ev.add(Kind.CUDA_KERNEL_ALIAS, F["__cudaGetKernel"], a0=handle, a1=stub_scale)
    ev.launch(handle).launch(stub_plain)
    h.correlator.on_events(ev.array())
    named = [(s.attributes["cuda.kernel.name"], s.attributes["cuda.kernel.name_source"]) for s in h.spans]
    assert named == [("void ns::scale<float>(float*, float)", "registration"), ("plain(float*)", "registration")]


def test_a_late_attach_names_a_handle_from_its_launch_site_in_a_device_stub(tmp_path) -> None:
    """Registration and __cudaGetKernel happened before the attach: the first launch's
    return address lies in nvcc's __device_stub__<mangled>, resolved from the ELF symbols
    of a real program built here."""
    src = tmp_path / "stub.c"
    src.write_text("void _Z24__device_stub__Z5plainPfPf(float *p) { (void)p; }\nint main(void) { return 0; }\n")
    exe = tmp_path / "stub"
    subprocess.run(["gcc", "-O0", "-o", str(exe), str(src)], check=True)
    subprocess.run(["gcc", "-O0", "-shared", "-fPIC", "-o", str(exe) + ".so", str(src)], check=True)
    lib = ctypes.CDLL(str(exe) + ".so")
    stub = ctypes.cast(lib._Z24__device_stub__Z5plainPfPf, ctypes.c_void_p).value
    h = Harness()
    handle = 0x5555_0000_4560
    ev = Events()
    ev.add(Kind.CUDA_LAUNCH_SITE, F.cudaLaunchKernel, a0=handle, a1=fn_address("getppid"), a2=stub + 4, dur=0)
    ev.launch(handle)
    h.correlator.on_events(ev.array())
    [span] = h.spans
    assert span.attributes["cuda.kernel.name"] == "plain(float*)"
    assert span.attributes["cuda.kernel.name_source"] == "device_stub"


def test_an_unnamed_handle_falls_back_to_its_launch_site_object_and_offset() -> None:
    h = Harness()
    handle = 0x5555_0000_7890
    getppid = fn_address("getppid")
    ev = Events()
    ev.add(Kind.CUDA_LAUNCH_SITE, F.cuLaunchKernel, a0=handle, a1=getppid + 1, dur=0)
    ev.launch(handle, func=F.cuLaunchKernel)
    h.correlator.on_events(ev.array())
    [span] = h.spans
    name = span.attributes["cuda.kernel.name"]
    assert name.startswith("[launched at libc.so.6+0x") and "build id" in name, name
    assert span.attributes["cuda.kernel.name_source"] == "launch_site"
    h.maps["launches"][LaunchKey(ME, int(F.cuLaunchKernel), handle)] = 7
    m = h.collect()[ME]
    assert points(m["otelbpf.cuda.kernel_launches.named"]) == {(("otelbpf.name_source", "launch_site"),): 7}


def test_frees_carry_the_size_of_what_they_freed_and_unmaps_their_own() -> None:
    h = Harness()
    ev = Events()
    ev.malloc(4096, 0x7000_0000)
    ev.add(Kind.CUDA_FREE, F.cuMemFree_v2, a0=0x7000_0000, flags=4)
    ev.add(Kind.CUDA_MALLOC, F.cuMemMap, a0=1 << 21, a1=0x7100_0000, flags=4)
    ev.add(Kind.CUDA_FREE, F.cuMemUnmap, a0=0x7100_0000, a1=1 << 21, flags=4)
    h.correlator.on_events(ev.array())
    free, unmap = h.spans[1], h.spans[3]
    assert (free.attributes["cuda.memory.address"], free.attributes["cuda.memory.bytes"]) == ("0x70000000", 4096)
    assert free.attributes["cuda.api.layer"] == "driver"
    assert unmap.attributes["cuda.memory.bytes"] == 1 << 21
    assert h.correlator.memory_snapshot()[ME] == (0, 1 << 21)


def test_copies_from_pinned_memory_are_told_from_pageable_ones() -> None:
    h = Harness()
    ev = Events()
    ev.add(Kind.CUDA_HOST_ALLOC, F.cudaHostAlloc, a0=1 << 20, a1=0x10_0000)
    ev.add(Kind.CUDA_MEMCPY, F.cudaMemcpy, a0=4096, a1=1, a3=0x10_0000 + 512)  # H2D from pinned
    ev.add(Kind.CUDA_MEMCPY, F.cudaMemcpy, a0=100, a1=2, a3=0x30_0000)  # D2H to pageable
    ev.add(Kind.CUDA_HOST_FREE, F.cudaFreeHost, a0=0x10_0000)
    ev.add(Kind.CUDA_MEMCPY, F.cudaMemcpy, a0=8, a1=1, a3=0x10_0000)  # freed: pageable now
    h.correlator.on_events(ev.array())
    kinds = [s.attributes.get("cuda.memcpy.host_memory") for s in h.spans if s.name == "cudaMemcpy"]
    assert kinds == ["pinned", "pageable", "pageable"]
    m = h.collect()[ME]
    assert points(m["cuda.memcpy.host_bytes"]) == {
        (("cuda.memcpy.direction", "D2H"), ("cuda.memcpy.host_memory", "pageable")): 100,
        (("cuda.memcpy.direction", "H2D"), ("cuda.memcpy.host_memory", "pageable")): 8,
        (("cuda.memcpy.direction", "H2D"), ("cuda.memcpy.host_memory", "pinned")): 4096,
    }


def test_an_event_query_that_is_not_ready_is_an_answer_not_an_error() -> None:
    h = Harness()
    ev = Events()
    ev.add(Kind.CUDA_CALL, F.cudaEventQuery, a0=0xE1, ret=600)
    ev.add(Kind.CUDA_CALL, F.cudaEventQuery, a0=0xE1, ret=0)
    ev.add(Kind.CUDA_SYNC, F.cudaEventSynchronize, a0=0xE1, a1=1)
    h.correlator.on_events(ev.array())
    assert [s.status.status_code for s in h.spans] == [StatusCode.UNSET] * 3
    assert h.spans[2].attributes["cuda.event"] == "0xe1"
    m = h.collect()[ME]
    assert points(m["cuda.api.calls"]) == {
        (("cuda.api.function", "cudaEventQuery"),): 2,
        (("cuda.api.function", "cudaEventSynchronize"),): 1,
    }
    assert "cuda.api.errors" not in m


def test_calls_made_on_a_thread_while_it_serves_a_request_are_children_of_that_request() -> None:
    """The HTTP correlator opens an interval per server span on its thread (causality.py); a
    CUDA call on that thread within it is that span's child, on another thread or after it not."""
    causality = Causality()
    h = Harness(parent_of=causality.parent)
    serving, other = Events(tid=ME + 1), Events(tid=ME + 2)
    other.ts = serving.ts
    request = new_context()
    interval = causality.open(ME, ME + 1, serving.ts + 5_000, request)
    serving.malloc(1 << 20, 0xA000)  # +10 us: inside
    other.malloc(1 << 20, 0xB000)  # +10 us, another thread
    serving.launch(fn_address("getppid"))  # +20 us: inside
    causality.close(ME, ME + 1, interval, serving.ts + 5_000)
    serving.sync(dur=2_000)  # +30 us: after the request ended
    h.correlator.on_events(np.concatenate([serving.array(), other.array()]))
    spans = {(s.name, s.attributes["thread.id"]): s for s in h.spans}
    for name in ("cudaMalloc", "cudaLaunchKernel"):
        span = spans[(name, ME + 1)]
        assert span.parent == request and span.context.trace_id == request.trace_id, name
    assert spans[("cudaMalloc", ME + 2)].parent is None
    assert spans[("cudaStreamSynchronize", ME + 1)].parent is None


def test_a_hand_off_record_makes_a_pool_threads_calls_children_of_the_request_that_woke_it() -> None:
    """EV_HANDOFF (the wake-up that handed a thread its work) goes to causality ahead of the spans
    of its batch; each span says how it was tied: thread, wakeup, or link."""
    causality = Causality()
    h = Harness(
        parent_of=causality.parent,
        in_flight=causality.in_flight,
        handed=causality.handed,
        on_handoffs=causality.woken,
    )
    handler, worker, loose = Events(tid=ME + 1), Events(tid=ME + 2), Events(tid=ME + 3)
    worker.ts = loose.ts = handler.ts
    request = new_context()
    causality.open(ME, ME + 1, handler.ts + 1_000, request)
    worker.add(Kind.HANDOFF, 0, dur=0, a0=ME + 1)  # +10 us: the handler woke the worker
    worker.rows[-1] = (handler.ts + 2_000, *worker.rows[-1][1:])  # ... at +2 us (ts_ns: the wake-up)
    worker.malloc(1 << 20, 0xA000)  # +20 us
    handler.malloc(1 << 20, 0xB000)  # +10 us, on the request's own thread
    loose.malloc(1 << 20, 0xC000)  # +10 us: a thread nobody handed work to
    h.correlator.on_events(np.concatenate([worker.array(), handler.array(), loose.array()]))
    spans = {s.attributes["thread.id"]: s for s in h.spans}
    assert (spans[ME + 2].parent, spans[ME + 2].attributes["otelbpf.causality"]) == (request, "wakeup")
    assert (spans[ME + 1].parent, spans[ME + 1].attributes["otelbpf.causality"]) == (request, "thread")
    assert spans[ME + 3].parent is None and spans[ME + 3].attributes["otelbpf.causality"] == "link"
    assert [link.context for link in spans[ME + 3].links] == [request]


def test_driver_calls_graph_launches_event_waits_and_vmm_handles_say_what_they_are() -> None:
    h = Harness()
    ev = Events()
    ev.add(Kind.CUDA_MALLOC, F.cuMemAlloc_v2, flags=FLAG_DRIVER, a0=3 << 20, a1=0xD000)
    ev.add(Kind.CUDA_GRAPH, F.cudaGraphLaunch, a0=0x9999, a2=0x5EED)  # an executable graph never seen made
    ev.add(Kind.CUDA_CALL, F.cuMemCreate, flags=FLAG_DRIVER, a0=2 << 20, a1=0xABC)
    ev.sync(func=F.cudaEventSynchronize, stream=0xE1, a1=1)
    ev.sync(func=F.cudaStreamSynchronize, stream=0x5EED)
    h.correlator.on_events(ev.array())
    alloc, graph, create, event_sync, stream_sync = h.spans
    assert (alloc.name, alloc.attributes["cuda.api.layer"]) == ("cuMemAlloc_v2", "driver")
    assert (alloc.attributes["cuda.memory.bytes"], alloc.attributes["cuda.memory.address"]) == (3 << 20, "0xd000")
    assert graph.attributes["cuda.graph.exec"] == "0x9999" and graph.attributes["cuda.stream"] == "0x5eed"
    assert "cuda.kernel.name" not in graph.attributes  # a graph is not a kernel
    assert (create.attributes["cuda.memory.bytes"], create.attributes["cuda.memory.handle"]) == (2 << 20, "0xabc")
    assert event_sync.attributes["cuda.event"] == "0xe1" and "cuda.stream" not in event_sync.attributes
    assert stream_sync.attributes["cuda.stream"] == "0x5eed" and "cuda.event" not in stream_sync.attributes
    assert [s.attributes["cuda.api.layer"] for s in h.spans] == ["driver", "runtime", "driver", "runtime", "runtime"]


def test_calls_made_for_a_shed_request_are_unsampled_spans_and_counted_as_any_call() -> None:
    """EVF_SHED (the thread served a request head sampling shed): its span is recorded unsampled
    with no parent nor links (though another thread's request is in flight then: not what the
    call was made for), and counted; its call counts in every metric. A kept request open on the
    thread at that time (an event loop's, the latest read being shed) keeps the call as its
    child. A kept request's children inherit its tracestate (its sampling threshold)."""
    causality = Causality()
    h = Harness(parent_of=causality.parent, in_flight=causality.in_flight)
    e = Events()
    request = sampled_context(new_context(), 2, own_trace=True)
    interval = causality.open(ME, ME, e.ts, request)
    causality.open(ME, ME + 1, e.ts, new_context())  # another thread's, in flight throughout
    e.malloc(1 << 20, 0xA000)  # +10 us: the kept request's
    e.free(0xA000, flags=FLAG_SHED)  # +20 us: the kept request still open on the thread
    causality.close(ME, ME, interval, e.ts + 5_000)
    e.memcpy(1 << 20, 1, flags=FLAG_SHED)  # +30 us: the shed request's
    e.launch(fn_address("getppid"), flags=FLAG_SHED)
    h.correlator.on_events(e.array())
    spans = {s.name: s for s in h.spans}
    for name in ("cudaMalloc", "cudaFree"):
        kept = spans[name]
        assert kept.parent == request and kept.context.trace_flags.sampled, name
        assert kept.context.trace_state == request.trace_state and request.trace_state.get("ot") == "th:c"
        assert "otelbpf.sampling.shed" not in kept.attributes
    for name in ("cudaMemcpy", "cudaLaunchKernel"):
        span = spans[name]
        assert span.parent is None and not span.links and not span.context.trace_flags.sampled, name
        assert span.attributes["otelbpf.sampling.shed"] is True and "otelbpf.causality" not in span.attributes
    metrics = h.collect()[ME]
    assert value(metrics["otelbpf.cuda.spans.shed"]) == 2
    assert points(metrics["cuda.api.calls"]) == {
        (("cuda.api.function", "cudaMalloc"),): 1,
        (("cuda.api.function", "cudaFree"),): 1,
        (("cuda.api.function", "cudaMemcpy"),): 1,
    }
    assert points(metrics["cuda.memcpy.bytes"]) == {(("cuda.memcpy.direction", "H2D"),): 1 << 20}


def test_calls_carry_the_device_their_thread_had_set() -> None:
    """bpf/cuda.c puts the thread's current device + 1 in bits 9-15 of a record's flags (0: none
    seen set): the span says it as cuda.device.id; cudaSetDevice's own span says the device it
    was asked for (a0, an int: the register's upper half is not the caller's)."""
    h = Harness()
    e = Events()
    e.malloc(1 << 20, 0xA000)  # no device set seen
    e.add(Kind.CUDA_CALL, F.cudaSetDevice, a0=(0xDEAD << 32) | 3, a3=1)
    e.memcpy(1 << 20, 1, flags=(3 + 1) << CUDA_DEVICE_SHIFT)
    e.launch(fn_address("getppid"), flags=FLAG_SHED | (0 + 1) << CUDA_DEVICE_SHIFT)
    e.add(Kind.CUDA_CALL, F.cudaSetDevice, a0=0xFFFFFFFF, ret=101)  # cudaSetDevice(-1): invalid
    h.correlator.on_events(e.array())
    spans = [(s.name, s.attributes.get("cuda.device.id")) for s in h.spans]
    assert spans == [
        ("cudaMalloc", None),
        ("cudaSetDevice", 3),
        ("cudaMemcpy", 3),
        ("cudaLaunchKernel", 0),
        ("cudaSetDevice", -1),
    ]
    assert [cuda_device(f) for f in (0, 1 << CUDA_DEVICE_SHIFT, 127 << CUDA_DEVICE_SHIFT | FLAG_SHED)] == [None, 0, 126]
