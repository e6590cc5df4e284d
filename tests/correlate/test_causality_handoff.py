"""Causality.handed: work handed to another thread, followed by the wake-up that handed it."""

from __future__ import annotations

from opentelemetry.trace import SpanContext

from otelbpf.correlate.causality import MAX_WAKES, Causality, Wake

PID = 100
HANDLER, OTHER_HANDLER, DISPATCHER, WORKER, LOOP = 1, 2, 3, 4, 5


def ctx(n: int) -> SpanContext:
    return SpanContext(trace_id=n, span_id=n, is_remote=False)


def test_a_workers_call_is_a_child_of_the_request_its_waker_was_serving() -> None:
    c = Causality()
    c.open(PID, HANDLER, 100, ctx(1))
    c.open(PID, OTHER_HANDLER, 110, ctx(2))  # open too: a link would name both
    c.woken(PID, WORKER, Wake(150, HANDLER))
    assert c.parent(PID, WORKER, 200) is None  # nothing open on the worker itself
    assert c.handed(PID, WORKER, 200) == ctx(1)


def test_the_last_wake_up_before_the_call_counts_not_a_later_one() -> None:
    c = Causality()
    c.open(PID, HANDLER, 100, ctx(1))
    c.open(PID, OTHER_HANDLER, 300, ctx(2))
    c.woken(PID, WORKER, Wake(150, HANDLER))
    c.woken(PID, WORKER, Wake(350, OTHER_HANDLER))
    assert c.handed(PID, WORKER, 200) == ctx(1)  # a call processed after a later hand-off
    assert c.handed(PID, WORKER, 400) == ctx(2)
    assert c.handed(PID, WORKER, 120) is None  # before any wake-up


def test_a_request_over_before_the_call_hands_nothing() -> None:
    """A worker that took queued work without sleeping: its last wake-up is an old request's."""
    c = Causality()
    iv = c.open(PID, HANDLER, 100, ctx(1))
    c.woken(PID, WORKER, Wake(150, HANDLER))
    c.close(PID, HANDLER, iv, 250)
    assert c.handed(PID, WORKER, 240) == ctx(1)
    assert c.handed(PID, WORKER, 260) is None


def test_work_marked_done_hands_nothing_until_the_next_wake_up() -> None:
    c = Causality()
    c.open(PID, HANDLER, 100, ctx(1))
    c.woken(PID, WORKER, Wake(150, HANDLER))
    c.woken(PID, WORKER, Wake(180, 0))  # the kernel's "result handed back": waker 0
    assert c.handed(PID, WORKER, 200) is None


def test_a_waker_serving_several_requests_gives_no_parent() -> None:
    c = Causality()
    c.open(PID, LOOP, 100, ctx(1))
    c.open(PID, LOOP, 110, ctx(2))
    c.woken(PID, WORKER, Wake(150, LOOP))
    assert c.handed(PID, WORKER, 200) is None
    assert c.ambiguous_lookups == 1
    assert c.in_flight(PID, WORKER, 200) == [ctx(2), ctx(1)]  # linked instead


def test_a_waker_that_took_more_requests_since_gives_no_parent() -> None:
    """An event loop handed request 1 to a batching thread alone, then read two more before the
    batch ran: the batch serves all three, and is linked to them rather than parented to one."""
    c = Causality()
    c.open(PID, LOOP, 100, ctx(1))
    c.woken(PID, WORKER, Wake(150, LOOP))
    assert c.handed(PID, WORKER, 160) == ctx(1)
    c.open(PID, LOOP, 170, ctx(2))
    c.open(PID, LOOP, 180, ctx(3))
    assert c.handed(PID, WORKER, 200) is None
    assert len(c.in_flight(PID, WORKER, 200)) == 3


def test_work_handed_on_twice_is_followed_one_hop_and_no_further() -> None:
    c = Causality()
    c.open(PID, HANDLER, 100, ctx(1))
    c.woken(PID, WORKER, Wake(200, DISPATCHER, hop=HANDLER, hop_ts_ns=150))
    assert c.handed(PID, WORKER, 250) == ctx(1)
    # the dispatcher's own waker served none either: two hops back is not followed
    c.woken(PID, 9, Wake(300, WORKER, hop=DISPATCHER, hop_ts_ns=200))
    assert c.handed(PID, 9, 350) is None


def test_the_waker_is_asked_at_the_wake_up_not_at_the_call() -> None:
    c = Causality()
    first = c.open(PID, HANDLER, 100, ctx(1))
    c.woken(PID, WORKER, Wake(150, HANDLER))
    c.close(PID, HANDLER, first, 400)
    c.open(PID, HANDLER, 500, ctx(2))  # the handler's next request, not the one that handed
    assert c.handed(PID, WORKER, 300) == ctx(1)


def test_wake_ups_are_bounded_per_thread_and_forgotten_with_the_process() -> None:
    c = Causality()
    c.open(PID, HANDLER, 0, ctx(1))
    for ts in range(1, 3 * MAX_WAKES):
        c.woken(PID, WORKER, Wake(ts, HANDLER))
    assert c.handed(PID, WORKER, 1) is None  # the oldest are gone
    assert c.handed(PID, WORKER, 3 * MAX_WAKES) == ctx(1)
    c.forget_process(PID)
    assert c.handed(PID, WORKER, 3 * MAX_WAKES) is None
