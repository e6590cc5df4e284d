"""The agent's own counters: every drop and failure, exported as otelbpf.*.

Plain integers behind one lock; written from the drain, processing and
export threads, read when metrics are collected.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the attributes' type only: base imports nothing of OpenTelemetry at run time
    from opentelemetry.util.types import AttributeValue


class Health:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (metric name, attrs) -> value
        self.counters: Counter[tuple[str, frozenset[tuple[str, AttributeValue]]]] = Counter()

    def add(self, name: str, value: int = 1, **attrs: AttributeValue) -> None:
        if value:
            with self._lock:
                self.counters[(name, frozenset(attrs.items()))] += value

    def get(self, name: str, **attrs: AttributeValue) -> int:
        with self._lock:
            if attrs:
                return self.counters.get((name, frozenset(attrs.items())), 0)
            return sum(v for (n, _a), v in self.counters.items() if n == name)

    def snapshot(self) -> list[tuple[str, dict[str, AttributeValue], int]]:
        with self._lock:
            return [(n, dict(a), v) for (n, a), v in sorted(self.counters.items(), key=lambda kv: kv[0][0])]
