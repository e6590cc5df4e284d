"""How a response streamed: its transfer units and SSE events in time, and what an
OpenAI-compatible one said (genai.py).

A ``ResponseWatch`` is the body sink (protocols/http1.py ``BodySink``) the HTTP correlator sets on
a response worth watching: chunked or ``text/event-stream`` HTTP/1 responses, every HTTP/2
response (its DATA frames), and the response to an OpenAI-compatible request. It keeps counts,
first and last times and a fixed-bucket histogram of the gaps between units and between events:
constant memory whatever the stream's length. It asks for the body's bytes only when it parses
them (SSE, or a GenAI JSON body).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from opentelemetry.sdk.metrics.export import HistogramDataPoint

from otelbpf.correlate.metrics import DURATION_BOUNDS, Attrs
from otelbpf.families.http.genai import ResponseFacts
from otelbpf.families.http.protocols.limits import DEFAULT, Limits
from otelbpf.families.http.protocols.sse import EventStream

#: (entry ns, exit ns, thread id) of the syscall that carried a piece.
Stamp = tuple[int, int, int]


class Gaps:
    """An explicit-bucket histogram (seconds) fed one value at a time, OTel's (lower, upper] buckets."""

    __slots__ = ("bounds", "counts", "n", "total", "min", "max")

    def __init__(self, bounds: Sequence[float] = DURATION_BOUNDS) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.n = 0
        self.total = 0.0
        self.min = float("inf")
        self.max = 0.0

    def add(self, seconds: float) -> None:
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.n += 1
        self.total += seconds
        if seconds < self.min:
            self.min = seconds
        if seconds > self.max:
            self.max = seconds

    def merge(self, other: Gaps) -> None:
        self.counts = [a + b for a, b in zip(self.counts, other.counts)]
        self.n += other.n
        self.total += other.total
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)

    def point(self, attrs: Attrs, start_ns: int, now_ns: int) -> HistogramDataPoint:
        return HistogramDataPoint(
            attributes=attrs,
            start_time_unix_nano=start_ns,
            time_unix_nano=now_ns,
            count=self.n,
            sum=self.total,
            bucket_counts=list(self.counts),
            explicit_bounds=list(self.bounds),
            min=self.min if self.n else 0.0,
            max=self.max,
        )


class Pacing:
    """Arrival times of one kind of unit: how many, the first and last (ns), the gaps between them."""

    __slots__ = ("n", "first_ns", "last_ns", "gaps")

    def __init__(self) -> None:
        self.n = 0
        self.first_ns = 0
        self.last_ns = 0
        self.gaps: Gaps | None = None  # made at the second unit: most responses have one

    def add(self, t_ns: int) -> None:
        if self.n:
            if self.gaps is None:
                self.gaps = Gaps()
            self.gaps.add(max(t_ns - self.last_ns, 0) / 1e9)
        else:
            self.first_ns = t_ns
        self.n += 1
        self.last_ns = t_ns


class ResponseWatch:
    """One response body's sink: units (HTTP/1 chunks, HTTP/2 DATA frames), SSE events, GenAI facts."""

    __slots__ = ("units", "events", "sse", "genai", "problems", "wants_bytes")

    def __init__(self, *, sse: bool = False, genai: ResponseFacts | None = None, limits: Limits = DEFAULT) -> None:
        self.units = Pacing()
        self.events = Pacing()
        self.sse = EventStream(max_line=limits.sse_line, max_data=limits.sse_data) if sse else None
        self.genai = genai
        self.wants_bytes = sse or genai is not None
        #: What could not be followed, by reason (the SSE parser's, and the GenAI reader's).
        self.problems: dict[str, int] = self.sse.problems if self.sse is not None else {}

    def unit(self, stamp: Stamp) -> None:
        self.units.add(stamp[1])

    def data(self, data: bytes, stamp: Stamp) -> None:
        if self.sse is not None:
            for event in self.sse.feed(data, stamp):
                t = event.stamp[1]
                self.events.add(t)
                if self.genai is not None:
                    self.genai.event(event.data, t)
        elif self.genai is not None:
            self.genai.data(data, stamp[1])

    def gap(self, n: int) -> None:
        if self.sse is not None:
            self.sse.gap(n)
        elif self.genai is not None:
            self.genai.gap()

    def done(self) -> None:
        """The body ended (whole or not): a JSON body's facts are read now."""
        if self.genai is not None:
            if self.sse is None:
                self.genai.body_done()
            if self.genai.problem:
                self.problems[f"genai_{self.genai.problem}"] = 1
