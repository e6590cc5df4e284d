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
from otelbpf.correlate.protocols.http2 import PREFACE, H2Connection, looks_like_preface


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
    client.send_headers(stream_id, [(":method", "GET"), (":path", path), (":scheme", "http"), (":authority", "svc"),
                                    ("x-custom", "value-%d" % stream_id)], end_stream=True)
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
        (1, "/p0", "value-1", "200"), (3, "/p1", "value-3", "200"), (5, "/p2", "value-5", "404"),
        (7, "/p3", "value-7", "200")]
    assert all(s.complete and s.response_bytes == 2 and s.first == (s.id, "req") and s.last == (s.id, "resp")
               for s in done)


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
