"""The torch correlator on records made here: operator names from entry addresses, nested
calls adopted by the call around them (which arrives after them), request -> operator ->
CUDA nesting through Causality, calls below ``min_span_ns``, whole trees under the span
budget, orphans, and the per-operator metrics."""

from __future__ import annotations

import os

import numpy as np
import pytest
from opentelemetry.trace import TraceState

from otelbpf.base.events import EVENT_DTYPE, Kind
from otelbpf.correlate.base import CorrelatorSettings
from otelbpf.correlate.causality import Causality
from otelbpf.correlate.clock import MonotonicClock
from otelbpf.correlate.process_info import ProcessInfo
from otelbpf.correlate.spans import new_context
from otelbpf.families.torch.correlator import ORPHAN_NS, TorchCorrelator, operator_name

PID, TID = os.getpid(), 4242
SOFTMAX, _SOFTMAX, MM = 0x7000, 0x7100, 0x7200
NAMES = {
    SOFTMAX: "at::_ops::softmax_int::call(at::Tensor const&, long, std::optional<c10::ScalarType>)",
    _SOFTMAX: "at::_ops::_softmax::call(at::Tensor const&, long, bool)",
    MM: "at::_ops::mm::call(at::Tensor const&, at::Tensor const&)",
}
MS = 1_000_000


class Symbols:
    """Stands in for the symbolizer: entry address -> demangled function."""

    def __init__(self) -> None:
        self.asked: list[tuple[int, int]] = []

    def remember(self, pid: int) -> None:
        pass

    def resolve(self, pid: int, addr: int) -> str:
        self.asked.append((pid, addr))
        return NAMES.get(addr, f"libtorch_cpu.so+{addr:#x}")


def records(*calls: tuple[int, int, int, int], kind: Kind = Kind.TORCH_OP, tid: int = TID) -> np.ndarray:
    """(entry address, start ns, duration ns, depth) -> TORCH_OP records, in the order given."""
    arr = np.zeros(len(calls), EVENT_DTYPE)
    for i, (entry, start, dur, depth) in enumerate(calls):
        arr[i]["ts_ns"], arr[i]["duration_ns"], arr[i]["a0"], arr[i]["a1"] = start, dur, entry, depth
        arr[i]["pid"], arr[i]["tid"], arr[i]["kind"] = PID, tid, int(kind)
    return arr


@pytest.fixture
def world():
    spans: list = []
    sampled: list[int] = []
    causality = Causality()

    def make(**kw) -> TorchCorrelator:
        return TorchCorrelator(
            CorrelatorSettings(ProcessInfo(), MonotonicClock(), spans.extend),
            Symbols(),
            causality,
            on_sampled_out=sampled.append,
            **kw,
        )

    return make, spans, causality, sampled


def test_operator_name_from_the_demangled_entry():
    assert operator_name(NAMES[SOFTMAX]) == "softmax_int"
    assert operator_name("at::_ops::mm::redispatch(c10::DispatchKeySet)") == "[unknown]"
    assert operator_name("libtorch_cpu.so+0x10") == "[unknown]"


def test_request_operator_and_cuda_nest(world):
    make, spans, causality, _ = world
    request = new_context()
    causality.open(PID, TID, 0, request)
    torch = make()
    # _softmax (inside softmax_int) returns first; an mm later is a sibling root
    torch.on_events(records((_SOFTMAX, 2 * MS, 5 * MS, 1), (SOFTMAX, 1 * MS, 7 * MS, 0), (MM, 10 * MS, 1 * MS, 0)))
    by_name = {s.name: s for s in spans}
    assert set(by_name) == {"softmax_int", "_softmax", "mm"}
    outer, inner = by_name["softmax_int"], by_name["_softmax"]
    assert outer.parent == request and by_name["mm"].parent == request
    assert inner.parent == outer.context and inner.context.trace_id == request.trace_id
    assert inner.attributes == {"torch.operator.name": "_softmax", "torch.operator.depth": 1, "thread.id": TID}
    assert inner.end_time - inner.start_time == 5 * MS
    # a CUDA call inside _softmax nests under it; one inside softmax_int only, under softmax_int
    assert causality.parent(PID, TID, 3 * MS) == inner.context
    assert causality.parent(PID, TID, int(7.5 * MS)) == outer.context
    assert causality.parent(PID, TID, int(9 * MS)) == request  # between operators: the request
    assert causality.parent(PID, TID + 1, 3 * MS) is None  # another thread


def test_operators_carry_their_requests_sampling_threshold(world):
    """A request kept by head sampling at 1/4 (tracestate ot=th:c): its operators stand for 4 too."""
    make, spans, causality, _ = world
    request = new_context(trace_state=TraceState([("ot", "th:c")]))
    causality.open(PID, TID, 0, request)
    make().on_events(records((_SOFTMAX, 2 * MS, 5 * MS, 1), (SOFTMAX, 1 * MS, 7 * MS, 0)))
    assert {s.name for s in spans} == {"softmax_int", "_softmax"}
    assert all(s.context.trace_state == request.trace_state for s in spans)


def test_a_nested_call_waits_for_the_call_around_it_across_batches(world):
    make, spans, _, _ = world
    torch = make()
    torch.on_events(records((_SOFTMAX, 2 * MS, 5 * MS, 1)))
    assert spans == []
    torch.on_events(records((SOFTMAX, 1 * MS, 7 * MS, 0)))
    assert {s.name for s in spans} == {"softmax_int", "_softmax"}
    assert (
        next(s for s in spans if s.name == "_softmax").parent
        == next(s for s in spans if s.name == "softmax_int").context
    )


def test_a_call_whose_enclosing_call_never_returns_becomes_a_root(world):
    make, spans, _, _ = world
    torch = make()
    torch.on_events(records((_SOFTMAX, 2 * MS, 5 * MS, 1)))  # softmax_int's return lost (exception)
    torch.on_events(records((MM, 8 * MS + ORPHAN_NS, MS, 0)))
    assert {s.name for s in spans} == {"_softmax", "mm"} and all(s.parent is None for s in spans)


def test_short_calls_make_no_span_and_what_ran_inside_them_nests_one_up(world):
    make, spans, causality, _ = world
    torch = make(min_span_ns=6 * MS)
    # outer 7 ms and middle 6.5 ms make spans, the innermost 1 ms does not
    torch.on_events(records((MM, 2 * MS, 1 * MS, 2), (_SOFTMAX, MS // 2, int(6.5 * MS), 1), (SOFTMAX, 0, 7 * MS, 0)))
    assert sorted(s.name for s in spans) == ["_softmax", "softmax_int"]
    outer = next(s for s in spans if s.name == "softmax_int")
    middle = next(s for s in spans if s.name == "_softmax")
    assert middle.parent == outer.context
    # a CUDA call inside the call that made no span nests under the one around it
    assert causality.parent(PID, TID, int(2.5 * MS)) == middle.context


def test_the_budget_takes_or_drops_whole_trees(world):
    make, spans, _, sampled = world
    torch = make(max_spans_per_second=2)
    torch.on_events(records((_SOFTMAX, 2 * MS, 5 * MS, 1), (SOFTMAX, 1 * MS, 7 * MS, 0), (MM, 10 * MS, MS, 0)))
    assert sorted(s.name for s in spans) == ["_softmax", "softmax_int"]
    assert sampled == [1]


def test_metrics_count_every_call(world):
    make, spans, _, _ = world
    torch = make(max_spans_per_second=0)  # no traces pipeline: metrics only
    torch.on_events(records(*[(MM, i * MS, (i + 1) * 1000, 0) for i in range(5)], (SOFTMAX, 100 * MS, 2000, 0)))
    torch.on_events(records((MM, 200 * MS, 4000, 0), tid=TID + 1))
    assert spans == []
    ((_resource, metrics),) = torch.collect()
    by_name = {m.name: m for m in metrics}
    calls = {
        p.attributes["torch.operator.name"]: p.value for p in by_name["otelbpf.torch.operator.calls"].data.data_points
    }
    assert calls == {"mm": 6, "softmax_int": 1}
    hist = {p.attributes["torch.operator.name"]: p for p in by_name["otelbpf.torch.operator.duration"].data.data_points}
    assert hist["mm"].count == 6 and hist["mm"].sum == pytest.approx((1 + 2 + 3 + 4 + 5 + 4) * 1e-6)
    # the process exits: exported once more, then forgotten
    exit_ = np.zeros(1, EVENT_DTYPE)
    exit_[0]["pid"], exit_[0]["kind"] = PID, int(Kind.PROC_EXIT)
    torch.on_events(exit_)
    assert len(torch.collect()) == 1 and torch.collect() == []


def test_a_cuda_call_in_the_same_batch_nests_under_the_operator(world):
    """What the agent does with one drained batch: the torch correlator first (opens_scopes),
    then the CUDA correlator, whose parent lookup is Causality's."""
    from otelbpf.base.events import CudaFunc
    from otelbpf.correlate.symbolizer import Symbolizer
    from otelbpf.families.cuda.correlator import CudaCorrelator

    make, spans, causality, _ = world
    request = new_context()
    causality.open(PID, TID, 0, request)
    torch = make()
    settings = CorrelatorSettings(ProcessInfo(), MonotonicClock(), spans.extend)
    cuda = CudaCorrelator(settings, Symbolizer(), lambda name: [], lambda name, keys: None, parent_of=causality.parent)
    assert torch.opens_scopes and not getattr(cuda, "opens_scopes", False)
    batch = np.concatenate([records((_SOFTMAX, 2 * MS, 5 * MS, 1)), records((SOFTMAX, 1 * MS, 7 * MS, 0))])
    sync = np.zeros(2, EVENT_DTYPE)
    for rec, start in zip(sync, (3 * MS, 15 * MS), strict=True):  # inside _softmax; after both operators
        rec["ts_ns"], rec["duration_ns"], rec["pid"], rec["tid"] = start, MS, PID, TID
        rec["kind"], rec["func"] = int(Kind.CUDA_SYNC), int(CudaFunc.cudaDeviceSynchronize)
    batch = np.concatenate([sync[:1], batch, sync[1:]])  # ring order: the CUDA call returns first
    torch.on_events(batch)
    cuda.on_events(batch)
    by_name: dict[str, list] = {}
    for s in spans:
        by_name.setdefault(s.name, []).append(s)
    inner, outer = by_name["_softmax"][0], by_name["softmax_int"][0]
    inside, after = sorted(by_name["cudaDeviceSynchronize"], key=lambda s: s.start_time)
    assert inside.parent == inner.context and inside.context.trace_id == request.trace_id
    assert inner.parent == outer.context and outer.parent == request
    assert after.parent == request


def test_the_operators_of_a_shed_request_and_their_cuda_calls_are_recorded_unsampled(world):
    """A thread serving an HTTP request head sampling shed (FLAG_SHED on its records, bpf/torch.c
    and cuda.c): no request span to be the child of. The operator tree and the CUDA call inside
    it are recorded unsampled (the agent's files, never a backend), marked and counted; under a
    kept request (an event loop holding one open) the same flag changes nothing."""
    from otelbpf.base.events import FLAG_SHED, CudaFunc
    from otelbpf.correlate.symbolizer import Symbolizer
    from otelbpf.families.cuda.correlator import CudaCorrelator

    make, spans, causality, _ = world
    torch = make()
    settings = CorrelatorSettings(ProcessInfo(), MonotonicClock(), spans.extend)
    cuda = CudaCorrelator(settings, Symbolizer(), lambda name: [], lambda name, keys: None, parent_of=causality.parent)
    ops = records((_SOFTMAX, 2 * MS, 5 * MS, 1), (SOFTMAX, 1 * MS, 7 * MS, 0))
    sync = np.zeros(1, EVENT_DTYPE)
    sync[0]["ts_ns"], sync[0]["duration_ns"], sync[0]["pid"], sync[0]["tid"] = 3 * MS, MS, PID, TID
    sync[0]["kind"], sync[0]["func"] = int(Kind.CUDA_SYNC), int(CudaFunc.cudaDeviceSynchronize)
    batch = np.concatenate([sync, ops])
    batch["flags"] |= FLAG_SHED
    torch.on_events(batch)
    cuda.on_events(batch)
    by_name = {s.name: s for s in spans}
    outer, inner, call = by_name["softmax_int"], by_name["_softmax"], by_name["cudaDeviceSynchronize"]
    assert outer.parent is None and inner.parent == outer.context and call.parent == inner.context
    assert not any(s.context.trace_flags.sampled for s in (outer, inner, call))
    assert all(s.attributes["otelbpf.sampling.shed"] is True for s in (outer, inner, call))
    ((_resource, metrics),) = torch.collect()
    [shed] = [m for m in metrics if m.name == "otelbpf.torch.spans.shed"]
    assert [p.value for p in shed.data.data_points] == [2]
    # the same flag under a kept request: its child, sampled
    spans.clear()
    request = new_context()
    causality.open(PID, TID, 20 * MS, request)
    later = records((MM, 21 * MS, MS, 0))
    later["flags"] |= FLAG_SHED
    torch.on_events(later)
    [mm] = spans
    assert mm.parent == request and mm.context.trace_flags.sampled and "otelbpf.sampling.shed" not in mm.attributes
