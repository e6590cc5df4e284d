"""MetricsLoop: sources grouped per resource, a broken source or exporter isolated and
counted, a timer that exports, and a last export at stop. Exports go to the real file
exporter, read back from disk, beside a small recording MetricExporter (pure logic)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.resources import Resource

from harness.agent import wait_until
from otelbpf.base.health import Health
from otelbpf.correlate import metrics as m
from otelbpf.correlate.spans import scope
from otelbpf.export.jsonfile import FileMetricExporter
from otelbpf.export.metrics_loop import MetricsLoop

JOB = Resource({"service.name": "job", "process.pid": 10})
OTHER = Resource({"service.name": "other", "process.pid": 11})
CUDA, AGENT = scope("otelbpf.cuda"), scope("otelbpf")


def counter(name: str, value: int, now: int = 2_000):
    return m.cumulative_sum(name, "1", name, [({}, value)], 1_000, now)


class Recording(MetricExporter):
    def __init__(self, result: MetricExportResult = MetricExportResult.SUCCESS, raises: bool = False) -> None:
        super().__init__()
        self.exports: list[MetricsData] = []
        self.result, self.raises = result, raises
        self.shutdowns = 0
        self.lock = threading.Lock()

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs) -> MetricExportResult:
        with self.lock:
            self.exports.append(metrics_data)
        if self.raises:
            raise RuntimeError("exporter bug")
        return self.result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        self.shutdowns += 1


def summary(data: MetricsData) -> dict[str, dict[str, list[str]]]:
    """service.name -> scope name -> metric names."""
    return {
        rm.resource.attributes["service.name"]: {sm.scope.name: [x.name for x in sm.metrics] for sm in rm.scope_metrics}
        for rm in data.resource_metrics
    }


def broken_source():
    raise RuntimeError("source bug")


def test_a_failing_source_does_not_hide_the_others() -> None:
    health = Health()
    loop = MetricsLoop([], [broken_source, lambda: [(JOB, CUDA, [counter("a", 1)])]], health, interval_s=60)
    assert summary(loop.collect()) == {"job": {"otelbpf.cuda": ["a"]}}
    assert health.get("otelbpf.metrics.source_errors") == 1


def test_sources_are_grouped_by_resource() -> None:
    same_job = Resource({"process.pid": 10, "service.name": "job"})  # equal attributes, another object
    loop = MetricsLoop(
        [],
        [
            lambda: [(JOB, CUDA, [counter("a", 1)]), (OTHER, CUDA, [counter("b", 2)])],
            lambda: [(same_job, AGENT, [counter("c", 3)])],
        ],
        Health(),
        interval_s=60,
    )
    assert summary(loop.collect()) == {
        "job": {"otelbpf.cuda": ["a"], "otelbpf": ["c"]},
        "other": {"otelbpf.cuda": ["b"]},
    }


@pytest.mark.parametrize(
    "bad", [Recording(MetricExportResult.FAILURE), Recording(raises=True)], ids=["returns-failure", "raises"]
)
def test_a_failing_exporter_is_counted_and_the_file_still_gets_every_export(tmp_path: Path, bad: Recording) -> None:
    health = Health()
    loop = MetricsLoop(
        [("bad", bad), ("file", FileMetricExporter(str(tmp_path)))],
        [lambda: [(JOB, CUDA, [counter("a", 1)])]],
        health,
        interval_s=60,
    )
    loop.export_once()
    loop.export_once()
    loop.stop()
    assert len(bad.exports) == 3 and bad.shutdowns == 1
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3
    assert health.get("otelbpf.export.failures", signal="metrics", exporter="bad") == 3
    assert health.get("otelbpf.export.sent", signal="metrics", exporter="file") == 3
    assert health.get("otelbpf.export.sent", signal="metrics", exporter="bad") == 0


def test_nothing_to_export_exports_nothing() -> None:
    rec = Recording()
    MetricsLoop([("rec", rec)], [lambda: []], Health(), interval_s=60).export_once()
    assert rec.exports == []


def test_the_timer_exports_and_stop_exports_the_totals_once_more(tmp_path: Path) -> None:
    values = iter(range(1, 10_000))
    rec = Recording()
    loop = MetricsLoop(
        [("rec", rec), ("file", FileMetricExporter(str(tmp_path)))],
        [lambda: [(JOB, CUDA, [counter("calls", next(values))])]],
        Health(),
        interval_s=0.02,
    )
    loop.start()
    assert wait_until(lambda: len(rec.exports) >= 3, timeout=10)
    loop.stop()
    timer_exports = len(rec.exports) - 1
    with rec.lock:
        last = rec.exports[-1]
    final = last.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points[0].value
    assert final == timer_exports + 1  # stop() collected once more after the timer stopped
    assert rec.shutdowns == 1
    written = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(written) == len(rec.exports)
    point = written[-1]["resourceMetrics"][0]["scopeMetrics"][0]["metrics"][0]["sum"]["dataPoints"][0]
    assert int(point["asInt"]) == final


def test_a_broken_source_never_stops_the_timer() -> None:
    rec = Recording()
    health = Health()
    loop = MetricsLoop(
        [("rec", rec)], [broken_source, lambda: [(JOB, CUDA, [counter("a", 1)])]], health, interval_s=0.02
    )
    loop.start()
    try:
        assert wait_until(lambda: len(rec.exports) >= 3, timeout=10)
    finally:
        loop.stop()
    assert health.get("otelbpf.metrics.source_errors") >= 3
    assert all(summary(d) == {"job": {"otelbpf.cuda": ["a"]}} for d in rec.exports)


def test_on_collect_gets_the_collection_the_exporters_get_and_counts_as_no_export() -> None:
    health, rec, seen = Health(), Recording(), []
    calls = iter(range(1, 100))
    loop = MetricsLoop(
        [("rec", rec)],
        [lambda: [(JOB, CUDA, [counter("a", next(calls))])]],
        health,
        interval_s=60,
        on_collect=seen.append,
    )
    loop.export_once()
    assert seen == rec.exports and len(seen) == 1  # one collect() for both: a source is asked once
    assert health.get("otelbpf.export.sent", signal="metrics", exporter="rec") == 1
    assert [n for n, _a, _v in health.snapshot()] == ["otelbpf.export.sent"]
