"""CUDA Graphs, per process: what each executable graph runs, and what its launches ran.

Fed, in time order, with a process's ``Kind.CUDA_GRAPH`` calls (capture, construction,
instantiation, update, destruction, launch), the launches its threads made while capturing
(``Kind.CUDA_CAPTURED``), and the stream events and synchronizes that tell which streams a
capture took and when a launched graph is known done. Kernels are kept as (launch function id,
handle), named later exactly as a launch is (kernel_names.py).

- A capture (``cudaStreamBeginCapture`` returned 0 -> ``cudaStreamEndCapture``) records the
  launches its thread makes on the captured stream, or on a stream that joined it (waited on
  an event recorded on a captured stream: the fork/join pattern). A launch of that thread on
  another stream ran: it is counted as a launch here (``uncaptured``), since the kernel did not.
- ``cudaGraphAddKernelNode`` adds the node's kernel to its graph.
- An instantiation copies its graph's kernels into an executable graph, numbered per process
  (``cuda.graph.id``: 1, 2, ... in the order seen; a handle reused after a destroy gets a new
  number); an update that returns 0 replaces them with the new graph's.
- Each graph launch that returns 0 runs the executable graph's kernels once each.

Bad input is counted by reason (``otelbpf.cuda.graph.anomalies``), never raised.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from otelbpf.base.events import CudaFunc, Kind, is_driver

F = CudaFunc
CAPTURE_BEGIN = frozenset(
    {
        F.cudaStreamBeginCapture,
        F.cudaStreamBeginCapture_ptsz,
        F.cuStreamBeginCapture,
        F.cuStreamBeginCapture_v2,
        F.cuStreamBeginCapture_ptsz,
        F.cuStreamBeginCapture_v2_ptsz,
    }
)
CAPTURE_END = frozenset(
    {F.cudaStreamEndCapture, F.cudaStreamEndCapture_ptsz, F.cuStreamEndCapture, F.cuStreamEndCapture_ptsz}
)
CREATE = frozenset({F.cudaGraphCreate, F.cuGraphCreate})
ADD_KERNEL_NODE = frozenset({F.cudaGraphAddKernelNode, F.cuGraphAddKernelNode, F.cuGraphAddKernelNode_v2})
INSTANTIATE = frozenset(
    {
        F.cudaGraphInstantiate,
        F.cudaGraphInstantiateWithFlags,
        F.cudaGraphInstantiateWithParams,
        F.cudaGraphInstantiateWithParams_ptsz,
        F.cuGraphInstantiate,
        F.cuGraphInstantiate_v2,
        F.cuGraphInstantiateWithFlags,
        F.cuGraphInstantiateWithParams,
        F.cuGraphInstantiateWithParams_ptsz,
    }
)
UPDATE = frozenset({F.cudaGraphExecUpdate, F.cuGraphExecUpdate, F.cuGraphExecUpdate_v2})
EXEC_SET_NODE = frozenset(
    {F.cudaGraphExecKernelNodeSetParams, F.cuGraphExecKernelNodeSetParams, F.cuGraphExecKernelNodeSetParams_v2}
)
SET_NODE = frozenset({F.cudaGraphKernelNodeSetParams, F.cuGraphKernelNodeSetParams, F.cuGraphKernelNodeSetParams_v2})
EXEC_DESTROY = frozenset({F.cudaGraphExecDestroy, F.cuGraphExecDestroy})
GRAPH_DESTROY = frozenset({F.cudaGraphDestroy, F.cuGraphDestroy})
LAUNCH = frozenset({F.cudaGraphLaunch, F.cudaGraphLaunch_ptsz, F.cuGraphLaunch, F.cuGraphLaunch_ptsz})
_EVENT_RECORD = frozenset({F.cudaEventRecord, F.cudaEventRecord_ptsz, F.cuEventRecord, F.cuEventRecord_ptsz})
_STREAM_WAIT = frozenset(
    {F.cudaStreamWaitEvent, F.cudaStreamWaitEvent_ptsz, F.cuStreamWaitEvent, F.cuStreamWaitEvent_ptsz}
)
_EVENT_QUERY = frozenset({F.cudaEventQuery, F.cuEventQuery})
_DEVICE_SYNC = frozenset({F.cudaDeviceSynchronize, F.cuCtxSynchronize})

#: ``otelbpf.cuda.graph.anomalies`` reasons.
REASONS = (
    "capture_invalidated",  # cudaStreamEndCapture returned an error: what it recorded never runs
    "capture_abandoned",  # a capture begun again, or left open when its process exited
    "capture_unseen",  # a capture ended that began before the agent watched: its kernels unknown
    "update_failed",  # cudaGraphExecUpdate of a known executable graph returned an error: it kept its kernels
    "unknown_exec",  # an executable graph not seen instantiated (or destroyed) launched, or updated
    "destroyed_in_flight",  # an executable graph destroyed with a launch not known done
    "unknown_node",  # a kernel node's parameters set where the node is not known (captured, or unseen)
)

#: A kernel as a launch names it: (launch function id, handle).
Kernel = tuple[int, int]


def _node_kernel(func: int, handle: int) -> Kernel:
    """A kernel node's kernel, named as a launch of the same API layer would name it."""
    return int(F.cuLaunchKernel if is_driver(func) else F.cudaLaunchKernel), handle


@dataclass
class Capture:
    stream: int
    tid: int
    streams: set[int]
    kernels: list[Kernel] = field(default_factory=list)
    events: set[int] = field(default_factory=set)  # events recorded on captured streams


@dataclass
class Version:
    """What an executable graph ran between two updates."""

    key: int  # Graphs.versions
    graph_id: int
    kernels: tuple[Kernel, ...] | None  # None: not known (made before the agent watched)
    #: its kernels' distinct names for launch spans (correlator), and the kernel-name facts
    #: count they were resolved at: resolved once per version, not per launch
    names: list[str] | None = None
    names_facts: int = -1


@dataclass
class Exec:
    version: Version
    nodes: dict[int, int]  # its graph's kernel nodes (cudaGraphAddKernelNode) -> their index
    pending: int | None = None  # the stream of a launch not known done


@dataclass
class GraphLaunch:
    """What one graph launch ran (for its span)."""

    graph_id: int | None
    version: Version | None  # None: the executable graph is not known


@dataclass
class Graphs:
    captures: dict[int, Capture] = field(default_factory=dict)  # capturing stream -> capture
    by_thread: dict[int, int] = field(default_factory=dict)  # tid -> the stream it captures
    graphs: dict[int, list[Kernel] | None] = field(default_factory=dict)  # cudaGraph_t -> kernels
    #: cudaGraph_t -> its kernel nodes added one by one -> their index in its kernels
    graph_nodes: dict[int, dict[int, int]] = field(default_factory=dict)
    nodes: dict[int, int] = field(default_factory=dict)  # such a node -> its graph
    execs: dict[int, Exec] = field(default_factory=dict)  # cudaGraphExec_t -> what it runs
    event_streams: dict[int, int] = field(default_factory=dict)  # event -> stream it was last recorded on
    next_id: int = 1
    #: version key -> launch function name -> graph launches that returned 0
    runs: dict[int, Counter[str]] = field(default_factory=dict)
    #: the live executable graphs' versions (one replaced or destroyed is folded into ``folded``,
    #: so an executable graph updated at every step keeps one)
    versions: dict[int, Version] = field(default_factory=dict)
    next_version: int = 0
    #: (graph launch function, cuda.graph.id, kernel) -> runs, of versions no longer live
    folded: Counter[tuple[str, int, Kernel]] = field(default_factory=Counter)
    #: launch function name -> graph launch calls (every one, as launches are counted at entry)
    launch_calls: Counter[str] = field(default_factory=Counter)
    #: launches of a capturing thread that the capture did not take: they ran
    uncaptured: Counter[Kernel] = field(default_factory=Counter)
    anomalies: Counter[str] = field(default_factory=Counter)

    def on(self, rec: tuple[int, ...]) -> GraphLaunch | None:
        """One event (an ``EVENT_DTYPE`` row as a tuple); a graph launch returns what it ran."""
        ts, _dur, _pid, tid, kind, func, _flags, ret, a0, a1, a2, a3 = rec
        if kind == Kind.CUDA_CAPTURED:
            cap = self.captures.get(self.by_thread.get(tid, -1))
            if cap is not None and a3 in cap.streams:
                cap.kernels.append((func, a0))
            else:
                self.uncaptured[(func, a0)] += 1
            return None
        if kind == Kind.CUDA_CALL:
            self._stream_event(tid, func, ret, a0, a2)
            return None
        if kind == Kind.CUDA_SYNC:
            if ret == 0:
                if func in _DEVICE_SYNC:
                    self._done(None)
                elif a1:  # an event synchronized: the work recorded before it is done
                    if a0 in self.event_streams:
                        self._done(self.event_streams[a0])
                else:
                    self._done(a0)
            return None
        if func in LAUNCH:
            return self._launch(CudaFunc(func).name, ret, a0, a2)
        if func in CAPTURE_BEGIN:
            if ret == 0:
                if a0 in self.captures or tid in self.by_thread:
                    self.anomalies["capture_abandoned"] += 1
                    self._end(self.by_thread.get(tid, a0))
                self.captures[a0] = Capture(a0, tid, {a0})
                self.by_thread[tid] = a0
        elif func in CAPTURE_END:
            cap = self._end(a0)
            if ret != 0:
                if cap is not None:  # else a call that failed (counted as an error), no capture
                    self.anomalies["capture_invalidated"] += 1
            elif cap is None:
                self.anomalies["capture_unseen"] += 1
                if a1:
                    self.graphs[a1] = None
            elif a1:
                self.graphs[a1] = cap.kernels
        elif func in CREATE:
            if ret == 0 and a1:
                self.graphs[a1] = []
        elif func in ADD_KERNEL_NODE:
            if ret == 0:
                kernels = self.graphs.get(a0)
                if kernels is not None:
                    if a1:
                        self.graph_nodes.setdefault(a0, {})[a1] = len(kernels)
                        self.nodes[a1] = a0
                    kernels.append(_node_kernel(func, a2))
                elif a0 not in self.graphs:
                    self.graphs[a0] = None  # a graph made before the agent watched
        elif func in INSTANTIATE:
            if ret == 0 and a1:
                kernels = self.graphs.get(a0)
                replaced = self.execs.get(a1)  # its destroy was not seen: what it ran is kept
                if replaced is not None:
                    self._retire(replaced.version)
                self.execs[a1] = Exec(self._version(self.next_id, kernels), dict(self.graph_nodes.get(a0, {})))
                self.next_id += 1
        elif func in UPDATE:
            known = self.execs.get(a0)
            if known is None:
                if ret == 0:  # what it runs now is not known
                    self.anomalies["unknown_exec"] += 1
            elif ret != 0:
                self.anomalies["update_failed"] += 1
            else:
                old, known.version = known.version, self._version(known.version.graph_id, self.graphs.get(a2))
                self._retire(old)
        elif func in EXEC_SET_NODE:
            if ret == 0:
                self._set_exec_node(a0, a1, _node_kernel(func, a2))
        elif func in SET_NODE:
            if ret == 0:
                graph = self.nodes.get(a1)
                kernels = self.graphs.get(graph) if graph is not None else None
                index = self.graph_nodes.get(graph, {}).get(a1) if graph is not None else None
                if kernels is None or index is None or index >= len(kernels):
                    self.anomalies["unknown_node"] += 1
                else:
                    kernels[index] = _node_kernel(func, a2)
        elif func in EXEC_DESTROY:
            gone = self.execs.pop(a0, None)
            if gone is not None:
                self._retire(gone.version)
                if gone.pending is not None:
                    self.anomalies["destroyed_in_flight"] += 1
        elif func in GRAPH_DESTROY and ret == 0:
            self.graphs.pop(a0, None)  # its executable graphs keep their copies
            for node in self.graph_nodes.pop(a0, {}):
                self.nodes.pop(node, None)
        return None

    def _launch(self, name: str, ret: int, exec_handle: int, stream: int) -> GraphLaunch:
        self.launch_calls[name] += 1
        e = self.execs.get(exec_handle)
        if e is None:
            self.anomalies["unknown_exec"] += 1
            return GraphLaunch(None, None)
        if ret == 0:  # a launch that failed ran nothing
            self.runs.setdefault(e.version.key, Counter())[name] += 1
            e.pending = stream
        return GraphLaunch(e.version.graph_id, e.version)

    def _set_exec_node(self, exec_handle: int, node: int, kernel: Kernel) -> None:
        """One kernel node of an executable graph given another kernel: a new version."""
        e = self.execs.get(exec_handle)
        index = e.nodes.get(node) if e is not None else None
        if e is None:
            self.anomalies["unknown_exec"] += 1
        elif index is None or e.version.kernels is None or index >= len(e.version.kernels):
            self.anomalies["unknown_node"] += 1
        else:
            kernels = list(e.version.kernels)
            kernels[index] = kernel
            old, e.version = e.version, self._version(e.version.graph_id, kernels)
            self._retire(old)

    def _version(self, graph_id: int, kernels: list[Kernel] | None) -> Version:
        v = Version(self.next_version, graph_id, tuple(kernels) if kernels is not None else None)
        self.next_version += 1
        self.versions[v.key] = v
        return v

    def _retire(self, v: Version) -> None:
        """``v`` runs no more: its runs folded by kernel, once."""
        self.versions.pop(v.key, None)
        runs = self.runs.pop(v.key, None)
        if runs:
            self._fold(v, runs, self.folded)

    @staticmethod
    def _fold(v: Version, runs: Counter[str], into: Counter[tuple[str, int, Kernel]]) -> None:
        for k, c in Counter(v.kernels or ()).items():
            for name, n in runs.items():
                into[(name, v.graph_id, k)] += c * n

    def _stream_event(self, tid: int, func: int, ret: int, event: int, stream: int) -> None:
        if ret != 0:
            return
        if func in _EVENT_RECORD:
            self.event_streams[event] = stream
            cap = self.captures.get(self.by_thread.get(tid, -1))
            if cap is not None and stream in cap.streams:
                cap.events.add(event)
        elif func in _STREAM_WAIT:
            cap = self.captures.get(self.by_thread.get(tid, -1))
            if cap is not None and event in cap.events:
                cap.streams.add(stream)  # a fork: the stream joined the capture
        elif func in _EVENT_QUERY and event in self.event_streams:
            self._done(self.event_streams[event])

    def _done(self, stream: int | None) -> None:
        """The work queued on ``stream`` (None: every stream) so far is done."""
        for e in self.execs.values():
            if e.pending is not None and (stream is None or e.pending == stream):
                e.pending = None

    def _end(self, stream: int) -> Capture | None:
        cap = self.captures.pop(stream, None)
        if cap is not None and self.by_thread.get(cap.tid) == stream:
            del self.by_thread[cap.tid]
        return cap

    def exited(self) -> None:
        """The process is gone: captures left open are counted."""
        if self.captures:
            self.anomalies["capture_abandoned"] += len(self.captures)
            self.captures.clear()
            self.by_thread.clear()

    def kernel_runs(self) -> Counter[tuple[str, int, Kernel]]:
        """(graph launch function, cuda.graph.id, kernel) -> times run."""
        out = Counter(self.folded)
        for key, runs in self.runs.items():
            self._fold(self.versions[key], runs, out)
        return out
