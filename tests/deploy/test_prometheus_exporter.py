"""The ``prometheus`` exporter (otelbpf/export/prometheus.py): /metrics in the exposition format
over HTTP, the names the Collector's prometheus exporter gives (prometheus_names.py), every
scrape served the newest push, per-process series kept apart by their resource labels, stale
ones expired; the config."""

from __future__ import annotations

import urllib.request

import pytest
from opentelemetry.sdk.metrics.export import MetricsData, ResourceMetrics, ScopeMetrics
from prometheus_client.parser import text_string_to_metric_families
from prometheus_names import OtlpMetric, label_name, series_names

from harness.nccl_events import MS, blocking_job, correlator, feed, torchrun
from otelbpf.config import ConfigError, PrometheusExporterConfig
from otelbpf.export.factory import metric_exporter
from otelbpf.export.prometheus import PrometheusExporter
from otelbpf.families.nccl.correlator import SCOPE, NcclCorrelator
from otelbpf.families.registry import load_config_text


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> (labels, value) of every sample on /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        assert r.status == 200
        text = r.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def data_of(c: NcclCorrelator) -> MetricsData:
    """What the metrics loop pushes: the correlator's metrics, a resource each."""
    return MetricsData(
        resource_metrics=[
            ResourceMetrics(
                resource=r, scope_metrics=[ScopeMetrics(scope=SCOPE, metrics=ms, schema_url="")], schema_url=""
            )
            for r, ms in c.collect()
        ]
    )


@pytest.fixture
def exporter():
    clock = [0.0]
    e = PrometheusExporter("127.0.0.1", 0, expiration_s=60, clock=lambda: clock[0])
    e.clock = clock  # type: ignore[attr-defined]
    yield e
    e.shutdown()


def test_nccl_metrics_are_served_under_the_collector_s_names_with_resource_labels(exporter) -> None:
    c, _ = correlator({100 + r: torchrun(r) for r in range(4)}, completion_timeout_ns=500 * MS)
    feed(c, blocking_job(12, 40))
    data = data_of(c)
    exporter.export(data)
    served = scrape(exporter.port)
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = type(m.data).__name__.lower()
                monotonic = bool(getattr(m.data, "is_monotonic", False))
                for name in series_names(OtlpMetric(m.name, m.unit, kind, monotonic)):
                    assert name in served, f"{m.name} ({m.unit}) -> {name} not in {sorted(served)}"
    waits = served["nccl_collective_wait_seconds_count"]
    assert len(waits) == 4, "one series per rank: process.pid and host.name keep them apart"
    labels = waits[0][0]
    for key in ("nccl.comm.id", "nccl.rank", "nccl.job.id", "host.name", "process.pid"):
        assert label_name(key) in labels
    # a second scrape, before the next push, serves the same
    assert scrape(exporter.port)["nccl_collective_wait_seconds_count"] == waits


def test_a_process_not_refreshed_within_the_expiration_is_no_longer_served(exporter) -> None:
    c, _ = correlator({100: torchrun(0, 1)}, completion_timeout_ns=500 * MS)
    feed(c, blocking_job(6, 0, ranks=range(1), world=1, slow=-1))
    exporter.export(data_of(c))
    assert "nccl_collective_wait_seconds_count" in scrape(exporter.port)
    exporter.clock[0] = 61.0
    assert "nccl_collective_wait_seconds_count" not in scrape(exporter.port)


def test_the_config_and_the_factory() -> None:
    assert PrometheusExporterConfig().host_port == ("localhost", 9464)
    assert PrometheusExporterConfig(endpoint="[::1]:9100").host_port == ("::1", 9100)
    for bad in ("localhost", "http://h:1/x", "h:99999", "a b:1", "h:0"):
        with pytest.raises(ValueError):
            PrometheusExporterConfig(endpoint=bad)
    e = metric_exporter(PrometheusExporterConfig(endpoint="127.0.0.1:19464"))
    try:
        assert isinstance(e, PrometheusExporter) and e.port == 19464
    finally:
        e.shutdown()


def test_a_prometheus_exporter_in_the_traces_pipeline_is_refused() -> None:
    text = """
receivers: {nccl: {}}
exporters: {prometheus: {endpoint: "0.0.0.0:9464"}}
service:
  pipelines:
    traces: {receivers: [nccl], exporters: [prometheus]}
"""
    with pytest.raises(ConfigError, match="serves metrics only"):
        load_config_text(text)
    ok = text.replace("traces:", "metrics:")
    assert load_config_text(ok).exporters["prometheus"].endpoint == "0.0.0.0:9464"
