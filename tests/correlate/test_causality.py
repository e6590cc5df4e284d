"""Thread + time causality: which request a thread was serving when it did something."""

from __future__ import annotations

from otelbpf.correlate.causality import Causality
from otelbpf.correlate.spans import new_context


def test_sequential_requests_on_one_thread_partition_it_by_time():
    c = Causality()
    a, b = new_context(), new_context()
    ia = c.open(1, 10, 100, a)
    assert c.parent(1, 10, 150) == a  # open: everything after its start belongs to it
    c.close(1, 10, ia, 200)
    ib = c.open(1, 10, 300, b)
    c.close(1, 10, ib, 400)
    assert [c.parent(1, 10, t) for t in (50, 100, 200, 250, 300, 400, 401)] == [None, a, a, None, b, b, None]
    assert c.parent(1, 11, 150) is None and c.parent(2, 10, 150) is None  # other threads, other processes
    assert not ia.concurrent and not ib.concurrent


def test_two_requests_open_on_one_thread_link_nothing_and_are_marked():
    c = Causality()
    a, b = new_context(), new_context()
    ia = c.open(1, 10, 100, a)
    ib = c.open(1, 10, 120, b)  # an event loop took a second request
    assert c.parent(1, 10, 130) is None and c.ambiguous_lookups == 1
    assert ia.concurrent and ib.concurrent
    c.close(1, 10, ia, 140)
    assert c.parent(1, 10, 150) == b  # after the first ended, only the second is open
    c.close(1, 10, ib, 160)
    assert c.parent(1, 10, 135) is None  # a late event from the overlap still finds two


def test_closed_intervals_expire_and_processes_are_forgotten():
    c = Causality(retention_ns=1000)
    a = new_context()
    c.close(1, 10, c.open(1, 10, 100, a), 200)
    c.open(1, 10, 5000, new_context())  # pruning happens as new requests open
    assert c.parent(1, 10, 150) is None
    c.forget_process(1)
    assert c.parent(1, 10, 5001) is None


def test_a_busy_thread_keeps_a_bounded_window(monkeypatch):
    """Pruning runs a few times per retention window, not per request, and a thread keeps at
    most MAX_PER_THREAD (+25% before a prune) closed intervals, the most recent ones; a request
    still open is found whatever its age."""
    import otelbpf.correlate.causality as causality

    monkeypatch.setattr(causality, "MAX_PER_THREAD", 100)
    c = Causality(retention_ns=10_000)
    slow = c.open(1, 10, 0, new_context())  # a long request, open throughout
    contexts = []
    for i in range(1, 2001):  # then 2,000 short ones, back to back
        contexts.append(new_context())
        c.close(1, 10, c.open(1, 10, i * 11, contexts[-1]), i * 11 + 10)
    t = c._threads[(1, 10)]
    assert 100 <= len(t.intervals) <= 125
    assert t.starts == sorted(t.starts) == [iv.start_ns for iv in t.intervals]
    assert c.parent(1, 10, 2000 * 11 + 5) is None  # the slow request is open then too: ambiguous
    c.close(1, 10, slow, 30_000)
    assert c.parent(1, 10, 2000 * 11 + 5) == contexts[-1]  # recent intervals are still found
    assert c.parent(1, 10, 16) is None  # beyond the per-thread cap: no parent
