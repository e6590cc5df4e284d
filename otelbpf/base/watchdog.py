"""A worker thread stuck on one item is said, not silent.

The agent's processing thread runs every correlator on every batch. A parser bug that
loops (the kind the hardening audit found: a chunk size that moved the parse position
backwards) would stop every span and metric while the probes keep firing; Python cannot
kill a thread, but it can say which one is stuck, where, and for how long. The drain thread
goes on, and the bounded processing queue counts what it has to drop
(``otelbpf.events.dropped{reason=processing_queue_full}``).

The worker calls ``begin``/``end`` around each item (two attribute writes, no lock: the
check reads a consistent pair because it reads one tuple). A checker thread calls ``check``
every second: past ``stall_after_s`` it logs the worker's Python stack once per stall and
counts ``otelbpf.agent.stalls{worker, item}``; the longest current busy time is a gauge.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable

from otelbpf.base.health import Health

log = logging.getLogger(__name__)


class Watchdog:
    def __init__(
        self, worker: str, health: Health, stall_after_s: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.worker = worker
        self._health = health
        self._stall_after = stall_after_s
        self._clock = clock
        #: (what, since, thread id) while busy; None while idle
        self._busy: tuple[str, float, int] | None = None
        self._reported: tuple[str, float, int] | None = None

    def begin(self, what: str) -> None:
        self._busy = (what, self._clock(), threading.get_ident())

    def end(self) -> None:
        self._busy = None

    def busy_seconds(self) -> float:
        busy = self._busy
        return self._clock() - busy[1] if busy is not None else 0.0

    def stalled(self) -> bool:
        """Busy with one item past the stall threshold now."""
        return self.busy_seconds() >= self._stall_after

    def check(self) -> float:
        """Report a stall once (log with the stack, count); returns the current busy seconds."""
        busy = self._busy
        if busy is None:
            return 0.0
        what, since, ident = busy
        took = self._clock() - since
        if took >= self._stall_after and busy is not self._reported:
            self._reported = busy
            self._health.add("otelbpf.agent.stalls", 1, worker=self.worker, item=what)
            frame = sys._current_frames().get(ident)
            stack = "".join(traceback.format_stack(frame)) if frame is not None else "(thread gone)\n"
            log.error(
                "%s has been busy with %s for %.0f s: spans and metrics from it are held up, "
                "and the bounded queue before it drops and counts what no longer fits. Its stack:\n%s",
                self.worker,
                what,
                took,
                stack,
            )
        return took


def run_checks(watchdogs: list[Watchdog], stop: threading.Event, every_s: float = 1.0) -> threading.Thread:
    """A daemon thread calling ``check`` on each watchdog until ``stop`` is set."""

    def loop() -> None:
        while not stop.wait(every_s):
            for w in watchdogs:
                w.check()

    thread = threading.Thread(target=loop, name="otelbpf-watchdog", daemon=True)
    thread.start()
    return thread
