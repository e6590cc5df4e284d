"""Small builders for OpenTelemetry SDK metric data.

The agent aggregates itself (counts come from BPF maps, bytes from events),
so it builds the SDK's data classes directly instead of recording through
instruments; the OTLP and file exporters then encode them as usual.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    NumberDataPoint,
    Sum,
)
from opentelemetry.util.types import AttributeValue

Attrs = Mapping[str, AttributeValue]

#: Seconds. Covers a few µs (a sync on an idle stream) to tens of seconds (a
#: checkpoint or a stalled collective).
DURATION_BOUNDS = (
    1e-6,
    5e-6,
    1e-5,
    5e-5,
    1e-4,
    5e-4,
    1e-3,
    5e-3,
    1e-2,
    5e-2,
    0.1,
    0.5,
    1.0,
    5.0,
    10.0,
    60.0,
)


class HistogramState:
    """Cumulative explicit-bucket histogram, fed with numpy arrays."""

    def __init__(self, bounds: Sequence[float] = DURATION_BOUNDS) -> None:
        self.bounds = np.asarray(bounds, dtype=float)
        self.counts = np.zeros(len(bounds) + 1, dtype=np.int64)
        self.total = 0.0
        self.n = 0
        self.min = float("inf")
        self.max = float("-inf")

    def add(self, values: np.ndarray) -> None:
        if not len(values):
            return
        # OTel buckets are (lower, upper]: a value equal to a bound belongs below it.
        idx = np.searchsorted(self.bounds, values, side="left")
        self.counts += np.bincount(idx, minlength=len(self.counts))
        self.total += float(values.sum())
        self.n += len(values)
        self.min = min(self.min, float(values.min()))
        self.max = max(self.max, float(values.max()))

    def point(self, attrs: Attrs, start_ns: int, now_ns: int) -> HistogramDataPoint:
        return HistogramDataPoint(
            attributes=attrs,
            start_time_unix_nano=start_ns,
            time_unix_nano=now_ns,
            count=self.n,
            sum=self.total,
            bucket_counts=[int(c) for c in self.counts],
            explicit_bounds=[float(b) for b in self.bounds],
            min=self.min if self.n else 0.0,
            max=self.max if self.n else 0.0,
        )


def cumulative_sum(
    name: str,
    unit: str,
    description: str,
    points: Iterable[tuple[Attrs, float]],
    start_ns: int,
    now_ns: int,
    monotonic: bool = True,
) -> Metric | None:
    return cumulative_sum_since(name, unit, description, ((a, v, start_ns) for a, v in points), now_ns, monotonic)


def cumulative_sum_since(
    name: str,
    unit: str,
    description: str,
    points: Iterable[tuple[Attrs, float, int]],
    now_ns: int,
    monotonic: bool = True,
) -> Metric | None:
    """A cumulative sum whose points each carry their own start (a series that began later, or
    whose counts were carried over from an earlier incarnation: ibverbs' queue pairs)."""
    dps = [
        NumberDataPoint(attributes=a, start_time_unix_nano=st, time_unix_nano=now_ns, value=v) for a, v, st in points
    ]
    if not dps:
        return None
    return Metric(
        name=name,
        description=description,
        unit=unit,
        data=Sum(data_points=dps, aggregation_temporality=AggregationTemporality.CUMULATIVE, is_monotonic=monotonic),
    )


def gauge(name: str, unit: str, description: str, points: Iterable[tuple[Attrs, float]], now_ns: int) -> Metric | None:
    dps = [NumberDataPoint(attributes=a, start_time_unix_nano=0, time_unix_nano=now_ns, value=v) for a, v in points]
    if not dps:
        return None
    return Metric(name=name, description=description, unit=unit, data=Gauge(data_points=dps))


def histogram(name: str, unit: str, description: str, points: list[HistogramDataPoint]) -> Metric | None:
    if not points:
        return None
    return Metric(
        name=name,
        description=description,
        unit=unit,
        data=Histogram(data_points=points, aggregation_temporality=AggregationTemporality.CUMULATIVE),
    )
