"""The live state's snapshot of the last metric collection (otelbpf/live/state.py)."""

from __future__ import annotations

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Buckets,
    ExponentialHistogram,
    ExponentialHistogramDataPoint,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otelbpf.live.state import LiveState

CUMULATIVE = AggregationTemporality.CUMULATIVE


def _collection(*metrics: Metric) -> MetricsData:
    scope = ScopeMetrics(InstrumentationScope("test"), list(metrics), "")
    return MetricsData([ResourceMetrics(Resource({"service.name": "svc", "process.pid": 42}), [scope], "")])


def test_an_exponential_histogram_is_snapshotted_by_count_sum_and_max():
    # Its points have no ``value``: the snapshot used to fail on them (found by mypy, issue 12).
    point = ExponentialHistogramDataPoint(
        {"op": "read"}, 0, 5, count=3, sum=6.0, scale=0, zero_count=0, positive=Buckets(0, [3]),
        negative=Buckets(0, []), flags=0, min=1.0, max=3.0,
    )  # fmt: skip
    counter = Sum([NumberDataPoint({"op": "read"}, 0, 5, 7)], CUMULATIVE, True)
    state = LiveState(clock=lambda: 1000)
    state.on_metrics(
        _collection(
            Metric("latency", None, "s", ExponentialHistogram([point], CUMULATIVE)),
            Metric("reads", None, "1", counter),
        )
    )

    [process] = state.snapshot()["processes"]

    assert process["resource"] == {"service.name": "svc", "process.pid": 42}
    assert process["metrics"] == [
        {
            "name": "latency",
            "kind": "histogram",
            "points": [{"attributes": {"op": "read"}, "count": 3, "sum": 6.0, "max": 3.0}],
        },
        {"name": "reads", "kind": "sum", "points": [{"attributes": {"op": "read"}, "value": 7, "start": 0}]},
    ]


def test_a_process_resource_is_the_one_its_newest_span_carries() -> None:
    from otelbpf.correlate.spans import make_span, scope

    state = LiveState()
    old, new = Resource({"process.pid": 42, "service.name": "sh"}), Resource({"process.pid": 42, "service.name": "py"})
    other = Resource({"process.pid": 7})
    for res in (old, new, other):
        state.on_spans([make_span("s", resource=res, scope=scope("t"), start_ns=1, end_ns=2, attributes={})])
    assert state.resource(42) is new and state.resource(7) is other and state.resource(9) is None
