"""HTTP/1 head sampling, user space's half (sampling.py): thresholds as OpenTelemetry's
probability-sampling spec writes them, the shift controller, and the kernel's counts of shed
requests joining the spans' series."""

from __future__ import annotations

import ctypes
import re
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

from otelbpf.base.events import Kind, SockFunc
from otelbpf.correlate import metrics as m
from otelbpf.families.http.correlator import KNOWN_METHODS, OTHER
from otelbpf.families.http.probes import (
    DECISIONS,
    H2_RED_MAP,
    H2_STATS,
    RED_MAP,
    SAMPLING_BACKLOG,
    SAMPLING_MAP,
    SAMPLING_PROCESSED,
    SAMPLING_SHIFT,
    SHIFT_BIT,
    bounds_c,
)
from otelbpf.families.http.sampling import (
    CALM_TICKS,
    TICK_S,
    HeadSampler,
    RedDelta,
    add_counted,
    consistent_trace_id,
    last_stamp,
    randomness_kept,
    red_series,
    sampled_context,
    shift_for,
    threshold,
)


@pytest.mark.parametrize(
    ("probability", "shift", "th"),
    [(1.0, 0, "0"), (0.5, 1, "8"), (0.25, 2, "c"), (0.3, 2, "c"), (1 / 1024, 10, "ffc"), (1e-9, 20, "fffff")],
)
def test_probability_rounds_down_to_a_power_of_two_and_its_threshold(probability, shift, th):
    assert shift_for(probability) == shift
    assert threshold(shift) == th
    # the spec's meaning of th: reject R < T, T = th padded to 56 bits; P(keep) = 1 - T / 2^56
    t = int(th.ljust(14, "0"), 16)
    assert 1 - t / 2**56 == pytest.approx(2.0**-shift)


def test_a_new_trace_gets_randomness_the_threshold_keeps_an_adopted_one_is_left_alone():
    rng = np.random.default_rng(7)
    for shift in (1, 2, 5, 20):
        for _ in range(50):
            tid = int(rng.integers(1, 2**63)) << 64 | int(rng.integers(0, 2**63))
            own = consistent_trace_id(tid, shift)
            assert randomness_kept(own, shift)
            assert own >> 56 == tid >> 56  # only the random bits the threshold reads are moved
            ctx = SpanContext(tid, 5, False, TraceFlags(1))
            mine = sampled_context(ctx, shift, own_trace=True)
            assert mine.trace_id == own and mine.trace_state.get("ot") == f"th:{threshold(shift)}"
            adopted = sampled_context(ctx, shift, own_trace=False)
            assert adopted.trace_id == tid
            assert ("ot" in adopted.trace_state) == randomness_kept(tid, shift)


def test_last_stamp_reads_the_first_eight_bytes_of_each_address():
    addrs = np.zeros(3, dtype="V16")
    raw = addrs.view(np.uint8).reshape(3, 16)
    for i, stamp in enumerate((100, 9_000_000_000, 42)):
        raw[i, :8] = np.frombuffer(stamp.to_bytes(8, "little"), dtype=np.uint8)
        raw[i, 8:] = 0xFF  # the rest of the field is not the stamp
    assert last_stamp(addrs) == 9_000_000_000


def test_kernel_bounds_are_the_span_histograms_in_ns():
    count, bounds, bound = bounds_c()
    assert count == f"-DHTTP_BUCKETS={len(m.DURATION_BOUNDS)}"
    assert bounds.startswith("-DHTTP_BOUNDS_NS={1000ULL,5000ULL,") and bounds.endswith("60000000000ULL}")
    # HTTP_BOUND(i): one "(i) == k ? bound : " arm per bucket, in order (a constant once unrolled)
    arms = re.findall(r"\(i\) == (\d+) \? (\d+)ULL : ", bound)
    got = [int(b) for _, b in arms]
    assert [int(k) for k, _ in arms] == list(range(len(m.DURATION_BOUNDS)))
    assert got == [round(b * 1e9) for b in m.DURATION_BOUNDS]


class FakeKernel:
    """The maps HeadSampler talks to: decisions and losses it reads, values it writes."""

    def __init__(self) -> None:
        self.decisions = [0] * len(DECISIONS)
        self.lost = 0
        self.h2_stats = [0] * len(H2_STATS)
        self.writes: dict[str, dict[int, int]] = {SAMPLING_MAP: {}}
        self.red: list[tuple[Any, Any]] = []  # http_red
        self.h2_red: list[tuple[Any, Any]] = []

    def update(self, name: str, items: list[tuple[int, int]]) -> None:
        self.writes[name].update(items)

    def with_bpf(self, fn):
        return list(self.decisions), self.lost, list(self.h2_stats)

    def read(self, name: str) -> list[tuple[Any, Any]]:
        return {RED_MAP: self.red, H2_RED_MAP: self.h2_red}[name]


def sampler(kernel: FakeKernel, now: list[float], counts: list, **kw: Any) -> HeadSampler:
    options = {"min_shift": 0, "adaptive": True, "backlog_bytes": 4096, "span_budget": 1000, **kw}
    s = HeadSampler(
        kernel.update,
        kernel.read,
        kernel.with_bpf,
        lambda metric, n, **attrs: counts.append((metric, n, attrs)),
        lambda: 0,
        clock=lambda: now[0],
        **options,
    )
    return s


def test_processed_stamps_and_the_configuration_reach_the_kernel():
    k, now, counts = FakeKernel(), [100.0], []
    s = sampler(k, now, counts, min_shift=3, backlog_bytes=8192)
    s.processed(500)
    s.processed(400)  # older: not written back
    assert k.writes[SAMPLING_MAP] == {SAMPLING_SHIFT: 3, SAMPLING_BACKLOG: 8192, SAMPLING_PROCESSED: 500}


def test_shift_rises_on_pressure_falls_when_calm_and_never_below_the_configured_one():
    k, now, counts = FakeKernel(), [100.0], []
    s = sampler(k, now, counts, min_shift=1)
    s.tick()  # the first tick only reads the counters
    for i in range(3):
        now[0] += TICK_S
        k.decisions[0] += 10
        k.decisions[2] += 50  # shed for the backlog: pressure
        s.tick()
        assert s.shift == 2 + i
    assert k.writes[SAMPLING_MAP][SAMPLING_SHIFT] == 4
    now[0] += TICK_S
    k.lost += 3  # records lost in the kernel: pressure too
    s.tick()
    assert s.shift == 5
    for _ in range(4 * CALM_TICKS):
        now[0] += TICK_S
        k.decisions[0] += 100  # 200 kept/s: twice that fits the budget of 1000
        s.tick()
    assert s.shift == 1  # back down, one step per CALM_TICKS calm ticks, to the configured floor
    s.over_budget(5)  # spans over the budget: the kernel should have shed them
    now[0] += TICK_S
    s.tick()
    assert s.shift == 2
    kept = sum(n for metric, n, a in counts if a == {"decision": "kept", "protocol": "http1"})
    assert kept == k.decisions[0]
    assert sum(n for metric, n, a in counts if a == {"decision": "backlog", "protocol": "http1"}) == 150


def test_ring_full_requests_are_reported_once_not_as_kept():
    k, now, counts = FakeKernel(), [100.0], []
    s = sampler(k, now, counts, adaptive=False)
    k.decisions[0] = 10
    k.decisions[4] = 3  # of the 10 kept, 3 found the ring full at their first record and were shed
    s.tick()
    got = {a["decision"]: n for _m, n, a in counts}
    assert got == {"kept": 7, "ring_full": 3}


class RedKey(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_uint32),
        ("role", ctypes.c_uint8),
        ("method", ctypes.c_uint8),
        ("minor", ctypes.c_uint8),
        ("bucket", ctypes.c_uint8),
        ("status", ctypes.c_uint16),
        ("pad", ctypes.c_uint16),
    ]


def test_kernel_counts_are_read_as_deltas_into_the_spans_series():
    k, now, counts = FakeKernel(), [100.0], []
    s = sampler(k, now, counts)
    key = RedKey(pid=7, role=1, method=1, minor=1, bucket=3, status=503)
    k.red = [(key, SimpleNamespace(count=5, sum_ns=50_000, min_ns=8_000, max_ns=12_000))]
    [d] = s.red_deltas(m.DURATION_BOUNDS)
    assert (d.pid, d.server, d.method, d.version, d.status, d.count) == (7, True, "GET", "1.1", 503, 5)
    assert d.sum_s == pytest.approx(50e-6)
    assert s.red_deltas(m.DURATION_BOUNDS) == []  # nothing new
    k.red = [(key, SimpleNamespace(count=7, sum_ns=70_000, min_ns=8_000, max_ns=12_000))]
    [d2] = s.red_deltas(m.DURATION_BOUNDS)
    assert d2.count == 2 and d2.sum_s == pytest.approx(20e-6)
    metric, series = red_series(d, KNOWN_METHODS, OTHER)
    assert metric == "http.server.request.duration"
    assert dict(series) == {
        "http.request.method": "GET",
        "network.protocol.version": "1.1",
        "http.response.status_code": 503,
        "http.response.status_class": "5xx",
        "error.type": "503",
    }
    assert list(series) == sorted(series)
    hist = m.HistogramState()
    hist.add(np.array([3e-5]))
    add_counted(hist, d)
    assert hist.n == 6 and hist.counts[3] == 6 and hist.min == pytest.approx(8e-6)


def test_a_client_request_without_response_and_a_client_error():
    none = RedDelta(1, False, "POST", "1.1", 0, 2, 1, 0.1, 0.1, 0.1)
    metric, series = red_series(none, KNOWN_METHODS, OTHER)
    assert metric == "http.client.request.duration"
    assert dict(series) == {
        "http.request.method": "POST",
        "network.protocol.version": "1.1",
        "http.response.status_class": "none",
    }
    err = RedDelta(1, False, "GET", "1.0", 404, 2, 1, 0.1, 0.1, 0.1)
    assert dict(red_series(err, KNOWN_METHODS, OTHER)[1])["error.type"] == "404"


def test_the_correlator_marks_kept_spans_and_adds_the_shed_requests_to_their_series():
    from families.http.test_http_unit import CLIENT_PID, SERVER_PID, Http, Records  # the correlator's own harness

    k, now, counts = FakeKernel(), [100.0], []
    http = Http(sampler=sampler(k, now, counts))
    rec = Records()
    rec.accept(1_000)
    rec.connect(900)
    rec.io(SockFunc.sendto, b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n", 2_000, 500, pid=CLIENT_PID, fd=6)
    rec.io(SockFunc.recvfrom, b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n", 2_100, 600, pid=SERVER_PID, fd=5)
    response = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    rec.io(SockFunc.sendto, response, 3_000, 500, pid=SERVER_PID, fd=5)
    rec.io(SockFunc.recvfrom, response, 3_100, 600, pid=CLIENT_PID, fd=6)
    arr = rec.array()
    data = arr["kind"] == Kind.SOCK_DATA
    arr["flags"][data] |= 2 << SHIFT_BIT  # kept at 1/4 by the kernel
    stamps = arr["addr"][data].copy()
    stamps.view(np.uint8).reshape(-1, 16)[:, :8] = (
        np.arange(1, data.sum() + 1, dtype="<u8").view(np.uint8).reshape(-1, 8)
    )
    arr["addr"][data] = stamps
    http.correlator.on_ring("sockdata", arr)
    http.correlator.on_tick()
    server, client = http.span(SpanKind.SERVER), http.span(SpanKind.CLIENT)
    for span in (server, client):
        assert span.attributes["otelbpf.http.sampling.adjusted_count"] == 4
        assert span.context.trace_state.get("ot") == "th:c"
        assert randomness_kept(span.context.trace_id, 2)
    assert k.writes[SAMPLING_MAP][SAMPLING_PROCESSED] == 4  # the last data record's stamp
    # three more GET 200s served, shed in the kernel: they join the span's series
    key = RedKey(pid=SERVER_PID, role=1, method=1, minor=1, bucket=5, status=200)
    k.red = [(key, SimpleNamespace(count=3, sum_ns=3_000_000, min_ns=900_000, max_ns=1_100_000))]
    [point] = [
        p
        for p in http.histograms()["http.server.request.duration"]
        if p.attributes.get("http.response.status_code") == 200
    ]
    assert point.count == 4
    assert point.bucket_counts[5] == 3
