"""CUDA events -> spans and per-process metrics.

Input: drained ``EVENT_DTYPE`` arrays (paired calls, sampled launches,
process exits), ``STREVENT_DTYPE`` arrays (driver function names), and the
in-kernel launch/error counting maps. Output: finished spans handed to
``emit_spans`` and, on demand, one list of metrics per process.
"""

from __future__ import annotations

import bisect
import heapq
import logging
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from opentelemetry.sdk.metrics.export import Metric
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import Link, SpanContext

from otelbpf.base.events import (
    FLAG_DRIVER,
    FLAG_INCOMPLETE,
    FLAG_SHED,
    MEMCPY_DIRECTION,
    CudaFunc,
    Kind,
    StrKind,
    cuda_device,
    is_driver,
    unpack_dim,
)
from otelbpf.correlate import metrics as m
from otelbpf.correlate.base import CorrelatorBase, CorrelatorSettings
from otelbpf.correlate.causality import Wake
from otelbpf.correlate.spans import make_span, scope
from otelbpf.correlate.symbolizer import Symbolizer
from otelbpf.families.cuda.errors import error_name
from otelbpf.families.cuda.graphs import LAUNCH as _GRAPH
from otelbpf.families.cuda.graphs import REASONS as _GRAPH_REASONS
from otelbpf.families.cuda.graphs import GraphLaunch, Graphs, Kernel, Version
from otelbpf.families.cuda.kernel_names import KernelNames
from otelbpf.sensor.family import MapReader

log = logging.getLogger(__name__)

SCOPE = scope("otelbpf.cuda")
_GRAPH_LAUNCHES = np.array(sorted(_GRAPH), dtype=np.uint8)
#: Kernel names a graph-launch span lists (its kernel count is exact, whatever the number).
_GRAPH_NAMES = 16
#: Paired calls (one event per completed call): counted, spans when long enough.
PAIRED_KINDS = np.array(
    [
        Kind.CUDA_MEMCPY,
        Kind.CUDA_MALLOC,
        Kind.CUDA_FREE,
        Kind.CUDA_SYNC,
        Kind.CUDA_CALL,
        Kind.CUDA_HOST_ALLOC,
        Kind.CUDA_HOST_FREE,
        Kind.CUDA_GRAPH,
    ],
    dtype=np.uint8,
)
#: What a process's graphs follow, in time order (graphs.py): graph calls, launches recorded
#: by a capture, and the stream events and synchronizes that tell streams joined and work done.
_GRAPH_KINDS = np.array([Kind.CUDA_GRAPH, Kind.CUDA_CAPTURED], dtype=np.uint8)
_GRAPH_CONTEXT = np.array([Kind.CUDA_GRAPH, Kind.CUDA_CAPTURED, Kind.CUDA_CALL, Kind.CUDA_SYNC], dtype=np.uint8)
#: What a launch handle means comes from these (kernel_names.py).
_FACT_KINDS = np.array(
    [Kind.CUDA_KERNEL_NAME, Kind.CUDA_KERNEL_ALIAS, Kind.CUDA_LAUNCH_SITE, Kind.CUDA_CAPTURED], dtype=np.uint8
)
#: Event kinds this correlator owns (events.py: 10-19 and 60).
CUDA_KINDS = (Kind.CUDA_LAUNCH, Kind.CUDA_KERNEL_ALIAS)
#: Return codes that are answers, not errors: cudaErrorNotReady / CUDA_ERROR_NOT_READY
#: from an event query is "still running".
_NOT_READY = 600
_QUERIES = frozenset({CudaFunc.cudaEventQuery, CudaFunc.cuEventQuery})
_HOST_SIDED = {1: "H2D", 2: "D2H"}


@dataclass
class _Process:
    """Everything accumulated for one process since it was first seen."""

    resource: Resource
    start_ns: int
    calls: Counter[str] = field(default_factory=Counter)  # function -> calls
    errors: Counter[tuple[str, int]] = field(default_factory=Counter)  # (function, code) -> calls
    memcpy_bytes: Counter[str] = field(default_factory=Counter)  # direction -> bytes
    # function -> histogram
    sync: defaultdict[str, m.HistogramState] = field(default_factory=lambda: defaultdict(m.HistogramState))
    live: dict[int, int] = field(default_factory=dict)  # device address -> bytes
    in_use: int = 0
    high_water: int = 0
    untracked_frees: int = 0
    incomplete: int = 0
    kernels: KernelNames = field(default_factory=KernelNames)
    pinned: dict[int, int] = field(default_factory=dict)  # page-locked host address -> bytes
    pinned_starts: list[int] = field(default_factory=list)  # sorted keys of pinned
    # (direction, pinned|pageable) -> bytes
    pinned_copy_bytes: Counter[tuple[str, str]] = field(default_factory=Counter)
    exited: bool = False
    graphs: Graphs | None = None  # from its first CUDA Graphs call
    shed_spans: int = 0  # spans of calls made for a shed HTTP request (FLAG_SHED): recorded, not sent

    def host_memory(self, addr: int) -> str:
        """'pinned' when ``addr`` lies in page-locked memory the process allocated or
        registered while watched, else 'pageable'."""
        i = bisect.bisect_right(self.pinned_starts, addr) - 1
        if i >= 0:
            start = self.pinned_starts[i]
            if addr < start + self.pinned[start]:
                return "pinned"
        return "pageable"


class CudaCorrelator(CorrelatorBase[_Process]):
    scope = SCOPE

    def __init__(
        self,
        settings: CorrelatorSettings,
        symbolizer: Symbolizer,
        read_map: MapReader,
        forget_keys: Callable[[str, list[object]], None],
        *,
        min_span_ns: int = 0,
        top_kernels: int = 20,
        launch_sample_every: int = 0,
        max_spans_per_second: int = 20_000,
        on_sampled_out: Callable[[int], None] = lambda n: None,
        parent_of: Callable[[int, int, int], SpanContext | None] = lambda pid, tid, ts: None,
        in_flight: Callable[[int, int, int], list[SpanContext]] = lambda pid, tid, ts: [],
        handed: Callable[[int, int, int], SpanContext | None] = lambda pid, tid, ts: None,
        on_handoffs: Callable[[int, int, Wake], None] = lambda pid, tid, wake: None,
        sync: Callable[[], object] = lambda: None,
    ) -> None:
        super().__init__(settings, max_spans_per_second=max_spans_per_second)
        self._sym = symbolizer
        self._read_map = read_map
        self._forget_keys = forget_keys
        self._min_span_ns = min_span_ns
        self._top = top_kernels
        self._sample_every = launch_sample_every
        self._on_sampled_out = on_sampled_out
        #: (pid, tid, monotonic ns) -> the request being served then (causality.py)
        self._parent_of = parent_of
        #: (pid, tid, monotonic ns) -> the requests in flight then: links of a span with no parent
        self._in_flight = in_flight
        #: (pid, tid, monotonic ns) -> the request that handed the thread its work (a wake-up)
        self._handed = handed
        #: EV_HANDOFF records -> causality: who woke the thread that makes the next CUDA calls
        self._on_handoffs = on_handoffs
        #: Process every event emitted so far (Agent.sync): see collect().
        self._sync = sync
        #: pid -> wall time its last metrics were exported after it exited; its
        #: map keys may still be read once more (final snapshot) and are ignored.
        self._finished: dict[int, int] = {}
        #: pid -> wall time its exit was seen, for every process (one that only
        #: launched kernels has no state until a collect reads the launch map).
        self._exited: dict[int, int] = {}
        #: (pid, ts) of a free in the batch being handled -> the bytes it released
        self._freed: dict[tuple[int, int], int] = {}
        #: (pid, ts) of a host<->device copy in the batch being handled -> pinned | pageable
        self._copy_memory: dict[tuple[int, int], str] = {}
        #: (pid, tid, ts) of a graph launch in the batch being handled -> what it ran
        self._graph_launch: dict[tuple[int, int, int], GraphLaunch] = {}

    # -- events -----------------------------------------------------------

    def _new_process(self, pid: int, resource: Resource, start_ns: int) -> _Process:
        self._sym.remember(pid)
        # Late events of a process already gone: export them once, then forget it again.
        return _Process(resource, start_ns, exited=pid in self._exited or pid in self._finished)

    def on_strings(self, arr: np.ndarray) -> None:
        names = arr[arr["kind"] == StrKind.CUDA_FUNC_NAME]
        with self._lock:
            for rec in names:
                name = rec["s"].split(b"\0", 1)[0].decode(errors="replace")
                kernels = self._proc(int(rec["pid"])).kernels
                kernels.driver[int(rec["a0"])] = name
                kernels.learn()

    def on_events(self, arr: np.ndarray) -> None:
        spans: list[ReadableSpan] = []
        with self._lock:
            self._freed, self._copy_memory, self._graph_launch = {}, {}, {}
            for pid, tid, ts, waker, hop, hop_ts in arr[arr["kind"] == Kind.HANDOFF][
                ["pid", "tid", "ts_ns", "a0", "a1", "a2"]
            ].tolist():
                self._on_handoffs(pid, tid, Wake(ts, waker, hop, hop_ts))
            self._aggregate(arr)
            wanted = arr[self._span_worthy(arr)]
            allowed = self._budget.take(len(wanted))
            if allowed < len(wanted):
                self._on_sampled_out(len(wanted) - allowed)
            for rec in wanted[:allowed].tolist():
                span = self._span(rec)
                if span is not None:
                    spans.append(span)
        self._send(spans)

    def _aggregate(self, arr: np.ndarray) -> None:
        """Vectorised metric updates for one drained batch."""
        for pid in np.unique(arr["pid"]):
            mine = arr[arr["pid"] == pid]
            kinds = mine["kind"]
            life = mine[(kinds == Kind.PROC_EXEC) | (kinds == Kind.PROC_EXIT)]
            if len(life):
                if (life["kind"] == Kind.PROC_EXEC).any():
                    self._finished.pop(int(pid), None)  # a new program under a reused pid
                    self._exited.pop(int(pid), None)
                if (life["kind"] == Kind.PROC_EXIT).any():
                    self._exited[int(pid)] = self._clock.now_wall()
                last = life[-1]
                raw = np.array([last["a0"], last["a1"]], dtype="<u8").tobytes()
                comm = raw.split(b"\0", 1)[0].decode(errors="replace")
                self._info.note_comm(int(pid), comm)
                execs = life["ts_ns"][life["kind"] == Kind.PROC_EXEC]
                if len(execs):
                    self._info.forget(int(pid), before_ns=int(execs.max()))
                    self._sym.forget(int(pid), before_ns=int(execs.max()))
                    self._info.resource(int(pid))
            facts = mine[np.isin(kinds, _FACT_KINDS)]
            calls = mine[np.isin(kinds, PAIRED_KINDS)]
            graph = np.isin(kinds, _GRAPH_KINDS)
            if not len(calls) and not len(facts) and not graph.any() and not (kinds == Kind.CUDA_LAUNCH).any():
                if int(pid) in self._exited and int(pid) in self._procs:
                    self._procs[int(pid)].exited = True
                continue
            p = self._proc(int(pid))
            if len(facts):
                self._learn(p, facts)
            complete = calls[(calls["flags"] & FLAG_INCOMPLETE) == 0]
            p.incomplete += len(calls) - len(complete)
            # graph launches are launches (cuda.kernel.launches, from graphs.py), not API calls
            counted = complete[~((complete["kind"] == Kind.CUDA_GRAPH) & np.isin(complete["func"], _GRAPH_LAUNCHES))]
            funcs, counts = np.unique(counted["func"], return_counts=True)
            for f, c in zip(funcs.tolist(), counts.tolist()):
                p.calls[CudaFunc(f).name] += c
            failed = complete[(complete["ret"] != 0)]
            if len(failed):
                failed = failed[~((failed["ret"] == _NOT_READY) & np.isin(failed["func"], list(_QUERIES)))]
                pairs, counts = np.unique(failed[["func", "ret"]], return_counts=True)
                for (f, code), c in zip(pairs.tolist(), counts.tolist()):
                    p.errors[(CudaFunc(f).name, code)] += c
            copies = complete[(complete["kind"] == Kind.CUDA_MEMCPY) & (complete["ret"] == 0)]
            for kind in np.unique(copies["a1"]).tolist():
                p.memcpy_bytes[MEMCPY_DIRECTION.get(kind, f"kind{kind}")] += int(
                    copies["a0"][copies["a1"] == kind].sum()
                )
            self._classify_copies(p, complete)
            syncs = complete[complete["kind"] == Kind.CUDA_SYNC]
            for f in np.unique(syncs["func"]).tolist():
                p.sync[CudaFunc(f).name].add(syncs["duration_ns"][syncs["func"] == f] / 1e9)
            for rec in complete[(complete["kind"] == Kind.CUDA_MALLOC) | (complete["kind"] == Kind.CUDA_FREE)].tolist():
                self._track_memory(p, rec)
            if graph.any() or p.graphs is not None:
                self._follow_graphs(p, mine)
            if int(pid) in self._exited:
                p.exited = True
                if p.graphs is not None:
                    p.graphs.exited()

    def _follow_graphs(self, p: _Process, mine: np.ndarray) -> None:
        """Feed the process's graph calls, captured launches, stream events and syncs to its
        graphs in time order (a thread's events reach the ring in program order; a paired
        call's at its return, its ts at entry)."""
        if p.graphs is None:
            p.graphs = Graphs()
        relevant = mine[np.isin(mine["kind"], _GRAPH_CONTEXT) & ((mine["flags"] & FLAG_INCOMPLETE) == 0)]
        relevant = relevant[np.argsort(relevant["ts_ns"], kind="stable")]
        for rec in relevant.tolist():
            launched = p.graphs.on(rec)
            if launched is not None:
                self._graph_launch[(rec[2], rec[3], rec[0])] = launched

    @staticmethod
    def _learn(p: _Process, facts: np.ndarray) -> None:
        """Registrations, handle aliases and launch sites: what names kernels."""
        k = p.kernels
        for kind, func, a0, a1, a2 in zip(*(facts[f].tolist() for f in ("kind", "func", "a0", "a1", "a2"))):
            if kind == Kind.CUDA_KERNEL_NAME:
                k.registered[a0] = a1
            elif kind == Kind.CUDA_KERNEL_ALIAS:
                k.aliases[a0] = a1
            elif kind == Kind.CUDA_CAPTURED:  # also where the launch was made, each time: kept once
                if (func, a0) not in k.sites:
                    k.sites[(func, a0)] = (a1, a2)
            else:
                k.sites[(func, a0)] = (a1, a2)
        k.learn()

    def _track_memory(self, p: _Process, rec: tuple[int, ...]) -> None:
        ts, _dur, pid, _tid, kind, _func, _flags, ret, a0, a1, _a2, _a3 = rec
        if ret != 0:
            return
        if kind == Kind.CUDA_MALLOC and a1:
            p.live[a1] = a0
            p.in_use += a0
            p.high_water = max(p.high_water, p.in_use)
        elif kind == Kind.CUDA_FREE and a0:
            size = p.live.pop(a0, None)
            if size is None:
                p.untracked_frees += 1  # allocated before the agent started
            else:
                p.in_use -= size
                self._freed[(pid, ts)] = size

    def _classify_copies(self, p: _Process, complete: np.ndarray) -> None:
        """Host<->device copies as pinned or pageable, against the page-locked memory
        the process held at the time of each copy (allocations, registrations and frees
        replayed in time order)."""
        kind, a1 = complete["kind"], complete["a1"]
        host = (kind == Kind.CUDA_HOST_ALLOC) | (kind == Kind.CUDA_HOST_FREE)
        sided = (kind == Kind.CUDA_MEMCPY) & np.isin(a1, [1, 2]) & (complete["a3"] != 0)
        relevant = complete[(host | sided) & (complete["ret"] == 0)]
        if not len(relevant):
            return
        relevant = relevant[np.argsort(relevant["ts_ns"], kind="stable")]
        for ts, pid, k, a0, a1, a3 in zip(*(relevant[f].tolist() for f in ("ts_ns", "pid", "kind", "a0", "a1", "a3"))):
            if k == Kind.CUDA_HOST_ALLOC:
                if a1 and a1 not in p.pinned:
                    bisect.insort(p.pinned_starts, a1)
                if a1:
                    p.pinned[a1] = a0
            elif k == Kind.CUDA_HOST_FREE:
                if p.pinned.pop(a0, None) is not None:
                    del p.pinned_starts[bisect.bisect_left(p.pinned_starts, a0)]
            else:
                memory = p.host_memory(a3)
                self._copy_memory[(pid, ts)] = memory
                p.pinned_copy_bytes[(_HOST_SIDED[a1], memory)] += a0

    def _span_worthy(self, arr: np.ndarray) -> np.ndarray:
        """Mask of events that become spans (before the budget)."""
        kind = arr["kind"]
        paired = np.isin(kind, PAIRED_KINDS)
        long_enough = (arr["duration_ns"] >= self._min_span_ns) | ((arr["flags"] & FLAG_INCOMPLETE) != 0)
        graph_launch = (kind == Kind.CUDA_GRAPH) & np.isin(arr["func"], _GRAPH_LAUNCHES)
        worthy: np.ndarray = (kind == Kind.CUDA_LAUNCH) | graph_launch | (paired & long_enough)
        return worthy

    def _span(self, rec: tuple[int, ...]) -> ReadableSpan | None:
        ts, dur, pid, tid, kind, func, flags, ret, a0, a1, a2, a3 = rec
        incomplete = bool(flags & FLAG_INCOMPLETE)
        cfunc = CudaFunc(func)
        fname = cfunc.name
        attrs: dict[str, object] = {
            "cuda.api.function": fname,
            "cuda.api.layer": "driver" if flags & FLAG_DRIVER else "runtime",
            "thread.id": tid,
        }
        # the device it was made for: the thread's current one; cudaSetDevice's own, the one it sets
        device = (
            ((a0 & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000 if cfunc == CudaFunc.cudaSetDevice else cuda_device(flags)
        )
        if device is not None:
            attrs["cuda.device.id"] = device
        if kind == Kind.CUDA_MEMCPY:
            attrs["cuda.memcpy.bytes"] = a0
            attrs["cuda.memcpy.direction"] = MEMCPY_DIRECTION.get(a1, f"kind{a1}")
            attrs["cuda.memcpy.async"] = "Async" in fname
            if "Async" in fname:
                attrs["cuda.stream"] = f"{a2:#x}"
            memory = self._copy_memory.get((pid, ts))
            if memory is not None:
                attrs["cuda.memcpy.host_memory"] = memory
        elif kind == Kind.CUDA_MALLOC:
            attrs["cuda.memory.bytes"] = a0
            if ret == 0 and not incomplete:
                attrs["cuda.memory.address"] = f"{a1:#x}"
        elif kind == Kind.CUDA_FREE:
            attrs["cuda.memory.address"] = f"{a0:#x}"
            size = self._freed.get((pid, ts)) or a1  # cuMemUnmap says its size
            if size:
                attrs["cuda.memory.bytes"] = size
        elif kind in (Kind.CUDA_HOST_ALLOC, Kind.CUDA_HOST_FREE):
            attrs["cuda.host_memory.address"] = f"{(a1 if kind == Kind.CUDA_HOST_ALLOC else a0):#x}"
            if kind == Kind.CUDA_HOST_ALLOC:
                attrs["cuda.host_memory.bytes"] = a0
        elif kind == Kind.CUDA_SYNC:
            if a1:
                attrs["cuda.event"] = f"{a0:#x}"
            elif func not in (CudaFunc.cudaDeviceSynchronize, CudaFunc.cuCtxSynchronize):
                attrs["cuda.stream"] = f"{a0:#x}"
        elif kind == Kind.CUDA_CALL:
            if "Event" in fname:
                attrs["cuda.event"] = f"{a0:#x}"
                if a2 or "Query" not in fname:
                    attrs["cuda.stream"] = f"{a2:#x}"
            elif cfunc == CudaFunc.cuMemCreate:
                attrs["cuda.memory.bytes"] = a0
                attrs["cuda.memory.handle"] = f"{a1:#x}"
            elif cfunc == CudaFunc.cuMemRelease:
                attrs["cuda.memory.handle"] = f"{a1:#x}"
        elif kind == Kind.CUDA_LAUNCH:
            attrs.update(self._launch_attrs(pid, func, a0, a1, a2, a3))
        elif kind == Kind.CUDA_GRAPH:
            attrs.update(self._graph_attrs(pid, tid, ts, cfunc, a0, a1, a2))
        error = None
        if incomplete:
            attrs["otelbpf.incomplete"] = True
            error = f"thread {tid} exited before {fname} returned"
        elif kind != Kind.CUDA_LAUNCH:
            attrs["cuda.api.return_code"] = ret
            if ret != 0 and not (ret == _NOT_READY and cfunc in _QUERIES):
                attrs["cuda.error.name"] = error_name(fname, ret)
                error = f"{attrs['cuda.error.name']} ({ret})"
        start = self._clock.to_wall(ts)
        links: list[Link] = []
        parent, how = self._parent_of(pid, tid, ts), "thread"
        # The thread was serving a request head sampling shed, and no kept one of its own (an
        # event loop may hold a kept one open beside it, the latest read being shed: the call
        # stays that one's child): the shed request has no span, and the call belongs to none
        # other, or to an operator of it (torch, itself shed). Recorded for the agent's own
        # answers (its files, the live state: the diagnosis sees every call), never sent to a
        # trace backend, where it would be a root with no request above it.
        shed = bool(flags & FLAG_SHED) and (parent is None or not parent.trace_flags.sampled)
        if shed:
            self._proc(pid).shed_spans += 1
            attrs["otelbpf.sampling.shed"] = True
            if parent is not None:
                attrs["otelbpf.causality"] = how
        else:
            if parent is None:  # work a request handed to this thread (a pool worker)
                parent, how = self._handed(pid, tid, ts), "wakeup"
            # No single request: an event loop's or a batching engine's step serves all those in flight.
            links = [Link(c) for c in self._in_flight(pid, tid, ts)] if parent is None else []
            if links:
                attrs["otelbpf.links.in_flight"] = len(links)
                how = "link"
            if parent is not None or links:
                attrs["otelbpf.causality"] = how
        return make_span(
            fname,
            resource=self._proc(pid).resource,
            scope=SCOPE,
            start_ns=start,
            end_ns=start + dur,
            attributes=attrs,
            error=error,
            parent=parent,
            links=links,
            sampled=not shed,
        )

    def _graph_attrs(self, pid: int, tid: int, ts: int, func: CudaFunc, a0: int, a1: int, a2: int) -> dict[str, object]:
        """A graph call's handles; a graph launch's graph and the kernels it ran."""
        attrs: dict[str, object] = {}
        if func in _GRAPH:
            attrs["cuda.graph.exec"] = f"{a0:#x}"
            attrs["cuda.stream"] = f"{a2:#x}"
            launched = self._graph_launch.get((pid, tid, ts))
            if launched is not None and launched.graph_id is not None:
                attrs["cuda.graph.id"] = launched.graph_id
            v = launched.version if launched is not None else None
            if v is not None and v.kernels is not None:
                attrs["cuda.graph.kernel_count"] = len(v.kernels)
                attrs["cuda.graph.kernel_names"] = self._graph_kernel_names(pid, v)
            return attrs
        name = func.name
        if "Capture" in name:
            attrs["cuda.stream"] = f"{a0:#x}"
            if "End" in name and a1:
                attrs["cuda.graph.handle"] = f"{a1:#x}"
        # Not cuda.kernel.name nor cuda.graph.exec here: those tell a launch (report_ai.py).
        elif "KernelNodeSetParams" in name:
            if "Exec" in name:
                attrs["cuda.graph.exec_handle"] = f"{a0:#x}"
            attrs["cuda.graph.node"] = f"{a1:#x}"
            attrs["cuda.graph.node.function_address"] = f"{a2:#x}"
            f = CudaFunc.cuLaunchKernel if is_driver(func) else CudaFunc.cudaLaunchKernel
            attrs["cuda.graph.node.kernel_name"] = self._kernel_name(pid, f, a2)[0]
        elif "AddKernelNode" in name:
            attrs["cuda.graph.handle"] = f"{a0:#x}"
            if a1:
                attrs["cuda.graph.node"] = f"{a1:#x}"
            attrs["cuda.graph.node.function_address"] = f"{a2:#x}"
            f = CudaFunc.cuLaunchKernel if is_driver(func) else CudaFunc.cudaLaunchKernel
            attrs["cuda.graph.node.kernel_name"] = self._kernel_name(pid, f, a2)[0]
        elif "Instantiate" in name:
            attrs["cuda.graph.handle"] = f"{a0:#x}"
            if a1:
                attrs["cuda.graph.exec_handle"] = f"{a1:#x}"
        elif "ExecUpdate" in name:
            attrs["cuda.graph.exec_handle"] = f"{a0:#x}"
            attrs["cuda.graph.handle"] = f"{a2:#x}"
        elif "ExecDestroy" in name:
            attrs["cuda.graph.exec_handle"] = f"{a0:#x}"
        else:  # cudaGraphCreate, cudaGraphDestroy
            attrs["cuda.graph.handle"] = f"{(a1 if 'Create' in name else a0):#x}"
        return attrs

    def _graph_kernel_names(self, pid: int, v: Version) -> list[str]:
        """The distinct names of a graph version's kernels (at most _GRAPH_NAMES, in graph order),
        resolved once per version and again only when a kernel-name fact arrived since."""
        facts = self._proc(pid).kernels.facts
        if v.names is None or v.names_facts != facts:
            names: list[str] = []
            seen: set[Kernel] = set()
            for k in v.kernels or ():
                if k in seen:
                    continue
                seen.add(k)
                name = self._kernel_name(pid, k[0], k[1])[0]
                if name not in names:
                    names.append(name)
                    if len(names) == _GRAPH_NAMES:
                        break
            v.names, v.names_facts = names, facts
        return v.names

    def _launch_attrs(self, pid: int, func: int, fn: int, grid: int, block: int, stream: int) -> dict[str, object]:
        attrs: dict[str, object] = {"cuda.stream": f"{stream:#x}"}
        attrs["cuda.kernel.name"], attrs["cuda.kernel.name_source"] = self._kernel_name(pid, func, fn)
        attrs["cuda.kernel.function_address"] = f"{fn:#x}"
        for label, packed in (("grid", grid), ("block", block)):
            x, y, z = unpack_dim(packed)
            attrs[f"cuda.{label}.x"], attrs[f"cuda.{label}.y"], attrs[f"cuda.{label}.z"] = x, y, z
        if self._sample_every > 1:
            attrs["otelbpf.sample_every"] = self._sample_every
        return attrs

    def _kernel_name(self, pid: int, func: int, fn: int) -> tuple[str, str]:
        """(name, how it was found): see kernel_names.py."""
        return self._proc(pid).kernels.resolve(self._sym, pid, func, fn)

    # -- metrics ----------------------------------------------------------

    def collect(self) -> list[tuple[Resource, list[Metric]]]:
        """Cumulative metrics per process; forgets processes that exited."""
        now = self._clock.now_wall()
        launches: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
        map_keys: dict[int, list[object]] = defaultdict(list)
        for key, count in self._read_map("launches"):
            launches[key.pid].append((key.func, key.fn, count))
            map_keys[key.pid].append(key)
        launch_errors: dict[int, Counter[tuple[str, int]]] = defaultdict(Counter)
        error_keys: dict[int, list[object]] = defaultdict(list)
        for key, count in self._read_map("launch_errors"):
            launch_errors[key.pid][(CudaFunc(key.func).name, key.ret)] += count
            error_keys[key.pid].append(key)
        # The launch counts run ahead of the events that name their kernels (registrations,
        # on the ring): a collect between a program's start and the next drain named its
        # kernels by symbol, and every span after that too. Process what was emitted before
        # the read first. When that cannot be done in time (the sync timed out, counted by
        # the agent; or the agent is stopping and its final drain is still to come), this
        # export is skipped: the counts are cumulative, the next export (at the latest the
        # final one, which waits for the processing thread) carries them with their names.
        if self._sync() is False:
            return []
        out = []
        with self._lock:
            horizon = now - 60 * 10**9
            self._finished = {pid: t for pid, t in self._finished.items() if t > horizon}
            self._exited = {pid: t for pid, t in self._exited.items() if t > horizon or pid in self._procs}
            for pid in (set(launches) | set(launch_errors)) - set(self._finished):
                self._proc(pid)
            for pid, p in list(self._procs.items()):
                p.exited = p.exited or pid in self._exited
                metrics = self._process_metrics(pid, p, launches.get(pid, []), launch_errors.get(pid, Counter()), now)
                if metrics:
                    out.append((p.resource, metrics))
                if p.exited:
                    del self._procs[pid]
                    self._exited.pop(pid, None)
                    self._finished[pid] = now
                    self._forget_keys("launches", map_keys.get(pid, []))
                    self._forget_keys("launch_errors", error_keys.get(pid, []))
                    self._sym.forget(pid)
                    self._info.forget(pid)
        return out

    def _process_metrics(
        self,
        pid: int,
        p: _Process,
        launches: list[tuple[int, int, int]],
        launch_errors: Counter[tuple[str, int]],
        now: int,
    ) -> list[Metric]:
        by_func: Counter[str] = Counter()
        per_kernel: Counter[tuple[str, int]] = Counter()
        for func, fn, count in launches:
            fname = CudaFunc(func).name
            by_func[fname] += count
            if func not in _GRAPH:
                per_kernel[(fname, fn)] += count
        g = p.graphs
        # Kernels run by graph launches: (graph launch function, cuda.graph.id, (launch function, handle))
        graph_runs = g.kernel_runs() if g is not None else Counter()
        if g is not None:
            by_func.update(g.launch_calls)
            for (f, fn), c in g.uncaptured.items():  # a capturing thread's launches that ran
                by_func[CudaFunc(f).name] += c
                per_kernel[(CudaFunc(f).name, fn)] += c
        # A graph's kernels by name: one kernel recorded through two launch APIs is one point.
        graph_named: Counter[tuple[str, int, str]] = Counter()
        for (name, gid, (f, fn)), c in graph_runs.items():
            graph_named[(name, gid, self._kernel_name(pid, f, fn)[0])] += c
        ranked: list[tuple[dict[str, str | int] | tuple[str, int], int]] = list(per_kernel.items())
        ranked += [
            ({"cuda.api.function": name, "cuda.kernel.name": kname, "cuda.graph.id": gid}, c)
            for (name, gid, kname), c in graph_named.items()
        ]
        top = heapq.nlargest(self._top, ranked, key=lambda kv: kv[1])
        errors = p.errors + launch_errors
        # How each kernel launched here got its name (a self metric: the share left
        # unresolved is what an operator checks first).
        sources: Counter[str] = Counter()
        for (fname, fn), c in per_kernel.items():
            sources[self._kernel_name(pid, CudaFunc[fname], fn)[1]] += c
        graph_kernels: Counter[str] = Counter()
        for (name, _gid, (f, fn)), c in graph_runs.items():
            sources[self._kernel_name(pid, f, fn)[1]] += c
            graph_kernels[name] += c
        built = [
            m.cumulative_sum(
                "cuda.kernel.launches",
                "{launch}",
                "Kernel and graph launches (a graph's kernels in cuda.graph.kernel.launches; a launch "
                "recorded by a stream capture is not one)",
                [({"cuda.api.function": f}, c) for f, c in sorted(by_func.items())],
                p.start_ns,
                now,
            ),
            m.gauge(
                "cuda.kernel.launches.top",
                "{launch}",
                f"Launches so far of the {self._top} most launched kernels of the process (a bounded top-N); "
                "those a graph ran carry the graph launch function and cuda.graph.id",
                [
                    (
                        key
                        if isinstance(key, dict)
                        else {
                            "cuda.api.function": key[0],
                            "cuda.kernel.name": self._kernel_name(pid, CudaFunc[key[0]], key[1])[0],
                        },
                        c,
                    )
                    for key, c in top
                ],
                now,
            ),
            m.cumulative_sum(
                "cuda.api.calls",
                "{call}",
                "Completed calls of probed CUDA API functions (launches excluded)",
                [({"cuda.api.function": f}, c) for f, c in sorted(p.calls.items())],
                p.start_ns,
                now,
            ),
            m.cumulative_sum(
                "cuda.api.errors",
                "{call}",
                "CUDA API calls that returned an error",
                [
                    ({"cuda.api.function": f, "cuda.error.code": code, "cuda.error.name": error_name(f, code)}, c)
                    for (f, code), c in sorted(errors.items())
                ],
                p.start_ns,
                now,
            ),
            m.cumulative_sum(
                "cuda.memcpy.bytes",
                "By",
                "Bytes copied by successful cudaMemcpy* calls, by direction",
                [({"cuda.memcpy.direction": d}, b) for d, b in sorted(p.memcpy_bytes.items())],
                p.start_ns,
                now,
            ),
            m.cumulative_sum(
                "cuda.memcpy.host_bytes",
                "By",
                "Bytes of successful host<->device copies, by whether the host memory was page-locked (pinned) "
                "or pageable (staged through a bounce buffer: slower, and synchronous for async copies)",
                [
                    ({"cuda.memcpy.direction": d, "cuda.memcpy.host_memory": h}, b)
                    for (d, h), b in sorted(p.pinned_copy_bytes.items())
                ],
                p.start_ns,
                now,
            ),
            m.cumulative_sum(
                "otelbpf.cuda.kernel_launches.named",
                "{launch}",
                "Launches by how their kernel's name was found (registration, driver, symbol, device_stub, "
                "launch_site, unresolved)",
                [({"otelbpf.name_source": src}, c) for src, c in sorted(sources.items())],
                p.start_ns,
                now,
            ),
            m.cumulative_sum(
                "cuda.graph.kernel.launches",
                "{launch}",
                "Kernels run by graph launches that returned 0 (each launch runs each kernel of its graph once)",
                [({"cuda.api.function": f}, c) for f, c in sorted(graph_kernels.items())],
                p.start_ns,
                now,
            ),
            m.histogram(
                "cuda.sync.duration",
                "s",
                "Time the host thread waited in a synchronize call",
                [h.point({"cuda.api.function": f}, p.start_ns, now) for f, h in sorted(p.sync.items())],
            ),
        ]
        if p.high_water:  # after a first successful allocation
            built.append(
                m.gauge(
                    "cuda.memory.in_use",
                    "By",
                    "Device memory allocated through probed calls and not yet freed",
                    [({}, p.in_use)],
                    now,
                )
            )
            built.append(
                m.gauge("cuda.memory.high_water", "By", "Highest cuda.memory.in_use seen", [({}, p.high_water)], now)
            )
        if p.incomplete or p.untracked_frees:
            built.append(
                m.cumulative_sum(
                    "otelbpf.cuda.anomalies",
                    "{call}",
                    "Calls the agent could not account fully",
                    [
                        ({"reason": r}, v)
                        for r, v in (("incomplete", p.incomplete), ("untracked_free", p.untracked_frees))
                        if v
                    ],
                    p.start_ns,
                    now,
                )
            )
        if p.shed_spans:
            built.append(
                m.cumulative_sum(
                    "otelbpf.cuda.spans.shed",
                    "{span}",
                    "Spans of CUDA calls made while their thread served an HTTP request that head sampling "
                    "shed: written to the agent's own files and live state (the diagnosis counts every call), "
                    "not sent to trace backends (the calls are counted in every CUDA metric as any other)",
                    [({}, p.shed_spans)],
                    p.start_ns,
                    now,
                )
            )
        if g is not None and g.anomalies:
            built.append(
                m.cumulative_sum(
                    "otelbpf.cuda.graph.anomalies",
                    "{event}",
                    "CUDA Graphs calls the agent could not follow as made: " + ", ".join(_GRAPH_REASONS),
                    [({"reason": r}, v) for r, v in sorted(g.anomalies.items())],
                    p.start_ns,
                    now,
                )
            )
        return [x for x in built if x is not None]

    def memory_snapshot(self) -> dict[int, tuple[int, int]]:
        """pid -> (bytes in use, high-water mark); for tests and the summary."""
        with self._lock:
            return {pid: (p.in_use, p.high_water) for pid, p in self._procs.items()}
