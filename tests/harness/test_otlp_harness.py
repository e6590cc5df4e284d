"""The OTLP harness, proven with the real opentelemetry-sdk exporters through real rotel.

Each test sends known telemetry over OTLP/gRPC or OTLP/HTTP, lets rotel receive, batch and
re-export it, and checks the sink's flattened view field by field. That also pins down what
rotel forwards unchanged (int/double/bool/str/array attributes, explicit times, events,
links, status, histogram buckets, min/max, exemplars with filtered attributes) and that an
exporter reaches it again after ``stop()`` / ``start()`` on the same ports.
"""

from __future__ import annotations

import socket
import time

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics import Counter, MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from harness.otlp import MetricPoint, OtlpCollector, SpanRecord

T0 = 1_700_000_000_000_000_000  # explicit span times, so they can be compared exactly
NEVER_MS = 3_600_000  # periodic metric export interval; tests export with force_flush()
LINKED_TRACE = 0x0AF7651916CD43DD8448EB211C80319C
LINKED_SPAN = 0xB7AD6B7169203331


def span_exporter(collector: OtlpCollector, protocol: str, timeout: float = 5.0):
    if protocol == "grpc":
        return GrpcSpanExporter(endpoint=collector.grpc_endpoint, insecure=True, timeout=timeout)
    return HttpSpanExporter(endpoint=f"{collector.http_endpoint}/v1/traces", timeout=timeout)


def metric_exporter(collector: OtlpCollector, protocol: str, **options):
    if protocol == "grpc":
        return GrpcMetricExporter(endpoint=collector.grpc_endpoint, insecure=True, **options)
    return HttpMetricExporter(endpoint=f"{collector.http_endpoint}/v1/metrics", **options)


def tracer_provider(collector: OtlpCollector, protocol: str, resource: Resource, **options) -> TracerProvider:
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(SimpleSpanProcessor(span_exporter(collector, protocol, **options)))
    return provider


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_spans_arrive_exactly(otlp_collector: OtlpCollector, protocol: str) -> None:
    resource = Resource({"service.name": "harness-test", "host.id": 7, "protocol": protocol})
    provider = tracer_provider(otlp_collector, protocol, resource)
    tracer = provider.get_tracer("harness.scope", "1.2.3")
    root = tracer.start_span(
        "request",
        kind=SpanKind.SERVER,
        start_time=T0,
        attributes={"i": 7, "d": 2.5, "b": True, "s": "text", "list": ["a", "b"], "neg": -3},
    )
    linked = SpanContext(LINKED_TRACE, LINKED_SPAN, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    child = tracer.start_span(
        "cudaMemcpy",
        context=trace.set_span_in_context(root),
        kind=SpanKind.CLIENT,
        start_time=T0 + 1_000,
        links=[Link(linked, {"link.kind": "follows"})],
    )
    child.add_event("copy.done", {"bytes": 4096, "async": False}, timestamp=T0 + 4_000)
    child.set_status(Status(StatusCode.ERROR, "error 35"))
    child.end(end_time=T0 + 5_000)
    root.end(end_time=T0 + 10_000)
    provider.shutdown()

    otlp_collector.wait_for(lambda: len(otlp_collector.spans()) >= 2, timeout=5, what="2 spans")
    spans = {span.name: span for span in otlp_collector.spans()}
    trace_id = f"{root.get_span_context().trace_id:032x}"
    root_id = f"{root.get_span_context().span_id:016x}"
    common = dict(
        trace_id=trace_id, resource=dict(resource.attributes), scope_name="harness.scope", scope_version="1.2.3"
    )
    assert len(otlp_collector.spans()) == 2
    assert spans == {
        "request": SpanRecord(
            name="request",
            kind="SPAN_KIND_SERVER",
            span_id=root_id,
            parent_span_id="",
            start_ns=T0,
            end_ns=T0 + 10_000,
            attributes={"i": 7, "d": 2.5, "b": True, "s": "text", "list": ["a", "b"], "neg": -3},
            status_code="STATUS_CODE_UNSET",
            status_message="",
            **common,
        ),
        "cudaMemcpy": SpanRecord(
            name="cudaMemcpy",
            kind="SPAN_KIND_CLIENT",
            span_id=f"{child.get_span_context().span_id:016x}",
            parent_span_id=root_id,
            start_ns=T0 + 1_000,
            end_ns=T0 + 5_000,
            attributes={},
            status_code="STATUS_CODE_ERROR",
            status_message="error 35",
            events=[("copy.done", {"bytes": 4096, "async": False})],
            event_times_ns=[T0 + 4_000],
            links=[(f"{LINKED_TRACE:032x}", f"{LINKED_SPAN:016x}", {"link.kind": "follows"})],
            **common,
        ),
    }
    assert spans["cudaMemcpy"].duration_ns == 4_000


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_metrics_arrive_exactly_with_exemplars(otlp_collector: OtlpCollector, protocol: str) -> None:
    resource = Resource({"service.name": "harness-test", "protocol": protocol})
    exporter = metric_exporter(otlp_collector, protocol, preferred_temporality={Counter: AggregationTemporality.DELTA})
    provider = MeterProvider(
        resource=resource,
        metric_readers=[PeriodicExportingMetricReader(exporter, export_interval_millis=NEVER_MS)],
        # Keeping only "route" moves "peer" into the exemplars' filtered attributes.
        views=[View(instrument_name="latency", attribute_keys={"route"})],
    )
    meter = provider.get_meter("harness.meter")
    latency = meter.create_histogram("latency", unit="ms", explicit_bucket_boundaries_advisory=[1.0, 10.0, 100.0])
    copied = meter.create_counter("bytes", unit="By", description="bytes copied")
    inflight = meter.create_up_down_counter("inflight")
    meter.create_observable_gauge(
        "temperature", callbacks=[lambda options: [Observation(41.5, {"gpu": 0})]], unit="Cel"
    )
    sampled = TracerProvider().get_tracer("exemplar-source")
    recorded_from = time.time_ns()
    with sampled.start_as_current_span("work") as span:
        for value in (0.5, 5.0, 50.0, 500.0):
            latency.record(value, {"route": "/a", "peer": "x"})
        copied.add(4096, {"direction": "h2d"})
    recorded_until = time.time_ns()
    inflight.add(3)
    inflight.add(-5)
    provider.shutdown()  # collects and exports once

    names = {"latency", "bytes", "inflight", "temperature"}
    otlp_collector.wait_for(
        lambda: names <= {p.name for p in otlp_collector.metric_points()}, timeout=5, what=f"points of {sorted(names)}"
    )
    points = {point.name: point for point in otlp_collector.metric_points()}
    assert len(otlp_collector.metric_points()) == 4
    trace_id = f"{span.get_span_context().trace_id:032x}"
    span_id = f"{span.get_span_context().span_id:016x}"
    latency_point = points["latency"]
    common = dict(resource=dict(resource.attributes), scope_name="harness.meter")
    assert latency_point == MetricPoint(
        name="latency",
        description="",
        unit="ms",
        kind="histogram",
        is_monotonic=None,
        temporality="AGGREGATION_TEMPORALITY_CUMULATIVE",
        attributes={"route": "/a"},
        start_time_ns=latency_point.start_time_ns,
        time_ns=latency_point.time_ns,
        count=4,
        sum=555.5,
        min=0.5,
        max=500.0,
        bucket_counts=[1, 1, 1, 1],
        explicit_bounds=[1.0, 10.0, 100.0],
        exemplars=[
            {
                "value": value,
                "filtered_attributes": {"peer": "x"},
                "time_ns": exemplar["time_ns"],
                "trace_id": trace_id,
                "span_id": span_id,
            }
            for value, exemplar in zip((0.5, 5.0, 50.0, 500.0), latency_point.exemplars, strict=True)
        ],
        **common,
    )
    assert 0 < latency_point.start_time_ns <= latency_point.time_ns
    assert all(recorded_from <= e["time_ns"] <= recorded_until for e in latency_point.exemplars)
    bytes_point = points["bytes"]
    assert (bytes_point.kind, bytes_point.is_monotonic, bytes_point.temporality) == (
        "sum",
        True,
        "AGGREGATION_TEMPORALITY_DELTA",
    )
    assert (bytes_point.value, bytes_point.unit, bytes_point.description, bytes_point.attributes) == (
        4096,
        "By",
        "bytes copied",
        {"direction": "h2d"},
    )
    assert [(e["value"], e["filtered_attributes"], e["trace_id"], e["span_id"]) for e in bytes_point.exemplars] == [
        (4096, {}, trace_id, span_id)
    ]
    inflight_point = points["inflight"]
    assert (inflight_point.kind, inflight_point.is_monotonic, inflight_point.temporality, inflight_point.value) == (
        "sum",
        False,
        "AGGREGATION_TEMPORALITY_CUMULATIVE",
        -2,
    )
    gauge = points["temperature"]
    assert (gauge.kind, gauge.value, gauge.unit, gauge.attributes, gauge.temporality, gauge.is_monotonic) == (
        "gauge",
        41.5,
        "Cel",
        {"gpu": 0},
        None,
        None,
    )
    assert all(point.resource == dict(resource.attributes) for point in points.values())


def test_latest_points_picks_newest_point_per_series(otlp_collector: OtlpCollector) -> None:
    resource = Resource({"service.name": "harness-test", "host.name": "node-1"})
    reader = PeriodicExportingMetricReader(metric_exporter(otlp_collector, "grpc"), export_interval_millis=NEVER_MS)
    provider = MeterProvider(resource=resource, metric_readers=[reader])
    launches = provider.get_meter("harness.meter").create_counter("launches")
    launches.add(1, {"gpu": 0})
    launches.add(10, {"gpu": 1})
    assert provider.force_flush(5_000)
    otlp_collector.wait_for(lambda: len(otlp_collector.metric_points("launches")) == 2, timeout=5, what="first export")
    launches.add(5, {"gpu": 1})
    assert provider.force_flush(5_000)
    otlp_collector.wait_for(lambda: len(otlp_collector.metric_points("launches")) == 4, timeout=5, what="second export")
    provider.shutdown()

    assert sorted(p.value for p in otlp_collector.latest_points("launches")) == [1, 15]
    assert [p.value for p in otlp_collector.latest_points("launches", gpu=1)] == [15]
    assert len(otlp_collector.latest_points("launches", **{"host.name": "node-1"})) == 2
    assert otlp_collector.latest_points("launches", **{"host.name": "node-2"}) == []


def _refuses(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return False
    except ConnectionRefusedError:
        return True


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_stop_then_start_on_same_ports(otlp_collector: OtlpCollector, protocol: str) -> None:
    endpoints = (otlp_collector.grpc_endpoint, otlp_collector.http_endpoint)
    # One exporter for the whole test, as an agent has: it must reach the collector again by itself.
    provider = tracer_provider(otlp_collector, protocol, Resource({"service.name": "harness-test"}), timeout=2.0)
    tracer = provider.get_tracer("harness.scope")
    tracer.start_span("before").end()
    otlp_collector.wait_for(lambda: otlp_collector.spans("before"), timeout=5, what="span 'before'")

    otlp_collector.stop()
    assert not otlp_collector.running
    assert _refuses(int(otlp_collector.grpc_endpoint.rsplit(":", 1)[1]))
    assert _refuses(int(otlp_collector.http_endpoint.rsplit(":", 1)[1]))
    tracer.start_span("while-down").end()  # the exporter gives up after its 2 s timeout

    otlp_collector.start()
    assert otlp_collector.running
    assert (otlp_collector.grpc_endpoint, otlp_collector.http_endpoint) == endpoints
    tracer.start_span("after").end()
    otlp_collector.wait_for(lambda: otlp_collector.spans("after"), timeout=5, what="span 'after' once restarted")
    provider.shutdown()
    assert [span.name for span in otlp_collector.spans()] == ["before", "after"]
    assert otlp_collector.log_text().count("Starting Rotel") == 2


def test_wait_for_timeout_says_what_arrived(otlp_collector: OtlpCollector) -> None:
    provider = tracer_provider(otlp_collector, "grpc", Resource({"service.name": "harness-test"}))
    provider.get_tracer("harness.scope").start_span("present").end()
    otlp_collector.wait_for(lambda: otlp_collector.spans("present"), timeout=5, what="span 'present'")
    provider.shutdown()

    with pytest.raises(AssertionError) as failure:
        otlp_collector.wait_for(lambda: otlp_collector.spans("absent"), timeout=0.2, what="span 'absent'")
    message = str(failure.value)
    assert "timed out after 0.2s waiting for span 'absent'" in message
    assert "spans by name: present x1" in message
    assert "metric points by name: none" in message
    assert "rotel is running" in message
    assert "Received traces" in message  # rotel's own debug log line for the request


def test_clear_forgets_received_data(otlp_collector: OtlpCollector) -> None:
    provider = tracer_provider(otlp_collector, "http", Resource({"service.name": "harness-test"}))
    tracer = provider.get_tracer("harness.scope")
    tracer.start_span("first").end()
    otlp_collector.wait_for(lambda: otlp_collector.spans("first"), timeout=5, what="span 'first'")
    otlp_collector.clear()
    assert otlp_collector.spans() == [] and otlp_collector.trace_requests() == []
    tracer.start_span("second").end()
    otlp_collector.wait_for(lambda: otlp_collector.spans("second"), timeout=5, what="span 'second'")
    provider.shutdown()
    assert [span.name for span in otlp_collector.spans()] == ["second"]


def test_collectors_run_side_by_side_and_close_cleanly() -> None:
    with OtlpCollector() as first, OtlpCollector() as second:
        assert len({first.grpc_endpoint, first.http_endpoint, second.grpc_endpoint, second.http_endpoint}) == 4
    assert not first.running and not second.running
    assert "Starting Rotel" in first.log_text()
