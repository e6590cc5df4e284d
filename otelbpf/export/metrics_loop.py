"""Export metrics every ``interval``: the probe families' cumulative metrics
per process, plus the agent's own otelbpf.* health.

All metrics are cumulative, so an export that fails loses nothing for good:
the next successful one carries the totals. Failures are still counted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from opentelemetry.sdk.metrics.export import (
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otelbpf.base.health import Health
from otelbpf.base.threadname import name_os_thread

log = logging.getLogger(__name__)

#: A source returns (resource, scope, metrics) triples.
Source = Callable[[], list[tuple[Resource, InstrumentationScope, list[Metric]]]]


class MetricsLoop:
    def __init__(
        self,
        exporters: Sequence[tuple[str, MetricExporter]],
        sources: Sequence[Source],
        health: Health,
        interval_s: float,
        on_collect: Callable[[MetricsData], None] | None = None,
    ) -> None:
        """``on_collect``: also given each collection (the live view, live/state.py): the same
        one the exporters get, since a source's collect() forgets the processes that exited."""
        self._on_collect = on_collect
        self._exporters = list(exporters)
        self._sources = list(sources)
        self._health = health
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otelbpf-metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        name_os_thread("otelbpf-metrics")
        while not self._stop.wait(self._interval):
            try:
                self.export_once()
            except Exception:  # a failed round must not end the loop: the agent would export nothing
                log.exception("metrics export failed; trying again in %.1fs", self._interval)
                self._health.add("otelbpf.metrics.export_errors")

    @property
    def failed(self) -> bool:
        """The timer thread ended before stop(): no metric leaves any more (the agent exits)."""
        return self._thread.ident is not None and not self._thread.is_alive() and not self._stop.is_set()

    def collect(self) -> MetricsData:
        grouped: dict[tuple[tuple[str, str], ...], tuple[Resource, list[ScopeMetrics]]] = {}
        for source in self._sources:
            try:
                for resource, scope, metrics in source():
                    key = tuple(sorted((k, str(v)) for k, v in resource.attributes.items()))
                    scopes = grouped.setdefault(key, (resource, []))[1]
                    scopes.append(ScopeMetrics(scope=scope, metrics=metrics, schema_url=""))
            except Exception:  # one broken source must not hide the others
                log.exception("metric source failed")
                self._health.add("otelbpf.metrics.source_errors")
        return MetricsData(
            resource_metrics=[
                ResourceMetrics(resource=resource, scope_metrics=scopes, schema_url="")
                for resource, scopes in grouped.values()
            ]
        )

    def export_once(self) -> None:
        data = self.collect()
        if self._on_collect is not None:
            self._on_collect(data)
        if not data.resource_metrics:
            return
        for name, exporter in self._exporters:
            try:
                result = exporter.export(data)
            except Exception as exc:
                log.warning("metric exporter %s raised: %s", name, exc)
                result = MetricExportResult.FAILURE
            if result == MetricExportResult.SUCCESS:
                self._health.add("otelbpf.export.sent", len(data.resource_metrics), signal="metrics", exporter=name)
            else:
                self._health.add("otelbpf.export.failures", 1, signal="metrics", exporter=name)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the timer and export one last time, so totals at exit are kept.

        Bounded: a round stuck on a lock (a correlator whose thread never lets go) must not
        hold the agent's exit. Then the final export is skipped, said and counted
        (``otelbpf.metrics.stop_timeouts``, in the log: nothing would carry it out)."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        final = threading.Thread(target=self.export_once, name="otelbpf-metrics-final", daemon=True)
        if not self._thread.is_alive():
            final.start()
            final.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive() or final.is_alive():
            self._health.add("otelbpf.metrics.stop_timeouts")
            log.error(
                "the last metrics export did not finish within %.0fs (a metric source is stuck): "
                "totals since the previous export are lost",
                timeout_s,
            )
        for _name, exporter in self._exporters:
            try:
                exporter.shutdown()
            except Exception as exc:
                log.warning("metric exporter shutdown failed: %s", exc)
