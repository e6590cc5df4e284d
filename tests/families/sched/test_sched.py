"""SchedCorrelator on the records and map entries bpf/sched.c writes, built by hand so every
number is known: reasons from states and kernel stacks, off_cpu spans within the budget,
metrics per process and thread name, a process's keys forgotten after its exit. Kernel
stacks are symbolized by the real KernelSymbols from a kallsyms file written here."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from opentelemetry.sdk.metrics.export import Histogram, Sum

from otelbpf.base.events import EVENT_DTYPE, Kind
from otelbpf.correlate.base import CorrelatorSettings
from otelbpf.correlate.clock import MonotonicClock
from otelbpf.correlate.kallsyms import KernelSymbols
from otelbpf.correlate.process_info import ProcessInfo
from otelbpf.families.sched.correlator import RUNQ_BOUNDS, SchedCorrelator, classify
from otelbpf.families.sched.probes import IN_CUDA, RECORD_DTYPE, State, sched_family

ME = os.getpid()
FUTEX_STACK, SLEEP_STACK, FSYNC_STACK = 1, 2, 3
KALLSYMS = """\
ffffffff81000000 T __schedule
ffffffff81000100 T schedule
ffffffff81000200 T futex_wait_queue
ffffffff81000300 T __x64_sys_futex
ffffffff81000400 T do_nanosleep
ffffffff81000500 T ext4_sync_file
ffffffff81000600 T do_fsync
ffffffff81000700 T do_syscall_64
ffffffff81000800 T _etext
"""
STACKS = {
    FUTEX_STACK: [0xFFFFFFFF81000010, 0xFFFFFFFF81000110, 0xFFFFFFFF81000210, 0xFFFFFFFF81000310, 0xFFFFFFFF81000710],
    SLEEP_STACK: [0xFFFFFFFF81000010, 0xFFFFFFFF81000410, 0xFFFFFFFF81000710],
    FSYNC_STACK: [0xFFFFFFFF81000010, 0xFFFFFFFF81000510, 0xFFFFFFFF81000610, 0xFFFFFFFF81000710],
}


class OffKey(ctypes.Structure):
    _fields_ = [
        ("tgid", ctypes.c_uint32),
        ("tid", ctypes.c_uint32),
        ("kstack", ctypes.c_int32),
        ("state", ctypes.c_uint32),
    ]


class OffVal(ctypes.Structure):
    _fields_ = [
        ("count", ctypes.c_uint64),
        ("blocked_ns", ctypes.c_uint64),
        ("runq_ns", ctypes.c_uint64),
        ("comm", ctypes.c_char * 16),
    ]


class RunqKey(ctypes.Structure):
    _fields_ = [
        ("tgid", ctypes.c_uint32),
        ("tid", ctypes.c_uint32),
        ("slot", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
    ]


class Table:
    """What the correlator uses of a BCC table: walk (stacks), items, and a per-CPU array."""

    def __init__(self, stacks: dict | None = None, items: list | None = None) -> None:
        self._stacks, self._items = stacks or {}, items or []

    def walk(self, i: int) -> list[int]:
        if i not in self._stacks:
            raise KeyError(i)
        return self._stacks[i]

    def items(self) -> list:
        return self._items

    def Key(self, i: int) -> int:  # noqa: N802 (BCC's name)
        return i

    def __getitem__(self, slot: int) -> list[int]:
        return [2, 1] if slot == 0 else [0, 0]  # two CPUs; ring_full 3, the rest 0


class Rig:
    def __init__(self, tmp: Path) -> None:
        ksyms = tmp / "kallsyms"
        ksyms.write_text(KALLSYMS)
        self.off: list = []
        self.runq: list = []
        self.spans: list = []
        self.forgotten: dict[str, list] = {}
        self.counts: list = []
        bpf = {"sched_stacks": Table(STACKS), "sched_stats": Table(), "sched_off": Table(items=self.off)}
        self.corr = SchedCorrelator(
            CorrelatorSettings(ProcessInfo(), MonotonicClock(), self.spans.extend),
            lambda name: {"sched_off": self.off, "sched_runq": self.runq}[name],
            lambda name, keys: self.forgotten.setdefault(name, []).extend(keys),
            lambda fn: fn(bpf),
            lambda metric, n, **attrs: self.counts.append((metric, n, attrs)),
            traces=True,
            max_spans_per_second=1000,
            kernel_symbols=KernelSymbols(str(ksyms)),
        )

    def off_cpu(self, tid: int, name: str, stack: int, state: int, blocked: int, runq: int, count: int = 1) -> None:
        self.off.append((OffKey(ME, tid, stack, state), OffVal(count, blocked, runq, name.encode())))

    def queued(self, tid: int, slot: int, n: int) -> None:
        self.runq.append((RunqKey(ME, tid, slot, 0), n))


def records(*rows: tuple) -> np.ndarray:
    """One record per row: (tid, comm, stack, state, blocked, runq[, count, length]); a row
    without a length lasts blocked + runq (one interval)."""
    arr = np.zeros(len(rows), RECORD_DTYPE)
    for i, (tid, comm, stack, state, blocked, runq, *rest) in enumerate(rows):
        count, length = (rest + [1, blocked + runq])[:2] if rest else (1, blocked + runq)
        off = 10**9 + i * 10**8
        arr[i] = (off, off + length, blocked, runq, ME, tid, stack, state, count, 0, comm.encode())
    return arr


def test_reasons_from_state_and_stack() -> None:
    futex = ("__schedule", "futex_wait_queue", "__x64_sys_futex")
    assert classify(State.sleeping, futex) == "futex"
    assert classify(State.sleeping | IN_CUDA, futex) == "cuda"  # inside a CUDA call: the GPU, not a lock
    assert classify(State.preempted, futex) == "preempted"
    assert classify(State.sleeping, ("__schedule", "pipe_read", "vfs_read")) == "pipe"
    assert classify(State.sleeping, ("schedule_hrtimeout_range", "ep_poll", "do_epoll_wait")) == "poll"
    assert classify(State.sleeping, ("__schedule", "do_nanosleep", "hrtimer_nanosleep")) == "sleep"
    assert classify(State.disk, ("io_schedule", "folio_wait_bit", "ext4_sync_file")) == "io"
    assert classify(State.disk, None) == "io"  # no stack: D is still mostly I/O
    assert classify(State.sleeping, None) == "other"


def test_long_intervals_become_spans_with_reason_and_stack(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.corr.on_ring(
        "schedevents",
        records(
            (ME + 1, "train", FUTEX_STACK, State.sleeping, 20_000_000, 50_000),
            (ME + 2, "loader", SLEEP_STACK, State.sleeping, 19_000_000, 0),
            (ME + 1, "train", -1, State.preempted, 0, 4_000_000),
        ),
    )
    by = {(s.attributes["thread.name"], s.attributes["otelbpf.sched.reason"]): s for s in rig.spans}
    assert set(by) == {("train", "futex"), ("loader", "sleep"), ("train", "preempted")}
    futex = by[("train", "futex")]
    assert futex.name == "off_cpu" and futex.instrumentation_scope.name == "otelbpf.sched"
    assert futex.end_time - futex.start_time == 20_050_000
    assert futex.attributes["thread.id"] == ME + 1 and futex.attributes["otelbpf.sched.blocked_ns"] == 20_000_000
    # the scheduler's own frames are dropped; the rest innermost first
    assert list(futex.attributes["otelbpf.sched.kernel_stack"]) == [
        "futex_wait_queue",
        "__x64_sys_futex",
        "do_syscall_64",
    ]
    assert futex.resource.attributes["process.pid"] == ME
    assert "otelbpf.sched.kernel_stack" not in by[("train", "preempted")].attributes


def test_a_windows_short_intervals_are_one_span_over_the_window(tmp_path: Path) -> None:
    """bpf/sched.c sums the intervals under span_threshold per thread and window: one record
    from the first switch-out to the last switch-in, with the count and the sums."""
    rig = Rig(tmp_path)
    rig.corr.on_ring(
        "schedevents",
        records((ME + 1, "train", FSYNC_STACK, State.disk, 600_000, 40_000, 3, 900_000)),
    )
    [s] = rig.spans
    assert s.end_time - s.start_time == 900_000  # the window's extent, not the 640 us it holds
    assert s.attributes["otelbpf.sched.intervals"] == 3
    assert s.attributes["otelbpf.sched.blocked_ns"] == 600_000 and s.attributes["otelbpf.sched.runqueue_ns"] == 40_000
    assert s.attributes["otelbpf.sched.reason"] == "io"


def test_spans_beyond_the_budget_are_counted_longest_kept(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.corr._budget.rate = rig.corr._budget._tokens = 2  # a tiny budget, refilled by nothing in this test
    rig.corr.on_ring("schedevents", records(*[(ME, "t", -1, State.sleeping, 1_000_000 * (i + 1), 0) for i in range(5)]))
    assert sorted(s.attributes["otelbpf.sched.blocked_ns"] for s in rig.spans) == [4_000_000, 5_000_000]
    assert ("otelbpf.spans.sampled_out", 3, {}) in rig.counts


def test_metrics_per_thread_name_and_reason(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.off_cpu(ME + 1, "train", FUTEX_STACK, State.sleeping, 900_000_000, 1_000_000, count=45)
    rig.off_cpu(ME + 1, "train", FUTEX_STACK, State.sleeping | IN_CUDA, 300_000_000, 0, count=10)
    rig.off_cpu(ME + 1, "train", -1, State.preempted, 0, 200_000_000, count=50)
    rig.off_cpu(ME + 2, "loader", SLEEP_STACK, State.sleeping, 1_000_000_000, 2_000_000, count=50)
    rig.off_cpu(ME + 3, "saver", FSYNC_STACK, State.disk, 50_000_000, 0, count=2)
    rig.queued(ME + 1, 22, 50)  # ~4 ms each
    rig.queued(ME + 1, 15, 45)  # ~33 us
    rig.queued(ME + 2, 15, 50)
    [(res, metrics)] = rig.corr.collect()
    assert res.attributes["process.pid"] == ME
    by = {mt.name: mt for mt in metrics}
    off = {
        (p.attributes["thread.name"], p.attributes["otelbpf.sched.reason"]): p.value
        for p in by["otelbpf.thread.off_cpu.time"].data.data_points
    }
    assert off == pytest.approx(
        {
            ("train", "futex"): 0.901,
            ("train", "cuda"): 0.3,
            ("train", "preempted"): 0.2,
            ("loader", "sleep"): 1.002,
            ("saver", "io"): 0.05,
        }
    )
    assert isinstance(by["otelbpf.thread.off_cpu.time"].data, Sum)
    hist = by["otelbpf.thread.runqueue.latency"].data
    assert isinstance(hist, Histogram)
    points = {p.attributes["thread.name"]: p for p in hist.data_points}
    train = points["train"]
    assert train.count == 95 and train.sum == pytest.approx(0.201)
    assert len(train.bucket_counts) == len(RUNQ_BOUNDS) + 1 == len(train.explicit_bounds) + 1
    # slot 22 is [2^22, 2^23) ns: the bucket whose upper bound is 2^23 ns
    assert train.bucket_counts[list(train.explicit_bounds).index(2**23 / 1e9)] == 50
    assert train.bucket_counts[list(train.explicit_bounds).index(2**16 / 1e9)] == 45
    assert train.min == 2**15 / 1e9 and train.max == 2**23 / 1e9
    assert ("otelbpf.sched.dropped", 3, {"reason": "ring_full"}) in rig.counts


def test_an_exited_process_is_exported_once_more_then_forgotten(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.off_cpu(ME + 1, "train", FUTEX_STACK, State.sleeping, 10_000_000, 0)
    rig.queued(ME + 1, 20, 1)
    assert len(rig.corr.collect()) == 1
    exits = np.zeros(1, EVENT_DTYPE)
    exits["kind"], exits["pid"], exits["tid"] = int(Kind.PROC_EXIT), ME, ME
    rig.corr.on_events(exits)
    assert len(rig.corr.collect()) == 1  # its last counts still go out
    assert [k.tid for k in rig.forgotten["sched_off"]] == [ME + 1] and len(rig.forgotten["sched_runq"]) == 1


def test_the_family_compiles_in_its_limits() -> None:
    fam = sched_family(
        span_threshold_ns=2_000_000,
        ring_bytes=1 << 20,
        thread_entries=4096,
        off_entries=8192,
        runq_entries=16384,
        stack_entries=2048,
    )
    assert fam.c_file == "sched.c" and fam.libraries == ()
    assert {
        "-DSCHED_SPAN_NS=2000000ULL",
        "-DSCHED_AGG_NS=1000000ULL",
        "-DSCHED_AGG_MIN_NS=50000ULL",
        "-DSCHED_RING_PAGES=256",
        "-DSCHED_STACK_ENTRIES=2048",
    } <= set(fam.cflags)
    assert [r.name for r in fam.rings] == ["schedevents"] and fam.rings[0].dtype.itemsize == 72
    assert set(fam.counting_maps) == {"sched_off", "sched_runq"}


def test_a_process_that_exits_before_its_first_export_is_forgotten_after_it(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    exits = np.zeros(1, EVENT_DTYPE)
    exits["kind"], exits["pid"], exits["tid"] = int(Kind.PROC_EXIT), ME, ME
    rig.corr.on_events(exits)
    rig.off_cpu(ME + 1, "train", FUTEX_STACK, State.sleeping, 10_000_000, 0)
    assert len(rig.corr.collect()) == 1
    assert [k.tid for k in rig.forgotten["sched_off"]] == [ME + 1]
    rig.off.clear()
    assert rig.corr.collect() == []


def test_an_exec_reads_the_resource_again(tmp_path: Path) -> None:
    """A forked shell that execs the job: the series carry the job's resource after the exec."""
    child = subprocess.Popen(
        ["/bin/sh", "-c", f"read x; exec {sys.executable} -c 'import sys; sys.stdin.read()'"],
        stdin=subprocess.PIPE,
        text=True,
    )
    try:
        rig = Rig(tmp_path)
        rig.off.append((OffKey(child.pid, child.pid, -1, State.sleeping), OffVal(1, 10_000_000, 0, b"sh")))
        [(res, _m)] = rig.corr.collect()
        assert "python" not in str(res.attributes.get("process.executable.name", ""))
        child.stdin.write("go\n")
        child.stdin.flush()
        deadline = time.monotonic() + 10
        while "python" not in os.readlink(f"/proc/{child.pid}/exe") and time.monotonic() < deadline:
            time.sleep(0.01)
        execs = np.zeros(1, EVENT_DTYPE)
        execs["kind"], execs["pid"], execs["tid"], execs["ts_ns"] = (
            int(Kind.PROC_EXEC),
            child.pid,
            child.pid,
            time.monotonic_ns(),
        )
        rig.corr.on_events(execs)
        [(res, _m)] = rig.corr.collect()
        assert "python" in str(res.attributes.get("process.executable.name", ""))
    finally:
        child.kill()
        child.wait()


def test_the_window_and_floor_are_options_compiled_in() -> None:
    from otelbpf.families.sched.config import SchedReceiverConfig

    cfg = SchedReceiverConfig.model_validate({"aggregate_window": "0s", "aggregate_min": "20us"})
    assert (cfg.aggregate_window, cfg.aggregate_min) == (0, 20_000)
    assert SchedReceiverConfig().aggregate_window == 1_000_000 and SchedReceiverConfig().aggregate_min == 50_000
    fam = sched_family(
        span_threshold_ns=1_000_000,
        ring_bytes=1 << 20,
        aggregate_window_ns=cfg.aggregate_window,
        aggregate_min_ns=cfg.aggregate_min,
        thread_entries=4096,
        off_entries=8192,
        runq_entries=16384,
        stack_entries=2048,
    )
    assert {"-DSCHED_AGG_NS=0ULL", "-DSCHED_AGG_MIN_NS=20000ULL"} <= set(fam.cflags)  # 0: nothing summed
