"""HTTP/1.x parsing on byte streams real peers exchanged (stdlib server and clients)."""

from __future__ import annotations

import dataclasses
import http.client
import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from harness.tcp_recorder import TcpRecorder
from otelbpf.families.http.protocols.http1 import Http1Connection, looks_like_request, looks_like_response


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.startswith("/chunked"):
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (b"a" * 10, b"b" * 300, b"c" * 5000):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\nX-Trailer: yes\r\n\r\n")
            return
        status = 404 if self.path == "/missing" else 200
        body = b"x" * (7000 if self.path == "/big" else 11)
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "12345")
        self.end_headers()

    def do_POST(self) -> None:
        n = int(self.headers["Content-Length"])
        self.rfile.read(n)
        self.send_response(201)
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture
def recorded():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    recorder = TcpRecorder(server.server_address)
    yield recorder
    recorder.close()
    server.shutdown()
    server.server_close()


def _replay(chunks, *, cap: int | None = None, skip: int = 0, synchronized: bool = True):
    """Feed recorded chunks as the sensor would: at most ``cap`` bytes captured per chunk."""
    conn = Http1Connection(synchronized=synchronized)
    out = []
    for i, c in enumerate(chunks[skip:]):
        data = c.data if cap is None else c.data[:cap]
        out += conn.feed(c.client_to_server, data, len(c.data) - len(data), (i, c.t))
    out += conn.close(("end", 0))
    return conn, out


def _wait_for_chunks(recorder, n: int) -> list:
    import time

    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        chunks = recorder.stream(0)
        if len(chunks) >= n:
            return chunks
        time.sleep(0.01)
    return recorder.stream(0)


def test_keep_alive_requests_of_every_framing_are_paired_in_order(recorded):
    client = http.client.HTTPConnection("127.0.0.1", recorded.port)
    calls = [
        ("GET", "/a", None),
        ("POST", "/upload", b"y" * 3000),
        ("HEAD", "/h", None),
        ("GET", "/chunked", None),
        ("GET", "/missing", None),
        ("GET", "/big", None),
    ] * 5
    for method, path, body in calls:
        client.request(method, path, body=body, headers={"Authorization": "Bearer secret"})
        client.getresponse().read()
    client.close()
    chunks = _wait_for_chunks(recorded, 2 * len(calls))
    conn, exchanges = _replay(chunks)

    assert [(e.request.head.method, e.request.head.target) for e in exchanges] == [(m, p) for m, p, _ in calls]
    status = {"/a": 200, "/upload": 201, "/h": 200, "/chunked": 200, "/missing": 404, "/big": 200}
    assert [e.response.head.status for e in exchanges] == [status[p] for _, p, _ in calls]
    assert all(e.request.complete and e.response.complete and not e.error for e in exchanges)
    sizes = {e.request.head.target: (e.request.body_size, e.response.body_size) for e in exchanges}
    assert sizes == {
        "/a": (0, 11),
        "/upload": (3000, 0),
        "/h": (0, 0),
        "/chunked": (0, 5310),
        "/missing": (0, 11),
        "/big": (0, 7000),
    }
    assert exchanges[0].request.head.get("authorization") == "Bearer secret"
    assert conn.problems == {}


def test_bodies_larger_than_the_capture_are_skipped_by_length(recorded):
    client = http.client.HTTPConnection("127.0.0.1", recorded.port)
    for path in ("/big", "/a", "/big", "/a"):
        client.request("GET", path)
        client.getresponse().read()
    chunks = _wait_for_chunks(recorded, 8)
    _, exchanges = _replay(chunks, cap=256)
    assert [(e.request.head.target, e.response.head.status, e.response.body_size) for e in exchanges] == [
        ("/big", 200, 7000),
        ("/a", 200, 11),
        ("/big", 200, 7000),
        ("/a", 200, 11),
    ]
    assert all(e.response.complete for e in exchanges)


def test_a_chunked_body_cut_by_the_capture_is_marked_and_the_next_response_is_found(recorded):
    client = http.client.HTTPConnection("127.0.0.1", recorded.port)
    for path in ("/chunked", "/a"):
        client.request("GET", path)
        client.getresponse().read()
    chunks = _wait_for_chunks(recorded, 4)
    conn, exchanges = _replay(chunks, cap=200)
    assert [e.request.head.target for e in exchanges] == ["/chunked", "/a"]
    first, second = exchanges
    assert first.response.head.status == 200 and not first.response.complete and first.error
    assert second.response.complete and second.response.body_size == 11
    assert conn.problems


def test_pipelined_requests_in_one_write_are_answered_in_order():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    recorder = TcpRecorder(server.server_address)
    try:
        s = socket.create_connection(("127.0.0.1", recorder.port))
        s.sendall(
            b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /missing HTTP/1.1\r\nHost: x\r\n\r\n"
            b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabcGET /big HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        received = b""
        while received.count(b"HTTP/1.") < 4 or not received.endswith(b"x" * 100):
            received += s.recv(65536)
        s.close()
        chunks = _wait_for_chunks(recorder, 2)
        _, exchanges = _replay(chunks)
    finally:
        recorder.close()
        server.shutdown()
        server.server_close()
    assert [(e.request.head.target, e.response.head.status) for e in exchanges] == [
        ("/a", 200),
        ("/missing", 404),
        ("/upload", 201),
        ("/big", 200),
    ]


def test_joining_mid_connection_starts_at_the_next_request(recorded):
    client = http.client.HTTPConnection("127.0.0.1", recorded.port)
    for path in ("/big", "/a", "/missing"):
        client.request("GET", path)
        client.getresponse().read()
    chunks = _wait_for_chunks(recorded, 6)
    # Begin inside the first response, as an agent started mid-transfer would.
    first = next(i for i, c in enumerate(chunks) if not c.client_to_server)
    chunks[first] = dataclasses.replace(chunks[first], data=chunks[first].data[50:])
    conn, exchanges = _replay(chunks, skip=first, synchronized=False)
    assert [(e.request.head.target, e.response.head.status) for e in exchanges] == [("/a", 200), ("/missing", 404)]


def test_random_bytes_are_never_taken_for_http():
    conn = Http1Connection()
    out = []
    for i in range(50):
        out += conn.feed(i % 2 == 0, os.urandom(700), 0, i)
    out += conn.close(99)
    assert all(e.request is None and e.response is None for e in out) or out == []
    assert conn.problems
    assert not looks_like_request(b"\x16\x03\x01\x02\x00") and not looks_like_response(b"SSH-2.0-OpenSSH\r\n")


def test_a_peer_reset_mid_response_gives_an_exchange_with_the_error():
    conn = Http1Connection()
    conn.feed(True, b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n", 0, 1)
    conn.feed(False, b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\npartial", 0, 2)
    [exchange] = conn.close(3, error="connection_reset")
    assert exchange.request.head.target == "/slow" and exchange.response.head.status == 200
    assert not exchange.response.complete and exchange.error == "connection_reset"


def test_headers_larger_than_the_capture_keep_the_request_line_and_say_so():
    conn = Http1Connection()
    head = b"GET /long HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * 5000 + b"\r\n\r\n"
    conn.feed(True, head[:1024], len(head) - 1024, 1)
    out = conn.feed(False, b"HTTP/1.1 204 No Content\r\n\r\n", 0, 2)
    [exchange] = out
    assert exchange.request.head.method == "GET" and exchange.request.head.target == "/long"
    assert exchange.request.head.truncated and exchange.request.head.get("host") == "x"
    assert exchange.response.head.status == 204 and exchange.response.complete


class _Sink:
    """A body sink that records what it is told."""

    wants_bytes = True

    def __init__(self) -> None:
        self.calls: list = []

    def unit(self, stamp) -> None:
        self.calls.append(("unit", stamp))

    def data(self, data: bytes, stamp) -> None:
        self.calls.append(("data", data, stamp))

    def gap(self, n: int) -> None:
        self.calls.append(("gap", n))


def test_sinks_get_bodies_de_chunked_with_chunk_starts_and_gaps():
    """The request sink (set at the request head) and the response sink (set when the response head
    names the request it answers) get the bodies as captured, de-chunked, split anywhere."""
    sinks: dict[str, _Sink] = {}
    answered = []

    def on_request(msg) -> None:
        msg.sink = sinks["request"] = _Sink()

    def on_response(request, response) -> None:
        answered.append(request.head.target)
        response.sink = sinks["response"] = _Sink()

    request = b"POST /v1/completions HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"
    response = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n"
    for cut in range(len(response) + 1):
        conn = Http1Connection(on_request=on_request, on_response=on_response)
        conn.feed(True, request, 0, "q")
        (exchange,) = conn.feed(False, response[:cut], 0, "a") + conn.feed(False, response[cut:], 0, "b")
        assert exchange.response.chunks == 2 and exchange.response.complete
        body = b"".join(c[1] for c in sinks["response"].calls if c[0] == "data")
        assert body == b"abcde" and [c[0] for c in sinks["response"].calls].count("unit") == 2, cut
    assert sinks["request"].calls == [("data", b"hello", "q")] and set(answered) == {"/v1/completions"}
    # A chunk cut by the capture: what was captured, then the gap; the next chunk starts clean.
    conn = Http1Connection(on_request=on_request, on_response=on_response)
    conn.feed(True, request, 0, "q")
    conn.feed(False, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\na\r\n0123", 6, "a")
    conn.feed(False, b"\r\n1\r\nz\r\n0\r\n\r\n", 0, "b")
    assert sinks["response"].calls == [
        ("unit", "a"),
        ("data", b"0123", "a"),
        ("gap", 6),
        ("unit", "b"),
        ("data", b"z", "b"),
    ]
