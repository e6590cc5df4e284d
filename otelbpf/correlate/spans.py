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
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags, TraceState
from opentelemetry.trace.status import Status, StatusCode

from otelbpf import __version__

_rand = random.Random()
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
#: Status is immutable: spans without an error share one.
_UNSET = Status(StatusCode.UNSET)


def scope(name: str) -> InstrumentationScope:
    return InstrumentationScope(name, __version__)


_UNSAMPLED = TraceFlags(TraceFlags.DEFAULT)


def new_context(
    trace_id: int | None = None, trace_state: TraceState | None = None, *, sampled: bool = True
) -> SpanContext:
    bits = _rand.getrandbits
    flags = _SAMPLED if sampled else _UNSAMPLED
    return SpanContext(trace_id or bits(128) or 1, bits(64) or 1, False, flags, trace_state)


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
    sampled: bool = True,
) -> ReadableSpan:
    """``context``: the span's own, when it was chosen before the span ended
    (children may have been made with it as their parent already). A child inherits its
    parent's tracestate: a request's head-sampling threshold (``ot=th:``) holds for its whole
    subtree, as the OpenTelemetry probability-sampling spec has children inherit ``th``, so a
    backend re-weights the children of a request kept at 1/4 by 4 too. ``sampled``: False for a
    span recorded for the agent's own answers (its files, the live state) but kept out of trace
    backends (export/span_queue.py), the W3C sampled flag off; the child of such a span is such
    a span too (a backend would get a child without its parent), but not the child of a remote
    parent: a caller's own sampling flag does not decide what the agent exports."""
    if parent is not None and not parent.is_remote and not parent.trace_flags.sampled:
        sampled = False
    ctx = context or new_context(
        parent.trace_id if parent else None, parent.trace_state if parent else None, sampled=sampled
    )
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
