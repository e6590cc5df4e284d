"""Kernel time -> wall-clock time.

BPF stamps events with bpf_ktime_get_ns() (CLOCK_MONOTONIC). OTLP wants Unix
epoch nanoseconds. The offset is measured once at start-up, bracketing the
wall-clock read between two monotonic reads to bound its error.
"""

from __future__ import annotations

import time


class MonotonicClock:
    def __init__(self) -> None:
        best: tuple[int, int] | None = None
        for _ in range(5):
            m0 = time.monotonic_ns()
            wall = time.time_ns()
            m1 = time.monotonic_ns()
            if best is None or m1 - m0 < best[0]:
                best = (m1 - m0, wall - (m0 + m1) // 2)
        assert best is not None  # the loop ran
        self.error_ns, self.offset_ns = best

    def to_wall(self, mono_ns: int) -> int:
        return mono_ns + self.offset_ns

    def now_wall(self) -> int:
        return time.time_ns()
