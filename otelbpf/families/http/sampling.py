"""User space's half of HTTP/1 head sampling (bpf/sockets.c ``http_gate``).

The kernel decides at each HTTP/1 request's first bytes whether the request goes to the
ring whole (kept) or not at all (shed): kept with probability 2^-shift, and shed whatever
the draw while user space is more than ``backlog`` bytes behind the ring (what the kernel
wrote minus the stamp of the last data record processed here: the ring and the agent's
processing queue together). A shed request is counted in the kernel (``http_red``: process,
end, method, version, status, duration bucket) and those counts join the spans' RED
histograms here, so ``http.server.request.duration``'s count is every request, sampled or not.

This side:
- hands the kernel the stamp of the last data record processed (``processed``), every batch;
- moves ``shift`` (``tick``): one step up (half the requests) on any sign of pressure since the
  last tick (requests shed for the backlog, records lost in the kernel or dropped before
  processing, spans over the span budget), one step down after ``CALM_TICKS`` calm ticks when
  twice the kept rate still fits the span budget; never below the configured probability;
- counts the kernel's decisions (``otelbpf.http.sampled{decision}``) and reads the shed
  requests' counts as deltas of the kernel's cumulative ones (``red_deltas``).

Sampling shifts are powers of two, so that a kept span's adjusted count is exact and its
OpenTelemetry threshold (``ot=th:``, the probability-sampling spec) is a short hex string.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from opentelemetry.trace import SpanContext, TraceState

from otelbpf.base.events import Stat
from otelbpf.families.http.probes import (
    DECISIONS,
    DECISIONS_MAP,
    H2_ENDS,
    H2_RED_MAP,
    H2_STATS,
    H2_STATS_MAP,
    MAX_SHIFT,
    METHODS,
    RED_MAP,
    SAMPLING_BACKLOG,
    SAMPLING_MAP,
    SAMPLING_PROCESSED,
    SAMPLING_SHIFT,
)

#: Seconds between two moves of the shift.
TICK_S = 0.5
#: Calm ticks before the shift comes one step down.
CALM_TICKS = 6
#: 56 bits of randomness in a trace id (W3C trace context level 2), as the spec's threshold counts them.
_R_BITS = 56
#: gRPC codes that are server errors (OpenTelemetry's rpc conventions); any non-OK code fails a client call.
GRPC_SERVER_ERRORS = frozenset({2, 4, 12, 13, 14, 15})
#: HTTP/2 streams are sampled at the same shift (correlator.py ``_sampled_open``; a walked server's
#: in the kernel, ``h2_keep``): their decisions, as otelbpf.http.sampled's ``decision`` (``protocol=http2``).
STREAM_DECISIONS = ("kept", "probability", "parent")
STREAM_KEPT, STREAM_PROBABILITY, STREAM_PARENT = range(3)


def last_stamp(addrs: np.ndarray) -> int:
    """The highest stamp among data records' ``addr`` fields (sockets.c: its first 8 bytes)."""
    return int(np.frombuffer(np.ascontiguousarray(addrs).tobytes(), dtype="<u8")[::2].max())


def shift_for(probability: float) -> int:
    """The smallest shift whose probability 2^-shift is at most ``probability`` (1.0 -> 0)."""
    if probability >= 1.0:
        return 0
    return min(MAX_SHIFT, math.ceil(-math.log2(probability) - 1e-9))


def h2_keep(seq: int, stream: int, shift: int) -> bool:
    """Whether the kernel kept an HTTP/2 server stream at 2^-shift (bpf/h2_frames.h ``h2_keep``, bit
    for bit): murmur3's finalizer over the connection's sequence and the stream's id."""
    h = (seq ^ (stream * 0x9E3779B1)) & 0xFFFFFFFF
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    h ^= h >> 16
    return not h & ((1 << shift) - 1)


def threshold(shift: int) -> str:
    """The ``th`` value of OpenTelemetry's tracestate for probability 2^-shift: the 56-bit rejection
    threshold T = 2^56 - 2^(56-shift) in hex, trailing zeros removed ("0" for probability 1)."""
    if shift <= 0:
        return "0"
    t = (1 << _R_BITS) - (1 << (_R_BITS - shift))
    return f"{t:014x}".rstrip("0") or "0"


def consistent_trace_id(trace_id: int, shift: int) -> int:
    """``trace_id`` with its 56 random bits moved into the kept range (R >= T) for 2^-shift: a
    new trace's randomness, drawn given that it was kept, as consistent sampling would keep it."""
    if shift <= 0:
        return trace_id
    top = ((1 << shift) - 1) << (_R_BITS - shift)
    return trace_id | top


def randomness_kept(trace_id: int, shift: int) -> bool:
    """Whether a trace id's randomness R passes threshold 2^-shift (R >= T)."""
    t = (1 << _R_BITS) - (1 << (_R_BITS - shift))
    return (trace_id & ((1 << _R_BITS) - 1)) >= t


@dataclass(frozen=True, slots=True)
class RedDelta:
    """Shed requests counted in the kernel since the last read, for one series and bucket."""

    pid: int
    server: bool
    method: str
    version: str
    status: int
    bucket: int
    count: int
    sum_s: float
    min_s: float
    max_s: float


@dataclass(frozen=True, slots=True)
class H2Delta:
    """HTTP/2 streams the kernel counted (bpf/h2_frames.h) since the last read, for one series and bucket."""

    pid: int
    server: bool
    grpc: bool
    method: str  # "" unknown
    status: int  # 0 unknown
    code: int | None  # grpc-status, None unknown
    end: str  # ended | reset | closed
    bucket: int
    count: int
    sum_s: float
    min_s: float
    max_s: float


class HeadSampler:
    def __init__(
        self,
        update_map: Callable[[str, list[tuple[int, int]]], None],
        read_map: Callable[[str], list[tuple[Any, Any]]],
        with_bpf: Callable[[Callable[[Any], Any]], Any],
        count: Callable[..., None],
        queue_drops: Callable[[], int],
        *,
        min_shift: int,
        adaptive: bool,
        backlog_bytes: int,
        span_budget: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._update = update_map
        self._read = read_map
        self._with_bpf = with_bpf
        self._count = count
        self._queue_drops = queue_drops
        self.min_shift = min_shift
        self.shift = min_shift
        self._adaptive = adaptive
        self._backlog = backlog_bytes
        self._budget = span_budget
        self._clock = clock
        self._last_tick = 0.0
        self._calm = 0
        self._configured = False
        self._processed = 0
        self._decisions = [0] * len(DECISIONS)
        self._pending = [0] * len(DECISIONS)  # decisions since the controller's last tick
        self._lost = 0
        self._lost_pending = 0
        self._final: tuple[list[int], int, list[int]] | None = None
        #: tick() runs on the processing thread, tick(count_only) on the metrics thread
        self._lock = threading.Lock()
        self._dropped = 0
        self._over_budget = 0
        self._red_seen: dict[bytes, tuple[int, int]] = {}
        self._h2_seen: dict[bytes, tuple[int, int]] = {}
        self._h2_stats = [0] * len(H2_STATS)
        self._streams = [0] * len(STREAM_DECISIONS)  # HTTP/2 decisions not reported yet
        self._streams_kept = 0  # HTTP/2 streams kept since the controller's last tick

    def streams_decided(self, counts: list[int]) -> None:
        """HTTP/2 streams sampled in user space (by STREAM_* index), ended since the last call."""
        with self._lock:
            self._streams = [a + b for a, b in zip(self._streams, counts, strict=True)]
            self._streams_kept += counts[STREAM_KEPT]

    def processed(self, stamp: int) -> None:
        """The stamp of the last data record processed (bytes the kernel had written up to it)."""
        if not self._configured:
            self._configured = True
            self._update(SAMPLING_MAP, [(SAMPLING_SHIFT, self.shift), (SAMPLING_BACKLOG, self._backlog)])
        if stamp > self._processed:
            self._processed = stamp
            self._update(SAMPLING_MAP, [(SAMPLING_PROCESSED, stamp)])

    def over_budget(self, spans: int) -> None:
        """Spans the user-space budget dropped: kept by the kernel only to be thrown away here."""
        self._over_budget += spans

    def tick(self, *, count_only: bool = False) -> None:
        """Count the kernel's decisions and move the shift; at most once per TICK_S, but for
        ``count_only`` (a metrics export: the counts as they are now, the shift left alone)."""
        with self._lock:
            self._tick(count_only)

    def _tick(self, count_only: bool) -> None:
        now = self._clock()
        elapsed = now - self._last_tick
        if count_only:
            self._count_decisions(consume=False)
            return
        if elapsed < TICK_S:
            return
        first = self._last_tick == 0.0
        self._last_tick = now
        read = self._count_decisions(consume=True)
        if read is None:
            return
        delta, lost_now = read
        streams_kept, self._streams_kept = self._streams_kept, 0
        dropped = self._queue_drops()
        dropped_now, self._dropped = dropped - self._dropped, dropped
        over, self._over_budget = self._over_budget, 0
        if not self._adaptive or first:
            return
        pressure = delta[2] > 0 or delta[4] > 0 or lost_now > 0 or dropped_now > 0 or over > 0
        if pressure:
            self._calm = 0
            if self.shift < MAX_SHIFT:
                self._set(self.shift + 1)
            return
        self._calm += 1
        kept_rate = (delta[0] + streams_kept) / elapsed if elapsed > 0 else 0.0
        fits = not self._budget or 2 * kept_rate < 0.8 * self._budget  # no traces: no span budget
        if self._calm >= CALM_TICKS and self.shift > self.min_shift and fits:
            self._calm = 0
            self._set(self.shift - 1)

    def _count_decisions(self, *, consume: bool) -> tuple[list[int], int] | None:
        """Count the kernel's decisions since the last read. ``consume``: also hand the controller
        the decisions and kernel losses since its last tick, HTTP/2 connections switched to counting
        among the losses (None when the program is gone)."""
        streams, self._streams = self._streams, [0] * len(STREAM_DECISIONS)
        for name, n in zip(STREAM_DECISIONS, streams, strict=True):
            if n:
                self._count("otelbpf.http.sampled", n, decision=name, protocol="http2")
        read = self._with_bpf(_read_counters)
        if read is None:
            read, self._final = self._final, None  # unloaded: what on_unload read, once
            if read is None:
                return None
        decisions, lost, h2_stats = read
        for name, n, seen in zip(H2_STATS, h2_stats, self._h2_stats, strict=True):
            if n <= seen:
                continue
            if name.startswith("switched"):  # otelbpf.http.h2.counted_connections counts them, as announced
                self._lost_pending += n - seen  # HTTP/2 connections the agent no longer keeps up with: pressure
            else:
                self._count("otelbpf.http.problems", n - seen, reason=name)
        self._h2_stats = h2_stats
        delta = [max(0, n - seen) for n, seen in zip(decisions, self._decisions, strict=True)]
        self._decisions = decisions
        reported = list(delta)
        reported[0] -= min(delta[0], delta[4])  # ring_full ones were counted kept first
        for name, n in zip(DECISIONS, reported, strict=True):
            if n:
                self._count("otelbpf.http.sampled", n, decision=name, protocol="http1")
        self._pending = [a + b for a, b in zip(self._pending, delta, strict=True)]
        self._lost_pending += max(0, lost - self._lost)
        self._lost = lost
        if not consume:
            return None
        out = (self._pending, self._lost_pending)
        self._pending, self._lost_pending = [0] * len(DECISIONS), 0
        return out

    def on_unload(self, bpf: Any) -> None:
        """The family's last moment (under the sensor's lock): keep the final counts for the final export."""
        self._final = _read_counters(bpf)

    def _set(self, shift: int) -> None:
        self.shift = shift
        self._update(SAMPLING_MAP, [(SAMPLING_SHIFT, shift)])

    def h2_deltas(self, bounds_s: tuple[float, ...]) -> list[H2Delta]:
        """HTTP/2 streams the kernel counted since the last call (its counts are cumulative); the
        count goes to otelbpf.http.sampled{decision=counted, protocol=http2} too."""
        out = []
        counted = 0
        for k, v in self._read(H2_RED_MAP):
            key = bytes(memoryview(k))
            count, sum_ns = int(v.count), int(v.sum_ns)
            seen_count, seen_sum = self._h2_seen.get(key, (0, 0))
            if count <= seen_count:
                continue
            self._h2_seen[key] = (count, sum_ns)
            method, code, end = int(k.method), int(k.code), int(k.end)
            out.append(
                H2Delta(
                    pid=int(k.pid),
                    server=int(k.role) == 1,
                    grpc=bool(k.grpc),
                    method=METHODS[method] if 0 < method < len(METHODS) else "",
                    status=int(k.status),
                    code=code - 1 if code else None,
                    end=H2_ENDS[end] if 0 < end < len(H2_ENDS) else "ended",
                    bucket=min(int(k.bucket), len(bounds_s)),
                    count=count - seen_count,
                    sum_s=(sum_ns - seen_sum) / 1e9,
                    min_s=int(v.min_ns) / 1e9,
                    max_s=int(v.max_ns) / 1e9,
                )
            )
            counted += count - seen_count
        if counted:
            self._count("otelbpf.http.sampled", counted, decision="counted", protocol="http2")
        return out

    def red_deltas(self, bounds_s: tuple[float, ...]) -> list[RedDelta]:
        """Shed requests the kernel counted since the last call (its counts are cumulative)."""
        out = []
        for k, v in self._read(RED_MAP):
            key = bytes(memoryview(k))  # a ctypes struct
            count, sum_ns = int(v.count), int(v.sum_ns)
            seen_count, seen_sum = self._red_seen.get(key, (0, 0))
            if count <= seen_count:
                continue
            self._red_seen[key] = (count, sum_ns)
            method = int(k.method)
            out.append(
                RedDelta(
                    pid=int(k.pid),
                    server=int(k.role) == 1,
                    method=METHODS[method] if 0 < method < len(METHODS) else "_OTHER",
                    version=f"1.{int(k.minor)}",
                    status=int(k.status),
                    bucket=min(int(k.bucket), len(bounds_s)),
                    count=count - seen_count,
                    sum_s=(sum_ns - seen_sum) / 1e9,
                    min_s=int(v.min_ns) / 1e9,
                    max_s=int(v.max_ns) / 1e9,
                )
            )
        return out


def _read_counters(bpf: Any) -> tuple[list[int], int, list[int]]:
    """The kernel's decision counts, its sockdata losses and its HTTP/2 walk's counts, summed over CPUs."""
    table = bpf[DECISIONS_MAP]
    decisions = [int(sum(table[table.Key(i)])) for i in range(len(DECISIONS))]
    stats = bpf["stats"]
    h2 = bpf[H2_STATS_MAP]
    h2_stats = [int(sum(h2[h2.Key(i)])) for i in range(len(H2_STATS))]
    return decisions, int(sum(stats[stats.Key(int(Stat.SOCK_LOST))])), h2_stats


def h2_series(d: H2Delta, known_methods: frozenset[str], other: str) -> tuple[str, tuple[tuple[str, Any], ...]]:
    """The metric and the (sorted) labels an HTTP/2 stream the kernel counted goes to: the series a
    span of it would have fed (HttpCorrelator._record_metrics) as far as the kernel could read it.
    A gRPC call's route is never known there (its :path is HPACK-coded): ``_OTHER``, the series of
    the routes a process has too many of; an unknown status leaves its label out."""
    key: tuple[tuple[str, Any], ...]
    error = {"reset": "reset", "closed": "connection_closed"}.get(d.end)
    if d.grpc:
        key = (("rpc.system", "grpc"), ("rpc.service", other), ("rpc.method", other))
        if d.code is not None:
            key += (("rpc.grpc.status_code", d.code),)
            if error is None and (d.code in GRPC_SERVER_ERRORS if d.server else d.code != 0):
                error = str(d.code)
        elif error is None and d.status >= (500 if d.server else 400):
            error = str(d.status)
        metric = "rpc.server.duration" if d.server else "rpc.client.duration"
    else:
        key = (
            ("http.request.method", d.method if d.method in known_methods else other),
            ("network.protocol.version", "2"),
        )
        if d.status:
            cls = f"{d.status // 100}xx" if 100 <= d.status < 600 else "other"
            key += (("http.response.status_code", d.status), ("http.response.status_class", cls))
            if error is None and d.status >= (500 if d.server else 400):
                error = str(d.status)
        else:
            key += (("http.response.status_class", "none"),)
        metric = "http.server.request.duration" if d.server else "http.client.request.duration"
    if error is not None:
        key += (("error.type", error),)
    return metric, tuple(sorted(key))


def red_series(d: RedDelta, known_methods: frozenset[str], other: str) -> tuple[str, tuple[tuple[str, Any], ...]]:
    """The metric and the (sorted) labels a shed request counts under: the same series as a span's
    (HttpCorrelator._record_metrics), from what the kernel read of the request and status lines."""
    key: tuple[tuple[str, Any], ...] = (
        ("http.request.method", d.method if d.method in known_methods else other),
        ("network.protocol.version", d.version),
    )
    if d.status:
        cls = f"{d.status // 100}xx" if 100 <= d.status < 600 else "other"
        key += (("http.response.status_code", d.status), ("http.response.status_class", cls))
        if d.status >= (500 if d.server else 400):
            key += (("error.type", str(d.status)),)
    else:
        key += (("http.response.status_class", "none"),)
    metric = "http.server.request.duration" if d.server else "http.client.request.duration"
    return metric, tuple(sorted(key))


def add_counted(hist: Any, d: RedDelta | H2Delta) -> None:
    """Add the kernel's counts of one bucket to a metrics.HistogramState."""
    hist.counts[d.bucket] += d.count
    hist.total += d.sum_s
    hist.n += d.count
    hist.min = min(hist.min, d.min_s)
    hist.max = max(hist.max, d.max_s)


def sampled_context(ctx: SpanContext, shift: int, own_trace: bool) -> SpanContext:
    """A kept request's span context, for probability 2^-shift: a trace it starts gets randomness
    consistent with the threshold, and the threshold goes into tracestate (``ot=th:``) whenever
    the trace id's randomness passes it (an adopted trace id may not: then only the span's
    ``otelbpf.http.sampling.adjusted_count`` says it)."""
    trace_id = consistent_trace_id(ctx.trace_id, shift) if own_trace else ctx.trace_id
    state = ctx.trace_state
    if randomness_kept(trace_id, shift):
        state = TraceState([("ot", f"th:{threshold(shift)}")])
    return SpanContext(trace_id, ctx.span_id, ctx.is_remote, ctx.trace_flags, state)
