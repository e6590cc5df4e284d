"""A metrics thread never dies quietly (issue 13, row 6): a round that fails anywhere (a
source yielding garbage, an exporter raising from its result) is logged and counted and the
next round runs; a thread that did end is reported by ``failed``, which the agent watches."""

from __future__ import annotations

import threading
import time

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.resources import Resource

from harness.agent import wait_until
from otelbpf.base.health import Health
from otelbpf.correlate import metrics as m
from otelbpf.correlate.spans import scope
from otelbpf.export.metrics_loop import MetricsLoop

JOB = Resource({"service.name": "job"})


class Recording(MetricExporter):
    def __init__(self) -> None:
        super().__init__()
        self.exports: list[MetricsData] = []

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs) -> MetricExportResult:
        self.exports.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        pass


def good_source():
    return [(JOB, scope("otelbpf.cuda"), [m.cumulative_sum("a", "1", "a", [({}, 1)], 1, 2)])]


def test_a_source_yielding_garbage_is_counted_and_the_timer_goes_on() -> None:
    rec, health = Recording(), Health()
    loop = MetricsLoop([("rec", rec)], [lambda: [None], good_source], health, interval_s=0.02)
    loop.start()
    try:
        assert wait_until(lambda: len(rec.exports) >= 3, timeout=10)
        assert not loop.failed
    finally:
        loop.stop()
    assert health.get("otelbpf.metrics.source_errors") >= 3


class Unhealthy(Health):
    """Health whose counter write for a successful export raises (a bug anywhere in a round)."""

    def __init__(self) -> None:
        super().__init__()
        self.raised = 0

    def add(self, name: str, value: int = 1, **attrs: object) -> None:
        if name == "otelbpf.export.sent" and self.raised < 2:
            self.raised += 1
            raise RuntimeError("boom")
        super().add(name, value, **attrs)


def test_a_round_that_raises_is_counted_and_the_next_round_runs() -> None:
    rec, health = Recording(), Unhealthy()
    loop = MetricsLoop([("rec", rec)], [good_source], health, interval_s=0.02)
    loop.start()
    try:
        assert wait_until(lambda: health.get("otelbpf.export.sent") >= 2, timeout=10)
        assert not loop.failed
    finally:
        loop.stop()
    assert health.get("otelbpf.metrics.export_errors") == 2


def test_a_dead_thread_is_reported() -> None:
    loop = MetricsLoop([], [], Health(), interval_s=0.01)
    loop._thread = threading.Thread(target=lambda: None)  # a timer thread that ended on its own
    loop.start()
    loop._thread.join()
    assert loop.failed
    loop.stop()
    assert not loop.failed


def test_stop_never_waits_forever_on_a_stuck_source() -> None:
    """A source blocked on a lock a spinning thread never releases (issue 13, row 1's hang
    as the metrics loop saw it): stop() returns within its bound and counts it."""
    held = threading.Lock()
    held.acquire()

    def stuck():
        with held:
            return []

    rec, health = Recording(), Health()
    loop = MetricsLoop([("rec", rec)], [stuck], health, interval_s=0.01)
    loop.start()
    time.sleep(0.1)  # the timer's round is now blocked
    stopper = threading.Thread(target=loop.stop, kwargs={"timeout_s": 0.5}, daemon=True)
    t0 = time.monotonic()
    stopper.start()
    stopper.join(10)
    assert not stopper.is_alive() and time.monotonic() - t0 < 2
    # The final round ran without it, said and counted by its name.
    assert health.get("otelbpf.metrics.source_timeouts") >= 1
    assert health.get("otelbpf.metrics.stop_timeouts") == 0


def _names(data: MetricsData) -> list[str]:
    return sorted(mt.name for rm in data.resource_metrics for sm in rm.scope_metrics for mt in sm.metrics)


def _source(name: str, value: int = 1):
    def source():
        return [(JOB, scope("otelbpf.cuda"), [m.cumulative_sum(name, "1", name, [({}, value)], 1, 2)])]

    return source


def test_a_stuck_source_holds_up_no_other_and_is_counted_by_name() -> None:
    """A receiver blocked behind a stuck processing thread: the agent's health and the other
    receivers still go out, every round, and the timeout names the source."""
    held = threading.Lock()
    held.acquire()

    def stuck_receiver():
        with held:
            return []

    rec, health = Recording(), Health()
    loop = MetricsLoop([("rec", rec)], [stuck_receiver, _source("health")], health, interval_s=60)
    try:
        for _ in range(2):
            t0 = time.monotonic()
            loop.export_once(wait_s=0.2)
            assert time.monotonic() - t0 < 2
        assert [_names(d) for d in rec.exports] == [["health"], ["health"]]
        assert (
            health.get(
                "otelbpf.metrics.source_timeouts",
                source="test_a_stuck_source_holds_up_no_other_and_is_counted_by_name.<locals>.stuck_receiver",
            )
            == 2
        )
    finally:
        held.release()
        loop.stop(timeout_s=1)


def test_what_a_source_returns_late_goes_out_first_in_the_next_round() -> None:
    """A late answer may hold the last totals of processes the source forgot since: it is
    exported on its own, before the source is asked again, never dropped."""
    release = threading.Event()
    calls: list[int] = []

    def slow():
        calls.append(1)
        if len(calls) == 1:
            release.wait(10)
            return _source("final_totals")()
        return _source("fresh")()

    rec, health = Recording(), Health()
    loop = MetricsLoop([("rec", rec)], [slow, _source("other")], health, interval_s=60)
    try:
        loop.export_once(wait_s=0.1)
        assert [_names(d) for d in rec.exports] == [["other"]]
        release.set()
        assert wait_until(lambda: not loop._runners[0].busy, timeout=10)
        loop.export_once(wait_s=5)
        assert [_names(d) for d in rec.exports] == [["other"], ["final_totals"], ["fresh", "other"]]
    finally:
        loop.stop(timeout_s=1)


def test_the_final_export_waits_for_a_source_that_timed_out_before() -> None:
    """At stop, a source still busy from an earlier round is waited for (up to the stop's
    budget) and its answer, with the final totals of a short job, goes out."""
    release = threading.Event()

    def slow():
        release.wait(10)
        return _source("short_job_totals")()

    rec, health = Recording(), Health()
    loop = MetricsLoop([("rec", rec)], [slow], health, interval_s=60)
    loop.export_once(wait_s=0.1)
    assert rec.exports == []
    threading.Timer(0.3, release.set).start()
    loop.stop(timeout_s=5)
    assert ["short_job_totals"] in [_names(d) for d in rec.exports]
    assert health.get("otelbpf.metrics.stop_timeouts") == 0
