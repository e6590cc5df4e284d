"""The drain loop leaves records in the kernel's rings while the processing thread is behind
(no BPF here: the loop's decisions, with the ring reads replaced)."""

from __future__ import annotations

import threading
import time

from otelbpf.sensor.sensor import Sensor, SensorOptions


def _wait(cond, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.005)


def test_a_backlogged_consumer_pauses_the_drain_until_it_catches_up():
    behind = threading.Event()
    behind.set()
    sensor = Sensor(SensorOptions([], drain_interval_s=0.005), lambda ring, arr: None, backlogged=behind.is_set)
    ticks: list[float] = []
    sensor.drain_tick = lambda: ticks.append(time.monotonic()) or 1  # type: ignore[method-assign]
    loop = threading.Thread(target=sensor._drain_loop, daemon=True)
    loop.start()
    try:
        _wait(lambda: sensor.drain_pauses >= 5)
        assert ticks == []  # nothing taken from the rings while the consumer is behind
        behind.clear()
        _wait(lambda: len(ticks) >= 3)
        paused = sensor.drain_pauses
        behind.set()
        _wait(lambda: sensor.drain_pauses > paused)
        n = len(ticks)
        _wait(lambda: sensor.drain_pauses > paused + 5)
        assert len(ticks) == n
    finally:
        sensor._stop.set()
        loop.join(5)


def test_without_a_consumer_signal_the_drain_never_pauses():
    sensor = Sensor(SensorOptions([], drain_interval_s=0.005), lambda ring, arr: None)
    ticks: list[int] = []
    sensor.drain_tick = lambda: ticks.append(1) or 1  # type: ignore[method-assign]
    loop = threading.Thread(target=sensor._drain_loop, daemon=True)
    loop.start()
    try:
        _wait(lambda: len(ticks) >= 5)
        assert sensor.drain_pauses == 0
    finally:
        sensor._stop.set()
        loop.join(5)
