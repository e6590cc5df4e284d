"""program.load under a storm of signals: the compile and load hold the asynchronous
signals, which the kernel's verifier would otherwise answer with EAGAIN (a SIGTERM or
SIGHUP during an agent's start made it fail), and deliver them once loaded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from types import FrameType

import pytest

from harness import cached_load
from otelbpf.families.http.probes import socket_family
from otelbpf.sensor import program

pytestmark = pytest.mark.bpf

#: Sends SIGUSR1 to the given pid every 2 ms until killed.
STORM = "import os, sys, time\npid = int(sys.argv[1])\nwhile True:\n    os.kill(pid, 10)\n    time.sleep(0.002)\n"


@pytest.mark.parametrize("cached", [False, True], ids=["compiled", "cached"])
def test_a_signal_storm_during_the_load_is_held_and_delivered_after(cached: bool) -> None:
    """Cached, the programs are loaded on parallel threads: they hold the signals too."""
    fam = socket_family([], payload_bytes=4096, ring_bytes=1 << 20)
    text, cflags = program.build([fam], filter_pids=True, events_ring_bytes=64 << 10)
    received: list[int] = []
    in_load = threading.Event()

    def on_usr1(signum: int, frame: FrameType | None) -> None:
        received.append(1 if in_load.is_set() else 0)

    old = signal.signal(signal.SIGUSR1, on_usr1)
    storm = subprocess.Popen([sys.executable, "-c", STORM, str(os.getpid())])
    try:
        while not received:  # the storm has begun
            signal.sigtimedwait([], 0.01)
        in_load.set()
        bpf = cached_load.load(text, cflags, [fam], cached=cached)
        in_load.clear()
        try:
            assert bpf[b"sock_capture_prog"][0].value != 0  # the tail call placed, also under the storm
        finally:
            bpf.cleanup()
    finally:
        storm.kill()
        storm.wait()
        signal.signal(signal.SIGUSR1, old)
    # Held on the loading (main) thread, the signals went pending and ran right after the load.
    assert received.count(1) >= 1


def test_signals_held_restores_the_mask() -> None:
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    with program.signals_held():
        assert signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before
