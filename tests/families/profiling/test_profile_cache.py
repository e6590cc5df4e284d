"""The profiler's bounded caches (otelbpf/families/profiling/profile_cache.py)."""

from __future__ import annotations

import pytest

from otelbpf.correlate.symbolizer import EVICTIONS
from otelbpf.families.profiling.profile_cache import Interned, Lru


@pytest.fixture(autouse=True)
def counted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(EVICTIONS, "profile_test", 0)


def test_a_full_cache_evicts_the_least_recently_used_counts_it_and_says_which() -> None:
    evicted: list[tuple[str, int]] = []
    lru: Lru[str, int] = Lru("test", 2, lambda k, v: evicted.append((k, v)))
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1  # now b is the least recently used
    lru.put("c", 3)
    assert evicted == [("b", 2)] and EVICTIONS["profile_test"] == 1
    assert "b" not in lru and lru.get("a") == 1 and lru.get("c") == 3 and len(lru) == 2


def test_released_entries_are_not_evictions() -> None:
    lru: Lru[str, int] = Lru("test", 4)
    for i, k in enumerate("abc"):
        lru.put(k, i)
    lru.release(lambda _k, v: v < 2)
    assert lru.pop("a") is None and lru.get("c") == 2 and len(lru) == 1
    assert EVICTIONS["profile_test"] == 0


def test_a_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="'test'.*at least 1"):
        Lru("test", 0)


def test_interning_shares_one_object_per_value_within_its_bound() -> None:
    intern: Interned[tuple[str, ...]] = Interned("test", 1)
    first = intern(("x", "y"))
    assert intern(tuple("xy")) is first
    other = intern(("z",))  # pushes the first out: later equal values are no longer shared with it
    assert intern(("z",)) is other and EVICTIONS["profile_test"] == 1
