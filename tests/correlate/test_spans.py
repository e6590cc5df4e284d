"""spans.py: the sampled flag a span gets from its parent."""

from __future__ import annotations

from opentelemetry.trace import SpanContext, TraceFlags

from otelbpf.correlate.process_info import agent_resource
from otelbpf.correlate.spans import make_span, new_context, scope


def _child(parent: SpanContext, **kw: bool):
    return make_span(
        "x", resource=agent_resource(), scope=scope("t"), start_ns=1, end_ns=2, attributes={}, parent=parent, **kw
    )


def test_a_local_unsampled_parent_makes_an_unsampled_child_a_remote_one_does_not():
    """A span recorded unsampled (a shed request's torch operator) has unsampled children: a
    backend would get a child without its parent. A caller's traceparent with the flag off
    decides nothing here: the agent's own sampling does."""
    unsampled = new_context(sampled=False)
    remote = SpanContext(unsampled.trace_id, unsampled.span_id, True, TraceFlags(0))
    assert not _child(unsampled).context.trace_flags.sampled
    assert _child(remote).context.trace_flags.sampled
    assert _child(new_context()).context.trace_flags.sampled
    assert not _child(new_context(), sampled=False).context.trace_flags.sampled
