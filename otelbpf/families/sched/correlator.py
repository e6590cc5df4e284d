"""Off-CPU time and run-queue latency of the traced threads (``bpf/sched.c``).

Metrics come from the kernel's aggregates, read at each export:

- ``otelbpf.thread.off_cpu.time`` (s, cumulative) per process, ``thread.name`` and
  ``otelbpf.sched.reason``: why the thread was off the CPU, from its state at
  switch-out and its kernel stack: ``cuda`` (inside a CUDA API call: waiting for the
  GPU), ``futex``, ``pipe``, ``socket``, ``poll`` (waiting for another thread or
  process: locks, queues, data loaders), ``io`` (file system and block I/O: fsync,
  page-cache writeback), ``sleep``, ``preempted`` (runnable, waiting for a CPU) or
  ``other``;
- ``otelbpf.thread.runqueue.latency`` (s, histogram) per process and ``thread.name``:
  wakeup (or preemption) to running again: the host's CPU contention as the thread
  feels it.

Off-CPU intervals above the family's threshold become ``off_cpu`` spans with the thread
id, the reason, the blocked and run-queue parts and the kernel stack: the diagnosis
joins them with the CUDA spans of the thread that launches GPU work. Shorter ones come
summed per thread and window (``aggregate_window``): one span from the window's first
switch-out to its last switch-in, ``otelbpf.sched.intervals`` the count, the blocked and
run-queue parts their sums (less than the span's length), the reason its longest wait's.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from opentelemetry.sdk.metrics.export import HistogramDataPoint, Metric
from opentelemetry.sdk.resources import Resource

from otelbpf.base.events import Kind
from otelbpf.correlate import metrics as m
from otelbpf.correlate.base import CorrelatorBase, CorrelatorSettings
from otelbpf.correlate.kallsyms import KernelSymbols
from otelbpf.correlate.spans import make_span, scope
from otelbpf.families.sched.probes import (
    IN_CUDA,
    OFF_MAP,
    RUNQ_MAP,
    SLOTS,
    STATS,
    State,
    counted_stacks,
    read_stacks,
    read_stats,
)

SCOPE = scope("otelbpf.sched")
SPAN_NAME = "off_cpu"
#: Kernel frames kept on a span (the innermost scheduler frames are dropped first).
SPAN_FRAMES = 16
#: Run-queue histogram bounds (s): the kernel's log2(ns) slots from 1 us up, each
#: bound the top of a slot.
RUNQ_BOUNDS = tuple(2.0 ** (s + 1) / 1e9 for s in range(10, SLOTS - 1))

#: (reason, kernel function name prefixes): the first reason any frame of a stack
#: matches, in this order (a socket wait sits under ep_poll's frames, a nanosleep under
#: the same hrtimer frames as a timed poll).
REASONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("futex", ("futex_", "__x64_sys_futex", "do_futex")),
    ("pipe", ("pipe_read", "pipe_write", "pipe_wait")),
    ("socket", ("sock_", "sk_wait", "tcp_", "unix_stream", "unix_dgram", "inet_", "udp_", "__skb_wait")),
    ("poll", ("ep_poll", "do_epoll", "do_select", "core_sys_select", "do_sys_poll")),
    (
        "io",
        (
            "io_schedule",
            "folio_wait",
            "wait_on_page",
            "blk_",
            "jbd2",
            "ext4_",
            "xfs_",
            "btrfs_",
            "vfs_fsync",
            "do_fsync",
            "file_write_and_wait",
            "filemap_",
            "__filemap",
        ),
    ),
    (
        "sleep",
        ("hrtimer_nanosleep", "do_nanosleep", "common_nsleep", "__x64_sys_nanosleep", "__x64_sys_clock_nanosleep"),
    ),
)
#: How long an exit is remembered for a process not yet exported (its keys may still come).
_EXIT_MEMORY_NS = 600 * 10**9
#: Scheduler frames at the top of every off-CPU stack: they say nothing.
_SCHED_FRAMES = ("__schedule", "schedule", "preempt_schedule", "__traceiter", "__bpf_trace", "bpf_")


def classify(state: int, frames: tuple[str, ...] | None) -> str:
    """The reason a thread was off-CPU (see the module doc)."""
    if state & IN_CUDA:
        return "cuda"
    base = state & 0xFF
    if base == State.preempted:
        return "preempted"
    for reason, prefixes in REASONS:
        if frames and any(f.startswith(prefixes) for f in frames):
            return reason
    if base == State.disk:
        return "io"
    return "other"


def _comm(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", errors="replace")


@dataclass
class _Proc:
    resource: Resource
    start_ns: int
    exited: bool = False


@dataclass
class _Read:
    """One read of the kernel aggregates."""

    off: list[tuple[Any, Any]] = field(default_factory=list)
    runq: list[tuple[Any, int]] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)


class SchedCorrelator(CorrelatorBase[_Proc]):
    scope = SCOPE

    def __init__(
        self,
        settings: CorrelatorSettings,
        read_map: Callable[[str], list[tuple[Any, Any]]],
        forget: Callable[[str, list[object]], None],
        with_bpf: Callable[[Callable[[Any], Any]], Any],
        count: Callable[..., None],
        *,
        traces: bool,
        max_spans_per_second: int,
        kernel_symbols: KernelSymbols | None = None,
    ) -> None:
        super().__init__(settings, max_spans_per_second=max_spans_per_second)
        self._read_map = read_map
        self._forget = forget
        self._with_bpf = with_bpf
        self._count = count
        self._traces = traces
        self._ksyms = kernel_symbols  # read at the first stack (~0.8 s): not on the agent's start
        self._stacks: dict[int, tuple[str, ...]] = {}  # stack id -> function names, innermost first
        self._exited: dict[int, int] = {}  # pid -> when its exit was seen (wall ns)
        self._execs: set[int] = set()  # pids that exec'd since the last export
        self._stats_seen: dict[str, int] = dict.fromkeys(STATS, 0)

    # -- events ------------------------------------------------------------

    def on_events(self, arr: np.ndarray) -> None:
        """Exits: a process's series are exported once more, then its kernel keys go (also
        for a process that exits before its first export). Execs: the process is another
        program from now on: its resource is read again (its counts so far carry over: the
        kernel counts per process id)."""
        life = arr[(arr["kind"] == int(Kind.PROC_EXIT)) | (arr["kind"] == int(Kind.PROC_EXEC))]
        if not len(life):
            return
        now = self._clock.now_wall()
        with self._lock:
            for e in life:
                pid = int(e["pid"])
                if int(e["kind"]) == Kind.PROC_EXIT:
                    self._exited[pid] = now
                else:
                    self._exited.pop(pid, None)
                    self._info.forget(pid, before_ns=int(e["ts_ns"]))
                    self._execs.add(pid)

    def on_strings(self, arr: np.ndarray) -> None:
        """No string records of its own."""

    def on_ring(self, name: str, arr: np.ndarray) -> None:
        """Long off-CPU intervals: one span each, within the span budget."""
        if not self._traces or not len(arr):
            return
        granted = self._budget.take(len(arr))
        if granted < len(arr):
            self._count("otelbpf.spans.sampled_out", len(arr) - granted)
        arr = arr[np.argsort(-(arr["blocked_ns"] + arr["runq_ns"]), kind="stable")[:granted]]
        self._resolve({int(k) for k in arr["kstack"].tolist() if k >= 0})
        spans = []
        for r in arr:
            frames = self._stacks.get(int(r["kstack"]))
            state = int(r["state"])
            start = self._clock.to_wall(int(r["off_ts"]))
            blocked, runq = int(r["blocked_ns"]), int(r["runq_ns"])
            # a window's short intervals summed: the span runs from the first switch-out to
            # the last switch-in, longer than the time off the CPU it holds
            end = start + max(int(r["end_ts"]) - int(r["off_ts"]), blocked + runq)
            attrs: dict[str, object] = {
                "thread.id": int(r["tid"]),
                "thread.name": _comm(bytes(r["comm"])),
                "otelbpf.sched.reason": classify(state, frames),
                "otelbpf.sched.state": _state_name(state),
                "otelbpf.sched.blocked_ns": blocked,
                "otelbpf.sched.runqueue_ns": runq,
                "otelbpf.sched.intervals": int(r["count"]) or 1,
            }
            if frames:
                attrs["otelbpf.sched.kernel_stack"] = list(_useful(frames)[:SPAN_FRAMES])
            spans.append(
                make_span(
                    SPAN_NAME,
                    resource=self._info.resource(int(r["tgid"])),
                    scope=SCOPE,
                    start_ns=start,
                    end_ns=end,
                    attributes=attrs,
                )
            )
        self._send(spans)

    # -- kernel stacks -------------------------------------------------------

    def _resolve(self, ids: set[int]) -> None:
        """Read and symbolize the kernel stacks not yet known (under the sensor's lock)."""
        new = sorted(i for i in ids if i not in self._stacks)
        if not new:
            return

        raw: dict[int, list[int]] = self._with_bpf(lambda bpf: read_stacks(bpf, new)) or {}
        for i, addrs in raw.items():
            self._stacks[i] = self._symbolize(addrs)

    def _symbolize(self, addrs: list[int]) -> tuple[str, ...]:
        if self._ksyms is None:
            self._ksyms = KernelSymbols()
        return tuple(self._ksyms.lookup(a) or f"0x{a:x}" for a in addrs)

    def on_unload(self, bpf: Any) -> None:
        """Before the program goes: stacks the final counts name are read while they can be."""
        new = [i for i in counted_stacks(bpf) if i not in self._stacks]
        for i, addrs in read_stacks(bpf, new).items():
            self._stacks[i] = self._symbolize(addrs) if addrs else ()
        self._count_stats(read_stats(bpf))

    def _count_stats(self, totals: dict[str, int]) -> None:
        for name, total in totals.items():
            if total > self._stats_seen[name]:
                self._count("otelbpf.sched.dropped", total - self._stats_seen[name], reason=name)
                self._stats_seen[name] = total

    # -- metrics -------------------------------------------------------------

    def collect(self) -> list[tuple[Resource, list[Metric]]]:
        """Cumulative off-CPU time and run-queue histograms per process."""
        off = self._read_map(OFF_MAP)
        runq = self._read_map(RUNQ_MAP)
        totals = self._with_bpf(read_stats)
        if totals is not None:
            self._count_stats(totals)
        self._resolve({int(k.kstack) for k, _v in off if int(k.kstack) >= 0})
        now = self._clock.now_wall()
        time_by: dict[int, dict[tuple[str, str], float]] = defaultdict(lambda: defaultdict(float))
        names: dict[tuple[int, int], str] = {}
        runq_ns: dict[tuple[int, int], int] = defaultdict(int)
        keys: dict[int, list[object]] = defaultdict(list)
        for k, v in off:
            pid, tid = int(k.tgid), int(k.tid)
            name = _comm(bytes(v.comm))
            names[(pid, tid)] = name
            reason = classify(int(k.state), self._stacks.get(int(k.kstack)))
            time_by[pid][(name, reason)] += (int(v.blocked_ns) + int(v.runq_ns)) / 1e9
            runq_ns[(pid, tid)] += int(v.runq_ns)
            keys[pid].append(k)
        slots: dict[tuple[int, str], np.ndarray] = {}
        sums: dict[tuple[int, str], float] = defaultdict(float)
        runq_keys: dict[int, list[object]] = defaultdict(list)
        for k, n in runq:
            pid, tid = int(k.tgid), int(k.tid)
            name = names.get((pid, tid), str(tid))
            hist = slots.setdefault((pid, name), np.zeros(SLOTS, dtype=np.int64))
            hist[min(int(k.slot), SLOTS - 1)] += int(n)
            runq_keys[pid].append(k)
        for (pid, tid), ns in runq_ns.items():
            sums[(pid, names[(pid, tid)])] += ns / 1e9
        out = []
        with self._lock:
            for pid in set(time_by) | {p for p, _n in slots}:
                if pid not in self._procs:
                    self._procs[pid] = _Proc(self._info.resource(pid), now)
            # an exit seen long ago whose keys are gone is forgotten; one seen before the
            # process's first export still marks it
            horizon = now - _EXIT_MEMORY_NS
            self._exited = {p: t for p, t in self._exited.items() if t > horizon or p in self._procs}
            for pid in self._execs & set(self._procs):
                self._procs[pid].resource = self._info.resource(pid)
            self._execs.clear()
            for pid, proc in list(self._procs.items()):
                proc.exited = proc.exited or self._exited.pop(pid, None) is not None
                metrics = [
                    x
                    for x in (
                        m.cumulative_sum(
                            "otelbpf.thread.off_cpu.time",
                            "s",
                            "Time threads spent off the CPU, by thread name and reason",
                            [
                                ({"thread.name": n, "otelbpf.sched.reason": r}, round(v, 9))
                                for (n, r), v in sorted(time_by.get(pid, {}).items())
                            ],
                            proc.start_ns,
                            now,
                        ),
                        m.histogram(
                            "otelbpf.thread.runqueue.latency",
                            "s",
                            "Wakeup or preemption to running again, per thread name",
                            [
                                _runq_point({"thread.name": n}, h, sums[(p, n)], proc.start_ns, now)
                                for (p, n), h in sorted(slots.items())
                                if p == pid
                            ],
                        ),
                    )
                    if x is not None
                ]
                if metrics:
                    out.append((proc.resource, metrics))
                if proc.exited:
                    del self._procs[pid]
                    self._forget(OFF_MAP, keys.get(pid, []))
                    self._forget(RUNQ_MAP, runq_keys.get(pid, []))
        return out


def _state_name(state: int) -> str:
    base = state & 0xFF
    return State(base).name if base in State._value2member_map_ else "other"


def _useful(frames: tuple[str, ...]) -> tuple[str, ...]:
    """The stack without the scheduler's own innermost frames."""
    i = 0
    while i < len(frames) and frames[i].startswith(_SCHED_FRAMES):
        i += 1
    return frames[i:] or frames


def _runq_point(attrs: m.Attrs, slots: np.ndarray, total_s: float, start_ns: int, now_ns: int) -> HistogramDataPoint:
    """An explicit-bucket point from the kernel's log2(ns) slots: slots below 1 us go to the
    first bucket; min and max are the bounds of the lowest and highest slot used."""
    counts = np.concatenate(([slots[:11].sum()], slots[11:]))
    used = np.nonzero(slots)[0]
    lo = 2.0 ** int(used[0]) / 1e9 if len(used) else 0.0
    hi = 2.0 ** (int(used[-1]) + 1) / 1e9 if len(used) else 0.0
    return HistogramDataPoint(
        attributes=attrs,
        start_time_unix_nano=start_ns,
        time_unix_nano=now_ns,
        count=int(slots.sum()),
        sum=round(total_s, 9),
        bucket_counts=[int(c) for c in counts],
        explicit_bounds=list(RUNQ_BOUNDS),
        min=lo,
        max=hi,
    )
