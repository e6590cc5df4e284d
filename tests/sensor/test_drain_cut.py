"""Each drain tick is a cut (sensor.py ``TICK``): the records of ``cut`` rings written at or after
the tick's mark wait one tick, so that two rings drained one after the other never hand over a
record later than what the other was drained up to (no BPF here: the ring reads replaced)."""

from __future__ import annotations

import time

import numpy as np

from otelbpf.base.events import EVENT_DTYPE, SOCK_RECORD_DTYPE
from otelbpf.sensor.family import RingSpec
from otelbpf.sensor.sensor import TICK, Sensor, SensorOptions


class _Ring:
    """A reader whose next drain returns what was put in it."""

    def __init__(self, dtype: np.dtype) -> None:
        self.dtype = dtype
        self.next: list[np.ndarray] = []

    def put(self, *ends: tuple[int, int]) -> None:
        """Records (ts_ns, duration_ns): written at their sum."""
        arr = np.zeros(len(ends), dtype=self.dtype)
        if "data" in self.dtype.names:
            arr["data"] = [b""] * len(ends)
        for i, (ts, dur) in enumerate(ends):
            arr["ts_ns"][i], arr["duration_ns"][i] = ts, dur
        self.next.append(arr)

    def pending_bytes(self) -> int:
        return len(self.next)

    def drain(self) -> np.ndarray:
        return self.next.pop(0) if self.next else np.zeros(0, dtype=self.dtype)


def _sensor(*specs: RingSpec) -> tuple[Sensor, list[tuple[str, list[int]]], dict[str, _Ring]]:
    delivered: list[tuple[str, list[int]]] = []
    sensor = Sensor(SensorOptions([]), lambda ring, arr: delivered.append((ring, arr["ts_ns"].tolist())))
    rings = {"events": _Ring(EVENT_DTYPE), **{s.name: _Ring(s.dtype) for s in specs}}
    sensor._readers = rings  # type: ignore[assignment]
    sensor._family_rings = lambda: list(specs)  # type: ignore[method-assign]
    sensor.records_received.update({s.name: 0 for s in specs})
    return sensor, delivered, rings


def test_records_written_after_the_mark_wait_one_tick_and_the_tick_ends_the_batches() -> None:
    socks = RingSpec("sockdata", SOCK_RECORD_DTYPE, 4096, variable=True, cut=True)
    sensor, delivered, rings = _sensor(socks)
    now = time.monotonic_ns()
    # before the mark; begun before it, ended after (written after); entirely after
    rings["sockdata"].put((now - 10**9, 1_000), (now - 1_000, 10**10), (now + 10**10, 0))
    rings["events"].put((now - 500, 0))
    assert sensor.drain_tick() == 4
    assert delivered == [("sockdata", [now - 10**9]), ("events", [now - 500]), (TICK, [])]
    delivered.clear()
    # the held ones come next tick, whatever their time (a record never waits more than one)
    rings["sockdata"].put((now - 5, 0))
    assert sensor.drain_tick() == 3
    assert delivered == [("sockdata", [now - 1_000, now + 10**10, now - 5]), (TICK, [])]
    delivered.clear()
    assert sensor.drain_tick() == 0 and delivered == []  # an idle tick says nothing


def test_a_ring_that_is_no_cut_and_the_final_drain_hold_nothing() -> None:
    socks = RingSpec("sockdata", SOCK_RECORD_DTYPE, 4096, variable=True, cut=True)
    other = RingSpec("other", SOCK_RECORD_DTYPE, 4096, variable=True)
    sensor, delivered, rings = _sensor(socks, other)
    later = time.monotonic_ns() + 10**10
    rings["other"].put((later, 0))
    rings["sockdata"].put((later, 0))
    sensor.drain_tick()
    assert delivered == [("other", [later]), (TICK, [])]
    delivered.clear()
    rings["sockdata"].put((later + 1, 0))
    sensor.drain_tick(hold=False)
    assert delivered == [("sockdata", [later, later + 1]), (TICK, [])]
