"""The http correlator's TLS entry (otelbpf/families/http/tls.py): plaintext records as the tls
receiver's ring delivers them (the socket layout: func 1 SSL_read, 2 SSL_write; the SSL pointer
in ``addr``), next to the socket path's records of the same connection. No kernel."""

from __future__ import annotations

import struct

from hpack import Encoder
from opentelemetry.trace import SpanKind
from test_http_unit import CLIENT_IP, CLIENT_PORT, SERVER_PID, SERVER_PORT, Http, Records, assert_attributes

from harness.hostile import grpc_call, h2_connection
from otelbpf.base.events import Kind, SockFunc
from otelbpf.families.http.tls import RING, TlsConns
from otelbpf.families.tls.probes import RING as TLS_FAMILY_RING

SSL = 0x5555_0000_1000
CLIENT_HELLO = b"\x16\x03\x01\x00\x50" + bytes(80)
REQUEST = b"POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\nContent-Length: 30\r\n\r\n"
BODY = b'{"model": "m1", "max_tokens": 3'[:30]
RESPONSE_BODY = b'{"model": "m1-s", "usage": {"prompt_tokens": 3, "completion_tokens": 2}}'
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(RESPONSE_BODY), RESPONSE_BODY)


def tls(
    r: Records,
    func: SockFunc,
    data: bytes,
    ts: int,
    dur: int,
    *,
    fd: int,
    ssl: int = SSL,
    ret=None,
    shift: int = 0,
    conn_id: int = 0,
) -> None:
    """A plaintext record as bpf/tls.c writes it: ``shift`` (its request's head sampling) in the
    SSL pointer's top byte, the kernel's connection id in ``port`` and ``local_port``."""
    r._add(
        ts_ns=ts,
        duration_ns=dur,
        pid=SERVER_PID,
        tid=SERVER_PID,
        fd=fd,
        ret=len(data) if ret is None else ret,
        kind=Kind.SOCK_DATA,
        func=func,
        cap=len(data),
        data=data,
        addr=struct.pack("<Q", ssl | shift << 56) + bytes(8),
        port=conn_id & 0xFFFF,
        local_port=conn_id >> 16,
    )


def test_the_ring_names_agree() -> None:
    assert RING == TLS_FAMILY_RING


def test_plaintext_makes_the_span_the_ciphertext_cannot_and_takes_the_socket_s_addresses() -> None:
    http = Http()
    sock = Records()
    sock.accept(1_000_000)
    sock.io(SockFunc.read, CLIENT_HELLO, 1_100_000, 1_000, pid=SERVER_PID, fd=5)
    http.deliver(sock)
    plain = Records()
    tls(plain, SockFunc.read, REQUEST + BODY, 2_000_000, 3_000, fd=5)
    tls(plain, SockFunc.write, RESPONSE, 2_050_000, 4_000, fd=5)
    http.plaintext(plain)
    span = http.span(SpanKind.SERVER)
    assert_attributes(
        span,
        {
            "url.scheme": "https",
            "url.path": "/v1/chat/completions",
            "http.response.status_code": 200,
            "server.port": SERVER_PORT,
            "client.address": CLIENT_IP,
            "client.port": CLIENT_PORT,
            "gen_ai.request.model": "m1",
            "gen_ai.response.model": "m1-s",
            "gen_ai.usage.output_tokens": 2,
        },
    )
    assert span.end_time - span.start_time == 2_054_000 - 2_003_000
    # the ciphertext was counted as TLS, never parsed
    assert http.counts[("otelbpf.http.connections", (("protocol", "tls"),))] == 1
    assert not [k for k in http.counts if k[0] == "otelbpf.http.problems"]


def test_a_kept_request_carries_its_sampling_and_the_shift_does_not_split_the_connection() -> None:
    """bpf/tls.c kept the first request at 1/4 (shift 2, in the SSL pointer's top byte) and the
    second whole (shift 0): the same SSL, so one connection, and each span its own sampling."""
    http = Http()
    plain = Records()
    tls(plain, SockFunc.read, REQUEST + BODY, 2_000_000, 3_000, fd=-1, shift=2)
    tls(plain, SockFunc.write, RESPONSE, 2_050_000, 4_000, fd=-1, shift=2)
    tls(plain, SockFunc.read, REQUEST + BODY, 3_000_000, 3_000, fd=-1)
    tls(plain, SockFunc.write, RESPONSE, 3_050_000, 4_000, fd=-1)
    http.plaintext(plain)
    first, second = sorted((s for s in http.spans if s.kind == SpanKind.SERVER), key=lambda s: s.start_time)
    assert first.attributes["otelbpf.http.sampling.adjusted_count"] == 4
    assert first.context.trace_state.get("ot") == "th:c"  # p = 1/4
    assert "otelbpf.http.sampling.adjusted_count" not in second.attributes
    assert first.attributes["url.scheme"] == second.attributes["url.scheme"] == "https"
    assert http.counts[("otelbpf.http.connections", (("protocol", "http1"),))] == 1


def test_without_an_fd_the_ssl_pointer_keys_the_connection() -> None:
    """A memory BIO (asyncio): no fd, two SSL objects of one process are two connections."""
    http = Http()
    plain = Records()
    tls(plain, SockFunc.read, REQUEST + BODY, 2_000_000, 3_000, fd=-1, ssl=SSL)
    tls(plain, SockFunc.read, REQUEST + BODY, 2_001_000, 3_000, fd=-1, ssl=SSL + 64)
    tls(plain, SockFunc.write, RESPONSE, 2_050_000, 4_000, fd=-1, ssl=SSL)
    tls(plain, SockFunc.write, RESPONSE, 2_060_000, 4_000, fd=-1, ssl=SSL + 64)
    http.plaintext(plain)
    spans = [s for s in http.spans if s.kind == SpanKind.SERVER]
    assert len(spans) == 2 and all(s.attributes["url.scheme"] == "https" for s in spans)


def test_a_socket_close_ends_the_tls_connection_two_batches_later_and_a_new_one_starts_fresh() -> None:
    """The rings drain apart: records written before the close may come in a later batch."""
    http = Http()
    sock = Records()
    sock.accept(1_000_000)
    http.deliver(sock)
    first = Records()
    tls(first, SockFunc.read, REQUEST + BODY, 2_000_000, 3_000, fd=5)
    http.plaintext(first)
    closing = Records()
    closing.close(2_100_000, pid=SERVER_PID, fd=5)
    http.deliver(closing)  # before the response's record
    late = Records()
    tls(late, SockFunc.write, RESPONSE, 2_050_000, 4_000, fd=5)
    http.plaintext(late)
    assert [s.attributes["http.response.status_code"] for s in http.spans] == [200]
    # a new connection on the reused fd number, after the close
    reopened = Records()
    reopened.accept(2_900_000)
    http.deliver(reopened)
    again = Records()
    tls(again, SockFunc.read, REQUEST + BODY, 3_000_000, 3_000, fd=5)
    tls(again, SockFunc.write, RESPONSE, 3_050_000, 4_000, fd=5)
    http.plaintext(again)
    assert len(http.spans) == 2


def test_an_ssl_read_of_zero_ends_a_client_exchange_and_garbage_plaintext_is_only_counted() -> None:
    http = Http()
    plain = Records()
    tls(plain, SockFunc.write, b"\x00\x01garbage that is no protocol", 1_000, 100, fd=9)
    tls(plain, SockFunc.read, b"", 2_000, 100, fd=9, ret=0)
    http.plaintext(plain)
    assert not any(k[0] == "otelbpf.http.unparsed_bytes" for k in http.counts)  # waits: fd 9 is new to both paths
    http.deliver(Records())  # the next batch (no socket record came for it): taken as it is
    assert http.spans == []
    assert any(k[0] == "otelbpf.http.unparsed_bytes" for k in http.counts)


def test_tls_conns_are_bounded() -> None:
    conns = TlsConns(lambda pid, fd: None, lambda pid, fd: (None, None, None), max_conns=2)
    ended = [conns.conn(1, fd, 0, fd)[1] for fd in range(4)]
    assert len(conns) == 2 and [len(e) for e in ended] == [0, 0, 1, 1]


def test_plaintext_drained_before_its_accept_waits_for_it_and_gets_its_addresses() -> None:
    """The rings drain apart: a short-lived peer's records may come before the socket's accept
    record (and its /proc be gone): they wait one batch of either ring."""
    http = Http()
    plain = Records()
    tls(plain, SockFunc.read, REQUEST + BODY, 2_000_000, 3_000, fd=5)
    tls(plain, SockFunc.write, RESPONSE, 2_050_000, 4_000, fd=5)
    http.plaintext(plain)
    assert http.spans == []
    sock = Records()
    sock.accept(1_000_000)
    http.deliver(sock)
    span = http.span(SpanKind.SERVER)
    assert_attributes(span, {"client.address": CLIENT_IP, "server.port": SERVER_PORT, "url.scheme": "https"})


def test_plaintext_on_a_port_the_http_receiver_does_not_trace_is_dropped() -> None:
    conns = TlsConns(
        lambda pid, fd: None,
        lambda pid, fd: ("client", ("10.0.0.2", 40000), ("10.0.0.9", 9999)),
        wanted=lambda *ports: SERVER_PORT in ports,
    )
    conn, _ = conns.conn(1, 7, 0, 10)
    assert conn is None and conns.unwanted(1, 7)
    conns.socket_closed(1, 7, 20)
    assert not conns.unwanted(1, 7)


def test_a_whole_connection_closed_before_its_plaintext_is_processed_keeps_its_addresses() -> None:
    """One drain held the accept, the ciphertext and the close: the plaintext comes after."""
    http = Http()
    sock = Records()
    sock.accept(1_000_000)
    sock.close(3_000_000, pid=SERVER_PID, fd=5)
    http.deliver(sock)
    plain = Records()
    tls(plain, SockFunc.read, REQUEST + BODY, 2_000_000, 3_000, fd=5)
    tls(plain, SockFunc.write, RESPONSE, 2_050_000, 4_000, fd=5)
    http.plaintext(plain)
    span = http.span(SpanKind.SERVER)
    assert_attributes(span, {"client.address": CLIENT_IP, "server.port": SERVER_PORT, "url.scheme": "https"})


def test_plaintext_no_socket_record_ever_names_is_released_by_the_metrics_collection() -> None:
    http = Http()
    plain = Records()
    tls(plain, SockFunc.read, REQUEST + BODY, 2_000_000, 3_000, fd=11)
    tls(plain, SockFunc.write, RESPONSE, 2_050_000, 4_000, fd=11)
    http.plaintext(plain)
    assert http.spans == []
    http.correlator.collect()
    assert http.span(SpanKind.SERVER).attributes["url.scheme"] == "https"


def test_an_h2_server_s_settings_before_the_preface_on_a_connection_of_unknown_role() -> None:
    """No socket record and no /proc: the client's preface decides the role, the server's first
    SETTINGS frame (written before it read anything) is kept for it."""
    preface_c2s, preface_s2c = h2_connection([])
    call_c2s, call_s2c = grpc_call(Encoder(), Encoder(), 1, path="/demo.Svc/Do")
    http = Http()
    plain = Records()
    tls(plain, SockFunc.write, preface_s2c, 1_900_000, 1_000, fd=12)  # the server's SETTINGS, first
    tls(plain, SockFunc.read, preface_c2s + call_c2s, 2_000_000, 3_000, fd=12)
    tls(plain, SockFunc.write, call_s2c, 2_050_000, 4_000, fd=12)
    http.plaintext(plain)
    http.correlator.collect()
    assert http.span(SpanKind.SERVER).name == "demo.Svc/Do"


def test_a_reused_fd_s_next_connection_is_told_apart_by_the_kernel_s_id_before_the_close_is_known() -> None:
    """A thread-per-connection h2 server closes a connection and accepts the next on the same fd:
    the plaintext ring can bring the next connection's preface before the socket ring's close
    and accept. The kernel's connection id ends the first (both its streams counted, not the
    second's preface parsed as its middle), and the second waits for its own accept's addresses
    rather than taking the first's."""
    ids = (0x1_0002, 0x1_0003)  # both halves used: the id spans port and local_port
    http = Http()
    sock = Records()
    sock.accept(1_000_000, port=40001)
    http.deliver(sock)
    plain = Records()
    for n, conn_id in enumerate(ids):
        c2s, s2c = h2_connection([])
        call_c2s, call_s2c = grpc_call(Encoder(), Encoder(), 1, path=f"/demo.Svc/Do{n}")
        at = 2_000_000 + n * 1_000_000
        tls(plain, SockFunc.write, s2c, at, 1_000, fd=5, conn_id=conn_id)
        tls(plain, SockFunc.read, c2s + call_c2s, at + 100_000, 3_000, fd=5, conn_id=conn_id)
        tls(plain, SockFunc.write, call_s2c, at + 200_000, 4_000, fd=5, conn_id=conn_id)
    http.plaintext(plain)  # the socket ring has said nothing of the close yet
    assert [s.name for s in http.spans] == ["demo.Svc/Do0"]  # the second waits for its accept
    later = Records()
    later.close(2_500_000, pid=SERVER_PID, fd=5)
    later.accept(2_900_000, port=40002)
    http.deliver(later)
    http.correlator.collect()
    spans = {s.name: s.attributes["client.port"] for s in http.spans}
    assert spans == {"demo.Svc/Do0": 40001, "demo.Svc/Do1": 40002}
    assert not [k for k in http.counts if k[0] == "otelbpf.http.problems"]


def test_without_ids_a_new_connection_after_the_close_still_starts_fresh() -> None:
    """Id 0 (the kernel's map was full) says nothing: the close's time decides, as before."""
    conns = TlsConns(lambda pid, fd: None, lambda pid, fd: (None, None, None))
    first, _ = conns.conn(1, 5, SSL, 100, 0)
    assert conns.conn(1, 5, SSL, 150, 7) == (first, [])  # an id after none: the same connection
    conns.socket_closed(1, 5, 200)
    second, ended = conns.conn(1, 5, SSL, 300, 0)
    assert ended == [first] and second is not first


UPSTREAM_REQUEST = b"GET /up HTTP/1.1\r\nHost: up\r\n\r\n"
UPSTREAM_RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


def _tick(http: Http, sock: Records, plain: Records, *, tls_first: bool) -> None:
    """One drain tick whose batches come in either order (the sensor drains rings one by one)."""
    batches = [lambda: http.correlator.on_tls(plain.array()), lambda: http.correlator.on_ring("sockdata", sock.array())]
    for deliver in batches if tls_first else batches[::-1]:
        deliver()
    http.correlator.on_tick()


def test_a_plain_request_s_https_call_is_its_child_whichever_ring_comes_first() -> None:
    """A gateway serving plain HTTP calls an HTTPS upstream: the request on the socket ring, the
    call on the TLS ring (a kept-alive upstream connection), the TLS batch delivered first. The
    tick is parsed as one, in time order: the request is open when the call starts."""
    http = Http()
    earlier = Records()
    earlier.connect(500_000, pid=SERVER_PID, fd=8)
    http.deliver(earlier)
    sock = Records()
    sock.accept(1_000_000)
    sock.io(SockFunc.read, REQUEST + BODY, 2_000_000, 3_000, pid=SERVER_PID, fd=5)
    sock.io(SockFunc.write, RESPONSE, 2_400_000, 4_000, pid=SERVER_PID, fd=5)
    plain = Records()
    tls(plain, SockFunc.write, UPSTREAM_REQUEST, 2_100_000, 2_000, fd=8)
    tls(plain, SockFunc.read, UPSTREAM_RESPONSE, 2_200_000, 90_000, fd=8)
    _tick(http, sock, plain, tls_first=True)
    server, client = http.span(SpanKind.SERVER), http.span(SpanKind.CLIENT)
    assert client.attributes["url.scheme"] == "https"
    assert client.parent is not None and client.parent.span_id == server.context.span_id
    assert client.context.trace_id == server.context.trace_id


def test_an_https_request_s_plain_call_is_its_child_whichever_ring_comes_first() -> None:
    """The other way: an HTTPS server (plaintext on the TLS ring) calls a plain upstream (socket
    ring), the socket batch delivered first."""
    http = Http()
    sock = Records()
    sock.accept(1_000_000)
    sock.io(SockFunc.read, CLIENT_HELLO, 1_100_000, 1_000, pid=SERVER_PID, fd=5)
    sock.connect(2_050_000, pid=SERVER_PID, fd=8)
    sock.io(SockFunc.write, UPSTREAM_REQUEST, 2_100_000, 2_000, pid=SERVER_PID, fd=8)
    sock.io(SockFunc.read, UPSTREAM_RESPONSE, 2_200_000, 90_000, pid=SERVER_PID, fd=8)
    plain = Records()
    tls(plain, SockFunc.read, REQUEST + BODY, 2_000_000, 3_000, fd=5)
    tls(plain, SockFunc.write, RESPONSE, 2_400_000, 4_000, fd=5)
    _tick(http, sock, plain, tls_first=False)
    server, client = http.span(SpanKind.SERVER), http.span(SpanKind.CLIENT)
    assert server.attributes["url.scheme"] == "https"
    assert client.parent is not None and client.parent.span_id == server.context.span_id


def test_a_tick_that_cannot_be_parsed_is_counted_by_ring_not_lost_silently(monkeypatch) -> None:
    """One record's failure is caught where it is parsed; a failure of the whole tick (here the
    merge itself) counts every record of it as dropped, by ring, as the agent counts a batch."""
    http = Http()
    sock = Records()
    sock.accept(1_000_000)
    plain = Records()
    tls(plain, SockFunc.read, REQUEST + BODY, 2_000_000, 3_000, fd=5)
    tls(plain, SockFunc.write, RESPONSE, 2_050_000, 4_000, fd=5)

    def broken(*args: object) -> None:
        raise ValueError("merge")

    monkeypatch.setattr(http.correlator, "_process", broken)
    _tick(http, sock, plain, tls_first=True)
    dropped = {dict(k[1])["ring"]: n for k, n in http.counts.items() if k[0] == "otelbpf.events.dropped"}
    assert dropped == {"sockdata": 1, "tlsdata": 2}
    assert http.counts[("otelbpf.http.problems", (("reason", "processing_error"),))] == 1
