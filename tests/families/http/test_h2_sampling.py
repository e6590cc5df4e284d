"""HTTP/2 and gRPC under load, user space's half (issue 38): streams are sampled here at the head
sampler's shift (spans only: the metrics count every stream), a client stream takes the fate of
the server request its thread serves, and a connection the kernel switched to counting
(bpf/h2_frames.h, EV_SOCK_COUNTED) is dropped without counting its streams in flight, whose ends
the kernel counts; its counts join the same series. No kernel: records as the sensor delivers
them, the kernel's maps faked (test_sampling.FakeKernel)."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import pytest
from hpack import Encoder
from opentelemetry.trace import SpanKind

from families.http.test_http_unit import CLIENT_PID, SERVER_PID, Http, Records
from families.http.test_sampling import FakeKernel, sampler
from harness.hostile import data_frame, frame, grpc_call, headers_frame
from otelbpf.base.events import SOCKF_SERVING_SHED, Kind, SockFunc
from otelbpf.correlate import metrics as m
from otelbpf.families.http import correlator as correlator_module
from otelbpf.families.http.correlator import KNOWN_METHODS, OTHER
from otelbpf.families.http.probes import H2_STATS
from otelbpf.families.http.protocols.http2 import PREFACE, RST_STREAM, SETTINGS
from otelbpf.families.http.sampling import TICK_S, H2Delta, h2_series, randomness_kept

SETTINGS_FRAME = frame(SETTINGS, 0, 0)


class H2Server:
    """One server-side HTTP/2 connection's records (fd 5 of SERVER_PID), gRPC calls on it."""

    def __init__(self, records: Records, *, fd: int = 5, pid: int = SERVER_PID, t: int = 1_000_000) -> None:
        self.r, self.fd, self.pid, self.t = records, fd, pid, t
        self.enc_c, self.enc_s = Encoder(), Encoder()
        self.next_stream = 1
        records.accept(t, pid=pid, fd=fd)
        self.read(PREFACE + SETTINGS_FRAME)
        self.write(SETTINGS_FRAME)

    def _tick(self) -> int:
        self.t += 10_000
        return self.t

    def read(self, data: bytes, *, tid: int | None = None) -> None:
        self.r.io(SockFunc.read, data, self._tick(), 1_000, pid=self.pid, fd=self.fd)
        if tid is not None:
            self.r.rows[-1]["tid"] = tid

    def write(self, data: bytes) -> None:
        self.r.io(SockFunc.write, data, self._tick(), 1_000, pid=self.pid, fd=self.fd)

    def call(self, *, grpc_status: str = "0", answer: bool = True, tid: int | None = None) -> int:
        """A unary call read whole; its response written whole unless not ``answer``."""
        stream = self.next_stream
        self.next_stream += 2
        c2s, s2c = grpc_call(self.enc_c, self.enc_s, stream, grpc_status=grpc_status)
        self.read(c2s, tid=tid)
        if answer:
            self.write(s2c)
        return stream


def grpc_points(http: Http) -> dict[int | None, int]:
    """rpc.server.duration's counts by rpc.grpc.status_code."""
    out: dict[int | None, int] = {}
    for p in http.histograms().get("rpc.server.duration", []):
        code = p.attributes.get("rpc.grpc.status_code")
        out[code] = out.get(code, 0) + p.count
    return out


def decisions(counts: list) -> dict[str, int]:
    out: dict[str, int] = {}
    for metric, n, attrs in counts:
        if metric == "otelbpf.http.sampled" and attrs.get("protocol") == "http2":
            out[attrs["decision"]] = out.get(attrs["decision"], 0) + n
    return out


@pytest.fixture
def draws(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The stream sampler's draws, in order (0: kept), instead of random ones."""
    planned: list[int] = []
    monkeypatch.setattr(correlator_module, "_getrandbits", lambda k: planned.pop(0))
    return planned


def test_streams_are_sampled_at_the_shift_and_every_one_is_counted(draws: list[int]) -> None:
    k, now, counts = FakeKernel(), [100.0], []
    s = sampler(k, now, counts, min_shift=2)
    http = Http(sampler=s)
    rec = Records()
    server = H2Server(rec)
    draws += [0, 1, 3, 0, 2, 1]  # kept, shed, shed, kept, shed, shed
    for i in range(6):
        server.call(grpc_status="5" if i == 5 else "0")
    http.deliver(rec)
    spans = [sp for sp in http.spans if sp.kind == SpanKind.SERVER]
    assert len(spans) == 2
    for span in spans:
        assert span.attributes["otelbpf.http.sampling.adjusted_count"] == 4
        assert span.context.trace_state.get("ot") == "th:c"
        assert randomness_kept(span.context.trace_id, 2)
    assert grpc_points(http) == {0: 5, 5: 1}  # every call, sampled or not
    s.tick(count_only=True)
    assert decisions(counts) == {"kept": 2, "probability": 4}
    # no thread interval for a shed stream: nothing its thread does has it as a parent
    parents = [http.causality.parent(SERVER_PID, SERVER_PID, t) for t in range(1_000_000, 1_200_000, 5_000)]
    assert {p.span_id for p in parents if p is not None} <= {sp.context.span_id for sp in spans}


def test_at_shift_zero_every_stream_is_kept_without_a_draw(draws: list[int]) -> None:
    k, now, counts = FakeKernel(), [100.0], []
    http = Http(sampler=sampler(k, now, counts))
    rec = Records()
    server = H2Server(rec)
    for _ in range(3):
        server.call()
    http.deliver(rec)  # no draw planned: one would fail
    spans = [sp for sp in http.spans if sp.kind == SpanKind.SERVER]
    assert len(spans) == 3 and all("otelbpf.http.sampling.adjusted_count" not in sp.attributes for sp in spans)
    assert all(not sp.context.trace_state for sp in spans)


def _client_call(rec: Records, enc_c: Encoder, enc_s: Encoder, stream: int, t: int, tid: int, flags: int = 0) -> None:
    """A client stream of CLIENT_PID's fd 6, written on thread ``tid``."""
    c2s, s2c = grpc_call(enc_c, enc_s, stream)
    rec.io(SockFunc.write, c2s, t, 1_000, pid=CLIENT_PID, fd=6)
    rec.rows[-1]["tid"] = tid
    rec.rows[-1]["flags"] = flags
    rec.io(SockFunc.read, s2c, t + 5_000, 1_000, pid=CLIENT_PID, fd=6)
    rec.rows[-1]["tid"] = tid


def test_a_client_stream_takes_the_fate_of_the_request_its_thread_serves(draws: list[int]) -> None:
    """The same thread serves an HTTP/2 stream (sampled here) and makes a client call meanwhile:
    the call is kept or shed with it. A call whose record says its thread serves an HTTP/1
    request the kernel shed (SOCKF_SERVING_SHED) is shed; one from a thread serving nothing draws."""
    k, now, counts = FakeKernel(), [100.0], []
    s = sampler(k, now, counts, min_shift=1)
    http = Http(sampler=s)
    rec = Records()
    # the client's connection (fd 6 of CLIENT_PID), opened first
    rec.connect(500_000, pid=CLIENT_PID, fd=6)
    enc_c, enc_s = Encoder(), Encoder()
    rec.io(SockFunc.write, PREFACE + SETTINGS_FRAME, 600_000, 1_000, pid=CLIENT_PID, fd=6)
    rec.io(SockFunc.read, SETTINGS_FRAME, 700_000, 1_000, pid=CLIENT_PID, fd=6)
    # the same process serves: one server stream kept, one shed, on thread 77
    server = H2Server(rec, pid=CLIENT_PID, fd=9, t=800_000)
    draws += [0, 1, 1]  # server stream 1 kept, server stream 3 shed, the lone client call shed
    server.call(answer=False, tid=77)  # stream 1, read at ~810 µs
    _client_call(rec, enc_c, enc_s, 1, 900_000, 77)  # made while stream 1 is open: kept with it
    server.t = 950_000
    server.write(grpc_call(server.enc_c, server.enc_s, 1)[1])  # answered
    server.call(answer=False, tid=77)  # stream 3, shed
    _client_call(rec, enc_c, enc_s, 3, 1_100_000, 77)  # shed with it
    server.t = 1_150_000
    server.write(grpc_call(server.enc_c, server.enc_s, 3)[1])
    _client_call(rec, enc_c, enc_s, 5, 1_300_000, 88, SOCKF_SERVING_SHED)  # an HTTP/1 request the kernel shed
    _client_call(rec, enc_c, enc_s, 7, 1_400_000, 99)  # serving nothing: its own draw (shed)
    http.deliver(rec)
    clients = [sp for sp in http.spans if sp.kind == SpanKind.CLIENT]
    servers = [sp for sp in http.spans if sp.kind == SpanKind.SERVER]
    assert len(servers) == 1 and len(clients) == 1
    [client], [top] = clients, servers
    assert client.parent.span_id == top.context.span_id and client.context.trace_id == top.context.trace_id
    assert client.attributes["otelbpf.http.sampling.adjusted_count"] == 2
    assert sum(p.count for p in http.histograms()["rpc.client.duration"]) == 4
    s.tick(count_only=True)
    assert decisions(counts) == {"kept": 2, "probability": 2, "parent": 2}


def test_a_connection_the_kernel_counts_drops_its_streams_in_flight_uncounted(draws: list[int]) -> None:
    """EV_SOCK_COUNTED: the kernel counts this connection's streams from here on (it counts the
    ends of those in flight). User space counts what ended before, drops the rest without a
    span or a count, frees their threads, and parses nothing more of the connection."""
    k, now, counts = FakeKernel(), [100.0], []
    http = Http(sampler=sampler(k, now, counts))
    rec = Records()
    server = H2Server(rec)
    server.call()  # ended before the switch: user space's
    server.call(answer=False)  # in flight at the switch: the kernel's
    rec._add(ts_ns=server._tick(), duration_ns=0, pid=SERVER_PID, tid=SERVER_PID, fd=5, ret=0,
             kind=Kind.SOCK_COUNTED, func=SockFunc.write)  # fmt: skip
    server.write(b"\x00\x00\x05\x00\x01\x00\x00\x00\x03hello")  # raced the switch: not parsed
    rec.close(server._tick(), pid=SERVER_PID, fd=5)
    http.deliver(rec)
    assert len([sp for sp in http.spans if sp.kind == SpanKind.SERVER]) == 1
    assert grpc_points(http) == {0: 1}
    assert http.counts[("otelbpf.http.h2.counted_connections", ())] == 1
    assert http.counts[("otelbpf.http.unparsed_bytes", (("protocol", "counted"),))] == 14
    assert http.causality.parent(SERVER_PID, SERVER_PID, server.t + 1) is None  # the dropped stream's interval closed
    # the kernel's count of the dropped stream joins the same series (route unknown there)
    k.h2_red = [(H2Key(pid=SERVER_PID, role=1, grpc=1, method=2, bucket=4, status=200, code=1, end=1),
                 SimpleNamespace(count=1, sum_ns=90_000, min_ns=90_000, max_ns=90_000))]  # fmt: skip
    points = http.histograms()["rpc.server.duration"]
    assert {(p.attributes["rpc.method"], p.attributes.get("rpc.grpc.status_code")): p.count for p in points} == {
        ("Unary", 0): 1,
        (OTHER, 0): 1,
    }
    s = http.correlator._sampler
    s.tick(count_only=True)
    assert decisions(counts) == {"kept": 1, "counted": 1}


def test_a_reset_stream_and_a_stream_open_at_the_close_before_any_switch_are_user_spaces() -> None:
    http = Http()
    rec = Records()
    server = H2Server(rec)
    stream = server.call(answer=False)
    server.write(frame(RST_STREAM, 0, stream, (8).to_bytes(4, "big")))
    server.call(answer=False)
    rec.close(server._tick(), pid=SERVER_PID, fd=5)
    http.deliver(rec)
    errors = sorted(p.attributes.get("error.type") for p in http.histograms()["rpc.server.duration"])
    assert errors == ["connection_closed", "reset"]


class H2Key(ctypes.Structure):
    """bpf/h2_frames.h struct h2_red_key."""

    _fields_ = [
        ("pid", ctypes.c_uint32),
        ("role", ctypes.c_uint8),
        ("grpc", ctypes.c_uint8),
        ("method", ctypes.c_uint8),
        ("bucket", ctypes.c_uint8),
        ("status", ctypes.c_uint16),
        ("code", ctypes.c_uint8),
        ("end", ctypes.c_uint8),
    ]


def test_kernel_counts_are_read_as_deltas() -> None:
    k, now, counts = FakeKernel(), [100.0], []
    s = sampler(k, now, counts)
    key = H2Key(pid=7, role=2, grpc=0, method=1, bucket=3, status=404, code=0, end=1)
    k.h2_red = [(key, SimpleNamespace(count=3, sum_ns=30_000, min_ns=9_000, max_ns=11_000))]
    [d] = s.h2_deltas(m.DURATION_BOUNDS)
    got = (d.pid, d.server, d.grpc, d.method, d.status, d.code, d.end, d.count)
    assert got == (7, False, False, "GET", 404, None, "ended", 3)
    assert s.h2_deltas(m.DURATION_BOUNDS) == []
    k.h2_red = [(key, SimpleNamespace(count=5, sum_ns=50_000, min_ns=9_000, max_ns=11_000))]
    [d] = s.h2_deltas(m.DURATION_BOUNDS)
    assert d.count == 2 and d.sum_s == pytest.approx(20e-6)
    assert sum(n for metric, n, a in counts if a == {"decision": "counted", "protocol": "http2"}) == 5


def delta(**kw: object) -> H2Delta:
    base = dict(pid=1, server=True, grpc=True, method="POST", status=200, code=0, end="ended", bucket=2, count=1,
                sum_s=0.1, min_s=0.1, max_s=0.1)  # fmt: skip
    base.update(kw)
    return H2Delta(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("d", "metric", "labels"),
    [
        (delta(), "rpc.server.duration", {"rpc.grpc.status_code": 0}),
        (delta(code=13), "rpc.server.duration", {"rpc.grpc.status_code": 13, "error.type": "13"}),
        (delta(code=5), "rpc.server.duration", {"rpc.grpc.status_code": 5}),  # NOT_FOUND: no server error
        (delta(code=5, server=False), "rpc.client.duration", {"rpc.grpc.status_code": 5, "error.type": "5"}),
        (delta(code=None), "rpc.server.duration", {}),  # a dynamic-table reference: unknown
        (delta(code=None, status=503), "rpc.server.duration", {"error.type": "503"}),
        (delta(code=None, end="reset"), "rpc.server.duration", {"error.type": "reset"}),
        (delta(code=None, end="closed", status=0), "rpc.server.duration", {"error.type": "connection_closed"}),
    ],
)
def test_grpc_calls_counted_in_the_kernel_go_to_the_route_unknown_series(d, metric, labels) -> None:
    got_metric, series = h2_series(d, KNOWN_METHODS, OTHER)
    assert got_metric == metric
    assert dict(series) == {"rpc.system": "grpc", "rpc.service": OTHER, "rpc.method": OTHER, **labels}
    assert list(series) == sorted(series)


def test_http2_requests_counted_in_the_kernel_go_to_their_method_and_status() -> None:
    metric, series = h2_series(delta(grpc=False, method="GET", status=404, code=None), KNOWN_METHODS, OTHER)
    assert metric == "http.server.request.duration"
    assert dict(series) == {
        "http.request.method": "GET",
        "network.protocol.version": "2",
        "http.response.status_code": 404,
        "http.response.status_class": "4xx",
    }
    _, series = h2_series(delta(grpc=False, method="", status=0, code=None, server=False), KNOWN_METHODS, OTHER)
    assert dict(series) == {
        "http.request.method": OTHER,
        "network.protocol.version": "2",
        "http.response.status_class": "none",
    }
    _, series = h2_series(delta(grpc=False, status=404, code=None, server=False), KNOWN_METHODS, OTHER)
    assert dict(series)["error.type"] == "404"


def test_a_data_frame_after_reset_is_not_a_new_stream() -> None:
    """Sanity of the fixtures: a DATA frame on a finished stream is ignored, as the kernel ignores
    an end with no stream entry."""
    http = Http()
    rec = Records()
    server = H2Server(rec)
    stream = server.call()
    server.write(data_frame(b"late", stream, end_stream=True) + headers_frame(b"\x88", stream, end_stream=True))
    http.deliver(rec)
    assert grpc_points(http) == {0: 1}


def test_connections_switched_to_counting_are_pressure_and_problems_are_counted() -> None:
    """An HTTP/2 connection the kernel switched to counting is one the agent did not keep up with:
    the controller halves the sampling as it does for records lost; the walk's other counts are
    otelbpf.http.problems."""
    k, now, counts = FakeKernel(), [100.0], []
    s = sampler(k, now, counts)
    s.tick()  # the first tick only reads the counters
    now[0] += TICK_S
    k.h2_stats[H2_STATS.index("switched_backlog")] += 1
    k.h2_stats[H2_STATS.index("h2_walk_desync")] += 2
    s.tick()
    assert s.shift == 1
    assert ("otelbpf.http.problems", 2, {"reason": "h2_walk_desync"}) in counts
    assert not [c for c in counts if c[2].get("reason", "").startswith("switched")]


def _decide(row: dict, shift: int, seq: int) -> None:
    """``row`` as a walked server's record: the streams whose HEADERS begin in it decided in the
    kernel at ``shift``, with its connection's sequence ``seq`` (bpf/sockets.c SOCKF_H2_DECIDED)."""
    from otelbpf.base.events import SOCKF_H2_DECIDED
    from otelbpf.families.http.probes import SHIFT_BIT

    row.update(flags=SOCKF_H2_DECIDED | (shift << SHIFT_BIT), port=seq & 0xFFFF, local_port=seq >> 16)


def test_a_stream_the_kernel_decided_is_decided_alike_here() -> None:
    """A server record with SOCKF_H2_DECIDED: its streams were sampled in the kernel at the shift its
    flags carry, by h2_keep over the connection's sequence (which the record carries) and the
    stream id; the agent keeps exactly those (no draw of its own). The record's sequence, not one
    the agent would derive from a control record it may have missed."""
    from otelbpf.families.http.sampling import h2_keep

    k, now, counts = FakeKernel(), [100.0], []
    http = Http(sampler=sampler(k, now, counts, min_shift=5))  # the agent's own shift is not used
    rec = Records()
    server = H2Server(rec)
    streams = [server.call() for _ in range(16)]
    seq = 0x9E3779B9  # not the accept record's time
    for row in rec.rows:
        if row.get("kind") == Kind.SOCK_DATA:
            _decide(row, 1, seq)
    http.deliver(rec)
    kept = [sp.attributes["otelbpf.http2.stream_id"] for sp in http.spans if sp.kind == SpanKind.SERVER]
    assert kept == [s for s in streams if h2_keep(seq, s, 1)]
    assert kept != [s for s in streams if h2_keep(rec.rows[0]["ts_ns"], s, 1)]  # P(equal) = 2^-16
    assert 0 < len(kept) < 16
    assert all(sp.attributes["otelbpf.http.sampling.adjusted_count"] == 2 for sp in http.spans)


@pytest.mark.parametrize("cut", [11, 5], ids=["block_in_the_next_read", "frame_header_in_the_next_read"])
def test_a_stream_is_decided_at_the_shift_of_the_read_its_headers_frame_began_in(cut: int) -> None:
    """A request HEADERS frame read in two pieces, the kernel's shift moved between them: the kernel
    decided the stream in the read that completed the frame's 9-byte header (bpf/h2_frames.h walks
    frame headers there), so the agent takes that read's shift, not the one of the read that
    completed the block (where it decodes it). ``cut`` 11: the header whole in the first read, its
    block in the second; 5: the header itself cut, completed in the second."""
    from otelbpf.families.http.sampling import h2_keep

    k, now, counts = FakeKernel(), [100.0], []
    http = Http(sampler=sampler(k, now, counts, min_shift=5))
    rec = Records()
    server = H2Server(rec)
    seq = rec.rows[0]["ts_ns"] & 0xFFFFFFFF
    for row in rec.rows:
        if row.get("kind") == Kind.SOCK_DATA:
            _decide(row, 0, seq)
    shifts = []
    for _ in range(24):
        stream = server.next_stream
        server.next_stream += 2
        c2s, s2c = grpc_call(server.enc_c, server.enc_s, stream)
        first, second = (1, 3) if stream % 4 == 1 else (3, 1)  # each shift first as often
        server.read(c2s[:cut])
        _decide(rec.rows[-1], first, seq)
        server.read(c2s[cut:])
        _decide(rec.rows[-1], second, seq)
        server.write(s2c)
        shifts.append((stream, first if cut >= 9 else second, second if cut >= 9 else first))
    http.deliver(rec)
    spans = [sp for sp in http.spans if sp.kind == SpanKind.SERVER]
    attrs = [sp.attributes for sp in spans]
    kept = {a["otelbpf.http2.stream_id"]: a["otelbpf.http.sampling.adjusted_count"] for a in attrs}
    assert kept == {s: 2**at for s, at, _ in shifts if h2_keep(seq, s, at)}
    # the other read's shift would have decided otherwise: the test tells them apart
    assert kept != {s: 2**other for s, _, other in shifts if h2_keep(seq, s, other)}
    assert grpc_points(http) == {0: 24}


def test_a_thread_serving_a_kept_stream_passes_it_on_while_it_is_open() -> None:
    """One read carries two request HEADERS the kernel decided, the first kept and the second shed:
    the thread serves both, and the kernel does not shed its calls while the kept one is open
    (bpf/h2_frames.h h2_serve: a kept stream's children are never lost). A client stream the
    thread makes meanwhile is kept with it, as its child; once the kept one is answered, the
    thread serves the shed one, and its next client stream is shed with it."""
    from otelbpf.families.http.sampling import h2_keep

    t = next(t for t in range(1_000_000, 2_000_000, 1_000) if h2_keep(t, 1, 1) and not h2_keep(t, 3, 1))
    k, now, counts = FakeKernel(), [100.0], []
    s = sampler(k, now, counts, min_shift=5)
    http = Http(sampler=s)
    rec = Records()
    rec.connect(t - 300_000, pid=CLIENT_PID, fd=6)
    enc_c, enc_s = Encoder(), Encoder()
    rec.io(SockFunc.write, PREFACE + SETTINGS_FRAME, t - 200_000, 1_000, pid=CLIENT_PID, fd=6)
    rec.io(SockFunc.read, SETTINGS_FRAME, t - 100_000, 1_000, pid=CLIENT_PID, fd=6)
    server = H2Server(rec, pid=CLIENT_PID, fd=9, t=t)
    (kept_c2s, kept_s2c), (shed_c2s, shed_s2c) = (grpc_call(server.enc_c, server.enc_s, i) for i in (1, 3))
    server.read(kept_c2s + shed_c2s, tid=77)
    for row in rec.rows:
        if row.get("kind") == Kind.SOCK_DATA and row["pid"] == CLIENT_PID and row["fd"] == 9:
            _decide(row, 1, t)
    _client_call(rec, enc_c, enc_s, 1, server.t + 50_000, 77)  # both open: the kept one's
    server.t += 100_000
    server.write(kept_s2c)
    _client_call(rec, enc_c, enc_s, 3, server.t + 50_000, 77)  # the shed one's alone
    server.t += 100_000
    server.write(shed_s2c)
    http.deliver(rec)
    [top] = [sp for sp in http.spans if sp.kind == SpanKind.SERVER]
    [client] = [sp for sp in http.spans if sp.kind == SpanKind.CLIENT]
    assert top.attributes["otelbpf.http2.stream_id"] == 1
    assert client.parent.span_id == top.context.span_id
    assert client.attributes["otelbpf.http.sampling.adjusted_count"] == 2
    s.tick(count_only=True)
    assert decisions(counts) == {"kept": 2, "probability": 1, "parent": 1}
