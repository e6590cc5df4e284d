"""HTTP/2 and gRPC parsing on byte streams real grpcio peers exchanged, and on
frames built with the ``h2`` library where a case needs exact control."""

from __future__ import annotations

import os
import time

import grpc
import h2.config
import h2.connection
import pytest

from harness import grpc_demo
from harness.tcp_recorder import TcpRecorder
from otelbpf.families.http.protocols.http2 import PREFACE, H2Connection, looks_like_preface


@pytest.fixture
def recorded_grpc():
    server, port = grpc_demo.serve()
    recorder = TcpRecorder(("127.0.0.1", port))
    yield recorder
    recorder.close()
    server.stop(0)


def _replay(chunks, *, cap: int | None = None):
    conn = H2Connection()
    requests, done = [], []
    conn._on_request = requests.append
    for i, c in enumerate(chunks):
        data = c.data if cap is None else c.data[:cap]
        done += conn.feed(c.client_to_server, data, len(c.data) - len(data), i)
    done += conn.close("end")
    return conn, requests, done


def _settle(recorder, conn: int = 0) -> list:
    time.sleep(0.3)
    return recorder.stream(conn)


def test_grpc_unary_and_server_streaming_with_statuses_from_trailers(recorded_grpc):
    with grpc.insecure_channel(f"127.0.0.1:{recorded_grpc.port}") as channel:
        for i in range(20):
            assert grpc_demo.unary(channel)(b"ping %d" % i) == b"ping %d" % i
        with pytest.raises(grpc.RpcError):
            grpc_demo.unary(channel)(b"missing")
        with pytest.raises(grpc.RpcError):
            list(grpc_demo.stream(channel)(b"tick"))
    chunks = _settle(recorded_grpc)
    first = next(c for c in chunks if c.client_to_server).data
    assert first.startswith(PREFACE) and looks_like_preface(first[:10])
    conn, requests, streams = _replay(chunks)

    assert conn.problems == {} and not conn.broken
    completed = [s for s in streams if s.complete]
    assert [s.header(":path") for s in completed] == ["/demo.Echo/Unary"] * 21 + ["/demo.Echo/Stream"]
    assert len(requests) == 22
    ok = completed[:20]
    assert all(s.grpc_status == 0 and s.header(":status", "response") == "200" for s in ok)
    assert all(s.header("content-type") == "application/grpc" for s in ok)
    assert [s.request_bytes for s in ok] == [5 + len(b"ping %d" % i) for i in range(20)]
    assert completed[20].grpc_status == 5 and completed[20].grpc_message == "no such thing"
    streaming = completed[21]
    assert streaming.grpc_status == 9 and streaming.grpc_message == grpc_demo.STREAM_ERROR
    assert streaming.response_bytes == 3 * (5 + 4)
    # grpcio's encoder indexes headers in the dynamic table: later requests refer to them.
    assert all(s.header(":authority") == f"127.0.0.1:{recorded_grpc.port}" for s in completed)
    assert all(s.header("user-agent").startswith("grpc-python") for s in completed)


def _client_server():
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    client.initiate_connection()
    server.initiate_connection()
    c2s, s2c = client.data_to_send(), server.data_to_send()
    server.receive_data(c2s)
    client.receive_data(s2c)
    c_ack, s_ack = client.data_to_send(), server.data_to_send()
    server.receive_data(c_ack)
    client.receive_data(s_ack)
    return client, server, c2s + c_ack, s2c + s_ack


def _request(client, server, stream_id: int, path: str, status: str = "200", body: bytes = b"ok"):
    client.send_headers(
        stream_id,
        [
            (":method", "GET"),
            (":path", path),
            (":scheme", "http"),
            (":authority", "svc"),
            ("x-custom", f"value-{stream_id}"),
        ],
        end_stream=True,
    )
    c2s = client.data_to_send()
    server.receive_data(c2s)
    server.send_headers(stream_id, [(":status", status), ("content-length", str(len(body)))])
    server.send_data(stream_id, body, end_stream=True)
    s2c = server.data_to_send()
    client.receive_data(s2c)
    return c2s, s2c


def test_dynamic_table_is_kept_per_direction_across_streams():
    client, server, c0, s0 = _client_server()
    conn = H2Connection()
    conn.feed(True, c0, 0, 0)
    conn.feed(False, s0, 0, 0)
    done = []
    for i, sid in enumerate((1, 3, 5, 7)):
        c2s, s2c = _request(client, server, sid, f"/p{i}", status="404" if sid == 5 else "200")
        done += conn.feed(True, c2s, 0, (sid, "req"))
        done += conn.feed(False, s2c, 0, (sid, "resp"))
    assert [(s.id, s.header(":path"), s.header("x-custom"), s.header(":status", "response")) for s in done] == [
        (1, "/p0", "value-1", "200"),
        (3, "/p1", "value-3", "200"),
        (5, "/p2", "value-5", "404"),
        (7, "/p3", "value-7", "200"),
    ]
    assert all(
        s.complete and s.response_bytes == 2 and s.first == (s.id, "req") and s.last == (s.id, "resp") for s in done
    )


def test_a_frame_cut_short_by_the_connection_end_is_counted():
    client, server, c0, s0 = _client_server()
    conn = H2Connection()
    conn.feed(True, c0, 0, 0)
    c2s, s2c = _request(client, server, 1, "/a")
    conn.feed(True, c2s, 0, 1)
    conn.feed(False, s0 + s2c[:12], 0, 2)  # a frame header and 3 bytes of its payload
    streams = conn.close(3, error="connection_reset")
    assert conn.problems == {"truncated_frame": 1}
    assert [(s.id, s.complete, s.problem) for s in streams] == [(1, False, "connection_reset")]


def test_hpack_garbage_stops_decoding_that_direction_without_guessing():
    client, server, c0, s0 = _client_server()
    conn = H2Connection()
    conn.feed(True, c0, 0, 0)
    conn.feed(False, s0, 0, 0)
    garbage = bytes([0xFF, 0xFF, 0xFF, 0xFF, 0x7F]) + os.urandom(20)
    frame = len(garbage).to_bytes(3, "big") + bytes([1, 0x5]) + (1).to_bytes(4, "big") + garbage
    conn.feed(True, frame, 0, 1)
    # A valid request after the garbage: its block may refer to entries the garbage would have added.
    c2s, _ = _request(client, server, 3, "/after")
    conn.feed(True, c2s, 0, 2)
    streams = conn.close(3)
    assert conn.problems.get("hpack_error") == 1
    assert [(s.id, s.headers_lost, s.request_headers) for s in streams] == [(1, True, []), (3, True, [])]


def test_random_bytes_after_the_preface_are_not_http2():
    conn = H2Connection()
    conn.feed(True, PREFACE, 0, 0)
    for i in range(20):
        conn.feed(True, os.urandom(300), 0, i)
    conn.close(99)
    assert conn.broken and sum(conn.problems.values()) >= 1


def test_a_gap_inside_data_is_skipped_and_a_gap_over_a_frame_header_breaks_the_direction():
    client, server, c0, s0 = _client_server()
    conn = H2Connection()
    conn.feed(True, c0, 0, 0)
    conn.feed(False, s0, 0, 0)
    client.send_headers(1, [(":method", "POST"), (":path", "/up"), (":scheme", "http"), (":authority", "s")])
    client.send_data(1, b"z" * 10000, end_stream=True)
    c2s = client.data_to_send()
    # Capture stops 100 bytes into the DATA payload: the rest is a gap inside it.
    cut = c2s.index(b"z" * 100) + 100
    assert conn.feed(True, c2s[:cut], len(c2s) - cut, 1) == []
    assert not conn.broken
    server.receive_data(c2s)
    server.send_headers(1, [(":status", "200")], end_stream=True)
    [stream] = conn.feed(False, server.data_to_send(), 0, 2)
    assert stream.request_bytes == 10000 and stream.header(":path") == "/up" and stream.complete
    # A gap that runs past the end of a frame hides the next frame header.
    conn.feed(False, b"\x00\x00\x04\x00\x00\x00\x00\x00\x01ab", 2 + 50, 3)
    assert conn.broken == "gap_in_framing"


def test_frames_split_anywhere_across_chunks_parse_as_whole_ones():
    client, server, c0, s0 = _client_server()
    traffic = [(True, c0), (False, s0)]
    for sid in (1, 3, 5):
        c2s, s2c = _request(client, server, sid, f"/split{sid}", body=b"x" * 100)
        traffic += [(True, c2s), (False, s2c)]

    def replay(step: int) -> list:
        conn, done = H2Connection(), []
        for c2s, data in traffic:
            for i in range(0, len(data), step):
                done += conn.feed(c2s, data[i : i + step], 0, 0)
        assert conn.problems == {}
        return [(s.id, s.request_headers, s.response_headers, s.response_bytes, s.complete) for s in done]

    whole = replay(1 << 20)
    assert [s[0] for s in whole] == [1, 3, 5] and all(s[-1] for s in whole)
    assert replay(1) == replay(7) == whole


def _headers_frame(stream_id: int, block: bytes) -> bytes:
    return len(block).to_bytes(3, "big") + bytes([1, 0x5]) + stream_id.to_bytes(4, "big") + block


def _count_decodes(conn: H2Connection, c2s: bool) -> list:
    """Calls of that direction's HPACK decoder (the ``hpack`` library's), recorded."""
    decoder = conn._dirs[c2s].decoder
    calls, decode = [], decoder.decode
    decoder.decode = lambda data, raw=False: calls.append(bytes(data)) or decode(data, raw=raw)
    return calls


GET = b"\x82\x86\x84"  # :method GET, :scheme http, :path / (static table)
EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def test_repeated_header_blocks_skip_the_decoder_only_while_the_table_is_unchanged():
    conn = H2Connection()
    calls = _count_decodes(conn, True)
    conn.feed(True, PREFACE + EMPTY_SETTINGS, 0, 0)
    newest = b"\xbe"  # index 62: the newest entry of the dynamic table
    blocks = [
        GET + b"\x40\x03x-a\x011",
        GET + newest,
        GET + newest,
        GET + b"\x40\x03x-b\x012",
        GET + newest,
        GET + newest,
    ]
    for i, block in enumerate(blocks):
        conn.feed(True, _headers_frame(2 * i + 1, block), 0, i)
    streams = conn.close(99)
    assert conn.problems == {}
    assert [s.header("x-a") or s.header("x-b") for s in streams] == ["1", "1", "1", "2", "2", "2"]
    assert all(s.header(":method") == "GET" and s.header(":path") == "/" for s in streams)
    # Every table change (a literal indexed) forgets what was decoded before it: each repeated block
    # goes through the decoder once after each change, and is skipped after that.
    assert calls == [GET, b"\x40\x03x-a\x011", GET + newest, GET, b"\x40\x03x-b\x012", GET + newest]


def test_a_new_literal_each_call_leaves_the_indexed_run_before_it_remembered():
    conn = H2Connection()
    calls = _count_decodes(conn, True)
    conn.feed(True, PREFACE + EMPTY_SETTINGS, 0, 0)
    for i in range(3):
        value = b"00-%032x-%016x-01" % (i + 1, i + 1)
        literal = b"\x00\x0btraceparent" + bytes([len(value)]) + value  # literal, not indexed
        conn.feed(True, _headers_frame(2 * i + 1, GET + literal), 0, i)
    streams = conn.close(99)
    assert [s.request_headers[-1] for s in streams] == [("traceparent", f"00-{i:032x}-{i:016x}-01") for i in (1, 2, 3)]
    assert [s.request_headers[:3] for s in streams] == [[(":method", "GET"), (":scheme", "http"), (":path", "/")]] * 3
    assert calls[0] == GET and GET not in calls[1:] and len(calls) == 4


def test_hpack_rules_still_apply_to_blocks_remembered():
    # A table size update after the first field is an error, even after an indexed run seen before.
    conn = H2Connection()
    conn.feed(True, PREFACE + EMPTY_SETTINGS, 0, 0)
    conn.feed(True, _headers_frame(1, GET), 0, 1)
    conn.feed(True, _headers_frame(3, GET + b"\x20"), 0, 2)
    assert conn.problems == {"hpack_error": 1}
    # A block decoded before is decoded again once the receiver has lowered the table size the
    # encoder may use, and fails the check the encoder did not honour.
    conn = H2Connection()
    conn.feed(True, PREFACE + EMPTY_SETTINGS, 0, 0)
    conn.feed(True, _headers_frame(1, GET), 0, 1)
    conn.feed(False, b"\x00\x00\x06\x04\x00\x00\x00\x00\x00" + b"\x00\x01\x00\x00\x00\x00", 0, 2)  # HEADER_TABLE_SIZE 0
    conn.feed(True, _headers_frame(3, GET), 0, 3)
    assert conn.problems == {"hpack_error": 1}
    assert [s.headers_lost for s in conn.close(4)] == [False, True]


def test_a_full_table_that_changes_but_keeps_its_length_and_newest_value_is_noticed():
    conn = H2Connection()
    conn.feed(True, PREFACE + EMPTY_SETTINGS, 0, 0)
    x_a, x_b = b"\x40\x03x-a\x011", b"\x40\x03x-b\x012"  # literals indexed: 36 bytes in the table each
    second_newest = b"\xbf"  # index 63
    blocks = [
        b"\x3f\x45" + x_b + x_a,  # table size 100: [x-a, x-b], full
        GET + second_newest,
        GET + second_newest,
        GET + x_a,  # [x-a, x-a]: x-b evicted; same length, newest equal to the one before
        GET + second_newest,
    ]
    for i, block in enumerate(blocks):
        conn.feed(True, _headers_frame(2 * i + 1, block), 0, i)
    streams = conn.close(99)
    assert conn.problems == {}
    assert [s.request_headers[-1] for s in streams[1:]] == [("x-b", "2"), ("x-b", "2"), ("x-a", "1"), ("x-a", "1")]


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


def test_data_frames_reach_the_stream_sinks_split_padded_and_cut():
    """Request and response sinks set by the callbacks get each DATA frame's start, its content without
    padding (whole, split across chunks, or cut by a gap), in wire order, also when the request's
    HEADERS and DATA come in one chunk."""
    client, server, c0, s0 = _client_server()
    sinks: dict[str, _Sink] = {}

    def on_request(stream) -> None:
        stream.request_sink = sinks["request"] = _Sink()

    def on_response(stream) -> None:
        stream.response_sink = sinks["response"] = _Sink()

    conn = H2Connection(on_request=on_request, on_response=on_response)
    conn.feed(True, c0, 0, 0)
    conn.feed(False, s0, 0, 0)
    client.send_headers(
        1, [(":method", "POST"), (":path", "/v1/completions"), (":scheme", "http"), (":authority", "s")]
    )
    client.send_data(1, b"hello", end_stream=True, pad_length=3)
    request = client.data_to_send()
    conn.feed(True, request, 0, 1)
    server.receive_data(request)
    server.send_headers(1, [(":status", "200")])
    server.send_data(1, b"data: a\n\n")
    server.send_data(1, b"data: " + b"b" * 200 + b"\n\n", pad_length=10)
    server.send_data(1, b"c" * 300)
    s2c = server.data_to_send()
    third = s2c.rindex(b"c" * 300)
    split = s2c.index(b"b" * 200) + 50
    conn.feed(False, s2c[:split], 0, 2)
    conn.feed(False, s2c[split : third + 100], len(s2c) - third - 100, 3)  # the last frame is cut after 100 bytes
    assert sinks["request"].calls == [("unit", 1), ("data", b"hello", 1)]
    assert sinks["response"].calls == [
        ("unit", 2),
        ("data", b"data: a\n\n", 2),
        ("unit", 2),
        ("data", b"data: " + b"b" * 200 + b"\n\n", 3),
        ("unit", 3),
        ("data", b"c" * 100, 3),
        ("gap", 200),
    ]
    assert conn.problems == {}
