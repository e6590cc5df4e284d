"""NCCL events -> spans, per-process metrics and live straggler findings.

Input: every drained ``EVENT_DTYPE`` batch. This correlator takes the NCCL kinds (bpf/nccl.c
documents them), the CUDA records that can observe a collective's completion (an NCCL call
only enqueues work) and process exits.

A collective has four timestamps (docs/semantic-conventions.md, "NCCL", says what each
means): *enter* (the host called it; span start), *enqueued* (it returned; inside a group,
the outermost ``ncclGroupEnd`` returned, since NCCL launches the group's work there), *sync
start* and *completion observed* (span end): the first of, after enqueued,

- a CUDA event recorded on its stream after it (``cudaEventRecord``), then found complete:
  ``cudaEventQuery`` returned 0, or ``cudaEventSynchronize`` returned (how PyTorch's
  ProcessGroupNCCL watches its work);
- a synchronize of its stream, of the device, or of a stream made to wait for such an event
  (``cudaStreamWaitEvent``, PyTorch's ``work.wait()``): the wait is on the GPU, and the
  host sees the collective done when it next synchronizes that stream. That synchronize
  also waits for the work queued behind the wait, so the span's end is only an upper bound
  of the completion (``nccl.completion.bound=upper``).

``nccl.completion.method`` says which. A collective whose completion is never observed ends at
enqueued, marked so.

Ranks and communicators: a communicator whose init was seen has its id and rank from it
(late_comms.py covers those created before the probes were attached). Every span says how
its rank was learned (``nccl.rank.source``).

Fleet signal (docs/stragglers.md): per rank and communicator, ``nccl.collective.wait``, the
time from this rank's arrival at a collective (its call's entry) to the collective's completion
as this rank knew it (the observed completion above; else the call returning, which is the
completion for a call that blocks until done). The rank every other rank waits for waits least,
so a backend compares ranks by it with no clock and no alignment; ``nccl.collective.phase``
holds what classifies the lateness (each rank's GPU wait and host time before its collectives).
Its communicator id is the same on every host (the ``ncclUniqueId``, or the launcher's job, size
and ordinal: late_comms.py), so Prometheus rules (deploy/prometheus/) compare ranks across nodes.

Live stragglers: the local ranks of a communicator are compared per (communicator id,
sequence number) when all have entered, by the adaptive test of correlate/adaptive.py
(lateness against the other ranks' spread, persistent over a window, a minimum scaled by the
collective's duration). A persistent straggler's finding goes on its span (event
``nccl.straggler``) and into the ``nccl.straggler`` metric, classified by correlate/lateness.py
from each rank's phase before the collective: the time since its previous collective
completed (``nccl.phase.duration``) and how much of it the host spent waiting on the GPU
(``nccl.phase.gpu_wait``).
"""

from __future__ import annotations

import socket
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import numpy as np
from opentelemetry.sdk.metrics.export import Metric
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.trace import SpanContext
from opentelemetry.util.types import AttributeValue

from otelbpf.base.events import FLAG_INCOMPLETE, FLAG_NCCL_UNKNOWN_COMM, CudaFunc, Kind, NcclFunc
from otelbpf.correlate import metrics as m
from otelbpf.correlate.adaptive import CommDetector, Params, Verdict
from otelbpf.correlate.base import CorrelatorBase, CorrelatorSettings
from otelbpf.correlate.lateness import UNKNOWN, classify, components
from otelbpf.correlate.spans import make_span, new_context, scope
from otelbpf.families.nccl import launch_env
from otelbpf.families.nccl.late_comms import LateComm, LateComms, Round, Signature

SCOPE = scope("otelbpf.nccl")

#: ncclDataType_t -> (name, bytes per element)
DATATYPES = {
    0: ("int8", 1),
    1: ("uint8", 1),
    2: ("int32", 4),
    3: ("uint32", 4),
    4: ("int64", 8),
    5: ("uint64", 8),
    6: ("float16", 2),
    7: ("float32", 4),
    8: ("float64", 8),
    9: ("bfloat16", 2),
    10: ("float8e4m3", 1),
    11: ("float8e5m2", 1),
}
#: ncclRedOp_t -> name; 5..0xfe are ops made by ncclRedOpCreatePreMulSum, 0xff is none.
REDUCTIONS = {0: "sum", 1: "prod", 2: "max", 3: "min", 4: "avg"}
NO_REDUCTION = 0xFF
RESULTS = {
    0: "ncclSuccess",
    1: "ncclUnhandledCudaError",
    2: "ncclSystemError",
    3: "ncclInternalError",
    4: "ncclInvalidArgument",
    5: "ncclInvalidUsage",
    6: "ncclRemoteError",
    7: "ncclInProgress",
}
IN_PROGRESS = 7

COLLECTIVES: dict[int, str] = {
    NcclFunc.ncclAllReduce: "AllReduce",
    NcclFunc.ncclAllGather: "AllGather",
    NcclFunc.ncclReduceScatter: "ReduceScatter",
    NcclFunc.ncclBroadcast: "Broadcast",
    NcclFunc.ncclReduce: "Reduce",
}
POINT_TO_POINT: dict[int, str] = {NcclFunc.ncclSend: "Send", NcclFunc.ncclRecv: "Recv"}
OPS: dict[int, str] = {**COLLECTIVES, **POINT_TO_POINT}  # looked up by the events' func codes
_ROOTED = (NcclFunc.ncclBroadcast, NcclFunc.ncclReduce)
_REDUCING = (NcclFunc.ncclAllReduce, NcclFunc.ncclReduceScatter, NcclFunc.ncclReduce)
_TIMES_NRANKS = (NcclFunc.ncclAllGather, NcclFunc.ncclReduceScatter)
_INITS = (NcclFunc.ncclCommInitRank, NcclFunc.ncclCommInitRankConfig, NcclFunc.ncclCommInitAll, NcclFunc.ncclCommSplit)
_ENDS = (NcclFunc.ncclCommDestroy, NcclFunc.ncclCommAbort)
_GROUP_CALLS = (NcclFunc.ncclGroupStart, NcclFunc.ncclGroupEnd)
_DEVICE_SYNCS = (CudaFunc.cudaDeviceSynchronize, CudaFunc.cuCtxSynchronize)
_EVENT_RECORDS = frozenset(
    {CudaFunc.cudaEventRecord, CudaFunc.cudaEventRecord_ptsz, CudaFunc.cuEventRecord, CudaFunc.cuEventRecord_ptsz}
)
_EVENT_QUERIES = frozenset({CudaFunc.cudaEventQuery, CudaFunc.cuEventQuery})
_STREAM_WAITS = frozenset(
    {
        CudaFunc.cudaStreamWaitEvent,
        CudaFunc.cudaStreamWaitEvent_ptsz,
        CudaFunc.cuStreamWaitEvent,
        CudaFunc.cuStreamWaitEvent_ptsz,
    }
)
_EVENT_CALLS = np.array(sorted(int(f) for f in _EVENT_RECORDS | _EVENT_QUERIES | _STREAM_WAITS))
_KINDS = (Kind.NCCL_ENTER, Kind.NCCL_RETURN, Kind.NCCL_COMM)
_NAMES = {int(f): f.name for f in NcclFunc}
_SYNC_NAMES = {int(f): f.name for f in CudaFunc}

#: Algorithm bandwidth, bytes per second: 1 MB/s to 1 TB/s.
BANDWIDTH_BOUNDS = (
    1e6,
    1e7,
    1e8,
    2.5e8,
    5e8,
    1e9,
    2.5e9,
    5e9,
    1e10,
    2.5e10,
    5e10,
    1e11,
    2.5e11,
    5e11,
    1e12,
)

OBSERVED = "observed"  # a synchronize on its stream returned after it was enqueued
UNOBSERVED = "unobserved"  # no synchronize came within completion_timeout
EXITED = "process_exited"  # the process ended first
FAILED = "failed"  # the call (or its group) returned an error: nothing was enqueued

#: nccl.completion.method: what observed an OBSERVED collective's completion.
EVENT_QUERY = "event_query"  # cudaEventQuery of an event recorded after it returned 0
EVENT_SYNC = "event_sync"  # cudaEventSynchronize of that event returned
STREAM_WAIT = "stream_wait"  # a stream made to wait on that event was synchronized
STREAM_SYNC = "stream_sync"  # its own stream was synchronized
DEVICE_SYNC = "device_sync"  # the device was synchronized
#: Methods whose observation may lag the completion by more than the observing call's own
#: wait: the synchronize of a stream made to wait also waits for that stream's later work, so
#: the collective ended at some time between its enqueue and ``completed`` (docs/design-notes.md).
UPPER_BOUND = frozenset({STREAM_WAIT})

#: nccl.comm.source of a communicator created before the probes (late_comms.py): its
#: collectives placed in rounds across ranks; not placed (yet: the placement was ambiguous, or
#: contradicted); two processes claiming one rank.
ALIGNED, UNALIGNED, CONFLICTED = "aligned", "unaligned", "conflicted"

#: nccl.rank.source for a communicator whose init was seen
FROM_INIT = "init"

#: nccl.collective.wait buckets, seconds: 10 us (the last rank's own transfer) to 60 s.
COLLECTIVE_WAIT_BOUNDS = (
    *(1e-5, 1e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2),
    *(0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0),
)
#: A collective call on a communicator created before the probes that lasted this long did not
#: only enqueue: the library returns at completion (a blocking wait, a CPU backend). Seen
#: ``BLOCKING_EVIDENCE`` times in a late group, its ranks' returns are their completions.
BLOCKING_CALL_NS = 1_000_000
BLOCKING_EVIDENCE = 3
#: Launcher jobs whose world size is remembered (to count ranks that disagree on it).
MAX_JOBS = 4096


def _rank(packed: int) -> tuple[int, int]:
    """(rank, nranks) from ``rank | nranks << 32`` (0xffffffff: unknown, -1)."""
    rank, nranks = packed & 0xFFFFFFFF, packed >> 32
    return (-1 if rank == 0xFFFFFFFF else rank), (-1 if nranks == 0xFFFFFFFF else nranks)


def comm_hex(comm_id: int) -> str:
    return f"{comm_id:016x}"


@dataclass(slots=True, eq=False)
class _Call:
    """One NCCL call, from its entry until its span is built. Times are CLOCK_MONOTONIC ns."""

    func: int
    pid: int
    tid: int
    enter: int
    comm: int = 0  # the communicator's id; its address when not known
    known: bool = True  # the communicator's init was seen
    seq: int = 0
    rank: int = -1
    nranks: int = -1
    count: int = 0
    dtype: int = 0
    op: int = NO_REDUCTION
    root: int = -1  # root (broadcast, reduce) or peer (send, recv)
    stream: int = 0
    parent: int = 0  # ncclCommSplit: the parent communicator's id
    returned: int | None = None
    ret: int = 0
    enqueued: int | None = None
    sync_start: int | None = None
    sync_func: int = 0
    completed: int | None = None
    completion: str = ""
    method: str = ""  # nccl.completion.method
    event: int = 0  # the CUDA event recorded after it, if any
    waiters: set[int] = field(default_factory=set)  # streams made to wait on that event
    rank_source: str = ""
    late: LateComm | None = None  # its communicator predates the probes
    round: Round | None = None  # the late communicator's round it was placed in
    signature: Signature = ()
    last_enter: int | None = None  # the last local rank's entry, once compared
    phase: int | None = None  # since the process's previous collective completed
    gpu_wait: int = 0  # of that, time in synchronize calls
    group: _Group | None = None
    finding: dict[str, AttributeValue] | None = None
    incomplete: bool = False
    done: bool = False

    @property
    def enqueued_ns(self) -> int:
        """When it was enqueued: set for every call in a process's ``pending``, bound to an event or waited on."""
        assert self.enqueued is not None, "a pending NCCL call has no enqueue time"
        return self.enqueued

    @property
    def end(self) -> int:
        for t in (self.completed, self.enqueued, self.returned):
            if t is not None:
                return t
        return self.enter

    def observed(self) -> tuple[int, int, int]:
        """(enqueued, sync_start, completed): set together once its completion was observed."""
        if self.enqueued is None or self.sync_start is None or self.completed is None:
            raise RuntimeError(f"NCCL call of pid {self.pid} at {self.enter} has no observed completion")
        return self.enqueued, self.sync_start, self.completed

    @property
    def bytes(self) -> int:
        """The message size nccl-tests reports (and divides by time for algorithm bandwidth):
        all-gather and reduce-scatter count every rank's part, where the size is known."""
        size = self.count * DATATYPES.get(self.dtype, ("", 1))[1]
        if self.func in _TIMES_NRANKS and self.nranks > 0:
            size *= self.nranks
        return size


@dataclass(slots=True, eq=False)
class _Group:
    """ncclGroupStart .. the outermost ncclGroupEnd on one thread, and the calls in between."""

    pid: int
    tid: int
    start: int
    members: list[_Call] = field(default_factory=list)
    end: int | None = None  # the outermost ncclGroupEnd returned
    ret: int = 0
    exited: bool = False
    emitted: bool = False


@dataclass
class _Process:
    resource: Resource
    start_ns: int
    open: dict[int, list[_Call]] = field(default_factory=lambda: defaultdict(list))  # tid -> stack of open calls
    depth: Counter[int] = field(default_factory=Counter)  # tid -> group nesting
    groups: dict[int, _Group] = field(default_factory=dict)  # tid -> open outermost group
    pending: list[_Call] = field(default_factory=list)  # enqueued, completion not yet seen
    comms: dict[int, int] = field(default_factory=dict)  # comm id -> rank
    comm_source: dict[int, str] = field(default_factory=dict)  # comm id -> how its rank is known
    events: dict[int, list[_Call]] = field(default_factory=dict)  # CUDA event -> calls recorded behind
    launch: launch_env.Launch | None = None
    last_done: int | None = None  # the last collective's completion (or enqueue): the phase start
    gpu_wait: int = 0  # synchronize time since last_done
    calls: Counter[str] = field(default_factory=Counter)  # op -> collectives
    bytes: Counter[str] = field(default_factory=Counter)  # op -> bytes
    errors: Counter[tuple[str, str]] = field(default_factory=Counter)  # (function, result) -> calls
    wait: dict[str, m.HistogramState] = field(default_factory=lambda: defaultdict(m.HistogramState))  # by op
    bandwidth: dict[str, m.HistogramState] = field(
        default_factory=lambda: defaultdict(lambda: m.HistogramState(BANDWIDTH_BOUNDS))
    )  # by op
    stragglers: Counter[tuple[str, str]] = field(default_factory=Counter)  # (comm hex, class) -> findings
    lateness: dict[str, m.HistogramState] = field(default_factory=lambda: defaultdict(m.HistogramState))  # by class
    anomalies: Counter[str] = field(default_factory=Counter)  # reason -> calls
    #: (comm hex, rank) -> nccl.collective.wait; (comm hex, rank, part) -> nccl.collective.phase seconds
    rank_wait: dict[tuple[str, int], m.HistogramState] = field(
        default_factory=lambda: defaultdict(lambda: m.HistogramState(COLLECTIVE_WAIT_BOUNDS))
    )
    rank_phase: dict[tuple[str, int, str], float] = field(default_factory=lambda: defaultdict(float))
    #: (histogram, its key) -> values of this batch, added to the histograms at its end
    samples: dict[tuple[str, Hashable], list[float]] = field(default_factory=lambda: defaultdict(list))
    exited: bool = False

    def flush_samples(self) -> None:
        for (which, label), values in self.samples.items():
            getattr(self, which)[label].add(np.asarray(values))
        self.samples.clear()

    def rank_labels(self, comm: str, rank: int) -> dict[str, AttributeValue]:
        """The fleet signal's attributes: a rule groups by communicator and names the rank, its
        host and pod without joining the resource (Mimir keeps resource attributes apart)."""
        attrs: dict[str, AttributeValue] = {"nccl.comm.id": comm, "nccl.rank": rank}
        if self.launch is not None:
            attrs["nccl.job.id"] = self.launch.job
        for key in ("host.name", "k8s.pod.name"):
            v = self.resource.attributes.get(key)
            if isinstance(v, str) and v:
                attrs[key] = v
        return attrs


class NcclCorrelator(CorrelatorBase[_Process]):
    scope = SCOPE

    def __init__(
        self,
        settings: CorrelatorSettings,
        *,
        straggler_threshold_ns: int = 1_000_000,
        straggler_params: Params | None = None,
        completion_timeout_ns: int = 30_000_000_000,
        max_spans_per_second: int = 20_000,
        on_sampled_out: Callable[[int], None] = lambda n: None,
        parent_of: Callable[[int, int, int], SpanContext | None] = lambda pid, tid, ts: None,
        launch_of: Callable[[int], launch_env.Launch | None] = launch_env.read,
        host: str | None = None,
    ) -> None:
        """``straggler_threshold_ns``: the adaptive test's floor (correlate/adaptive.py); lateness
        must also beat the other ranks' spread and a share of the collective's duration."""
        super().__init__(settings, max_spans_per_second=max_spans_per_second)
        self._params = straggler_params or Params(floor_ns=straggler_threshold_ns)
        self._detectors: dict[int, CommDetector[tuple[int, int]]] = {}  # comm id -> detector of (pid, rank)
        self._launch_of = launch_of
        self._late = LateComms(host or socket.gethostname())
        self._world_sizes: dict[str, int] = {}  # launcher job -> the world size its first rank was given
        self._timeout = completion_timeout_ns
        self._on_sampled_out = on_sampled_out
        self._parent_of = parent_of
        #: comm id -> local (pid, rank) -> the first seq it takes part in
        self._members: dict[int, dict[tuple[int, int], int]] = defaultdict(dict)
        self._arrivals: dict[tuple[int, int], dict[tuple[int, int], _Call]] = {}  # (comm, seq) -> ...
        self._ready: list[list[ReadableSpan]] = []  # built this batch: a span, or a group and its calls
        self._now = 0

    # -- events -----------------------------------------------------------

    def on_strings(self, arr: np.ndarray) -> None:
        """NCCL sends no strings."""

    def on_events(self, arr: np.ndarray) -> None:
        kinds = arr["kind"]
        mine = (kinds >= _KINDS[0]) & (kinds <= _KINDS[-1])
        if not mine.any() and not self._procs:
            return
        # Synchronizes and exits matter only for processes that call NCCL (seen before or now).
        pids = np.union1d(np.fromiter(self._procs, dtype=np.uint32, count=len(self._procs)), arr["pid"][mine])
        events = (kinds == Kind.CUDA_CALL) & np.isin(arr["func"], _EVENT_CALLS)
        related = ((kinds == Kind.CUDA_SYNC) | (kinds == Kind.PROC_EXIT) | events) & np.isin(arr["pid"], pids)
        with self._lock:
            for rec in arr[mine | related].tolist():
                self._dispatch(rec)
            self._expire()
            for p in self._procs.values():
                p.flush_samples()
            ready, self._ready = self._ready, []
        spans: list[ReadableSpan] = []
        for unit in ready:
            granted = self._budget.take(len(unit))
            if granted < len(unit):
                self._on_sampled_out(len(unit))
                continue
            spans.extend(unit)
        self._send(spans)

    def _new_process(self, pid: int, resource: Resource, start_ns: int) -> _Process:
        """A process of a job whose ranks disagree on the world size is counted
        (``world_size_disagrees``): its communicators sized from it are groups of their own."""
        p = _Process(resource, start_ns, launch=self._launch_of(pid))
        if p.launch is not None and p.launch.world_size > 0:
            first = self._world_sizes.setdefault(p.launch.job, p.launch.world_size)
            while len(self._world_sizes) > MAX_JOBS:  # the oldest jobs are long over
                del self._world_sizes[next(iter(self._world_sizes))]
            if first != p.launch.world_size:
                p.anomalies["world_size_disagrees"] += 1
        return p

    def _dispatch(self, rec: tuple[int, ...]) -> None:  # a row of the ring buffer's record array
        ts, dur, pid, tid, kind, func, flags, ret, a0, a1, a2, a3 = rec
        self._now = max(self._now, ts)
        if kind == Kind.NCCL_ENTER:
            self._enter(ts, dur, pid, tid, func, flags, ret, a0, a1, a2, a3)
        elif kind == Kind.NCCL_RETURN:
            self._return(ts, pid, tid, func, ret)
        elif kind == Kind.NCCL_COMM:
            if flags & FLAG_NCCL_UNKNOWN_COMM:
                self._late.learn(pid, a0, *_rank(a2))
            else:
                self._comm(pid, tid, func, a1, a2, a3)
        elif kind == Kind.CUDA_SYNC:
            if not flags & FLAG_INCOMPLETE and ret == 0:
                self._sync(ts, dur, pid, func, a0, bool(a1))
        elif kind == Kind.CUDA_CALL:
            if not flags & FLAG_INCOMPLETE and ret == 0:
                self._event_call(ts, dur, pid, func, a0, a2)
        elif kind == Kind.PROC_EXIT:
            self._exit(ts, pid)

    def _enter(
        self,
        ts: int,
        packed_rank: int,
        pid: int,
        tid: int,
        func: int,
        flags: int,
        ret: int,
        a0: int,
        a1: int,
        a2: int,
        a3: int,
    ) -> None:
        p = self._proc(pid)
        rank, nranks = _rank(packed_rank)
        call = _Call(func, pid, tid, ts, comm=a0, known=not flags & FLAG_NCCL_UNKNOWN_COMM, rank=rank, nranks=nranks)
        if call.known and rank >= 0:
            call.rank_source = p.comm_source.get(a0, FROM_INIT)
        if func == NcclFunc.ncclGroupStart:
            p.depth[tid] += 1
            if p.depth[tid] == 1:
                p.groups[tid] = _Group(pid, tid, ts)
        elif func in OPS:
            call.seq = a1 if call.known else 0
            call.count, call.dtype, call.op = a2 & 0xFFFFFFFFFFFF, (a2 >> 48) & 0xFF, a2 >> 56
            call.root, call.stream = ret, a3
            if p.last_done is not None:
                call.phase, call.gpu_wait = ts - p.last_done, p.gpu_wait
            call.group = p.groups.get(tid)
            if call.group is not None:
                call.group.members.append(call)
            if func in COLLECTIVES and call.known:
                self._arrive(call)
            elif func in COLLECTIVES and a0:
                self._late.identify(call, a0, p.launch, p.anomalies)
                if self._late.enter(call, (func, call.count, call.dtype, call.op, call.root), p.anomalies):
                    self._arrive(call)
        elif func in _ENDS and call.known and a0 in p.comms:
            self._leave(a0, (pid, p.comms.pop(a0)))
        elif func == NcclFunc.ncclCommSplit:
            call.parent = a3
        p.open[tid].append(call)

    def _return(self, ts: int, pid: int, tid: int, func: int, ret: int) -> None:
        p = self._procs.get(pid)
        if p is None:
            return
        stack = p.open.get(tid)
        if not stack or all(c.func != func for c in stack):
            p.anomalies["return_without_entry"] += 1  # attached while the call was running
            return
        while stack[-1].func != func:  # calls above it lost their return record
            lost = stack.pop()
            p.anomalies["return_lost"] += 1
            self._finish(p, lost, FAILED)
        call = stack.pop()
        call.returned, call.ret = ts, ret
        if func == NcclFunc.ncclGroupStart:
            return
        if func == NcclFunc.ncclGroupEnd:
            self._group_end(p, tid, ts, ret)
            return
        if func in OPS:
            p.calls[OPS[func]] += 1
            if ret not in (0, IN_PROGRESS):
                self._finish(p, call, FAILED)
            elif call.group is None:
                self._enqueued(p, call, ts)
                self._late_returned(p, call)
            return
        if func in _INITS and ret in (0, IN_PROGRESS):
            p.last_done, p.gpu_wait = ts, 0  # init waits for every rank: the first phase starts here
        self._finish(p, call, "")

    def _group_end(self, p: _Process, tid: int, ts: int, ret: int) -> None:
        if p.depth[tid] == 0:
            return
        p.depth[tid] -= 1
        if p.depth[tid]:
            return
        group = p.groups.pop(tid)
        group.end, group.ret = ts, ret
        for call in group.members:
            if call.done:
                continue
            if ret not in (0, IN_PROGRESS) or call.returned is None:
                self._finish(p, call, FAILED)
            else:
                self._enqueued(p, call, ts)
                self._late_returned(p, call)
        self._group_done(group)

    def _enqueued(self, p: _Process, call: _Call, ts: int) -> None:
        call.enqueued = ts
        p.pending.append(call)
        p.last_done, p.gpu_wait = ts, 0
        p.bytes[OPS[call.func]] += call.bytes

    def _late_returned(self, p: _Process, call: _Call) -> None:
        """A collective on a communicator created before the probes returned. Where its group's
        library returns at completion (``BLOCKING_CALL_NS``), the return is the completion: the
        rank's collectives are placed in rounds without any synchronize, oldest first."""
        lc = call.late
        if lc is None:
            return
        group = lc.joined()
        if call.enqueued_ns - call.enter >= BLOCKING_CALL_NS:
            group.blocking_calls += 1
        if group.blocking_calls < BLOCKING_EVIDENCE:
            return
        if call.round is not None:
            call.completed = call.enqueued_ns
            self._late.completed(call, p.anomalies)
        while lc.waiting:
            head = lc.waiting[0]
            assert isinstance(head, _Call)  # LateComms holds the calls it was given
            if head.enqueued is None:
                break  # not returned yet: it completes at its return
            head.completed = head.enqueued
            for placed in self._late.completed(head, p.anomalies):
                assert isinstance(placed, _Call)
                self._arrive(placed)

    def _comm(self, pid: int, tid: int, func: int, comm_id: int, packed_rank: int, parent: int) -> None:
        p = self._proc(pid)
        rank, nranks = _rank(packed_rank)
        if func == NcclFunc.ncclCommUserRank:
            p.comm_source[comm_id] = "ncclCommUserRank"
        stack = p.open.get(tid)
        if func in _INITS and stack and stack[-1].func == func:
            call = stack[-1]
            call.comm, call.nranks = comm_id, nranks
            if rank >= 0 or func != NcclFunc.ncclCommInitAll:
                call.rank = rank
        if func == NcclFunc.ncclCommInitAll:
            for r in range(nranks):
                self._join(pid, p, comm_id, r)
        else:
            self._join(pid, p, comm_id, rank)

    def _join(self, pid: int, p: _Process, comm_id: int, rank: int) -> None:
        old = p.comms.get(comm_id)
        if old is not None and old != rank:
            self._members[comm_id].pop((pid, old), None)  # a split's rank, learned after its init
        p.comms[comm_id] = rank
        self._members[comm_id].setdefault((pid, rank), 0)

    def _leave(self, comm_id: int, member: tuple[int, int]) -> None:
        members = self._members.get(comm_id)
        if members is None:
            return
        members.pop(member, None)
        detector = self._detectors.get(comm_id)
        if detector is not None:
            detector.forget(member)
        if not members:
            del self._members[comm_id]
            self._detectors.pop(comm_id, None)
        for key in [k for k in self._arrivals if k[0] == comm_id]:
            self._check_arrivals(key)

    def _sync(self, ts: int, dur: int, pid: int, func: int, target: int, is_event: bool) -> None:
        """A synchronize returned: of an event (``target``), of a stream, or of the device."""
        p = self._procs.get(pid)
        if p is None:  # before the process's first NCCL call in this batch
            return
        if is_event:
            observed, method = [c for c in p.events.pop(target, ()) if not c.done], EVENT_SYNC
        elif func in _DEVICE_SYNCS:
            observed, method = [c for c in p.pending if c.enqueued_ns <= ts], DEVICE_SYNC
        else:
            observed = [c for c in p.pending if c.enqueued_ns <= ts and (c.stream == target or target in c.waiters)]
            method = STREAM_SYNC
        self._observed(p, observed, ts, dur, func, method, target)

    def _event_call(self, ts: int, dur: int, pid: int, func: int, event: int, stream: int) -> None:
        """cudaEventRecord binds the collectives enqueued on its stream to the event;
        cudaEventQuery returning 0 observes them; cudaStreamWaitEvent makes ``stream`` wait."""
        p = self._procs.get(pid)
        if p is None:
            return
        if func in _EVENT_RECORDS:
            behind = [c for c in p.events.pop(event, ()) if not c.done]
            behind += [
                c
                for c in p.pending
                if c.enqueued_ns <= ts and c not in behind and (c.stream == stream or stream in c.waiters)
            ]
            if behind:
                p.events[event] = behind
                for c in behind:
                    c.event = event
        elif func in _EVENT_QUERIES:
            observed = [c for c in p.events.pop(event, ()) if not c.done]
            if observed:
                self._observed(p, observed, ts, dur, func, EVENT_QUERY, event)
        elif func in _STREAM_WAITS:
            for c in p.events.get(event, ()):
                c.waiters.add(stream)

    def _observed(
        self, p: _Process, observed: list[_Call], ts: int, dur: int, func: int, method: str, target: int
    ) -> None:
        if not observed:
            if func not in _EVENT_QUERIES:
                p.gpu_wait += dur
            return
        end = ts + dur
        for call in observed:
            call.sync_start, call.sync_func, call.completed = ts, func, end
            call.method = method
            if method == STREAM_SYNC and call.stream != target:
                call.method = STREAM_WAIT
            p.pending.remove(call)
            if call.late is not None:
                for placed in self._late.completed(call, p.anomalies):
                    assert isinstance(placed, _Call)  # LateComms hands back the calls it was given
                    self._arrive(placed)
            self._finish(p, call, OBSERVED)
        p.last_done, p.gpu_wait = end, 0

    def _exit(self, ts: int, pid: int) -> None:
        p = self._procs.get(pid)
        if p is None:
            return
        p.exited = True
        for stack in p.open.values():
            for call in stack:
                call.incomplete = True
                call.returned = ts
                self._finish(p, call, EXITED if call.func in OPS else "")
        p.open.clear()
        for call in list(p.pending):
            call.completed = None
            self._finish(p, call, EXITED)
        p.pending.clear()
        for group in p.groups.values():
            group.exited = True
            group.end = ts
            for call in group.members:
                if not call.done:
                    self._finish(p, call, EXITED)
            self._group_done(group)
        p.groups.clear()
        for comm_id, rank in list(p.comms.items()):
            self._leave(comm_id, (pid, rank))
        p.comms.clear()
        self._late.exited(pid)
        p.events.clear()

    def _expire(self) -> None:
        """Collectives nobody synchronized on within the timeout; stale straggler groups."""
        horizon = self._now - self._timeout
        for p in self._procs.values():
            stale = [c for c in p.pending if c.enqueued_ns < horizon]
            for call in stale:
                p.pending.remove(call)
                self._finish(p, call, UNOBSERVED)
        for key in [k for k, v in self._arrivals.items() if min(c.enter for c in v.values()) < horizon]:
            del self._arrivals[key]

    # -- live stragglers --------------------------------------------------

    def _arrive(self, call: _Call) -> None:
        """Record a local rank's entry; compare once every local member has entered. A rank
        that left the communicator after entering this collective still counts in it. A
        rank whose communicator predates the probes is a member from its first placed round."""
        members = self._members.get(call.comm, {})
        key, who = (call.comm, call.seq), (call.pid, call.rank)
        if call.late is not None:
            if call.late.joined().conflicted:
                return
            p = self._procs[call.pid]
            if call.comm not in p.comms:
                p.comms[call.comm] = call.rank
                members = self._members[call.comm]
                members[who] = call.seq
        if (
            key not in self._arrivals
            and (len(members) < 2 or who not in members)
            and (call.late is None or who not in members)
        ):
            return
        self._arrivals.setdefault(key, {})[who] = call
        self._check_arrivals(key)

    def _check_arrivals(self, key: tuple[int, int]) -> None:
        arrived = self._arrivals.get(key)
        members = self._members.get(key[0], {})
        if arrived is None or any(first <= key[1] and m not in arrived for m, first in members.items()):
            return
        del self._arrivals[key]
        if len(arrived) < 2:
            return
        detector = self._detectors.get(key[0])
        if detector is None:
            detector = self._detectors[key[0]] = CommDetector(self._params)
        last_enter = max(c.enter for c in arrived.values())
        for c in arrived.values():
            c.last_enter = last_enter
        for verdict in detector.add({who: c.enter for who, c in arrived.items()}):
            if verdict.persistent:
                self._straggled(
                    arrived[verdict.member], [c for w, c in arrived.items() if w != verdict.member], verdict
                )

    def _straggled(self, late: _Call, others: list[_Call], verdict: Verdict[tuple[int, int]]) -> None:
        finding: dict[str, AttributeValue] = {
            "nccl.straggler.lateness": verdict.deviation_ns / 1e9,
            "nccl.straggler.threshold": verdict.threshold_ns / 1e9,
            "nccl.straggler.spread": verdict.spread_ns / 1e9,
            "nccl.straggler.late_in_window": verdict.late_in_window,
            "nccl.straggler.window": verdict.window,
            "nccl.straggler.peers": len(others),
        }
        cls = UNKNOWN
        phases = [c.phase for c in others if c.phase is not None]
        if late.phase is not None and len(phases) == len(others):
            n = len(others)
            compute, host, communication = components(
                late.enter,
                late.phase,
                late.gpu_wait,
                sum(c.enter for c in others) / n,
                sum(phases) / n,
                sum(c.gpu_wait for c in others) / n,
            )
            cls = classify(compute, host, communication)
            finding.update(
                {
                    "nccl.straggler.compute": compute / 1e9,
                    "nccl.straggler.host": host / 1e9,
                    "nccl.straggler.communication": communication / 1e9,
                }
            )
        finding["nccl.straggler.class"] = cls
        if not late.done:
            late.finding = finding
        p = self._procs[late.pid]
        p.stragglers[(comm_hex(late.comm), cls)] += 1
        p.samples[("lateness", cls)].append(verdict.deviation_ns / 1e9)

    # -- spans --------------------------------------------------------------

    def _finish(self, p: _Process, call: _Call, completion: str) -> None:
        call.done = True
        call.completion = completion
        if call.late is not None and completion != OBSERVED:
            self._late.dropped(call)
        if completion == OBSERVED and call.last_enter is not None and call.comm in self._detectors:
            self._detectors[call.comm].note_duration(call.observed()[2] - call.last_enter)
        if call.func in OPS:
            name = _NAMES[call.func]
            if completion == FAILED and call.ret not in (0, IN_PROGRESS):
                p.errors[(name, RESULTS.get(call.ret, str(call.ret)))] += 1
            if call.incomplete:
                p.anomalies["incomplete"] += 1
            if call.func in COLLECTIVES and completion in (OBSERVED, UNOBSERVED):
                self._rank_signal(p, call, completion)
            if completion == OBSERVED:
                op = OPS[call.func]
                enqueued, _, completed = call.observed()
                p.samples[("wait", op)].append((completed - enqueued) / 1e9)
                elapsed = completed - call.enter
                if elapsed > 0 and call.bytes:
                    p.samples[("bandwidth", op)].append(call.bytes * 1e9 / elapsed)
        elif call.ret not in (0, IN_PROGRESS):
            p.errors[(_NAMES[call.func], RESULTS.get(call.ret, str(call.ret)))] += 1
        if call.group is not None:
            self._group_done(call.group)
        elif call.func not in _GROUP_CALLS:
            parent = self._parent_of(call.pid, call.tid, call.enter)
            self._ready.append([self._span(p, call, parent)])

    def _rank_signal(self, p: _Process, call: _Call, completion: str) -> None:
        """``nccl.collective.wait`` and ``nccl.collective.phase`` of a collective whose rank and
        communicator are known: from arrival (entry) to the completion as this rank knew it, the
        observed one, else its return (the completion of a call that blocks until done; the
        enqueue of one nobody waited for, as short on every rank). Two jobs the environment
        cannot tell apart (``conflicted``) are left out."""
        if call.rank < 0 or not call.comm or not (call.known or call.late is not None):
            return
        if call.late is not None and call.late.joined().conflicted:
            return
        end = call.observed()[2] if completion == OBSERVED else call.enqueued_ns
        key = (comm_hex(call.comm), call.rank)
        p.samples[("rank_wait", key)].append(max(end - call.enter, 0) / 1e9)
        if call.phase is not None:
            p.rank_phase[(*key, "gpu_wait")] += call.gpu_wait / 1e9
            p.rank_phase[(*key, "host")] += max(call.phase - call.gpu_wait, 0) / 1e9

    def _group_done(self, group: _Group) -> None:
        if group.emitted or group.end is None or not all(c.done for c in group.members):
            return
        group.emitted = True
        p = self._procs[group.pid]
        ctx = new_context()
        parent = self._parent_of(group.pid, group.tid, group.start)
        if parent is not None:
            ctx = new_context(parent.trace_id)
        children = [self._span(p, c, ctx) for c in group.members]
        end = max([group.end, *(c.end for c in group.members)])
        attrs: dict[str, object] = {"nccl.group.size": len(group.members), "thread.id": group.tid}
        error = None
        if group.exited:
            attrs["otelbpf.incomplete"] = True
            error = "the process exited inside the group"
        else:
            attrs["nccl.result"] = RESULTS.get(group.ret, str(group.ret))
            if group.ret not in (0, IN_PROGRESS):
                error = f"ncclGroupEnd returned {attrs['nccl.result']} ({group.ret})"
        start = self._clock.to_wall(group.start)
        span = make_span(
            "ncclGroup",
            resource=p.resource,
            scope=SCOPE,
            start_ns=start,
            end_ns=self._clock.to_wall(end),
            attributes=attrs,
            error=error,
            parent=parent,
            context=ctx,
        )
        self._ready.append([span, *children])

    def _span(self, p: _Process, call: _Call, parent: SpanContext | None) -> ReadableSpan:
        name = _NAMES[call.func]
        attrs: dict[str, object] = {"thread.id": call.tid}
        if call.late is not None:
            attrs["nccl.comm.address"] = f"{call.late.pointer:#x}"  # created before the probes were attached
            attrs["nccl.comm.id"] = comm_hex(call.comm)
            attrs["nccl.comm.source"] = (
                CONFLICTED if call.late.joined().conflicted else ALIGNED if call.round is not None else UNALIGNED
            )
        elif call.known and call.comm:
            attrs["nccl.comm.id"] = comm_hex(call.comm)
            attrs["nccl.comm.source"] = FROM_INIT
        elif call.comm:
            attrs["nccl.comm.address"] = f"{call.comm:#x}"
        if call.rank >= 0:
            attrs["nccl.rank"] = call.rank
            if call.rank_source:
                attrs["nccl.rank.source"] = call.rank_source
        if call.nranks >= 0:
            attrs["nccl.nranks"] = call.nranks
        if call.func in OPS:
            attrs.update(self._op_attrs(call))
        elif call.func == NcclFunc.ncclCommSplit and call.parent:
            attrs["nccl.comm.parent_id"] = comm_hex(call.parent)
        error = None
        if call.incomplete:
            attrs["otelbpf.incomplete"] = True
            error = f"the process exited during {name}"
        else:
            attrs["nccl.result"] = RESULTS.get(call.ret, str(call.ret))
            if call.ret not in (0, IN_PROGRESS):
                error = f"{name} returned {attrs['nccl.result']} ({call.ret})"
            elif call.completion == FAILED:
                error = "the group this call was in failed"
        events = []
        if call.finding:
            events.append(Event("nccl.straggler", call.finding, timestamp=self._clock.to_wall(call.enter)))
        return make_span(
            name,
            resource=p.resource,
            scope=SCOPE,
            start_ns=self._clock.to_wall(call.enter),
            end_ns=self._clock.to_wall(call.end),
            attributes=attrs,
            error=error,
            parent=parent,
            events=events,
        )

    def _op_attrs(self, call: _Call) -> dict[str, object]:
        attrs: dict[str, object] = {
            "nccl.op": OPS[call.func],
            "nccl.count": call.count,
            "nccl.datatype": DATATYPES.get(call.dtype, (f"type{call.dtype}", 1))[0],
            "nccl.bytes": call.bytes,
            "cuda.stream": f"{call.stream:#x}",
            "nccl.completion": call.completion,
        }
        if call.known and call.seq:
            attrs["nccl.seq"] = call.seq
        if call.func in _REDUCING:
            attrs["nccl.reduction"] = REDUCTIONS.get(call.op, "custom")
        if call.func in _ROOTED:
            attrs["nccl.root"] = call.root
        elif call.func in POINT_TO_POINT:
            attrs["nccl.peer"] = call.root
        if call.returned is not None:
            attrs["nccl.enqueue.duration"] = (call.returned - call.enter) / 1e9
        if call.enqueued is not None:
            attrs["nccl.enqueue.time_unix_nano"] = self._clock.to_wall(call.enqueued)
        if call.event:
            attrs["cuda.event"] = f"{call.event:#x}"
        if call.completion == OBSERVED:
            enqueued, sync_start, completed = call.observed()
            attrs["nccl.completion.method"] = call.method
            if call.method in UPPER_BOUND:
                attrs["nccl.completion.bound"] = "upper"
            attrs["nccl.wait.duration"] = (completed - enqueued) / 1e9
            attrs["nccl.sync.function"] = _SYNC_NAMES[call.sync_func]
            attrs["nccl.sync.duration"] = (completed - sync_start) / 1e9
        if call.phase is not None:
            attrs["nccl.phase.duration"] = call.phase / 1e9
            attrs["nccl.phase.gpu_wait"] = call.gpu_wait / 1e9
        return attrs

    # -- metrics ----------------------------------------------------------

    def collect(self) -> list[tuple[Resource, list[Metric]]]:
        """Cumulative metrics per process; forgets processes that exited."""
        now = self._clock.now_wall()
        out = []
        with self._lock:
            for pid, p in list(self._procs.items()):
                metrics = [x for x in self._metrics(p, now) if x is not None]
                if metrics:
                    out.append((p.resource, metrics))
                if p.exited:
                    del self._procs[pid]
        return out

    def _metrics(self, p: _Process, now: int) -> list[Metric | None]:
        start = p.start_ns
        return [
            m.cumulative_sum(
                "nccl.collectives",
                "{call}",
                "NCCL collective and send/recv calls that returned, by operation",
                [({"nccl.op": op}, n) for op, n in sorted(p.calls.items())],
                start,
                now,
            ),
            m.cumulative_sum(
                "nccl.bytes",
                "By",
                "Bytes of NCCL operations enqueued (nccl-tests' message size), by operation",
                [({"nccl.op": op}, n) for op, n in sorted(p.bytes.items())],
                start,
                now,
            ),
            m.cumulative_sum(
                "nccl.errors",
                "{call}",
                "NCCL calls that returned an error",
                [({"nccl.function": f, "nccl.result": r}, n) for (f, r), n in sorted(p.errors.items())],
                start,
                now,
            ),
            m.histogram(
                "nccl.wait.duration",
                "s",
                "From enqueue to observed completion (the synchronize that saw it returned), by operation",
                [h.point({"nccl.op": op}, start, now) for op, h in sorted(p.wait.items())],
            ),
            m.histogram(
                "nccl.algorithm.bandwidth",
                "By/s",
                "Bytes / (observed completion - call entry): nccl-tests' algorithm bandwidth, from the host",
                [h.point({"nccl.op": op}, start, now) for op, h in sorted(p.bandwidth.items())],
            ),
            m.cumulative_sum(
                "nccl.straggler",
                "{collective}",
                "Collectives this rank entered persistently late, by the adaptive test (correlate/adaptive.py)",
                [
                    ({"nccl.comm.id": comm, "nccl.straggler.class": cls}, n)
                    for (comm, cls), n in sorted(p.stragglers.items())
                ],
                start,
                now,
            ),
            m.histogram(
                "nccl.straggler.lateness",
                "s",
                "How late this rank entered the collectives it straggled on",
                [h.point({"nccl.straggler.class": cls}, start, now) for cls, h in sorted(p.lateness.items())],
            ),
            m.histogram(
                "nccl.collective.wait",
                "s",
                "From this rank's arrival at a collective to its completion as this rank knew it: "
                "the rank the others wait for waits least (docs/stragglers.md)",
                [h.point(p.rank_labels(*key), start, now) for key, h in sorted(p.rank_wait.items())],
            ),
            m.cumulative_sum(
                "nccl.collective.phase",
                "s",
                "Before this rank's collectives: time its host waited on the GPU (gpu_wait) and the rest (host)",
                [
                    ({**p.rank_labels(comm, rank), "nccl.phase.part": part}, v)
                    for (comm, rank, part), v in sorted(p.rank_phase.items())
                ],
                start,
                now,
            ),
            m.cumulative_sum(
                "otelbpf.nccl.anomalies",
                "{call}",
                "NCCL calls the agent could not account fully",
                [({"reason": r}, n) for r, n in sorted(p.anomalies.items())],
                start,
                now,
            ),
        ]
