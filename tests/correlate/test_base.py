"""The correlators' shared floor: per-process state made once, spans counted as they go, the budget."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from opentelemetry.sdk.resources import Resource

from otelbpf.correlate.base import CorrelatorBase, CorrelatorSettings, SpanBudget
from otelbpf.correlate.clock import MonotonicClock
from otelbpf.correlate.process_info import ProcessInfo
from otelbpf.correlate.spans import make_span, scope

ME = os.getpid()


@dataclass
class _State:
    pid: int
    resource: Resource
    start_ns: int


class _Minimal(CorrelatorBase[_State]):
    def _new_process(self, pid: int, resource: Resource, start_ns: int) -> _State:
        return _State(pid, resource, start_ns)


def test_a_process_state_is_made_once_with_its_resource_and_first_sight() -> None:
    c = _Minimal(CorrelatorSettings(ProcessInfo(), MonotonicClock(), lambda spans: None), max_spans_per_second=10)
    before = time.time_ns()
    first = c._proc(ME)
    assert c._proc(ME) is first
    assert first.pid == ME and before <= first.start_ns <= time.time_ns()
    assert first.resource.attributes["process.pid"] == ME


def test_spans_are_handed_on_and_counted_and_an_empty_batch_is_not_sent() -> None:
    sent: list[list] = []
    c = _Minimal(CorrelatorSettings(ProcessInfo(), MonotonicClock(), sent.append), max_spans_per_second=10)
    c._send([])
    span = make_span("s", resource=Resource.create({}), scope=scope("test"), start_ns=1, end_ns=2, attributes={})
    c._send([span, span])
    assert sent == [[span, span]] and c.spans_emitted == 2


def test_span_budget_refills_at_its_rate() -> None:
    budget = SpanBudget(100)
    time.sleep(0.1)  # already full: a burst never exceeds one second's worth
    assert budget.take(1000) == 100
    assert budget.take(10) == 0
    time.sleep(0.05)  # ~5 tokens
    assert 4 <= budget.take(100) <= 10
