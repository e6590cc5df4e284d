"""Streamed responses through the real ``HttpCorrelator`` (socket records as the sensor delivers
them, no kernel): HTTP/1 chunked SSE with known gaps and a final ``usage`` event, a JSON
completion, HTTP/2 DATA frames, and what goes wrong (a cut stream, malformed usage, a long stream)."""

from __future__ import annotations

import json

import pytest
from hpack import Encoder

from harness.hostile import Wire, data_frame, h2_connection, headers_frame
from otelbpf.families.http.genai import ResponseFacts
from otelbpf.families.http.streaming import Gaps, Pacing, ResponseWatch

MS = 1_000_000


def sse_event(obj: object) -> bytes:
    data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return b"data: " + data + b"\n\n"


def chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def completion_request(model: str = "llama-3-8b", stream: bool = True, prompt: str = "hello secret-prompt") -> bytes:
    body = json.dumps({"messages": [{"role": "user", "content": prompt}], "model": model, "stream": stream}).encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: api\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )


SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def token(i: int) -> dict:
    return {
        "id": "chatcmpl-1",
        "model": "llama-3-8b-instruct",
        "choices": [{"index": 0, "delta": {"content": f"secret-output-{i}"}, "finish_reason": None}],
    }


def stream_sse(w: Wire, fd: int, events: list[bytes], gaps_ms: list[int], first_ms: int = 20) -> None:
    """The server writes the head, then each event as a chunk after its gap, then the last chunk."""
    w._t += first_ms * MS
    w.server_sent(fd, SSE_HEAD)
    for event, gap in zip(events, gaps_ms):
        w._t += gap * MS
        w.server_sent(fd, chunk(event))
    w.server_sent(fd, b"0\r\n\r\n")


def metric_points(w: Wire, name: str) -> list:
    return [
        p
        for _, metrics in w.correlator.collect()
        for metric in metrics
        if metric.name == name
        for p in metric.data.data_points
    ]


def test_chunked_sse_completion_with_usage():
    w = Wire()
    w.accept(5)
    w.client_sent(5, completion_request())
    events = [sse_event(token(i)) for i in range(5)]
    events[-1] = sse_event({**token(4), "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    events += [
        sse_event(
            {
                "id": "chatcmpl-1",
                "model": "llama-3-8b-instruct",
                "choices": [],
                "usage": {"prompt_tokens": 17, "completion_tokens": 5, "total_tokens": 22},
            }
        ),
        sse_event(b"[DONE]"),
    ]
    stream_sse(w, 5, events, [0, 10, 10, 30, 10, 1, 1], first_ms=20)
    w.close(5)
    w.flush()
    (span,) = w.spans
    a = span.attributes
    assert (
        a["gen_ai.operation.name"],
        a["gen_ai.provider.name"],
        a["gen_ai.request.model"],
        a["gen_ai.response.model"],
        a["gen_ai.response.id"],
    ) == ("chat", "openai", "llama-3-8b", "llama-3-8b-instruct", "chatcmpl-1")
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (17, 5)
    assert "otelbpf.gen_ai.usage.output_tokens.estimated" not in a
    assert list(a["gen_ai.response.finish_reasons"]) == ["stop"]
    assert a["otelbpf.http.response.chunks"] == 7 and a["otelbpf.http.response.events"] == 7
    # Records are 2 µs apart besides the gaps added: the first event 20 ms (+ a few µs) after the request.
    assert a["otelbpf.http.response.time_to_first_event"] == pytest.approx(0.020, abs=1e-4)
    assert a["otelbpf.http.response.time_to_first_byte"] == pytest.approx(0.020, abs=1e-4)
    assert a["otelbpf.http.response.event_gap.max"] == pytest.approx(0.030, abs=1e-4)
    text = repr(a)
    assert "secret-prompt" not in text and "secret-output" not in text  # content is off by default
    (ttft,) = metric_points(w, "gen_ai.server.time_to_first_token")
    assert ttft.count == 1 and ttft.sum == pytest.approx(0.020, abs=1e-4)
    assert ttft.explicit_bounds[:3] == [0.001, 0.005, 0.01]
    assert dict(ttft.attributes) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "llama-3-8b",
        "gen_ai.response.model": "llama-3-8b-instruct",
        "server.port": 8080,
    }
    (tpot,) = metric_points(w, "gen_ai.server.time_per_output_token")
    # From the first token to the end: 10+10+30+10+1+1 ms of gaps (and a few µs), over 5 - 1 tokens.
    assert tpot.sum == pytest.approx(0.062 / 4, abs=1e-4)
    (duration,) = metric_points(w, "gen_ai.server.request.duration")
    assert duration.sum == pytest.approx(0.082, abs=1e-4) and duration.explicit_bounds[-1] == 81.92
    gaps = {p.attributes["otelbpf.stream.unit"]: p for p in metric_points(w, "otelbpf.http.server.response.gap")}
    assert gaps["event"].count == 6 and gaps["chunk"].count == 6
    assert gaps["event"].max == pytest.approx(0.030, abs=1e-4)


def test_events_estimate_output_tokens_without_usage_and_content_when_configured():
    w = Wire(correlator_options={"capture_message_content": True})
    w.accept(5)
    w.client_sent(5, completion_request())
    stream_sse(w, 5, [sse_event(token(i)) for i in range(3)] + [sse_event(b"[DONE]")], [0, 5, 5, 1])
    w.close(5)
    w.flush()
    a = w.spans[0].attributes
    assert a["gen_ai.usage.output_tokens"] == 3 and a["otelbpf.gen_ai.usage.output_tokens.estimated"] is True
    assert "gen_ai.usage.input_tokens" not in a
    assert json.loads(a["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "hello secret-prompt"}]}
    ]
    output = json.loads(a["gen_ai.output.messages"])
    assert output[0]["parts"][0]["content"] == "secret-output-0secret-output-1secret-output-2"


def test_json_completion_usage_and_no_time_to_first_token():
    w = Wire()
    body = json.dumps(
        {
            "id": "cmpl-9",
            "object": "text_completion",
            "model": "m1",
            "choices": [{"text": "x", "index": 0, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 16, "total_tokens": 19},
        }
    ).encode()
    request = json.dumps({"model": "m1", "prompt": "p", "max_tokens": 16}).encode()
    w.exchange(
        5,
        b"POST /v1/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(request), request),
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body),
    )
    a = w.spans[0].attributes
    assert (
        a["gen_ai.operation.name"],
        a["gen_ai.request.model"],
        a["gen_ai.usage.input_tokens"],
        a["gen_ai.usage.output_tokens"],
        list(a["gen_ai.response.finish_reasons"]),
    ) == ("text_completion", "m1", 3, 16, ["length"])
    assert "otelbpf.http.response.chunks" not in a
    assert metric_points(w, "gen_ai.server.request.duration")[0].count == 1
    assert not metric_points(w, "gen_ai.server.time_to_first_token")


def test_malformed_usage_is_counted_not_exported():
    w = Wire()
    w.accept(5)
    w.client_sent(5, completion_request())
    bad_type = sse_event(b'{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":"x"}}')
    stream_sse(w, 5, [sse_event(token(0)), bad_type, sse_event(b'{"usage":{"prompt_tokens":3,,}')], [0, 1, 1])
    w.close(5)
    w.flush()
    a = w.spans[0].attributes
    assert "gen_ai.usage.input_tokens" not in a
    assert a["otelbpf.gen_ai.usage.output_tokens.estimated"] is True
    assert w.problems().get("genai_bad_usage") == 1


def test_stream_cut_mid_chunk_ends_with_an_error():
    w = Wire()
    w.accept(5)
    w.client_sent(5, completion_request())
    w.server_sent(5, SSE_HEAD + chunk(sse_event(token(0))) + b'40\r\ndata: {"id"')
    w.close(5)
    w.flush()
    (span,) = w.spans
    assert span.status.status_code.name == "ERROR" and span.attributes["error.type"] == "eof"
    assert span.attributes["otelbpf.http.response.events"] == 1
    (duration,) = metric_points(w, "gen_ai.server.request.duration")
    assert duration.attributes["error.type"] == "eof"
    assert not metric_points(w, "gen_ai.server.time_to_first_token")


def test_long_stream_holds_constant_state():
    """A long event stream: the watch keeps counts and buckets, never the events."""
    w = Wire()
    w.accept(5)
    w.client_sent(5, b"GET /events HTTP/1.1\r\n\r\n")
    w.server_sent(5, b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
    for i in range(1000):
        w.server_sent(5, b"event: tick\ndata: %d\n\n" % i)
    w.close(5)
    w.flush()
    a = w.spans[0].attributes
    assert a["otelbpf.http.response.events"] == 1000 and "gen_ai.operation.name" not in a
    watch = ResponseWatch(sse=True, genai=ResponseFacts())
    for i in range(20_000):
        watch.data(b'data: {"choices":[{"delta":{"content":"%d"}}]}\n\n' % i, (0, i * 1000, 1))
    assert watch.events.n == 20_000 and watch.genai.token_events == 20_000
    assert len(watch.events.gaps.counts) == 17 and watch.genai.output == []
    assert not watch.sse._data and not watch.sse._line


def test_http2_data_frames_are_timed():
    enc_c, enc_s = Encoder(), Encoder()
    request = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/demo.Stream/Tokens"),
        (":authority", "svc"),
        ("content-type", "application/grpc"),
    ]
    c2s = headers_frame(enc_c.encode(request), 1) + data_frame(b"\0\0\0\0\x01x", 1, end_stream=True)
    client, server_preface = h2_connection([(c2s, b"")])
    w = Wire()
    w.accept(7)
    w.client_sent(7, client)
    w.server_sent(7, server_preface)
    w._t += 15 * MS
    w.server_sent(7, headers_frame(enc_s.encode([(":status", "200"), ("content-type", "application/grpc")]), 1))
    for _ in range(4):
        w._t += 5 * MS
        w.server_sent(7, data_frame(b"\0\0\0\0\x02ok", 1))
    w.server_sent(7, headers_frame(enc_s.encode([("grpc-status", "0")]), 1, end_stream=True))
    w.close(7)
    w.flush()
    (span,) = w.spans
    a = span.attributes
    assert a["rpc.service"] == "demo.Stream" and a["otelbpf.http.response.chunks"] == 4
    assert a["otelbpf.http.response.time_to_first_chunk"] == pytest.approx(0.020, abs=1e-4)
    assert a["otelbpf.http.response.chunk_gap.max"] == pytest.approx(0.005, abs=1e-4)
    (gaps,) = metric_points(w, "otelbpf.http.server.response.gap")
    assert gaps.attributes["otelbpf.stream.unit"] == "data_frame" and gaps.count == 3


def test_gaps_histogram_buckets_like_otel():
    g = Gaps((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 2.0):
        g.add(v)
    assert g.counts == [2, 1, 1] and (g.n, g.min, g.max) == (4, 0.05, 2.0)
    p = Pacing()
    for t in (10, 30, 35):
        p.add(t)
    assert (p.n, p.first_ns, p.last_ns, p.gaps.n, p.gaps.max) == (3, 10, 35, 2, 20e-9)


def test_http2_sse_completion_is_read_from_data_frames():
    """An OpenAI-compatible completion over HTTP/2 (h2c): the request body and the SSE events are read
    from DATA frames, HEADERS and DATA of the request in one chunk."""
    enc_c, enc_s = Encoder(), Encoder()
    body = json.dumps({"model": "h2-model", "stream": True, "messages": []}).encode()
    request = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/v1/chat/completions"),
        (":authority", "api"),
        ("content-type", "application/json"),
    ]
    c2s = headers_frame(enc_c.encode(request), 1) + data_frame(body, 1, end_stream=True)
    client, server_preface = h2_connection([(c2s, b"")])
    w = Wire()
    w.accept(7)
    w.client_sent(7, client)
    w.server_sent(7, server_preface)
    w._t += 30 * MS
    w.server_sent(7, headers_frame(enc_s.encode([(":status", "200"), ("content-type", "text/event-stream")]), 1))
    for i in range(3):
        w._t += 10 * MS
        w.server_sent(7, data_frame(sse_event(token(i)), 1))
    usage = {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 3}}
    w.server_sent(7, data_frame(sse_event(usage) + sse_event(b"[DONE]"), 1, end_stream=True))
    w.close(7)
    w.flush()
    (span,) = w.spans
    a = span.attributes
    assert (
        a["gen_ai.request.model"],
        a["gen_ai.response.model"],
        a["gen_ai.usage.input_tokens"],
        a["gen_ai.usage.output_tokens"],
    ) == ("h2-model", "llama-3-8b-instruct", 4, 3)
    assert a["otelbpf.http.response.events"] == 5 and a["otelbpf.http.response.chunks"] == 4
    assert a["otelbpf.http.response.time_to_first_event"] == pytest.approx(0.040, abs=1e-4)
    (ttft,) = metric_points(w, "gen_ai.server.time_to_first_token")
    assert ttft.sum == pytest.approx(0.040, abs=1e-4)
