"""Torch operator events -> operator spans, nested, and per-operator metrics.

Each ``TORCH_OP`` record is one finished call of a probed operator (bpf/torch.c): its
entry time, duration, thread, entry address and how many probed operators were open
around it on its thread (``depth``). The operator is named from the entry address
(``at::_ops::<op>::call``, by the symbolizer, once per process and address).

Nesting. A thread's records arrive in the order its calls returned, so a nested call
(``mm`` inside ``matmul``) arrives before the call around it. A call with depth > 0 waits
on its thread until the enclosing call (depth one less, around it in time) arrives and
adopts it; a call with depth 0 is a root: its whole tree is then given span contexts at
once, parented under the request its thread was serving (``Causality.parent``), and every
call of it becomes a scope in ``Causality``, so a CUDA call made inside an operator is the
operator's child (request -> operator -> CUDA call). The torch receiver is processed before
the others (``opens_scopes``), so CUDA records drained in the same batch find the scopes.
A call whose enclosing call never arrives (an exception left it: counted by the kernel as
``torch_unwound``) is emitted as a root once it is ``ORPHAN_NS`` older than the newest record.

Head sampling. A root made while its thread served an HTTP request the kernel shed (``EVF_SHED``,
bpf/torch.c) and under no kept request has no request to be the child of: its tree is recorded
unsampled (the agent's own files and live state, never a trace backend, as the CUDA calls of a
shed request are), and so are the CUDA calls inside it (spans.py: an unsampled parent's
children), and counted (``otelbpf.torch.spans.shed``).

Metrics count every call, whatever the span budget or ``min_span_ns`` leave out.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from opentelemetry.sdk.metrics.export import Metric
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext

from otelbpf.base.events import FLAG_SHED, Kind
from otelbpf.correlate import metrics as m
from otelbpf.correlate.base import CorrelatorBase, CorrelatorSettings
from otelbpf.correlate.causality import Causality
from otelbpf.correlate.spans import make_span, new_context, scope
from otelbpf.correlate.symbolizer import Symbolizer

SCOPE = scope("otelbpf.torch")
#: A call still waiting for its enclosing call this long after the newest record is a root.
ORPHAN_NS = 2 * 10**9
#: Calls waiting per thread, at most: beyond it the oldest are emitted as roots.
MAX_WAITING = 4096
UNKNOWN = "[unknown]"

_OPERATOR = re.compile(r"at::_ops::([A-Za-z0-9_]+)::call\b")


def operator_name(function: str) -> str:
    """``at::_ops::mm::call(at::Tensor const&, ...)`` -> ``mm``; UNKNOWN for anything else."""
    found = _OPERATOR.search(function)
    return found.group(1) if found else UNKNOWN


@dataclass(slots=True)
class Call:
    """One operator call, and the probed calls made inside it."""

    operator: str
    pid: int
    tid: int
    start_ns: int  # CLOCK_MONOTONIC
    duration_ns: int
    depth: int
    shed: bool = False  # made while its thread served a request head sampling shed (FLAG_SHED)
    children: list[Call] = field(default_factory=list)

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.duration_ns

    def size(self) -> int:
        return 1 + sum(c.size() for c in self.children)


def _of_process(pid: int) -> Callable[[Call], bool]:
    """The calls of one process (a closure per pid, where a loop's lambda would bind the last one)."""
    return lambda call: call.pid == pid


@dataclass
class _Process:
    resource: Resource
    first_seen_ns: int
    calls: dict[str, int] = field(default_factory=dict)
    durations: dict[str, m.HistogramState] = field(default_factory=dict)
    shed_spans: int = 0  # spans of operators of shed HTTP requests: recorded, not sent
    exited: bool = False


class TorchCorrelator(CorrelatorBase[_Process]):
    scope = SCOPE
    #: Its records open scopes other correlators' spans nest in: processed first (agent.py).
    opens_scopes = True

    def __init__(
        self,
        settings: CorrelatorSettings,
        symbolizer: Symbolizer,
        causality: Causality,
        *,
        min_span_ns: int = 0,
        max_spans_per_second: int = 10_000,
        on_sampled_out: Callable[[int], None] = lambda n: None,
    ) -> None:
        super().__init__(settings, max_spans_per_second=max_spans_per_second)
        self._sym = symbolizer
        self._causality = causality
        self._min_span_ns = min_span_ns
        self._spans_on = max_spans_per_second > 0
        self._on_sampled_out = on_sampled_out
        self._waiting: dict[tuple[int, int], list[Call]] = {}

    def on_strings(self, arr: np.ndarray) -> None:
        pass

    def on_events(self, arr: np.ndarray) -> None:
        spans: list[ReadableSpan] = []
        with self._lock:
            calls = arr[arr["kind"] == int(Kind.TORCH_OP)]
            if len(calls):
                self._aggregate(calls)
                if self._spans_on:
                    for call in self._calls(calls):
                        self._place(call, spans)
            for pid in arr["pid"][arr["kind"] == int(Kind.PROC_EXIT)].tolist():
                if pid in self._procs:
                    self._procs[pid].exited = True
                self._flush(_of_process(pid), spans)
            if len(calls):
                newest = int(calls["ts_ns"].max())
                self._flush(lambda c: c.end_ns < newest - ORPHAN_NS, spans)
        self._send(spans)

    # -- metrics ----------------------------------------------------------

    def _name(self, pid: int, entry: int) -> str:
        return operator_name(self._sym.resolve(pid, entry))

    def _new_process(self, pid: int, resource: Resource, start_ns: int) -> _Process:
        self._sym.remember(pid)
        return _Process(resource, start_ns)

    def _aggregate(self, calls: np.ndarray) -> None:
        keys = np.stack([calls["pid"].astype(np.uint64), calls["a0"]], axis=1)
        uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        seconds = calls["duration_ns"] / 1e9
        for i, (pid, entry) in enumerate(uniq.tolist()):
            p = self._proc(pid)
            op = self._name(pid, entry)
            mine = seconds[inverse == i]
            p.calls[op] = p.calls.get(op, 0) + len(mine)
            p.durations.setdefault(op, m.HistogramState()).add(mine)

    def collect(self) -> list[tuple[Resource, list[Metric]]]:
        now = self._clock.now_wall()
        out = []
        with self._lock:
            for pid, p in list(self._procs.items()):
                metrics = [
                    m.cumulative_sum(
                        "otelbpf.torch.operator.calls",
                        "{call}",
                        "Calls of a probed torch operator",
                        [({"torch.operator.name": op}, n) for op, n in sorted(p.calls.items())],
                        p.first_seen_ns,
                        now,
                    ),
                    m.cumulative_sum(
                        "otelbpf.torch.spans.shed",
                        "{span}",
                        "Operator spans of HTTP requests head sampling shed: written to the agent's own files "
                        "and live state, not to trace backends",
                        [({}, p.shed_spans)] if p.shed_spans else [],
                        p.first_seen_ns,
                        now,
                    ),
                    m.histogram(
                        "otelbpf.torch.operator.duration",
                        "s",
                        "Duration of torch operator calls",
                        [
                            h.point({"torch.operator.name": op}, p.first_seen_ns, now)
                            for op, h in sorted(p.durations.items())
                        ],
                    ),
                ]
                found = [x for x in metrics if x is not None]
                if found:
                    out.append((p.resource, found))
                if p.exited:
                    del self._procs[pid]
        return out

    # -- spans ------------------------------------------------------------

    def _calls(self, calls: np.ndarray) -> list[Call]:
        return [
            Call(self._name(pid, entry), pid, tid, ts, dur, depth, bool(flags & FLAG_SHED))
            for pid, tid, ts, dur, entry, depth, flags in zip(
                calls["pid"].tolist(),
                calls["tid"].tolist(),
                calls["ts_ns"].tolist(),
                calls["duration_ns"].tolist(),
                calls["a0"].tolist(),
                calls["a1"].tolist(),
                calls["flags"].tolist(),
                strict=True,
            )
        ]

    def _place(self, call: Call, spans: list[ReadableSpan]) -> None:
        """Adopt the calls waiting for this one; then wait in turn, or emit the tree."""
        key = (call.pid, call.tid)
        waiting = self._waiting.get(key)
        if waiting:
            inside = [
                c
                for c in waiting
                if c.depth == call.depth + 1 and c.start_ns >= call.start_ns and c.end_ns <= call.end_ns
            ]
            if inside:
                call.children = sorted(inside, key=lambda c: c.start_ns)
                adopted = {id(c) for c in inside}
                waiting[:] = [c for c in waiting if id(c) not in adopted]
        if call.depth == 0:
            self._tree(call, spans)
            return
        waiting = self._waiting.setdefault(key, [])
        waiting.append(call)
        if len(waiting) > MAX_WAITING:
            self._tree(waiting.pop(0), spans)

    def _flush(self, stale: Callable[[Call], bool], spans: list[ReadableSpan]) -> None:
        for key, waiting in list(self._waiting.items()):
            old = [c for c in waiting if stale(c)]
            if old:
                waiting[:] = [c for c in waiting if not stale(c)]
                for c in old:
                    self._tree(c, spans)
            if not waiting:
                del self._waiting[key]

    def _tree(self, root: Call, spans: list[ReadableSpan]) -> None:
        """Spans for a call and its nested calls, all or none (a partial tree would leave
        children pointing at a span never sent)."""
        wanted = self._count(root)
        if not wanted:
            return
        granted = self._budget.take(wanted)
        if granted < wanted:
            self._on_sampled_out(wanted)
            return
        parent = self._causality.parent(root.pid, root.tid, root.start_ns)
        shed = root.shed and (parent is None or not parent.trace_flags.sampled)
        if shed:
            self._proc(root.pid).shed_spans += wanted
        self._build(root, parent, spans, shed)

    def _count(self, call: Call) -> int:
        return int(call.duration_ns >= self._min_span_ns) + sum(self._count(c) for c in call.children)

    def _build(self, call: Call, parent: SpanContext | None, spans: list[ReadableSpan], shed: bool) -> None:
        """A call below ``min_span_ns`` makes no span: its children go to its parent. ``shed``:
        the tree of a shed request, recorded unsampled."""
        own = parent
        if call.duration_ns >= self._min_span_ns:
            # the request's tracestate too: its head-sampling threshold (ot=th:) holds for the
            # whole trace, so an operator of a 1/4-kept request stands for 4 as its request does
            own = new_context(
                parent.trace_id if parent else None, parent.trace_state if parent else None, sampled=not shed
            )
            self._causality.scope(call.pid, call.tid, call.start_ns, call.end_ns, own)
            start = self._clock.to_wall(call.start_ns)
            attrs: dict[str, object] = {
                "torch.operator.name": call.operator,
                "torch.operator.depth": call.depth,
                "thread.id": call.tid,
            }
            if shed:
                attrs["otelbpf.sampling.shed"] = True
            spans.append(
                make_span(
                    call.operator,
                    resource=self._proc(call.pid).resource,
                    scope=SCOPE,
                    start_ns=start,
                    end_ns=start + call.duration_ns,
                    attributes=attrs,
                    parent=parent,
                    context=own,
                )
            )
        for child in call.children:
            self._build(child, own, spans, shed)
