"""What the agent saw lately, held for `otelbpf top`: a read-only snapshot as plain JSON.

Two taps, no new collection: the metrics the metrics loop collected last (its ``on_collect``,
so nothing is collected twice: a correlator's ``collect()`` forgets exited processes, a
second caller would steal their last values), and
the last ``max_spans`` spans the correlators built (references kept in a ring; they are
converted only when a snapshot is asked for). Snapshots are cached for ``min_interval_s``,
so any number of viewers costs the agent at most a few snapshots a second.

Snapshot (``version`` 1)::

    {"version": 1, "agent_pid", "time_unix_nano", "metrics_time_unix_nano",
     "processes": [{"resource": {...}, "metrics": [{"name", "kind": "sum"|"gauge"|"histogram",
                    "points": [{"attributes", "value"} | {"attributes", "count", "sum", "max"}]}]}],
     "spans": [{"name", "scope", "kind", "trace_id", "span_id", "parent_id", "start", "end",
                "error", "attributes", "pid", "service"}],
     "timelines": [{"pid", "start_ns", "end_ns", "bucket_ns", "period_ns", "stacks", "threads"}]}

``timelines``: the profiler's CPU samples in time of the last ``TIMELINES_PER_PROCESS``
intervals of the processes that use a GPU (correlate/profile_record.CpuTimeline), newest
first, at most ``MAX_TIMELINE_ROWS`` rows: the live findings join them with the CUDA spans as
``otelbpf diagnose`` does with the files (analyze/idle.py).
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.metrics.export import DataT, ExponentialHistogram, Histogram, MetricsData, Sum
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.util.types import Attributes

from otelbpf.correlate.profile_record import Profile

VERSION = 1
#: A JSON object: a snapshot (its shape is above) or one of its parts, as sent and as read back.
JsonObject = dict[str, Any]
#: Attribute text longer than this is cut in snapshots (a URL, a kernel name).
MAX_TEXT = 160
#: CPU timelines kept: the last intervals of each process, of this many processes, and at most
#: this many rows in a snapshot (a busy thread makes ~990 a 10 s interval at 99 Hz).
TIMELINES_PER_PROCESS = 2
TIMELINE_PROCESSES = 64
MAX_TIMELINE_ROWS = 8192


def _value(v: object) -> object:
    if isinstance(v, str):
        return v if len(v) <= MAX_TEXT else v[:MAX_TEXT] + "..."
    if isinstance(v, (bool, int, float)):
        return v
    if isinstance(v, (tuple, list)):
        return [_value(x) for x in v[:16]]
    return str(v)[:MAX_TEXT]


def _attrs(attrs: Attributes) -> dict[str, object]:
    return {str(k): _value(v) for k, v in (attrs or {}).items()}


def _points(data: DataT) -> tuple[str, list[JsonObject]]:
    # An exponential histogram's points (count, sum, max) read as a histogram's: they have no value.
    if isinstance(data, (Histogram, ExponentialHistogram)):
        return "histogram", [
            {"attributes": _attrs(p.attributes), "count": p.count, "sum": p.sum, "max": p.max} for p in data.data_points
        ]
    if isinstance(data, Sum):  # with its start: a rate before a second collection (live/model.py)
        return "sum", [
            {"attributes": _attrs(p.attributes), "value": p.value, "start": p.start_time_unix_nano}
            for p in data.data_points
        ]
    return "gauge", [{"attributes": _attrs(p.attributes), "value": p.value} for p in data.data_points]


def _span(s: ReadableSpan) -> JsonObject:
    ctx, parent = s.context, s.parent
    res = s.resource.attributes if s.resource else {}
    pid = res.get("process.pid", 0)
    return {
        "name": s.name,
        "scope": s.instrumentation_scope.name if s.instrumentation_scope else "",
        "kind": s.kind.value + 1,  # OTLP numbering (SDK INTERNAL=0 is OTLP 1)
        "trace_id": f"{ctx.trace_id:032x}" if ctx else "",
        "span_id": f"{ctx.span_id:016x}" if ctx else "",
        "parent_id": f"{parent.span_id:016x}" if parent else "",
        "start": s.start_time or 0,
        "end": s.end_time or 0,
        "error": s.status.status_code.value == 2,
        "attributes": _attrs(s.attributes),
        "pid": int(pid or 0) if isinstance(pid, (int, float, str)) else 0,
        "service": str(res.get("service.name", "")),
    }


class LiveState:
    def __init__(
        self, max_spans: int = 2000, min_interval_s: float = 0.25, clock: Callable[[], int] = time.time_ns
    ) -> None:
        """``clock``: wall-clock ns stamped on collections and snapshots (tests pass their own)."""
        self._clock = clock
        self._spans: deque[ReadableSpan] = deque(maxlen=max_spans)
        self._metrics: MetricsData | None = None
        self._metrics_at = 0
        self._lock = threading.Lock()
        self._cached: tuple[float, JsonObject] | None = None
        self._min_interval = min_interval_s
        self._timelines: OrderedDict[int, deque[JsonObject]] = OrderedDict()

    def on_spans(self, spans: Sequence[ReadableSpan]) -> None:
        """Called with every batch of spans the correlators emit (deque appends are atomic)."""
        self._spans.extend(spans)

    def on_profiles(self, profiles: Sequence[Profile]) -> None:
        """Called with every batch of profiles the profiler makes: their CPU timelines kept."""
        with self._lock:
            for p in profiles:
                if p.timeline is None:
                    continue
                doc = {"pid": p.pid, "start_ns": p.start_ns, "end_ns": p.end_ns, **p.timeline.to_json()}
                kept = self._timelines.pop(p.pid, None) or deque(maxlen=TIMELINES_PER_PROCESS)
                kept.append(doc)
                self._timelines[p.pid] = kept  # the most recent last
                while len(self._timelines) > TIMELINE_PROCESSES:
                    self._timelines.popitem(last=False)

    def _timeline_docs(self) -> list[JsonObject]:
        """The kept timelines, newest first, up to MAX_TIMELINE_ROWS rows (lock held)."""
        out: list[JsonObject] = []
        rows = 0
        for kept in reversed(self._timelines.values()):
            for doc in reversed(kept):
                n = sum(len(r) for r in doc["threads"].values())
                if rows + n > MAX_TIMELINE_ROWS:
                    return out
                out.append(doc)
                rows += n
        return out

    def on_metrics(self, data: MetricsData) -> None:
        with self._lock:
            self._metrics, self._metrics_at = data, self._clock()

    def resource(self, pid: int) -> Resource | None:
        """The resource the newest span of process ``pid`` still held carries: the one its
        telemetry went out with, also after the process exited and the agent forgot it."""
        for span in reversed(self._spans.copy()):
            if span.resource is not None and span.resource.attributes.get("process.pid") == pid:
                return span.resource
        return None

    def snapshot(self) -> JsonObject:
        now = time.monotonic()
        with self._lock:
            if self._cached and now - self._cached[0] < self._min_interval:
                return self._cached[1]
            data, at = self._metrics, self._metrics_at
            timelines = self._timeline_docs()
        processes = []
        for rm in data.resource_metrics if data else ():
            metrics = []
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    kind, points = _points(m.data)
                    metrics.append({"name": m.name, "kind": kind, "points": points})
            processes.append({"resource": _attrs(rm.resource.attributes), "metrics": metrics})
        snap = {
            "version": VERSION,
            "agent_pid": os.getpid(),
            "time_unix_nano": self._clock(),
            "metrics_time_unix_nano": at,
            "processes": processes,
            "spans": [_span(s) for s in self._spans.copy()],
            "timelines": timelines,
        }
        with self._lock:
            self._cached = (now, snap)
        return snap
