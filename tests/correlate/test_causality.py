"""Thread + time causality: which request a thread was serving when it did something."""

from __future__ import annotations

from otelbpf.correlate.causality import Causality
from otelbpf.correlate.spans import new_context


def test_sequential_requests_on_one_thread_partition_it_by_time():
    c = Causality()
    a, b = new_context(), new_context()
    ia = c.open(1, 10, 100, a)
    assert c.parent(1, 10, 150) == a          # open: everything after its start belongs to it
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
    ib = c.open(1, 10, 120, b)               # an event loop took a second request
    assert c.parent(1, 10, 130) is None and c.ambiguous_lookups == 1
    assert ia.concurrent and ib.concurrent
    c.close(1, 10, ia, 140)
    assert c.parent(1, 10, 150) == b         # after the first ended, only the second is open
    c.close(1, 10, ib, 160)
    assert c.parent(1, 10, 135) is None      # a late event from the overlap still finds two


def test_closed_intervals_expire_and_processes_are_forgotten():
    c = Causality(retention_ns=1000)
    a = new_context()
    c.close(1, 10, c.open(1, 10, 100, a), 200)
    c.open(1, 10, 5000, new_context())       # pruning happens as new requests open
    assert c.parent(1, 10, 150) is None
    c.forget_process(1)
    assert c.parent(1, 10, 5001) is None
