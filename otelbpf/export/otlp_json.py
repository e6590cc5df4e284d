"""Spans straight to OTLP/JSON, without building protobuf messages first.

The SDK's route (``encode_spans`` → protobuf → ``MessageToDict`` → hex ids →
``json.dumps``) costs ~100 µs of CPU per span, which capped the default file
exporter near 10k spans/s per core: below what one busy inference server's
requests or a sampled launch stream produce. Here a span becomes plain dicts
and lists and ``msgspec`` writes the JSON: the same document (checked
field for field against the SDK's route in tests/export/test_otlp_json.py),
an order of magnitude cheaper.

The encoding follows the protobuf JSON mapping the Collector's file exporter
uses: lowerCamelCase names, 64-bit integers as strings, enums as integers,
hex trace and span ids, fields at their default value left out.

An integer OTLP cannot hold (outside int64) never fails the batch it is in
(up to 512 spans of every process): it is clamped to int64's bounds and
counted in ``CONVERSIONS``. A value of a type with no encoding at all is a
bug of the code that made the span, and stays a TypeError.
"""

from __future__ import annotations

import base64
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind
from opentelemetry.util.types import Attributes

#: OTLP's SpanKind numbers (SPAN_KIND_INTERNAL = 1 ...).
SPAN_KIND = {
    SpanKind.INTERNAL: 1,
    SpanKind.SERVER: 2,
    SpanKind.CLIENT: 3,
    SpanKind.PRODUCER: 4,
    SpanKind.CONSUMER: 5,
}
#: SpanFlags: the context's is_remote is known / is true.
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200

_encoder = msgspec.json.Encoder()
#: A JSON object as built for the encoder (OTLP/JSON field names, values of any JSON type).
JsonDict = dict[str, Any]
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


class Conversions:
    """Values the encoders changed to make them encodable, by kind; read (and reset) by the agent."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def add(self, kind: str) -> None:
        with self._lock:
            self._counts[kind] = self._counts.get(kind, 0) + 1

    def take(self) -> dict[str, int]:
        """Counts since the last call."""
        with self._lock:
            counts, self._counts = self._counts, {}
        return counts


#: Shared by both encoders (otlp_proto.py imports it).
CONVERSIONS = Conversions()


def clamp_int(value: int) -> int:
    """``value`` within int64 (counted when it was not)."""
    if INT64_MIN <= value <= INT64_MAX:
        return value
    CONVERSIONS.add("int_out_of_range")
    return INT64_MAX if value > 0 else INT64_MIN


def _float(value: float) -> JsonDict:
    if math.isfinite(value):
        return {"doubleValue": value}
    return {"doubleValue": "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")}


def _sequence(value: Sequence[object]) -> JsonDict:
    return {"arrayValue": {"values": [_any(v) for v in value]} if value else {}}


#: Encoders by exact type: one dict lookup for the common cases (isinstance chains cost
#: more than the rest of a span's encoding). Subclasses fall through to ``_any``'s checks.
_BY_TYPE: dict[type, Callable[[Any], JsonDict]] = {
    str: lambda v: {"stringValue": v},
    bool: lambda v: {"boolValue": v},
    int: lambda v: {"intValue": str(clamp_int(v))},
    float: _float,
    tuple: _sequence,
    list: _sequence,
}


def _any(value: object) -> JsonDict:
    """An ``AnyValue``."""
    enc = _BY_TYPE.get(type(value))
    if enc is not None:
        return enc(value)
    if isinstance(value, bool):  # before int: bool is an int
        return {"boolValue": bool(value)}
    if isinstance(value, str):
        return {"stringValue": str(value)}
    if isinstance(value, int):
        return {"intValue": str(clamp_int(int(value)))}
    if isinstance(value, float):
        return _float(float(value))
    if isinstance(value, bytes):
        return {"bytesValue": base64.b64encode(value).decode()}
    if isinstance(value, Mapping):
        return {"kvlistValue": {"values": _attributes(value)} if value else {}}
    if isinstance(value, Sequence):
        return _sequence(value)
    raise TypeError(f"attribute value of type {type(value).__name__} has no OTLP encoding")


#: Encoded key-value pairs of scalar attributes, reused: most of a span's attributes repeat
#: from span to span (function, method, protocol, pid, thread). Bounded: when full it starts
#: over, and the values that repeat are back in it at once. Entries are only read once made, so
#: sharing them between documents is safe. An entry is ~550 bytes: at 16,384 entries a full
#: cache was 8.6 MiB, and a host's churn (every new pid, thread id, command line, client port)
#: filled it over hours: the agent's slow creep under churn. 2,048 hold what repeats (~1.1 MiB).
_KV_CACHE: dict[tuple[str, type, object], JsonDict] = {}
_KV_CACHE_MAX = 1 << 11
_SCALARS = frozenset({str, bool, int})


def _attributes(attrs: Attributes) -> list[JsonDict]:
    if not attrs:
        return []
    cache, scalars, by_type = _KV_CACHE, _SCALARS, _BY_TYPE
    out = []
    for k, v in attrs.items():
        t = type(v)
        if t in scalars:
            key = (k, t, v)
            kv = cache.get(key)
            if kv is None:
                if len(cache) >= _KV_CACHE_MAX:
                    cache.clear()
                kv = cache[key] = {"key": k, "value": by_type[t](v)}
            out.append(kv)
        else:
            out.append({"key": k, "value": (by_type.get(t) or _any)(v)})
    return out


def span_flags(context: SpanContext | None) -> int:
    return _HAS_IS_REMOTE | _IS_REMOTE if context is not None and context.is_remote else _HAS_IS_REMOTE


def _span(span: ReadableSpan) -> JsonDict:
    ctx = span.context
    out: JsonDict = {"traceId": f"{ctx.trace_id:032x}", "spanId": f"{ctx.span_id:016x}"}
    if ctx.trace_state:
        out["traceState"] = ",".join(f"{k}={v}" for k, v in ctx.trace_state.items())
    if span.parent is not None:
        out["parentSpanId"] = f"{span.parent.span_id:016x}"
    out["flags"] = span_flags(span.parent)
    if span.name:
        out["name"] = span.name
    out["kind"] = SPAN_KIND[span.kind]
    if span.start_time:
        out["startTimeUnixNano"] = str(span.start_time)
    if span.end_time:
        out["endTimeUnixNano"] = str(span.end_time)
    if span.attributes:
        out["attributes"] = _attributes(span.attributes)
    if span.dropped_attributes:
        out["droppedAttributesCount"] = span.dropped_attributes
    if span.events:
        out["events"] = [_event(e) for e in span.events]
    if span.dropped_events:
        out["droppedEventsCount"] = span.dropped_events
    if span.links:
        out["links"] = [_link(link) for link in span.links]
    if span.dropped_links:
        out["droppedLinksCount"] = span.dropped_links
    status: JsonDict = {}
    if span.status.status_code.value:
        status["code"] = span.status.status_code.value
    if span.status.description:
        status["message"] = span.status.description
    out["status"] = status
    return out


def _event(event: Event) -> JsonDict:
    out: JsonDict = {}
    if event.timestamp:
        out["timeUnixNano"] = str(event.timestamp)
    if event.name:
        out["name"] = event.name
    if event.attributes:
        out["attributes"] = _attributes(event.attributes)
    if event.dropped_attributes:
        out["droppedAttributesCount"] = event.dropped_attributes
    return out


def _link(link: Link) -> JsonDict:
    out: JsonDict = {"traceId": f"{link.context.trace_id:032x}", "spanId": f"{link.context.span_id:016x}"}
    if link.attributes:
        out["attributes"] = _attributes(link.attributes)
    if link.dropped_attributes:
        out["droppedAttributesCount"] = link.dropped_attributes
    out["flags"] = span_flags(link.context)
    return out


def _scope(scope: InstrumentationScope) -> JsonDict:
    out: JsonDict = {}
    if scope.name:
        out["name"] = scope.name
    if scope.version:
        out["version"] = scope.version
    if scope.attributes:
        out["attributes"] = _attributes(scope.attributes)
    return out


#: One scope's spans (the SDK's spans may have no scope).
ScopeGroup = tuple[InstrumentationScope | None, list[ReadableSpan]]


def group_spans(spans: Sequence[ReadableSpan]) -> list[tuple[Resource, list[ScopeGroup]]]:
    """Spans by resource, then by scope, in first-seen order.

    Grouped by *object*: the agent keeps one Resource per process and one scope per
    receiver, and hashing a Resource (the SDK groups by value) serialises its attributes
    every time.
    """
    groups: dict[int, tuple[Resource, dict[int, ScopeGroup]]] = {}
    for span in spans:
        res = span.resource
        entry = groups.get(id(res))
        if entry is None:
            entry = groups[id(res)] = (res, {})
        scope = span.instrumentation_scope
        by_scope = entry[1].get(id(scope))
        if by_scope is None:
            by_scope = entry[1][id(scope)] = (scope, [])
        by_scope[1].append(span)
    return [(res, list(scopes.values())) for res, scopes in groups.values()]


def encode_spans_json(spans: Sequence[ReadableSpan]) -> bytes:
    """One ``ExportTraceServiceRequest`` in OTLP/JSON."""
    resource_spans = []
    for res, scopes in group_spans(spans):
        scope_spans = []
        for scope, members in scopes:
            item: JsonDict = {"scope": _scope(scope) if scope is not None else {}, "spans": [_span(s) for s in members]}
            if scope is not None and scope.schema_url:
                item["schemaUrl"] = scope.schema_url
            scope_spans.append(item)
        item = {
            "resource": {"attributes": _attributes(res.attributes)} if res.attributes else {},
            "scopeSpans": scope_spans,
        }
        if res.schema_url:
            item["schemaUrl"] = res.schema_url
        resource_spans.append(item)
    return _encoder.encode({"resourceSpans": resource_spans} if resource_spans else {})
