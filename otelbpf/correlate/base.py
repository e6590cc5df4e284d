"""What every span-making correlator shares: who a pid is, the clock, where spans go, the span budget.

Each family's correlator (cuda, torch, nccl, ibverbs, http, sched) keeps per-process state
created at a process's first event with its resource and the wall time it was first seen, and
sends its spans through one callable within a per-second budget. That preamble lives here once,
so a new family starts from it instead of copying it (README: adding a probe family).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan

from otelbpf.correlate.clock import MonotonicClock
from otelbpf.correlate.process_info import ProcessInfo

P = TypeVar("P")


class SpanBudget:
    """Token bucket: at most ``rate`` spans per second, bursts up to one second's worth."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self._tokens = float(rate)
        self._last = time.monotonic()

    def take(self, n: int) -> int:
        now = time.monotonic()
        self._tokens = min(float(self.rate), self._tokens + (now - self._last) * self.rate)
        self._last = now
        granted = min(n, int(self._tokens))
        self._tokens -= granted
        return granted


@dataclass(frozen=True)
class CorrelatorSettings:
    """What every correlator is built with, whatever its family (as a Collector receiver's
    factory is given its settings): who a pid is, the clock, where finished spans go."""

    process_info: ProcessInfo
    clock: MonotonicClock
    emit_spans: Callable[[list[ReadableSpan]], None]


class CorrelatorBase(Generic[P]):
    """The shared floor of a correlator whose per-process state is a ``P``.

    ``_procs`` and ``_lock`` are the subclass's to use (the sensor thread feeds events while the
    exporter's thread collects metrics); ``_new_process`` says how a ``P`` is made.
    """

    def __init__(self, settings: CorrelatorSettings, *, max_spans_per_second: int) -> None:
        self._info = settings.process_info
        self._clock = settings.clock
        self._emit = settings.emit_spans
        self._budget = SpanBudget(max_spans_per_second)
        self._procs: dict[int, P] = {}
        self._lock = threading.Lock()
        #: spans handed to ``emit_spans`` so far (the agent's stop line sums them)
        self.spans_emitted = 0

    def _new_process(self, pid: int, resource: Resource, start_ns: int) -> P:
        """The state of a process seen for the first time (``start_ns``: wall time, the start of its series)."""
        raise NotImplementedError

    def _proc(self, pid: int) -> P:
        """``pid``'s state, made at its first sight with its resource read then (it may be gone later)."""
        p = self._procs.get(pid)
        if p is None:
            p = self._procs[pid] = self._new_process(pid, self._info.resource(pid), self._clock.now_wall())
        return p

    def _send(self, spans: list[ReadableSpan]) -> None:
        """Hand ``spans`` on, counted; nothing when there are none."""
        if spans:
            self.spans_emitted += len(spans)
            self._emit(spans)
