"""A real OTLP collector for tests, with everything it forwards kept for assertions.

Data path: code under test --(OTLP gRPC or HTTP)--> rotel --(OTLP/gRPC)--> an in-process
sink. Tests therefore check telemetry that a real collector accepted, decoded and
re-encoded, not what an exporter object was handed. Typical use::

    collector = OtlpCollector()
    ...  # point the code under test at collector.grpc_endpoint or collector.http_endpoint
    span = collector.wait_for(lambda: collector.spans(name="cudaMemcpy"), what="a cudaMemcpy span")[0]
    collector.close()

``wait_for`` failures list what did arrive and end with rotel's own log.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from .otlp_records import MetricPoint, SpanRecord, freeze, metric_points_of, spans_of
from .otlp_sink import OtlpSink
from .rotel_process import RotelProcess

__all__ = ["MetricPoint", "OtlpCollector", "SpanRecord"]

T = TypeVar("T")
_LOG_TAIL_LINES = 60


class OtlpCollector:
    """rotel on free loopback ports (gRPC and HTTP receivers) in front of a recording sink.

    ``verbosity`` is rotel's ``--debug-log-verbosity``: ``"basic"`` logs one line per
    request received, ``"detailed"`` every field. ``batch_timeout`` is rotel's batch flush
    interval; the 20 ms default keeps rotel's batching in the path while keeping tests fast.
    """

    def __init__(self, *, verbosity: str = "basic", batch_timeout: str = "20ms") -> None:
        self._workdir = Path(tempfile.mkdtemp(prefix="otlp-collector-"))
        self._lock = threading.Lock()
        self._spans: list[SpanRecord] = []
        self._points: list[MetricPoint] = []
        self._traces_read = 0
        self._metrics_read = 0
        self._closed_log: str | None = None
        self._sink = OtlpSink()
        self._rotel = RotelProcess(
            self._sink.endpoint, self._workdir / "rotel.log", verbosity=verbosity, batch_timeout=batch_timeout
        )
        try:
            self._rotel.start(pick_new_ports_on_conflict=True)
        except BaseException:
            self.close()
            raise

    # -- endpoints and lifecycle ---------------------------------------------------------

    @property
    def grpc_endpoint(self) -> str:
        """What an OTLP/gRPC exporter is given, e.g. ``OTLPSpanExporter(endpoint=..., insecure=True)``."""
        return f"http://127.0.0.1:{self._rotel.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        """Base URL for OTLP/HTTP; signal paths ``/v1/traces`` and ``/v1/metrics`` are appended to it."""
        return f"http://127.0.0.1:{self._rotel.http_port}"

    @property
    def running(self) -> bool:
        return self._rotel.running

    def stop(self) -> None:
        """Take the collector down (both receivers refuse connections); the ports stay reserved to us."""
        self._rotel.stop()

    def start(self) -> None:
        """Bring the collector back on the same ports after ``stop()``; returns once it accepts."""
        self._rotel.start()

    def close(self) -> None:
        """Stop rotel and the sink and delete the work directory; ``log_text()`` keeps working."""
        self._rotel.stop()
        self._sink.stop()
        if self._closed_log is None:
            self._closed_log = self._rotel.log_text()
        shutil.rmtree(self._workdir, ignore_errors=True)

    def __enter__(self) -> OtlpCollector:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- received data -------------------------------------------------------------------

    def _refresh(self) -> None:
        """Flatten requests that arrived since the last call (each request is decoded once)."""
        traces = self._sink.trace_requests(self._traces_read)
        metrics = self._sink.metric_requests(self._metrics_read)
        self._traces_read += len(traces)
        self._metrics_read += len(metrics)
        for request in traces:
            self._spans.extend(spans_of(request))
        for request in metrics:
            self._points.extend(metric_points_of(request))

    def spans(self, name: str | None = None) -> list[SpanRecord]:
        """Every span received so far (optionally only those called ``name``), in arrival order."""
        with self._lock:
            self._refresh()
            return [span for span in self._spans if name is None or span.name == name]

    def metric_points(self, name: str | None = None) -> list[MetricPoint]:
        """Every metric data point received so far (optionally of metric ``name``), in arrival order."""
        with self._lock:
            self._refresh()
            return [point for point in self._points if name is None or point.name == name]

    def latest_points(self, name: str, **filters: Any) -> list[MetricPoint]:
        """The newest point of each series of metric ``name`` that matches every filter.

        A series is one (resource, scope, attributes) combination. A filter ``key=value``
        matches when the point's attributes or its resource have ``key`` equal to ``value``;
        pass dotted keys as ``**{"process.pid": 42}``.
        """
        latest: dict[Any, MetricPoint] = {}
        for point in self.metric_points(name):
            if not all(_has(point, key, value) for key, value in filters.items()):
                continue
            series = (freeze(point.resource), point.scope_name, freeze(point.attributes))
            if series not in latest or point.time_ns >= latest[series].time_ns:
                latest[series] = point
        return list(latest.values())

    def trace_requests(self) -> list[ExportTraceServiceRequest]:
        """The raw ``ExportTraceServiceRequest``s rotel forwarded, for checks the records do not cover."""
        return self._sink.trace_requests()

    def trace_states(self) -> dict[str, str]:
        """Each span's W3C tracestate as sent (span id in hex -> ``ot=th:...``): the records keep
        no tracestate, and a head-sampled span's threshold is what a backend re-weights by."""
        return {
            span.span_id.hex(): span.trace_state
            for request in self.trace_requests()
            for rs in request.resource_spans
            for ss in rs.scope_spans
            for span in ss.spans
        }

    def metric_requests(self) -> list[ExportMetricsServiceRequest]:
        """The raw ``ExportMetricsServiceRequest``s rotel forwarded."""
        return self._sink.metric_requests()

    def clear(self) -> None:
        """Forget everything received so far (rotel's log is kept)."""
        with self._lock:
            self._sink.clear()
            self._spans.clear()
            self._points.clear()
            self._traces_read = self._metrics_read = 0

    # -- waiting and diagnostics ---------------------------------------------------------

    def wait_for(
        self, predicate: Callable[[], T], timeout: float = 10.0, what: str | None = None, interval: float = 0.05
    ) -> T:
        """Poll ``predicate()`` until it returns something truthy, and return that.

        On timeout raise ``AssertionError`` naming ``what`` was awaited, what did arrive
        (span and metric names with counts), rotel's state and the tail of rotel's log.
        """
        deadline = time.monotonic() + timeout
        while True:
            result = predicate()
            if result:
                return result
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"timed out after {timeout:g}s waiting for {what or getattr(predicate, '__name__', 'predicate')}\n"
                    f"{self.describe()}"
                )
            time.sleep(interval)

    def describe(self) -> str:
        """What arrived through rotel so far, rotel's state, and the tail of its log."""
        spans = Counter(span.name for span in self.spans())
        points = Counter(f"{point.name} ({point.kind})" for point in self.metric_points())
        lines = [
            f"received through rotel: {len(self._sink.trace_requests())} trace requests, "
            f"{len(self._sink.metric_requests())} metrics requests",
            f"spans by name: {_counts(spans)}",
            f"metric points by name: {_counts(points)}",
            f"endpoints: gRPC {self.grpc_endpoint}, HTTP {self.http_endpoint}; {self._rotel.state()}",
            f"--- rotel log (last {_LOG_TAIL_LINES} lines) ---",
            *self.log_text().splitlines()[-_LOG_TAIL_LINES:],
        ]
        return "\n".join(lines)

    def log_text(self) -> str:
        """rotel's whole output across restarts: startup, errors, one entry per request received."""
        return self._closed_log if self._closed_log is not None else self._rotel.log_text()


def _has(point: MetricPoint, key: str, value: Any) -> bool:
    return (key in point.attributes and point.attributes[key] == value) or (
        key in point.resource and point.resource[key] == value
    )


def _counts(counter: Counter[str]) -> str:
    if not counter:
        return "none"
    return ", ".join(f"{name} x{count}" for name, count in sorted(counter.items()))
