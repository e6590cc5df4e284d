"""Build finished OpenTelemetry spans from kernel events.

Events arrive after the fact with their own timestamps and belong to other
processes, so spans are constructed directly as ``ReadableSpan`` objects
(each with its process's Resource) rather than started and ended through a
Tracer, which would stamp the agent's clock and the agent's resource.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from otelbpf import __version__

_rand = random.Random()
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
#: Status is immutable: spans without an error share one.
_UNSET = Status(StatusCode.UNSET)


def scope(name: str) -> InstrumentationScope:
    return InstrumentationScope(name, __version__)


def new_context(trace_id: int | None = None) -> SpanContext:
    bits = _rand.getrandbits
    return SpanContext(trace_id or bits(128) or 1, bits(64) or 1, False, _SAMPLED)


def make_span(
    name: str,
    *,
    resource: Resource,
    scope: InstrumentationScope,
    start_ns: int,
    end_ns: int,
    attributes: Mapping[str, Any],  # as each correlator builds them; the SDK checks the values
    error: str | None = None,
    parent: SpanContext | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
    context: SpanContext | None = None,
    events: Sequence[Event] = (),
    links: Sequence[Link] = (),
) -> ReadableSpan:
    """``context``: the span's own, when it was chosen before the span ended
    (children may have been made with it as their parent already)."""
    ctx = context or new_context(parent.trace_id if parent else None)
    status = Status(StatusCode.ERROR, error) if error else _UNSET
    return ReadableSpan(
        name=name,
        context=ctx,
        parent=parent,
        resource=resource,
        attributes=attributes,
        kind=kind,
        status=status,
        start_time=start_ns,
        end_time=end_ns,
        instrumentation_scope=scope,
        events=tuple(events),
        links=tuple(links),
    )
