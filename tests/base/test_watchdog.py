"""A stuck worker is reported once per stall, with its stack, and counted."""

from __future__ import annotations

import logging
import threading
import time

from otelbpf.base.health import Health
from otelbpf.base.watchdog import Watchdog, run_checks


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_stall_is_counted_once_and_an_idle_worker_never():
    health, clock = Health(), FakeClock()
    w = Watchdog("otelbpf-process", health, stall_after_s=10, clock=clock)
    assert w.check() == 0.0
    w.begin("http events")
    clock.now += 9
    assert w.check() == 9 and health.get("otelbpf.agent.stalls") == 0
    clock.now += 2
    w.check()
    clock.now += 30
    w.check()
    assert health.get("otelbpf.agent.stalls", worker="otelbpf-process", item="http events") == 1
    w.end()
    assert w.busy_seconds() == 0.0
    w.begin("http events")  # a new stall of the same item counts again
    clock.now += 11
    w.check()
    assert health.get("otelbpf.agent.stalls", worker="otelbpf-process", item="http events") == 2


def test_the_log_shows_where_the_real_thread_is_stuck(caplog):
    health = Health()
    w = Watchdog("worker", health, stall_after_s=0.2)
    release = threading.Event()

    def stuck_in_a_parser() -> None:
        w.begin("a batch")
        release.wait(10)
        w.end()

    t = threading.Thread(target=stuck_in_a_parser)
    stop = threading.Event()
    with caplog.at_level(logging.ERROR, logger="otelbpf.base.watchdog"):
        t.start()
        checker = run_checks([w], stop, every_s=0.05)
        deadline = time.monotonic() + 5
        while health.get("otelbpf.agent.stalls") == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        release.set()
        t.join()
        stop.set()
        checker.join()
    assert health.get("otelbpf.agent.stalls", worker="worker", item="a batch") == 1
    [record] = [r for r in caplog.records if "busy with a batch" in r.getMessage()]
    assert "stuck_in_a_parser" in record.getMessage()


def test_stalled_says_whether_the_worker_is_stuck_now():
    """Agent.stop waits 2 s, not 30, for a processing thread that is stalled."""
    clock = FakeClock()
    w = Watchdog("otelbpf-process", Health(), stall_after_s=10, clock=clock)
    assert not w.stalled()
    w.begin("cuda events")
    clock.now += 9
    assert not w.stalled()
    clock.now += 1
    assert w.stalled()
    w.end()
    assert not w.stalled()
