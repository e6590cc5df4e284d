"""Hostile traffic (issue 13, rows 1-4, 9, 10): what a peer can send to a traced port never hangs
the processing thread, never escapes as an exception that loses other spans, never holds memory
without bound, and never puts a credential in a span or the log. Records go through the real
``HttpCorrelator`` as the sensor delivers them (harness/hostile.py)."""

from __future__ import annotations

import contextlib
import logging
import signal
import tracemalloc

import pytest
from hpack import Encoder

from harness.hostile import Wire, continuation, data_frame, grpc_call, h2_connection, headers_frame, settings
from otelbpf.correlate.spans import make_span, scope
from otelbpf.export import otlp_json
from otelbpf.export.otlp_json import INT64_MAX, encode_spans_json
from otelbpf.export.otlp_proto import encode_spans_proto
from otelbpf.families.http.protocols.http1 import Http1Connection
from otelbpf.families.http.protocols.http2 import PREFACE, H2Connection
from otelbpf.families.http.protocols.limits import DEFAULT, Held, Limits

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@contextlib.contextmanager
def within(seconds: int = 2):
    """Fail, rather than hang the suite, if the block takes longer (a parse position moving
    backwards spins forever)."""

    def hang(*_):
        raise TimeoutError(f"still running after {seconds}s")

    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# -- row 1: chunk sizes, lengths, targets --------------------------------------------------------------


@pytest.mark.parametrize("size", [b"-6", b"+5", b"1_0", b" 5", b"5 5", b"0x5", b"5" * 5000, b"1" * 16, b""])
def test_chunk_sizes_int_accepts_but_http_forbids_desync_and_never_move_backwards(size):
    conn = Http1Connection()
    with within():
        # "-6" right after the head made the old parser step back onto the head's CRLF and re-read
        # the same size line forever.
        conn.feed(
            True, b"POST /up HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + size + b"\r\nhello\r\n0\r\n\r\n", 0, 1
        )
        [ex] = conn.feed(False, OK, 0, 2)
    assert conn.problems == {"bad_chunk_size": 1}
    assert ex.request.problem == "bad_chunk_size" and ex.request.body_size == 0 and ex.request.size > 0


def test_valid_chunk_sizes_with_extensions_still_parse():
    conn = Http1Connection()
    conn.feed(
        True,
        b"POST /up HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nA ;name=v\r\n0123456789\r\n"
        b"00000000000005\r\nhello\r\n0\r\n\r\n",
        0,
        1,
    )
    [ex] = conn.feed(False, OK, 0, 2)
    assert ex.request.complete and ex.request.body_size == 15 and conn.problems == {}


def test_a_chunk_not_followed_by_crlf_desyncs():
    conn = Http1Connection()
    conn.feed(True, b"POST /up HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXY5\r\nhello\r\n", 0, 1)
    assert conn.problems == {"bad_chunk": 1}


@pytest.mark.parametrize("value", ["-5", "+5", "5_0", " 5x", "5, 6", "1" * 40, "0x10", "5.0"])
def test_content_lengths_outside_the_grammar_desync_and_are_counted(value):
    conn = Http1Connection()
    conn.feed(True, f"POST /p HTTP/1.1\r\nContent-Length: {value}\r\n\r\nhello".encode(), 0, 1)
    [ex] = conn.feed(False, OK, 0, 2)
    assert conn.problems == {"bad_content_length": 1}
    assert ex.request.body_size == 0 and ex.request.problem == "bad_content_length"


def test_two_content_length_fields_that_disagree_desync():
    conn = Http1Connection()
    conn.feed(True, b"POST /p HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 5\r\n\r\nhello", 0, 1)
    assert conn.problems == {"bad_content_length": 1}


def test_repeated_equal_content_lengths_are_one_length():
    conn = Http1Connection()
    conn.feed(True, b"POST /p HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\nhello", 0, 1)
    [ex] = conn.feed(False, OK, 0, 2)
    assert ex.request.body_size == 5 and ex.request.complete and conn.problems == {}


@pytest.mark.parametrize("target", ["/a\x01b", "/a\x7fb", "a/b", "host:80", "*", "/" + "a" * 20_000])
def test_request_targets_outside_the_grammar_desync_and_are_counted(target):
    conn = Http1Connection()
    conn.feed(True, b"GET " + target.encode("latin-1") + b" HTTP/1.1\r\nHost: x\r\n\r\n", 0, 1)
    assert conn.problems == {"bad_request_target": 1}
    assert conn.feed(False, OK, 0, 2)[0].request is None  # answered nothing followed


@pytest.mark.parametrize(
    "method,target", [("CONNECT", "host:443"), ("OPTIONS", "*"), ("GET", "http://h/x"), ("GET", "/caf\xc3\xa9")]
)
def test_the_other_target_forms_are_followed(method, target):
    conn = Http1Connection()
    conn.feed(True, f"{method} {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode("latin-1"), 0, 1)
    assert conn.problems == {}


def test_the_row_1_hang_does_not_stop_the_correlator():
    """Through the correlator: the hostile connection is counted, the next one still gives its span."""
    w = Wire()
    with within():
        w.exchange(10, b"POST /evil HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n-6\r\nX", OK)
        w.exchange(11, b"GET /fine HTTP/1.1\r\nHost: x\r\n\r\n", OK)
    assert w.problems()["bad_chunk_size"] == 1
    assert w.by_path()["/fine"].attributes["http.response.status_code"] == 200
    assert w.by_path()["/evil"].attributes["otelbpf.http.incomplete"] == "bad_chunk_size"


# -- rows 2 and 3: HTTP/2 values that are not what they claim --------------------------------------------


def test_bad_status_and_grpc_paths_keep_the_record_and_count_the_problem():
    ec, es = Encoder(), Encoder()
    calls = [
        grpc_call(ec, es, 1, status="abc"),
        grpc_call(ec, es, 3, path="x/y/z"),
        grpc_call(ec, es, 5, path="/a/b/c"),
        grpc_call(ec, es, 7, status="9" * 30, grpc_status="9" * 30),
        grpc_call(ec, es, 9, grpc_status="17"),
        grpc_call(ec, es, 11),
    ]
    c2s, s2c = h2_connection(calls)
    w = Wire()
    w.accept(10)
    w.client_sent(10, c2s)
    w.server_sent(10, s2c)
    w.close(10)
    w.flush()
    assert "processing_error" not in w.problems()
    assert w.problems() == {"bad_status": 2, "bad_path": 1, "bad_grpc_path": 1, "bad_grpc_status": 2}
    by_stream = {s.attributes["otelbpf.http2.stream_id"]: s.attributes for s in w.spans}
    assert sorted(by_stream) == [1, 3, 5, 7, 9, 11]
    assert "http.response.status_code" not in by_stream[1] and by_stream[1]["rpc.method"] == "Unary"
    assert "url.path" not in by_stream[3] and "rpc.system" not in by_stream[3]
    assert "rpc.system" not in by_stream[5]
    assert "http.response.status_code" not in by_stream[7] and "rpc.grpc.status_code" not in by_stream[7]
    assert by_stream[11]["rpc.grpc.status_code"] == 0 and by_stream[11]["http.response.status_code"] == 200
    encode_spans_proto(w.spans).SerializeToString()  # row 3: the batch encodes


def test_one_failing_exchange_does_not_stop_the_others_of_its_process(monkeypatch):
    """Row 2's other half: an exception while finishing one connection at process exit lost the
    batch and left the process's other connections unfinished."""
    import numpy as np

    from otelbpf.base.events import EVENT_DTYPE, Kind

    w = Wire()
    for fd in (10, 11, 12):
        w.accept(fd)
        w.client_sent(fd, f"GET /p{fd} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    w.flush()
    real = w.correlator._finished_http1

    def fail_on_p11(conn, ex):
        if ex.request.head.target == "/p11":
            raise ValueError("secret-in-message")
        real(conn, ex)

    monkeypatch.setattr(w.correlator, "_finished_http1", fail_on_p11)
    exits = np.zeros(1, dtype=EVENT_DTYPE)
    exits["kind"], exits["pid"] = Kind.PROC_EXIT, 4242
    w.correlator.on_events(exits)
    assert sorted(w.by_path()) == ["/p10", "/p12"]
    assert w.problems()["processing_error"] == 1


def test_an_int_beyond_int64_is_clamped_and_counted_not_a_lost_batch():
    from opentelemetry.sdk.resources import Resource

    otlp_json.CONVERSIONS.take()
    spans = [
        make_span(
            "s",
            resource=Resource({}),
            scope=scope("t"),
            start_ns=1,
            end_ns=2,
            attributes={"big": 1 << 70, "neg": -(1 << 80), "list": [1, 1 << 64], "ok": 5},
        )
        for _ in range(3)
    ]
    message = encode_spans_proto(spans)
    attrs = {kv.key: kv.value for kv in message.resource_spans[0].scope_spans[0].spans[0].attributes}
    assert attrs["big"].int_value == INT64_MAX and attrs["neg"].int_value == -(1 << 63)
    assert attrs["list"].array_value.values[1].int_value == INT64_MAX and attrs["ok"].int_value == 5
    doc = otlp_json.msgspec.json.decode(encode_spans_json(spans))
    assert doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["attributes"][0]["value"] == {
        "intValue": str(INT64_MAX)
    }
    assert otlp_json.CONVERSIONS.take()["int_out_of_range"] >= 6


# -- row 4: memory without bound --------------------------------------------------------------------------


def _allocated_during(fn) -> int:
    """Bytes still allocated after ``fn`` (tracemalloc), the things it returns kept alive."""
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    kept = fn()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del kept
    return after - before


def test_pipelined_requests_beyond_the_cap_are_counted_not_held_and_pairing_stays_right():
    conn = Http1Connection(limits=Limits(pending_requests=4))
    conn.feed(True, b"".join(b"GET /r%d HTTP/1.1\r\nHost: x\r\n\r\n" % i for i in range(10)), 0, 1)
    assert conn.problems == {"pending_limit": 6} and len(conn._pending) == 5
    done = conn.feed(False, OK * 6, 0, 2)
    assert [e.request.head.target for e in done] == ["/r0", "/r1", "/r2", "/r3"]
    conn.feed(True, b"GET /after HTTP/1.1\r\n\r\n", 0, 3)
    done = conn.feed(False, OK * 5, 0, 4)  # 4 for the requests not followed, then /after's
    assert [e.request.head.target for e in done] == ["/after"]


@pytest.mark.heavy
def test_one_million_pipelined_requests_hold_a_bounded_amount():
    request = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
    w = Wire()

    def flood():
        w.accept(10)
        for _ in range(20):
            w.client_sent(10, request * 2000)
        w.flush()
        return w

    grown = _allocated_during(flood)
    assert w.problems()["pending_limit"] == 40_000 - DEFAULT.pending_requests
    assert grown < 4 << 20, grown  # was ~31 MB for these 40k (774 MB per million)


def test_process_cap_spans_connections():
    held = Held(limit=3)
    a, b = Http1Connection(held=held), Http1Connection(held=held)
    a.feed(True, b"GET /1 HTTP/1.1\r\n\r\nGET /2 HTTP/1.1\r\n\r\n", 0, 1)
    b.feed(True, b"GET /3 HTTP/1.1\r\n\r\nGET /4 HTTP/1.1\r\n\r\n", 0, 1)
    assert b.problems == {"process_limit": 1} and held.n == 3
    a.close(2)
    assert held.n == 1


def test_streams_that_never_end_are_capped_oldest_first_and_their_spans_emitted():
    ec = Encoder()
    w = Wire(correlator_options={"limits": Limits(open_streams=8)})
    w.accept(10)
    w.client_sent(10, PREFACE + settings())
    for sid in range(1, 2 * 50, 2):
        block = ec.encode([(":method", "GET"), (":path", f"/s{sid}"), (":scheme", "http"), (":authority", "a")])
        w.client_sent(10, headers_frame(block, sid))
    w.flush()
    assert w.problems() == {"stream_limit": 42}
    assert sorted(int(p[2:]) for p in w.by_path()) == list(range(1, 2 * 42, 2))  # the oldest, given up
    assert all(s.attributes["otelbpf.http.incomplete"] == "stream_limit" for s in w.spans)
    conn = w.correlator._conns.get(4242, 10)
    assert len(conn.session._streams) == 8


@pytest.mark.heavy
def test_open_streams_hold_a_bounded_amount():
    ec = Encoder()
    conn = H2Connection()
    conn.feed(True, PREFACE + settings(), 0, 0)
    block = ec.encode([(":method", "GET"), (":path", "/x"), (":scheme", "http"), (":authority", "a")])
    frames = b"".join(headers_frame(block, sid) for sid in range(1, 2 * 20_000, 2))

    def flood():
        conn.feed(True, frames, 0, 1)
        return conn

    grown = _allocated_during(flood)
    assert conn.problems["stream_limit"] == 20_000 - DEFAULT.open_streams
    assert grown < 3 << 20, grown  # was ~9 MB for these 20k (438 MB per million)


def test_a_continuation_flood_is_cut_at_the_header_block_cap():
    ec = Encoder()
    conn = H2Connection()
    conn.feed(True, PREFACE + settings(), 0, 0)
    block = ec.encode([(":method", "GET"), (":path", "/x"), (":scheme", "http"), (":authority", "a")])
    conn.feed(True, headers_frame(block, 1, end_headers=False), 0, 1)

    def flood():
        for _ in range(400):
            conn.feed(True, continuation(b"\0" * 16_000, 1), 0, 2)
        return conn

    grown = _allocated_during(flood)
    assert grown < 1 << 20, grown  # was 6.4 MB held for these 400 frames
    assert sum(len(f.payload) for f in conn._dirs[True].block) < DEFAULT.header_block
    conn.feed(True, continuation(b"", 1, end_headers=True) + data_frame(b"", 1, end_stream=True), 0, 3)
    assert conn.problems == {"header_block_too_large": 1}
    assert 1 in conn._streams and conn._streams[1].headers_lost  # still timed


def test_a_huge_frame_keeps_no_payload():
    conn = H2Connection()
    conn.feed(True, PREFACE + settings(), 0, 0)
    conn.feed(False, settings(max_frame_size=(1 << 24) - 1), 0, 0)
    conn.feed(True, headers_frame(b"\0" * (1 << 20), 1), 0, 1)
    assert conn.problems == {"header_block_too_large": 1} and conn._dirs[True].reader._buf == bytearray()


def test_the_hpack_table_is_the_smaller_of_the_peers_setting_and_our_cap():
    conn = H2Connection()
    conn.feed(True, PREFACE + settings(), 0, 0)
    conn.feed(False, settings(header_table_size=(1 << 32) - 1), 0, 0)  # the server allows 4 GiB
    enc = Encoder()
    enc.header_table_size = 1 << 30
    block = enc.encode([(":method", "GET"), (":path", "/x"), ("x-big", "v" * 1000)])
    conn.feed(True, headers_frame(block, 1, end_stream=True), 0, 1)
    d = conn._dirs[True]
    assert d.decoder.max_allowed_table_size == DEFAULT.hpack_table
    assert d.hpack_lost.startswith("hpack_error") and conn.problems == {"hpack_error": 1}
    assert d.decoder.header_table.maxsize <= DEFAULT.hpack_table


def test_grpc_routes_beyond_the_cap_share_one_other_series():
    ec, es = Encoder(), Encoder()
    calls = [grpc_call(ec, es, 2 * i + 1, path=f"/svc.S{i}/M") for i in range(40)]
    c2s, s2c = h2_connection(calls)
    w = Wire(correlator_options={"max_routes": 10})
    w.accept(10)
    w.client_sent(10, c2s)
    w.server_sent(10, s2c)
    w.close(10)
    w.flush()
    [(_, metrics)] = w.correlator.collect()
    [hist] = [m for m in metrics if m.name == "rpc.server.duration"]
    services = sorted(p.attributes["rpc.service"] for p in hist.data.data_points)
    assert len(services) == 11 and services[0] == "_OTHER"
    assert [p.count for p in hist.data.data_points if p.attributes["rpc.service"] == "_OTHER"] == [30]
    assert w.count("otelbpf.http.routes_folded") == 30
    assert len(w.spans) == 40  # spans keep every route


def test_unknown_methods_share_the_other_series():
    w = Wire()
    for i in range(20):
        w.exchange(10 + i, f"X{chr(65 + i)} /x HTTP/1.1\r\n\r\n".encode(), OK)
    [(_, metrics)] = w.correlator.collect()
    [hist] = metrics
    assert {p.attributes["http.request.method"] for p in hist.data.data_points} == {"_OTHER"}


# -- rows 9 and 10: credentials in targets, Host and the log ---------------------------------------------


@pytest.mark.parametrize(
    "request_bytes,path,host",
    [
        (
            b"GET http://alice:pw-secret@origin.example:8080/p?token=q-secret HTTP/1.1\r\nHost: origin.example\r\n\r\n",
            "/p",
            "origin.example",
        ),
        (
            b"GET /cart;jsessionid=sess-secret/item;v=1;x HTTP/1.1\r\nHost: bob:host-secret@shop.example:80\r\n\r\n",
            "/cart;jsessionid=REDACTED/item;v=REDACTED;x",
            "shop.example",
        ),
        (b"GET https://u-secret@h.example HTTP/1.1\r\n\r\n", "/", "h.example"),
        (b"CONNECT u:pw-secret@h.example:443 HTTP/1.1\r\n\r\n", "h.example:443", None),
    ],
)
def test_userinfo_and_path_parameters_never_reach_a_span(request_bytes, path, host):
    w = Wire()
    w.exchange(10, request_bytes, OK)
    [span] = w.spans
    assert span.attributes["url.path"] == path
    if host:
        assert span.attributes["server.address"] == host
    assert "secret" not in repr(dict(span.attributes)) + span.name


def test_authority_userinfo_and_path_parameters_in_http2_never_reach_a_span():
    ec, es = Encoder(), Encoder()
    calls = [grpc_call(ec, es, 1, path="/svc.S/M;sid=sid-secret", extra=[(":authority", "u:pw-secret@svc:50051")])]
    c2s, s2c = h2_connection(calls)
    w = Wire()
    w.accept(10)
    w.client_sent(10, c2s)
    w.server_sent(10, s2c)
    w.close(10)
    w.flush()
    [span] = w.spans
    assert "secret" not in repr(dict(span.attributes)) + span.name
    assert span.attributes["server.address"] == "svc"


def test_payload_loggers_stay_quiet_at_debug(caplog):
    ec = Encoder()
    block = ec.encode([(":method", "GET"), (":path", "/"), ("authorization", "Bearer log-secret")])
    Wire()  # the receiver starts
    with caplog.at_level(logging.DEBUG):  # the root logger at DEBUG, as log_level: debug sets it
        conn = H2Connection()
        conn.feed(True, PREFACE + settings() + headers_frame(block, 1, end_stream=True), 0, 1)
    assert conn._streams[1].header("authorization") == "Bearer log-secret"  # decoded...
    assert "log-secret" not in caplog.text  # ... and not logged (hpack logs every header at DEBUG)


def test_an_exception_is_logged_without_its_message(monkeypatch, caplog):
    w = Wire()

    def fail(conn, ex):
        raise ValueError("msg-secret")

    monkeypatch.setattr(w.correlator, "_finished_http1", fail)
    with caplog.at_level(logging.DEBUG):
        w.exchange(10, b"GET /x HTTP/1.1\r\n\r\n", OK)
    assert "ValueError" in caplog.text and "msg-secret" not in caplog.text
    assert w.problems()["processing_error"] == 1


def test_an_http2_path_outside_the_grammar_is_left_out_and_counted():
    ec, es = Encoder(), Encoder()
    c2s, s2c = h2_connection([grpc_call(ec, es, 1, path="/svc.S/M\x00\x1b[2J"), grpc_call(ec, es, 3)])
    w = Wire()
    w.exchange(10, c2s, s2c)
    assert w.problems() == {"bad_path": 1}
    first, second = sorted(w.spans, key=lambda s: s.attributes["otelbpf.http2.stream_id"])
    assert "url.path" not in first.attributes and "rpc.method" not in first.attributes
    assert second.attributes["url.path"] == "/demo.Echo/Unary"


def test_spans_of_a_flood_are_handed_over_within_the_batch():
    """One ring batch of a stream flood finishes ~20k streams: held until the batch ends, their
    spans were 238 MB at the peak for a million streams."""
    ec = Encoder()
    w = Wire()
    handed = []
    w.correlator._emit = lambda spans: handed.append(len(spans))
    w.accept(10)
    w.client_sent(10, PREFACE + settings())
    block = ec.encode([(":method", "GET"), (":path", "/x"), (":scheme", "http"), (":authority", "a")])
    w.client_sent(10, b"".join(headers_frame(block, sid) for sid in range(1, 2 * 20_000, 2)))
    w.flush()  # one batch
    assert sum(handed) == 20_000 - DEFAULT.open_streams and max(handed) <= 4096 + 512
