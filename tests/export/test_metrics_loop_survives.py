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
    assert health.get("otelbpf.metrics.stop_timeouts") == 1
