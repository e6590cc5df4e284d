"""OpenAI-compatible payload facts from synthetic bodies: every split point, gaps, hostile JSON."""

from __future__ import annotations

import json

import pytest

from otelbpf.families.http.genai import JsonScanner, RequestFacts, ResponseFacts, attributes, operation
from otelbpf.families.http.protocols.limits import Limits

REQUEST = json.dumps(
    {
        "messages": [
            {"role": "system", "content": 'be "model": brief \\ {['},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ],
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.5,
    }
).encode()
RESPONSE = json.dumps(
    {
        "id": "chatcmpl-7",
        "object": "chat.completion",
        "created": 1,
        "model": "llama-3.1",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 21, "completion_tokens": 2, "total_tokens": 23},
    }
).encode()


def test_operations():
    assert operation("POST", "/v1/chat/completions") == "chat"
    assert operation("POST", "/openai/v1/completions") == "text_completion"
    assert operation("GET", "/v1/chat/completions") is None
    assert operation("POST", "/v1/embeddings") is None


def test_request_model_and_stream_at_every_split():
    for cut in range(len(REQUEST) + 1):
        r = RequestFacts("chat")
        r.data(REQUEST[:cut], None)
        r.data(REQUEST[cut:], None)
        assert (r.model, r.stream, r.problem) == ("meta-llama/Llama-3.1-8B-Instruct", True, ""), cut
    assert r.input_messages() is None  # content is not read unless asked


def test_request_content_only_when_asked_and_clipped():
    r = RequestFacts("chat", content_cap=4)
    for i in range(0, len(REQUEST), 5):
        r.data(REQUEST[i : i + 5], None)
    assert r.input_messages() == [
        {"role": "system", "parts": [{"type": "text", "content": "be "}]},
        {"role": "user", "parts": [{"type": "text", "content": "hi"}]},
    ]


def test_json_response_at_every_split():
    for cut in range(len(RESPONSE) + 1):
        f = ResponseFacts()
        f.data(RESPONSE[:cut])
        f.data(RESPONSE[cut:])
        f.body_done()
        assert (f.model, f.id, f.input_tokens, f.output_tokens, f.finish_reasons, f.problem) == (
            "llama-3.1",
            "chatcmpl-7",
            21,
            2,
            ["stop"],
            "",
        ), cut


def test_a_gap_ends_the_reading_and_usage_is_not_guessed():
    f = ResponseFacts()
    f.data(RESPONSE[:40])
    f.gap()
    f.data(RESPONSE[40:])  # the rest may be anything: not read
    f.body_done()
    assert (f.id, f.model, f.input_tokens) == ("chatcmpl-7", None, None)


@pytest.mark.parametrize(
    "body, reason",
    [
        (b'{"usage": {"prompt_tokens": 1, "completion_tokens": -3}}', "bad_usage"),
        (b'{"usage": {"prompt_tokens": 1, "completion_tokens": 2.5}}', "bad_usage"),
        (b'{"usage": {"prompt_tokens": 1, "completion_tokens": 99999999999999999999}}', "bad_usage"),
        (b'{"usage": {"prompt_tokens": 1, "completion_tokens": 2}', "bad_usage"),  # never closed
        (b'{"usage": {"prompt_tokens": 1 "completion_tokens": 2}}', "bad_json"),
        (b'{"usage": {"prompt_tokens": 1, "completion_tokens": 2]]', "bad_json"),
        (b'{"model": "a": "b"}', "bad_json"),
        (b"[" * 100, "too_deep"),
    ],
)
def test_malformed_json_is_named_and_no_counts_are_taken(body, reason):
    f = ResponseFacts()
    f.data(body)
    f.body_done()
    assert f.problem == reason and f.input_tokens is None and f.output_tokens is None


def test_documents_are_bounded():
    s = JsonScanner({("model",): ("model", 8)}, limits=Limits(json_document=1000))
    s.feed(b'{"model": "' + b"x" * 100 + b'", "prompt": [')
    assert s.values == {"model": ["xxxxxxxx"]} and s.clipped
    for _ in range(10):
        s.feed(b"1, 2, 3, " * 20)
    assert s.broken == "too_large" and len(s._stack) == 2


def test_scalars_and_escapes_split_across_pieces():
    s = JsonScanner({("n",): ("n", 64), ("s",): ("s", 64)})
    for piece in (b'{"n": 12', b'34, "s": "a\\', b'"b\\u00', b'e9"}'):
        s.feed(piece)
    assert s.complete and s.values == {"n": [1234], "s": ['a"b\u00e9']}


def test_sse_events_count_output_and_take_usage_from_the_last():
    f = ResponseFacts()
    f.event(b'{"id":"c1","model":"m","choices":[{"delta":{"role":"assistant","content":""}}]}', 100)
    f.event(b'{"id":"c1","model":"m","choices":[{"delta":{"content":"a"},"finish_reason":null}]}', 200)
    f.event(b'{"id":"c1","model":"m","choices":[{"delta":{},"finish_reason":"stop"}]}', 300)
    f.event(b'{"id":"c1","model":"m","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2}}', 400)
    f.event(b"[DONE]", 500)
    assert (f.token_events, f.first_token_ns, f.input_tokens, f.output_tokens, f.finish_reasons) == (
        3,
        100,
        9,
        2,
        ["stop"],
    )


def test_attributes_follow_the_semantic_conventions():
    r = RequestFacts("chat")
    r.data(REQUEST, None)
    f = ResponseFacts()
    f.event(b'{"model":"served","choices":[{"delta":{"content":"a"}}]}', 1)
    f.event(b'{"model":"served","choices":[{"delta":{"content":"b"}}]}', 2)
    assert attributes(r, f, lambda v: v[:10]) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "meta-llama",
        "gen_ai.response.model": "served",
        "gen_ai.usage.output_tokens": 2,
        "otelbpf.gen_ai.usage.output_tokens.estimated": True,
    }
