"""The profiler's caches: bounded, least recently used out first, evictions counted.

What the profiler keeps between rounds (stacks copied from the kernel, resolved stacks, code
objects, frames) scales with what the host runs, not with time: on a busy host it was the
agent's largest Python structure (issue 14). Each cache has a size in the config
(``receivers.profiling.cached_*``); what a full cache drops is counted in
``otelbpf.cache.evictions{cache="profile_<name>"}`` (``symbolizer.EVICTIONS``, the counter the
symbolizer's caches use). Entries released for other reasons (unused for some rounds, their
process gone) are not evictions and are not counted.

Thread-safe: the collection thread fills them while the processing thread drops what an exec
made stale.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from otelbpf.correlate.symbolizer import EVICTIONS

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Lru(Generic[K, V]):
    """A mapping of at most ``size`` entries. ``on_evict(key, value)`` hears of each entry the
    bound pushes out (a code object's kernel entry goes with it, so that it is captured again)."""

    def __init__(self, name: str, size: int, on_evict: Callable[[K, V], None] | None = None) -> None:
        if size < 1:
            raise ValueError(f"cache {name!r}: size must be at least 1, got {size}")
        self.name = f"profile_{name}"
        self.size = size
        self._on_evict = on_evict
        self._d: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, key: K) -> bool:
        return key in self._d

    def get(self, key: K) -> V | None:
        """The value, now the most recently used; None when absent."""
        with self._lock:
            value = self._d.get(key)
            if value is not None:
                self._d.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._d[key] = value
            self._d.move_to_end(key)
            evicted = [self._d.popitem(last=False) for _ in range(len(self._d) - self.size)]
        if evicted:
            EVICTIONS[self.name] += len(evicted)
            if self._on_evict is not None:
                for k, v in evicted:
                    self._on_evict(k, v)

    def pop(self, key: K) -> V | None:
        with self._lock:
            return self._d.pop(key, None)

    def release(self, drop: Callable[[K, V], bool]) -> None:
        """Remove every entry ``drop`` says is no longer needed (not counted as evictions)."""
        with self._lock:
            for key in [k for k, v in self._d.items() if drop(k, v)]:
                del self._d[key]


class Interned(Generic[K]):
    """One shared object per distinct value (frames repeat across the stacks of a process, and
    across processes running the same code): a bounded LRU of canonical instances. An evicted
    value stays valid wherever it is used; equal values made later are just not shared with it."""

    def __init__(self, name: str, size: int) -> None:
        self._lru: Lru[K, K] = Lru(name, size)

    def __len__(self) -> int:
        return len(self._lru)

    def __call__(self, value: K) -> K:
        shared = self._lru.get(value)
        if shared is None:
            self._lru.put(value, value)
            return value
        return shared
