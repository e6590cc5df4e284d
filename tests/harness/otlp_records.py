"""Flat, plain-Python views of decoded OTLP export requests.

Tests assert on exact content; nested protobufs make that noisy and easy to get wrong
(bytes ids, oneof values, enum ints). These records turn every span and every metric data
point into one frozen dataclass with hex ids, enum names and attributes as ``dict``s of
ordinary Python values, each carrying its resource and scope so a test can filter on them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.trace.v1 import trace_pb2


@dataclass(frozen=True)
class SpanRecord:
    """One span as it left the collector.

    ``kind`` and ``status_code`` are the proto enum names (``"SPAN_KIND_SERVER"``,
    ``"STATUS_CODE_ERROR"``); ids are lower-case hex, ``parent_span_id`` is ``""`` for a root.
    ``events`` are ``(name, attributes)`` pairs, ``links`` ``(trace_id, span_id, attributes)``.
    """

    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_span_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    scope_name: str
    scope_version: str
    status_code: str
    status_message: str
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    event_times_ns: list[int] = field(default_factory=list)
    links: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True)
class MetricPoint:
    """One metric data point as it left the collector.

    ``kind`` is the data field's name in the proto (``"sum"``, ``"gauge"``, ``"histogram"``,
    ``"exponential_histogram"``, ``"summary"``). ``value`` is set for sums and gauges (``int``
    or ``float`` as sent), ``count``/``sum`` for the distribution kinds, ``bucket_counts``/
    ``explicit_bounds``/``min``/``max`` for explicit-bucket histograms. ``temporality`` is the
    enum name (``"AGGREGATION_TEMPORALITY_CUMULATIVE"``) or ``None`` where the kind has none.
    Each exemplar is a dict with ``value``, ``filtered_attributes``, ``time_ns``, ``trace_id``
    and ``span_id`` (hex, ``""`` when absent).
    """

    name: str
    description: str
    unit: str
    kind: str
    is_monotonic: bool | None
    temporality: str | None
    attributes: dict[str, Any]
    resource: dict[str, Any]
    scope_name: str
    start_time_ns: int
    time_ns: int
    value: int | float | None = None
    count: int | None = None
    sum: float | None = None
    min: float | None = None
    max: float | None = None
    bucket_counts: list[int] = field(default_factory=list)
    explicit_bounds: list[float] = field(default_factory=list)
    exemplars: list[dict[str, Any]] = field(default_factory=list)


def any_value(value: AnyValue) -> Any:
    """Convert an OTLP ``AnyValue`` to the Python value an SDK user would have passed."""
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [any_value(item) for item in value.array_value.values]
    if which == "kvlist_value":
        return attributes(value.kvlist_value.values)
    return getattr(value, which)


def attributes(pairs: Iterable[KeyValue]) -> dict[str, Any]:
    return {pair.key: any_value(pair.value) for pair in pairs}


def freeze(value: Any) -> Any:
    """A hashable stand-in for an attribute value, so points can be grouped by series."""
    if isinstance(value, Mapping):
        return tuple(sorted((key, freeze(item)) for key, item in value.items()))
    if isinstance(value, list):
        return tuple(freeze(item) for item in value)
    return value


def spans_of(request: ExportTraceServiceRequest) -> Iterator[SpanRecord]:
    for resource_spans in request.resource_spans:
        resource = attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                yield SpanRecord(
                    name=span.name,
                    kind=trace_pb2.Span.SpanKind.Name(span.kind),
                    trace_id=span.trace_id.hex(),
                    span_id=span.span_id.hex(),
                    parent_span_id=span.parent_span_id.hex(),
                    start_ns=span.start_time_unix_nano,
                    end_ns=span.end_time_unix_nano,
                    attributes=attributes(span.attributes),
                    resource=resource,
                    scope_name=scope_spans.scope.name,
                    scope_version=scope_spans.scope.version,
                    status_code=trace_pb2.Status.StatusCode.Name(span.status.code),
                    status_message=span.status.message,
                    events=[(event.name, attributes(event.attributes)) for event in span.events],
                    event_times_ns=[event.time_unix_nano for event in span.events],
                    links=[
                        (link.trace_id.hex(), link.span_id.hex(), attributes(link.attributes)) for link in span.links
                    ],
                )


def _number(point: Any) -> int | float | None:
    """The value of a NumberDataPoint or Exemplar: ``as_int`` or ``as_double``, as sent."""
    which = point.WhichOneof("value")
    return None if which is None else getattr(point, which)


def _exemplar(exemplar: metrics_pb2.Exemplar) -> dict[str, Any]:
    return {
        "value": _number(exemplar),
        "filtered_attributes": attributes(exemplar.filtered_attributes),
        "time_ns": exemplar.time_unix_nano,
        "trace_id": exemplar.trace_id.hex(),
        "span_id": exemplar.span_id.hex(),
    }


def _temporality(data: Any) -> str:
    return metrics_pb2.AggregationTemporality.Name(data.aggregation_temporality)


def _points(metric: metrics_pb2.Metric, common: dict[str, Any]) -> Iterator[MetricPoint]:
    kind = metric.WhichOneof("data")
    if kind is None:
        return
    data = getattr(metric, kind)
    for point in data.data_points:
        fields: dict[str, Any] = dict(
            common,
            kind=kind,
            attributes=attributes(point.attributes),
            start_time_ns=point.start_time_unix_nano,
            time_ns=point.time_unix_nano,
            is_monotonic=data.is_monotonic if kind == "sum" else None,
            temporality=None if kind in ("gauge", "summary") else _temporality(data),
        )
        if kind in ("sum", "gauge"):
            fields["value"] = _number(point)
        else:
            fields["count"] = point.count
            fields["sum"] = point.sum
        if kind in ("histogram", "exponential_histogram"):
            fields["min"] = point.min if point.HasField("min") else None
            fields["max"] = point.max if point.HasField("max") else None
        if kind == "histogram":
            fields["bucket_counts"] = list(point.bucket_counts)
            fields["explicit_bounds"] = list(point.explicit_bounds)
        if kind != "summary":
            fields["exemplars"] = [_exemplar(exemplar) for exemplar in point.exemplars]
        yield MetricPoint(**fields)


def metric_points_of(request: ExportMetricsServiceRequest) -> Iterator[MetricPoint]:
    for resource_metrics in request.resource_metrics:
        resource = attributes(resource_metrics.resource.attributes)
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                common = dict(
                    name=metric.name,
                    description=metric.description,
                    unit=metric.unit,
                    resource=resource,
                    scope_name=scope_metrics.scope.name,
                )
                yield from _points(metric, common)
