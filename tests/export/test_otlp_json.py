"""The direct OTLP/JSON span encoder writes the very document the SDK's protobuf route writes
(encode_spans -> MessageToDict -> hex ids), for every kind of field a span can carry."""

from __future__ import annotations

import json

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags, TraceState
from opentelemetry.trace.status import Status, StatusCode

from otelbpf.correlate.spans import make_span, new_context, scope
from otelbpf.export.jsonfile import to_otlp_json
from otelbpf.export.otlp_json import encode_spans_json

T0 = 1_700_000_000_000_000_000
A = Resource({"service.name": "inference", "process.pid": 4242, "process.command_args": ("python", "serve.py")})
B = Resource({"service.name": "trainer", "host.name": "gpu-7"}, schema_url="https://opentelemetry.io/schemas/1.26.0")
EMPTY = Resource({})
S1, S2 = scope("otelbpf.http"), InstrumentationScope("otelbpf.cuda", "0.1", "https://example/schema")


def assorted() -> list[ReadableSpan]:
    remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1), trace_state=TraceState([("k", "v")]))
    attrs = {
        "s": "x",
        "empty": "",
        "b": True,
        "f": False,
        "i": -7,
        "big": 2**63 - 1,
        "d": 0.25,
        "whole": 3.0,
        "inf": float("inf"),
        "strs": ("a", "b"),
        "ints": [1, 2],
        "bools": (True,),
        "floats": [0.5],
        "none": (),
    }
    own = SpanContext(0x1234, 0x99, is_remote=False, trace_state=TraceState([("vendor", "a=b"), ("x", "y")]))
    return [
        make_span(
            "GET",
            resource=A,
            scope=S1,
            start_ns=T0,
            end_ns=T0 + 10,
            attributes=attrs,
            kind=SpanKind.SERVER,
            parent=remote,
        ),
        make_span(
            "cudaMemcpy",
            resource=A,
            scope=S2,
            start_ns=T0 + 1,
            end_ns=T0 + 2,
            attributes={},
            error="cudaErrorInsufficientDriver (35)",
            events=[Event("nccl.straggler", {"rank": 3, "lag": 0.5}, T0 + 1), Event("bare", None, T0 + 2)],
        ),
        make_span(
            "POST",
            resource=B,
            scope=S1,
            start_ns=T0,
            end_ns=T0 + 5,
            attributes={"x": 1},
            kind=SpanKind.CLIENT,
            parent=new_context(),
        ),
        ReadableSpan(
            name="linked",
            context=own,
            resource=EMPTY,
            instrumentation_scope=None,
            links=[Link(remote, {"why": "peer"}), Link(new_context())],
            status=Status(StatusCode.OK),
            kind=SpanKind.CONSUMER,
            start_time=T0,
            end_time=T0 + 1,
        ),
        ReadableSpan(
            name="",
            context=new_context(),
            resource=A,
            instrumentation_scope=S1,
            status=Status(StatusCode.ERROR),
            kind=SpanKind.PRODUCER,
            start_time=T0,
            end_time=T0,
        ),
        make_span("GET", resource=A, scope=S1, start_ns=T0 + 3, end_ns=T0 + 4, attributes={"again": "same group"}),
    ]


def test_same_document_as_the_sdk_route() -> None:
    spans = assorted()
    assert json.loads(encode_spans_json(spans)) == json.loads(to_otlp_json(encode_spans(spans)))


@pytest.mark.parametrize("n", [0, 1])
def test_edge_sizes(n: int) -> None:
    spans = assorted()[:n]
    assert json.loads(encode_spans_json(spans)) == json.loads(to_otlp_json(encode_spans(spans)))


def test_nan_is_spelled_as_protobuf_json_does() -> None:
    span = make_span(
        "x", resource=A, scope=S1, start_ns=T0, end_ns=T0, attributes={"nan": float("nan"), "ninf": float("-inf")}
    )
    assert json.loads(encode_spans_json([span])) == json.loads(to_otlp_json(encode_spans([span])))


def test_unencodable_attribute_is_a_clear_error() -> None:
    span = make_span("x", resource=A, scope=S1, start_ns=T0, end_ns=T0, attributes={"obj": object()})
    with pytest.raises(TypeError, match="attribute value of type object"):
        encode_spans_json([span])


def test_reused_attribute_encodings_never_leak_between_spans(monkeypatch):
    """Encoded scalar attributes are cached and shared; with a tiny cache that keeps starting
    over, and with values that differ only in type (True vs 1), every document is still right."""
    import otelbpf.export.otlp_json as otlp_json

    monkeypatch.setattr(otlp_json, "_KV_CACHE", {})
    monkeypatch.setattr(otlp_json, "_KV_CACHE_MAX", 4)
    spans = assorted() + [
        make_span("t", resource=A, scope=S1, start_ns=T0, end_ns=T0, attributes={"v": True, "w": 1}),
        make_span("t", resource=A, scope=S1, start_ns=T0, end_ns=T0, attributes={"v": 1, "w": True}),
    ]
    for _ in range(2):
        assert json.loads(encode_spans_json(spans)) == json.loads(to_otlp_json(encode_spans(spans)))
    assert len(otlp_json._KV_CACHE) <= 4


@pytest.mark.parametrize("module", ["otelbpf.export.otlp_json", "otelbpf.export.otlp_proto"])
def test_the_attribute_cache_stays_small_under_a_hosts_churn(module, monkeypatch):
    """A host's churn brings new attribute values for ever (pids, thread ids, command lines,
    client ports). The encodings cache keeps what repeats, and its memory stays ~1 MiB however
    many values went through it (at 16,384 entries it grew to 8.6 MiB over hours of churn)."""
    import importlib
    import tracemalloc

    mod = importlib.import_module(module)
    monkeypatch.setattr(mod, "_KV_CACHE", {})
    tracemalloc.start()
    try:
        for pid in range(20_000):
            attrs = {"process.pid": pid, "process.command_line": f"/usr/bin/python3 -c 'import m{pid}'"}
            kvs = mod._attributes({**attrs, "cuda.api.function": "cudaLaunchKernel"})
            assert kvs[0]["key"] == "process.pid"
        held_mib = tracemalloc.get_traced_memory()[0] / 2**20
    finally:
        tracemalloc.stop()
    assert len(mod._KV_CACHE) <= mod._KV_CACHE_MAX
    assert held_mib < 1.5, f"{held_mib:.2f} MiB held by {len(mod._KV_CACHE)} cached encodings"
    again = mod._attributes({"cuda.api.function": "cudaLaunchKernel"})[0]
    assert again is mod._KV_CACHE[("cuda.api.function", str, "cudaLaunchKernel")]  # what repeats is kept
