"""Anthropic's and Gemini's wire formats (otelbpf/families/http/genai.py), besides OpenAI's: which
requests are GenAI, and what their bodies and streamed events say. No kernel."""

from __future__ import annotations

import json

import pytest

from otelbpf.families.http.genai import (
    ANTHROPIC,
    GEMINI,
    OPENAI,
    VERTEX,
    RequestFacts,
    ResponseFacts,
    attributes,
    classify,
)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/v1/chat/completions", ("chat", "openai", None, False)),
        ("/v1/messages", ("chat", "anthropic", None, False)),
        (
            "/v1beta/models/gemini-2.0-flash:generateContent",
            ("generate_content", "gcp.gemini", "gemini-2.0-flash", False),
        ),
        ("/v1beta/models/g1:streamGenerateContent", ("generate_content", "gcp.gemini", "g1", True)),
        (
            "/v1/projects/p/locations/us/publishers/google/models/g2:generateContent",
            ("generate_content", "gcp.vertex_ai", "g2", False),
        ),
        ("/v1/models", None),
        ("/v1beta/models/g1:countTokens", None),
    ],
)
def test_classify(path, expected) -> None:
    found = classify("POST", path)
    assert (found and (found[0], found[1].provider, found[2], found[3])) == (expected or None)
    assert classify("GET", path) is None


def sse(response: ResponseFacts, events: list[dict]) -> None:
    for i, e in enumerate(events):
        response.event(json.dumps(e).encode(), 1_000 + i)


def test_anthropic_stream_model_tokens_and_stop_reason() -> None:
    request = RequestFacts("chat", api=ANTHROPIC)
    request.data(
        json.dumps({"model": "claude-x", "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode(),
        None,
    )
    response = ResponseFacts(api=ANTHROPIC)
    sse(
        response,
        [
            {
                "type": "message_start",
                "message": {"id": "msg_9", "model": "claude-x-1", "usage": {"input_tokens": 12, "output_tokens": 1}},
            },
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}},
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "lo"}},
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}},
            {"type": "message_stop"},
        ],
    )
    a = attributes(request, response, lambda s: s)
    assert a == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "anthropic",
        "gen_ai.request.model": "claude-x",
        "gen_ai.response.model": "claude-x-1",
        "gen_ai.response.id": "msg_9",
        "gen_ai.response.finish_reasons": ["end_turn"],
        "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": 2,
    }
    assert response.token_events == 2 and response.first_token_ns == 1_002
    assert request.stream is True


def test_anthropic_content_only_when_asked() -> None:
    response = ResponseFacts(api=ANTHROPIC, content_cap=100)
    sse(response, [{"type": "content_block_delta", "delta": {"type": "text_delta", "text": "secret"}}])
    assert response.output == ["secret"]
    quiet = ResponseFacts(api=ANTHROPIC)
    sse(quiet, [{"type": "content_block_delta", "delta": {"type": "text_delta", "text": "secret"}}])
    assert quiet.output == [] and quiet.output_messages() is None


def test_gemini_model_from_the_path_and_the_last_usage_metadata_stands() -> None:
    request = RequestFacts("generate_content", api=GEMINI, path_model="g1", path_stream=True)
    request.data(b'{"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}', None)
    response = ResponseFacts(api=GEMINI)
    chunk = {"candidates": [{"content": {"parts": [{"text": "a"}]}}], "modelVersion": "g1-001", "responseId": "r1"}
    last = {
        **chunk,
        "candidates": [{"content": {"parts": [{"text": "b"}]}, "finishReason": "STOP"}],
        "usageMetadata": {"promptTokenCount": 4, "candidatesTokenCount": 2},
    }
    sse(response, [{**chunk, "usageMetadata": {"promptTokenCount": 4, "candidatesTokenCount": 1}}, last])
    a = attributes(request, response, lambda s: s)
    assert (a["gen_ai.request.model"], a["gen_ai.response.model"], a["gen_ai.response.id"]) == ("g1", "g1-001", "r1")
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (4, 2)
    assert a["gen_ai.response.finish_reasons"] == ["STOP"] and request.stream is True
    assert response.token_events == 2


def test_a_json_body_of_each_provider() -> None:
    anthropic = ResponseFacts(api=ANTHROPIC)
    anthropic.data(
        b'{"id": "m", "model": "c", "stop_reason": "max_tokens", "usage": {"input_tokens": 3, "output_tokens": 9}}'
    )
    anthropic.body_done()
    assert (anthropic.input_tokens, anthropic.output_tokens, anthropic.finish_reasons) == (3, 9, ["max_tokens"])
    vertex = ResponseFacts(api=VERTEX)
    vertex.data(b'{"modelVersion": "g", "usageMetadata": {"promptTokenCount": 1, "candidatesTokenCount": 2}}')
    vertex.body_done()
    assert (vertex.model, vertex.input_tokens, vertex.output_tokens) == ("g", 1, 2)


@pytest.mark.parametrize("api", [ANTHROPIC, GEMINI])
def test_bad_usage_and_broken_events_are_flagged_not_believed(api) -> None:
    response = ResponseFacts(api=api)
    response.event(
        b'{"type": "message_delta", "usage": {"output_tokens": -4}, "usageMetadata": {"candidatesTokenCount": "x"}}', 1
    )
    response.event(b'{"type": "message_start", "message": {"usage": {"input_tokens": 3', 2)
    assert response.output_tokens is None and response.input_tokens is None
    assert response.problem in ("bad_usage", "bad_json")
    assert OPENAI.usage_together and not api.usage_together
