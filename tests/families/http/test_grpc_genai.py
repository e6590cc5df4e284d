"""gRPC generation streams (otelbpf/families/http/grpc_genai.py) from message bytes built here: the
protobuf fields read, the framing across DATA frames, gaps, and hostile bytes. No kernel."""

from __future__ import annotations

import pytest

from harness.tls_apps import model_infer_request, pb
from otelbpf.families.http.grpc_genai import TRITON, GrpcRequestFacts, GrpcResponseFacts, classify, fields


def framed(msg: bytes) -> bytes:
    return b"\x00" + len(msg).to_bytes(4, "big") + msg


def test_classify() -> None:
    assert classify("/inference.GRPCInferenceService/ModelStreamInfer") == ("text_completion", TRITON, True)
    assert classify("/inference.GRPCInferenceService/ModelInfer") == ("text_completion", TRITON, False)
    assert classify("/inference.GRPCInferenceService/ServerLive") is None
    found = classify("/generate.v2.TextGeneration/GenerateStream")
    assert found is not None and found[1].provider == "generate.v2" and found[2]
    assert classify("/demo.Tokens/Generate") is None


def test_triton_request_model_across_frames() -> None:
    facts = GrpcRequestFacts("text_completion", TRITON, True)
    data = framed(model_infer_request("llama"))
    for i in range(0, len(data), 3):  # three bytes a frame: the header split too
        facts.data(data[i : i + 3], None)
    assert facts.model == "llama" and facts.stream is True and facts.problem == ""


def response(model: str, outputs: bool) -> bytes:
    inner = pb(1, model) + pb(3, "id-7") + (pb(5, pb(1, "out")) if outputs else pb(4, pb(1, "final")))
    return framed(pb(2, inner))


def test_triton_stream_tokens_skip_the_final_empty_response_and_errors_fail() -> None:
    facts = GrpcResponseFacts(TRITON, True)
    for t in range(3):
        facts.data(response("m-served", True), 1_000 + t)
    facts.data(response("m-served", False), 2_000)
    facts.body_done()
    assert (facts.model, facts.id, facts.token_events, facts.first_token_ns) == ("m-served", "id-7", 3, 1_000)
    bad = GrpcResponseFacts(TRITON, True)
    bad.data(framed(pb(1, "model is not ready")), 1)
    assert bad.problem == "grpc_stream_error" and bad.token_events == 0


def test_a_gap_inside_a_message_is_skipped_and_one_in_a_header_stops_counting() -> None:
    facts = GrpcRequestFacts("text_completion", TRITON, True)
    msg = framed(model_infer_request("m") + bytes(100))
    facts.data(msg[:20], None)
    facts.gap(len(msg) - 20)
    facts.data(framed(model_infer_request("second")), None)
    assert facts.model == "m"
    out = GrpcResponseFacts(TRITON, True)
    out.data(response("x", True), 1)
    out.gap()
    out.data(response("x", True), 2)
    out.body_done()
    assert out.token_events == 1 and out.problem == "gap"


@pytest.mark.parametrize(
    "junk", [b"\xff" * 40, b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", b"\x0f" * 10, b"\x12\x05ab"]
)
def test_hostile_protobuf_never_raises(junk: bytes) -> None:
    fields(junk)
    facts = GrpcResponseFacts(TRITON, True)
    facts.data(framed(junk), 1)
    facts.data(junk, 2)
    facts.body_done()
