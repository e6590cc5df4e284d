"""The HTTP correlator (otelbpf/families/http/correlator.py) fed socket records built here, as the sensor
delivers them from the ``sockdata`` ring (``SOCK_RECORD_DTYPE``), with every timestamp chosen:
server and client spans of HTTP/1.1 and HTTP/2 gRPC exchanges, their names, attributes,
durations, statuses and parents, and the duration histograms. No kernel, no sockets."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

import numpy as np
import pytest
from hpack import Encoder
from opentelemetry.trace import SpanKind, StatusCode

from harness.hostile import grpc_call, h2_connection
from otelbpf.base.events import SOCK_RECORD_DTYPE, Kind, SockFunc
from otelbpf.correlate.base import CorrelatorSettings
from otelbpf.correlate.causality import Causality
from otelbpf.correlate.clock import MonotonicClock
from otelbpf.correlate.process_info import ProcessInfo
from otelbpf.families.http.correlator import HttpCorrelator

SERVER_PID, CLIENT_PID = 7001, 7002
SERVER_PORT, CLIENT_PORT = 8080, 51000
SERVER_IP, CLIENT_IP = "10.0.0.1", "10.0.0.2"
AF_INET = 2


def raw(ip: str) -> bytes:
    """An IPv4 address as the probe copies it: network order, in the first 4 of 16 bytes."""
    return socket.inet_aton(ip) + bytes(12)


@dataclass
class Records:
    """Socket records of one or more connections; ``deliver`` hands them over as one ring batch."""

    rows: list[dict] = field(default_factory=list)

    def _add(self, **row: object) -> None:
        self.rows.append(row)

    def accept(self, ts: int, *, pid: int = SERVER_PID, fd: int = 5, port: int = CLIENT_PORT) -> None:
        """The server accepted ``CLIENT_IP:port`` on ``SERVER_PORT`` as ``fd``."""
        self._add(
            ts_ns=ts,
            duration_ns=500,
            pid=pid,
            tid=pid,
            fd=fd,
            ret=3,
            kind=Kind.SOCK_ACCEPT,
            func=SockFunc.accept4,
            family=AF_INET,
            port=port,
            local_port=SERVER_PORT,
            addr=raw(CLIENT_IP),
        )

    def connect(self, ts: int, *, pid: int = CLIENT_PID, fd: int = 6) -> None:
        """The client connected ``fd`` to ``SERVER_IP:SERVER_PORT`` from ``CLIENT_IP:CLIENT_PORT``."""
        self._add(
            ts_ns=ts,
            duration_ns=500,
            pid=pid,
            tid=pid,
            fd=fd,
            ret=0,
            kind=Kind.SOCK_CONNECT,
            func=SockFunc.connect,
            family=AF_INET,
            port=SERVER_PORT,
            addr=raw(SERVER_IP),
        )
        self._add(
            ts_ns=ts + 100,
            duration_ns=0,
            pid=pid,
            tid=pid,
            fd=fd,
            ret=0,
            kind=Kind.SOCK_LOCAL,
            func=SockFunc.connect,
            family=AF_INET,
            port=CLIENT_PORT,
            addr=raw(CLIENT_IP),
        )

    def io(self, func: SockFunc, data: bytes, ts: int, dur: int, *, pid: int, fd: int) -> None:
        self._add(
            ts_ns=ts,
            duration_ns=dur,
            pid=pid,
            tid=pid,
            fd=fd,
            ret=len(data),
            kind=Kind.SOCK_DATA,
            func=func,
            cap=len(data),
            data=data,
        )

    def close(self, ts: int, *, pid: int, fd: int) -> None:
        self._add(ts_ns=ts, duration_ns=300, pid=pid, tid=pid, fd=fd, ret=0, kind=Kind.SOCK_CLOSE, func=SockFunc.close)

    def array(self) -> np.ndarray:
        arr = np.zeros(len(self.rows), dtype=SOCK_RECORD_DTYPE)
        arr["data"] = [b""] * len(self.rows)
        for i, row in enumerate(self.rows):
            for name, value in row.items():
                if name == "addr":
                    arr["addr"][i] = np.frombuffer(value, dtype="V16")[0]
                elif name == "data":
                    arr["data"][i] = value
                else:
                    arr[name][i] = value
        return arr


class Http:
    """A real HttpCorrelator and what it emitted."""

    def __init__(self, **options: object) -> None:
        self.spans: list = []
        self.counts: dict[tuple, int] = {}
        self.clock = MonotonicClock()
        self.causality = Causality()
        self.correlator = HttpCorrelator(
            CorrelatorSettings(ProcessInfo(), self.clock, self.spans.extend),
            self._count,
            self.causality,
            lambda name, items: None,
            ports=[SERVER_PORT],
            **options,
        )

    def _count(self, metric: str, n: int, **attrs: object) -> None:
        key = (metric, tuple(sorted(attrs.items())))
        self.counts[key] = self.counts.get(key, 0) + n

    def deliver(self, records: Records) -> None:
        """``records`` as one drain tick's socket batch."""
        self.correlator.on_ring("sockdata", records.array())
        self.correlator.on_tick()

    def plaintext(self, records: Records) -> None:
        """``records`` as one drain tick's TLS plaintext batch (tls.py)."""
        self.correlator.on_tls(records.array())
        self.correlator.on_tick()

    def span(self, kind: SpanKind):
        [span] = [s for s in self.spans if s.kind == kind]
        return span

    def histograms(self) -> dict[str, list]:
        """Metric name -> its data points, over every process."""
        out: dict[str, list] = {}
        for _, metrics in self.correlator.collect():
            for metric in metrics:
                out.setdefault(metric.name, []).extend(metric.data.data_points)
        return out


def assert_attributes(span, expected: dict) -> None:
    """``span`` has these attributes with these values (and may have others)."""
    assert {k: span.attributes.get(k) for k in expected} == expected


REQUEST = (
    b"GET /items/7?token=s3cret HTTP/1.1\r\nHost: api.example:8080\r\nUser-Agent: unit/1\r\n"
    b"Authorization: Bearer s3cret\r\n\r\n"
)


def response(status: int, body: bytes = b"hello") -> bytes:
    return f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


def served(status: int = 200, request: bytes = REQUEST) -> Http:
    """One HTTP/1.1 exchange seen at the server: read 10.000-10.002 ms, write 10.040-10.045 ms."""
    r = Records()
    r.accept(9_000_000)
    r.io(SockFunc.read, request, 10_000_000, 2_000, pid=SERVER_PID, fd=5)
    r.io(SockFunc.write, response(status), 10_040_000, 5_000, pid=SERVER_PID, fd=5)
    r.close(10_100_000, pid=SERVER_PID, fd=5)
    http = Http(capture_headers=["user-agent", "authorization"])
    http.deliver(r)
    return http


# -- HTTP/1.1 ----------------------------------------------------------------------------------------------


def test_http1_server_span_from_request_read_to_response_written() -> None:
    http = served()
    span = http.span(SpanKind.SERVER)
    assert span.name == "GET"
    # From the return of the read that carried the request to the return of the response's write.
    assert span.end_time - span.start_time == 10_045_000 - 10_002_000
    assert span.start_time == http.clock.to_wall(10_002_000)
    assert span.status.status_code == StatusCode.UNSET
    assert span.parent is None
    assert_attributes(
        span,
        {
            "http.request.method": "GET",
            "url.path": "/items/7",
            "network.protocol.name": "http",
            "network.protocol.version": "1.1",
            "server.address": "api.example",
            "server.port": SERVER_PORT,
            "client.address": CLIENT_IP,
            "client.port": CLIENT_PORT,
            "network.peer.address": CLIENT_IP,
            "user_agent.original": "unit/1",
            "http.request.header.user-agent": ["unit/1"],
            "http.response.status_code": 200,
            "http.response.body.size": 5,
            "http.request.body.size": 0,
            "http.request.size": len(REQUEST),
            "process.pid": SERVER_PID,
            "thread.id": SERVER_PID,
        },
    )


def test_http1_never_exports_the_query_string_or_credentials() -> None:
    span = served().span(SpanKind.SERVER)
    assert "http.request.header.authorization" not in span.attributes  # asked for, always redacted
    assert not [k for k, v in span.attributes.items() if "s3cret" in str(v)]


@pytest.mark.parametrize(("status", "error"), [(200, None), (404, None), (503, "503")])
def test_http1_server_spans_fail_on_5xx_only(status: int, error: str | None) -> None:
    span = served(status).span(SpanKind.SERVER)
    assert span.attributes["http.response.status_code"] == status
    assert span.attributes.get("error.type") == error
    assert span.status.status_code == (StatusCode.ERROR if error else StatusCode.UNSET)


def test_http1_server_span_adopts_the_traceparent_it_received() -> None:
    trace_id, parent_id = 0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7
    request = REQUEST.replace(b"\r\n\r\n", f"\r\ntraceparent: 00-{trace_id:032x}-{parent_id:016x}-01\r\n\r\n".encode())
    span = served(request=request).span(SpanKind.SERVER)
    assert (span.parent.trace_id, span.parent.span_id) == (trace_id, parent_id)
    assert span.context.trace_id == trace_id and span.context.span_id != parent_id
    assert span.attributes["otelbpf.parent.source"] == "traceparent"


def test_a_served_request_is_the_parent_of_what_its_thread_does_meanwhile() -> None:
    """The interval other correlators ask (causality.py): the request's thread, from its read to its write."""
    http = served()
    span = http.span(SpanKind.SERVER)
    assert http.causality.parent(SERVER_PID, SERVER_PID, 10_020_000) == span.context
    assert http.causality.parent(SERVER_PID, SERVER_PID, 10_060_000) is None  # after the response
    assert http.causality.parent(SERVER_PID, SERVER_PID + 1, 10_020_000) is None  # another thread


def test_http1_duration_histogram_holds_the_exchange() -> None:
    [point] = served(503).histograms()["http.server.request.duration"]
    assert point.count == 1 and point.sum == pytest.approx(43e-6)
    assert dict(point.attributes) == {
        "http.request.method": "GET",
        "network.protocol.version": "1.1",
        "http.response.status_code": 503,
        "http.response.status_class": "5xx",
        "error.type": "503",
    }


def test_http1_client_span_from_request_written_to_response_read_and_4xx_fails_it() -> None:
    r = Records()
    r.connect(1_000_000)
    r.io(
        SockFunc.write,
        b"POST /v1/jobs HTTP/1.1\r\nHost: jobs\r\nContent-Length: 4\r\n\r\nwork",
        2_000_000,
        3_000,
        pid=CLIENT_PID,
        fd=6,
    )
    r.io(SockFunc.read, response(404, b"gone"), 2_500_000, 7_000, pid=CLIENT_PID, fd=6)
    r.close(3_000_000, pid=CLIENT_PID, fd=6)
    http = Http()
    http.deliver(r)
    span = http.span(SpanKind.CLIENT)
    assert span.name == "POST"
    assert span.end_time - span.start_time == 2_507_000 - 2_000_000  # write entered -> read returned
    assert span.status.status_code == StatusCode.ERROR and span.attributes["error.type"] == "404"
    assert_attributes(
        span,
        {
            "http.request.method": "POST",
            "url.path": "/v1/jobs",
            "server.address": "jobs",
            "server.port": SERVER_PORT,
            "network.peer.address": SERVER_IP,
            "http.request.body.size": 4,
            "http.response.status_code": 404,
            "http.response.body.size": 4,
        },
    )
    assert [p.count for p in http.histograms()["http.client.request.duration"]] == [1]


def test_a_client_and_the_server_it_called_on_this_host_are_one_trace() -> None:
    """Both ends of one connection, in one batch: the server span's parent is the client span."""
    r = Records()
    r.connect(1_000_000)
    r.accept(1_000_200)
    r.io(SockFunc.write, REQUEST, 2_000_000, 3_000, pid=CLIENT_PID, fd=6)
    r.io(SockFunc.read, REQUEST, 2_001_000, 3_000, pid=SERVER_PID, fd=5)
    r.io(SockFunc.write, response(200), 2_050_000, 2_000, pid=SERVER_PID, fd=5)
    r.io(SockFunc.read, response(200), 2_051_000, 2_000, pid=CLIENT_PID, fd=6)
    http = Http()
    http.deliver(r)
    client, server = http.span(SpanKind.CLIENT), http.span(SpanKind.SERVER)
    assert server.parent.span_id == client.context.span_id
    assert server.context.trace_id == client.context.trace_id
    assert server.attributes["otelbpf.parent.source"] == "peer"
    assert client.start_time <= server.start_time and server.end_time <= client.end_time


# -- HTTP/2 gRPC -------------------------------------------------------------------------------------------


def grpc_records(pid: int, fd: int, *, server: bool, statuses: tuple[str, ...]) -> tuple[Records, list[int]]:
    """A gRPC connection with one unary call per status (streams 1, 3, ...), one read per call
    message; returns the records and each call's (start, end) bounds in ns, per side."""
    enc_c, enc_s = Encoder(), Encoder()
    calls = [grpc_call(enc_c, enc_s, 2 * i + 1, grpc_status=status) for i, status in enumerate(statuses)]
    preface_c2s, preface_s2c = h2_connection([])
    recv, send = (SockFunc.read, SockFunc.write) if server else (SockFunc.write, SockFunc.read)
    r = Records()
    if server:
        r.accept(1_000_000, pid=pid, fd=fd)
    else:
        r.connect(1_000_000, pid=pid, fd=fd)
    r.io(recv, preface_c2s, 1_100_000, 1_000, pid=pid, fd=fd)
    r.io(send, preface_s2c, 1_200_000, 1_000, pid=pid, fd=fd)
    bounds = []
    for i, (c2s, s2c) in enumerate(calls):
        t = 2_000_000 + i * 1_000_000
        r.io(recv, c2s, t, 4_000, pid=pid, fd=fd)
        r.io(send, s2c, t + 300_000, 6_000, pid=pid, fd=fd)
        # server: request read returned -> response written; client: request write entered -> response read.
        bounds.append((t + 4_000, t + 306_000) if server else (t, t + 306_000))
    return r, bounds


def test_grpc_server_spans_name_the_method_and_fail_on_server_error_codes() -> None:
    r, bounds = grpc_records(SERVER_PID, 5, server=True, statuses=("0", "5", "13"))
    http = Http()
    http.deliver(r)
    spans = sorted(http.spans, key=lambda s: s.attributes["otelbpf.http2.stream_id"])
    assert [s.name for s in spans] == ["demo.Echo/Unary"] * 3
    assert [s.kind for s in spans] == [SpanKind.SERVER] * 3
    assert [s.attributes["rpc.grpc.status_code"] for s in spans] == [0, 5, 13]
    # NOT_FOUND is the caller's problem, INTERNAL the server's.
    assert [s.status.status_code for s in spans] == [StatusCode.UNSET, StatusCode.UNSET, StatusCode.ERROR]
    assert spans[2].attributes["error.type"] == "13"
    assert [s.end_time - s.start_time for s in spans] == [end - start for start, end in bounds]
    assert_attributes(
        spans[0],
        {
            "rpc.system": "grpc",
            "rpc.service": "demo.Echo",
            "rpc.method": "Unary",
            "http.route": "/demo.Echo/Unary",
            "network.protocol.version": "2",
            "http.request.method": "POST",
            "http.response.status_code": 200,
            "server.address": "svc",
            "otelbpf.http2.stream_id": 1,
            "client.address": CLIENT_IP,
        },
    )
    points = http.histograms()["rpc.server.duration"]
    assert sorted((p.attributes["rpc.grpc.status_code"], p.count) for p in points) == [(0, 1), (5, 1), (13, 1)]


def test_grpc_client_spans_fail_on_any_code_but_ok() -> None:
    r, bounds = grpc_records(CLIENT_PID, 6, server=False, statuses=("0", "5"))
    http = Http()
    http.deliver(r)
    spans = sorted(http.spans, key=lambda s: s.attributes["otelbpf.http2.stream_id"])
    assert [s.kind for s in spans] == [SpanKind.CLIENT] * 2
    assert [s.status.status_code for s in spans] == [StatusCode.UNSET, StatusCode.ERROR]
    assert spans[1].attributes["error.type"] == "5"
    assert [s.end_time - s.start_time for s in spans] == [end - start for start, end in bounds]
    assert spans[0].attributes["server.port"] == SERVER_PORT
    assert sum(p.count for p in http.histograms()["rpc.client.duration"]) == 2
