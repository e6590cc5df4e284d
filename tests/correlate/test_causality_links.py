"""Requests in flight: what a span with no single parent (an event loop's step, a batching
engine's loop) is linked to."""

from __future__ import annotations

from otelbpf.correlate.causality import MAX_LINKS, Causality
from otelbpf.correlate.spans import new_context


def test_a_batching_thread_is_linked_to_every_request_other_threads_hold_open():
    c = Causality()
    a, b, other = new_context(), new_context(), new_context()
    ia = c.open(1, 10, 100, a)  # two handler threads read two requests
    c.open(1, 11, 110, b)
    c.open(2, 10, 100, other)  # another process's request is never linked
    # The engine thread (12) launches the batch's kernels: no parent, a link to each request.
    assert c.parent(1, 12, 150) is None
    assert c.in_flight(1, 12, 150) == [b, a]
    c.close(1, 10, ia, 200)
    assert c.in_flight(1, 12, 250) == [b]
    assert c.in_flight(1, 12, 150) == [b, a]  # a late lookup still finds a closed one
    assert c.in_flight(1, 12, 50) == [] and c.in_flight(3, 12, 150) == []


def test_an_event_loop_step_links_every_request_open_on_its_own_thread():
    c = Causality()
    contexts = [new_context() for _ in range(MAX_LINKS + 5)]
    for i, ctx in enumerate(contexts):
        c.open(1, 10, 100 + i, ctx)
    assert c.parent(1, 10, 500) is None  # ambiguous: no parent is picked
    assert c.in_flight(1, 10, 500) == contexts[::-1][:MAX_LINKS]  # bounded, the newest first


def test_forgetting_a_process_forgets_its_requests():
    c = Causality()
    c.open(1, 10, 100, new_context())
    c.forget_process(1)
    assert c.in_flight(1, 10, 150) == []
