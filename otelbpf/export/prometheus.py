"""The ``prometheus`` exporter: ``/metrics`` for Prometheus to scrape, as the Collector's.

For users who scrape node agents rather than send OTLP to a Collector. The conversion of names,
units and types is OpenTelemetry's Prometheus compatibility rules as the
``opentelemetry-exporter-prometheus`` package implements them (``nccl.collective.wait`` in ``s``
-> ``nccl_collective_wait_seconds_bucket``/``_sum``/``_count``, a monotonic sum gets ``_total``);
this module only adapts the agent's pipeline to it:

- the agent pushes cumulative ``MetricsData`` every ``metrics_interval``, and a scrape may come at
  any time, several times between pushes: the newest data of each (resource, scope) is kept and
  served on every scrape (the package's reader serves a push once), until ``metric_expiration``
  passes without a refresh (the process is gone);
- the agent's metrics are per process: the resource's attributes become labels
  (``resource_to_telemetry_conversion``) so that two processes' series do not collide, and no
  ``target_info`` (it would merge every process's resource into one).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
    ResourceMetrics,
)
from prometheus_client import CollectorRegistry, start_http_server

from otelbpf.config import PrometheusExporterConfig, to_seconds

log = logging.getLogger(__name__)

_Key = tuple[tuple[tuple[str, str], ...], str]  # (resource attributes, scope name)


class _Reader(PrometheusMetricReader):
    """The package's reader, fed on each scrape from ``snapshot`` instead of a MeterProvider.
    Its registry collector calls back before translating; the reader's own callback would ask a
    MeterProvider (there is none: the agent's sources are not SDK instruments), so the callback
    is pointed here (tests/export/test_prometheus_exporter.py catches a package that changes it)."""

    def __init__(self, snapshot: Callable[[], MetricsData], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._snapshot = snapshot
        self._collector._callback = self._feed  # type: ignore[assignment]  # typed None in the package

    def _feed(self) -> None:
        self._receive_metrics(self._snapshot())


class PrometheusExporter(MetricExporter):
    def __init__(
        self,
        host: str,
        port: int,
        *,
        resource_labels: bool = True,
        expiration_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._latest: dict[_Key, tuple[ResourceMetrics, float]] = {}
        self._expiration = expiration_s
        self._clock = clock
        self.registry = CollectorRegistry(auto_describe=False)
        self._reader = _Reader(
            self._snapshot,
            disable_target_info=True,
            resource_attribute_filter=(lambda key: True) if resource_labels else None,
            registry=self.registry,
        )
        self._server, self._thread = start_http_server(port, host, registry=self.registry)
        self.port = self._server.server_port
        log.info("prometheus exporter: /metrics on %s:%d", host, self.port)

    @classmethod
    def from_config(cls, cfg: PrometheusExporterConfig) -> PrometheusExporter:
        host, port = cfg.host_port
        return cls(
            host,
            port,
            resource_labels=cfg.resource_to_telemetry_conversion,
            expiration_s=to_seconds(cfg.metric_expiration),
        )

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        now = self._clock()
        with self._lock:
            for rm in metrics_data.resource_metrics:
                attrs = tuple(sorted((k, str(v)) for k, v in rm.resource.attributes.items()))
                for sm in rm.scope_metrics:
                    one = ResourceMetrics(resource=rm.resource, scope_metrics=[sm], schema_url=rm.schema_url)
                    self._latest[(attrs, sm.scope.name)] = (one, now)
        return MetricExportResult.SUCCESS

    def _snapshot(self) -> MetricsData:
        """The newest data of every (resource, scope) refreshed within the expiration."""
        horizon = self._clock() - self._expiration
        with self._lock:
            for key in [k for k, (_, t) in self._latest.items() if t < horizon]:
                del self._latest[key]
            kept = [rm for rm, _ in self._latest.values()]
        return MetricsData(resource_metrics=kept)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._reader.shutdown()
