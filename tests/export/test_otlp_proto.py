"""The dict-built protobuf span request equals the SDK's ``encode_spans`` message, field for
field, for every kind of field a span can carry (the spans of test_otlp_json.py)."""

from __future__ import annotations

import math

import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from export.test_otlp_json import S1, T0, A, assorted
from otelbpf.correlate.spans import make_span
from otelbpf.export.otlp_proto import encode_spans_proto


def test_same_message_as_the_sdk_encoder() -> None:
    spans = assorted()
    ours, sdk = encode_spans_proto(spans), encode_spans(spans)
    assert MessageToDict(ours) == MessageToDict(sdk)  # a readable diff when it fails
    assert ours == sdk
    assert ours.SerializeToString(deterministic=True) == sdk.SerializeToString(deterministic=True)


@pytest.mark.parametrize("n", [0, 1])
def test_edge_sizes(n: int) -> None:
    spans = assorted()[:n]
    assert encode_spans_proto(spans) == encode_spans(spans)


def test_non_finite_doubles_survive() -> None:
    span = make_span(
        "x", resource=A, scope=S1, start_ns=T0, end_ns=T0, attributes={"nan": float("nan"), "inf": float("inf")}
    )
    values = {
        kv.key: kv.value.double_value
        for kv in encode_spans_proto([span]).resource_spans[0].scope_spans[0].spans[0].attributes
    }
    assert math.isnan(values["nan"]) and values["inf"] == float("inf")


def test_unencodable_attribute_is_a_clear_error() -> None:
    span = make_span("x", resource=A, scope=S1, start_ns=T0, end_ns=T0, attributes={"obj": object()})
    with pytest.raises(TypeError, match="attribute value of type object"):
        encode_spans_proto([span])
