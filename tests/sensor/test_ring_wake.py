"""Wake-on-fill, on the real program: the record that fills another eighth of a ring wakes the
drain thread (bpf/common.h ``ring_wake``), so a burst is drained long before the drain timer's
tick, and a trickle below an eighth is not (it waits for the timer: no wake-up per record).

The sensor runs the real CUDA family on a private copy of the stand-in runtime (uprobes belong
to the inode), an ``events`` ring of 64 KiB (an eighth: 128 events) and a drain timer of 60 s,
which no test here lives to see: whatever is delivered was woken by the ring. It watches this
process and its children only (``--pid`` mode), so that the host's other processes put no
records of their own (execs, exits) on the ring.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from otelbpf.base.events import Kind
from otelbpf.families.cuda.probes import cuda_family
from otelbpf.sensor.sensor import Sensor, SensorOptions

pytestmark = [pytest.mark.bpf, pytest.mark.usefixtures("built")]

REPO = Path(__file__).resolve().parents[2]
LAUNCH_LOOP = REPO / "build" / "bench" / "launch_loop"
FAKE_CUDART = REPO / "build" / "examples" / "fakecudart" / "libcudart.so.12"
RING = 64 << 10
EIGHTH_EVENTS = RING // 8 // 64


class _Launches:
    """What the drain delivered: launch events by pid, and when they arrived."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_pid: dict[int, int] = {}
        self.first_at: float | None = None

    def deliver(self, ring: str, arr: np.ndarray) -> None:
        if ring != "events":
            return
        launches = arr[arr["kind"] == Kind.CUDA_LAUNCH]
        with self.lock:
            for pid, n in zip(*np.unique(launches["pid"], return_counts=True)):
                self.by_pid[int(pid)] = self.by_pid.get(int(pid), 0) + int(n)
            if len(launches) and self.first_at is None:
                self.first_at = time.monotonic()

    def of(self, pid: int) -> int:
        with self.lock:
            return self.by_pid.get(pid, 0)


@pytest.fixture
def sensor(tmp_path):
    lib = tmp_path / FAKE_CUDART.name
    shutil.copy2(FAKE_CUDART, lib)
    launches = _Launches()
    s = Sensor(
        SensorOptions(
            [cuda_family(["cudart"], launch_sample_every=1)],
            pids=[os.getpid()],
            search_globs=[str(lib)],
            drain_interval_s=60.0,
            events_ring_bytes=RING,
        ),
        launches.deliver,
    )
    s.start()
    try:
        yield s, lib, launches
    finally:
        s.stop()


def _wait(cond, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def test_a_burst_is_drained_as_it_fills_the_ring_not_at_the_timer(sensor):
    s, lib, launches = sensor
    # 20,000 launches at 40k/s: an eighth of the ring every ~3 ms, 156 eighths in all, and
    # 16 times what the ring holds, so nothing arrives unless the drain keeps being woken.
    started = time.monotonic()
    proc = subprocess.Popen(
        [str(LAUNCH_LOOP), "--lib", str(lib), "--rate", "40000", "--seconds", "0.5"],
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    calls = json.loads(out)["calls"] + 1  # and a warm-up call before the timed ones
    assert calls >= 19_000
    # Everything but the last partial eighth arrives, well before the 60 s timer.
    assert _wait(lambda: launches.of(proc.pid) >= calls - EIGHTH_EVENTS, 10.0), (launches.of(proc.pid), calls)
    assert launches.first_at is not None and launches.first_at - started < 5.0
    assert s.fill_wakeups >= (calls - EIGHTH_EVENTS) // EIGHTH_EVENTS // 2, s.fill_wakeups
    assert s.kernel_stats().get("events_lost", 0) == 0
    # The stop drains the rest: every launch, exactly once (the ring held 1/16 of them).
    s.stop()
    assert launches.of(proc.pid) == calls


def test_a_trickle_below_an_eighth_waits_for_the_timer(sensor):
    s, lib, launches = sensor
    n = EIGHTH_EVENTS // 2
    proc = subprocess.Popen(
        [str(LAUNCH_LOOP), "--lib", str(lib), "--calls", str(n), "--runs", "1"], stdout=subprocess.PIPE, text=True
    )
    proc.communicate(timeout=60)
    assert proc.returncode == 0
    # launch_loop makes one warm-up call and the run: n + 1 launches, under an eighth.
    time.sleep(1.0)
    assert (launches.of(proc.pid), s.fill_wakeups) == (0, 0)
    s.stop()
    assert launches.of(proc.pid) == n + 1
