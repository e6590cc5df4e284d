"""Host mode's pause in the kernel (common.h PAUSE_NEW_ONLY), driven by real opens of a child
process: what stops it and what does not, the ``paused`` map the guard reads (with its own
bpf(2) reader, sensor/pause_guard.py), the ``known_libs`` map the sensor writes, an exit
taking a stopped process out.

Host-wide: while the gate is open, any process on the machine opening a library by a path
unknown to this program is stopped too. A real pause guard holds the maps (max_pause 2 s) and
resumes them all when the test ends."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from harness.agent import wait_until
from otelbpf.base.events import STREVENT_DTYPE
from otelbpf.families.cuda.probes import cuda_family
from otelbpf.sensor import pause_guard, program
from otelbpf.sensor.ringbuf import RingBufferReader
from otelbpf.sensor.sensor import _know

pytestmark = pytest.mark.bpf

STR_RING = 256 << 10
#: Opens the path of each line it reads, its thread named as the line says ("" keeps it).
OPENER = (
    "import ctypes, sys\n"
    "libc = ctypes.CDLL(None)\n"
    "print('ready', flush=True)\n"
    "for line in sys.stdin:\n"
    "    name, path = line.rstrip('\\n').split(' ', 1)\n"
    "    if name: libc.prctl(15, name.encode(), 0, 0, 0)\n"
    "    open(path).close(); print('opened', flush=True)\n"
)


class Child:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", OPENER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "ready\n"
        self.pid = self.proc.pid

    def open(self, path: Path, thread_name: str = "") -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{thread_name} {path}\n")
        self.proc.stdin.flush()

    def opened(self, timeout: float = 10) -> bool:
        assert self.proc.stdout is not None
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            return False
        return self.proc.stdout.readline() == "opened\n"

    def state(self) -> str:
        with open(f"/proc/{self.pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]


@pytest.fixture
def host() -> Iterator[tuple[object, RingBufferReader, pause_guard.PauseGuard]]:
    text, cflags = program.build(
        [cuda_family(["cudart"])], filter_pids=False, pause_new_only=True, events_ring_bytes=64 << 10
    )
    bpf = program.load(text, cflags, [])
    strings = RingBufferReader(bpf[b"strevents"].map_fd, STR_RING, STREVENT_DTYPE)
    fds = [int(bpf[m].map_fd) for m in (b"pause_gate", b"paused", b"pause_stats")]
    guard = pause_guard.PauseGuard(fds[0], fds[1], fds[2], 2.0)
    try:
        assert guard.ready(30)
        yield bpf, strings, guard
    finally:
        pause_guard.close_pause_gate(fds[0])
        guard.close()  # resumes whatever is left stopped, the host's included
        assert guard.process.wait(10) == 0
        strings.close()
        bpf.cleanup()


def _mine(strings: RingBufferReader, pid: int) -> list[tuple[str, int]]:
    recs = strings.drain()
    recs = recs[(recs["pid"] == pid) & (recs["exec"] == 0)]  # its exec is reported too, never stopped
    return [(r["s"].split(b"\0", 1)[0].decode(), int(r["paused"])) for r in np.atleast_1d(recs)]


def _cgroup_of(pid: int) -> int:
    """The cgroup v2 id of ``pid``: its cgroup directory's inode."""
    relative = next(x for x in Path(f"/proc/{pid}/cgroup").read_text().splitlines() if x.startswith("0::"))[3:]
    mount = next(x.split()[1] for x in Path("/proc/self/mounts").read_text().splitlines() if x.split()[2] == "cgroup2")
    return os.stat(f"{mount}{relative}").st_ino


def test_only_an_unknown_library_path_stops_and_every_stop_is_in_the_paused_map(host, tmp_path):
    bpf, strings, guard = host
    gate, paused, stats = (int(bpf[m].map_fd) for m in (b"pause_gate", b"paused", b"pause_stats"))
    lib = tmp_path / "libcudart.so.12"
    other = tmp_path / "env" / "libcudart.so.12"
    plain = tmp_path / "notalibrary.so.12"
    other.parent.mkdir()
    for f in (lib, other, plain):
        f.write_bytes(b"")
    child = Child()
    try:
        child.open(lib)  # the gate closed: reported, not stopped
        assert child.opened()
        assert _mine(strings, child.pid) == [(str(lib), 0)]

        pause_guard.write_u32(gate, 0, 1)
        child.open(lib)
        assert wait_until(lambda: child.state() == "T", timeout=10)
        assert _mine(strings, child.pid) == [(str(lib), 1)]
        ((since, cgroup),) = [v for p, v in pause_guard.paused_pids(paused).items() if p == child.pid]
        assert cgroup == _cgroup_of(child.pid)
        assert pause_guard.take(paused, child.pid) and not pause_guard.take(paused, child.pid)
        _know(bpf, cgroup, str(lib).encode())  # as the sensor does once attached
        os.kill(child.pid, signal.SIGCONT)
        assert child.opened()

        child.open(lib)  # known in this cgroup now: not stopped
        assert child.opened()
        child.open(plain)  # no probed kind: not even reported
        assert child.opened()
        child.open(other, "otelbpf-attach")  # an agent's thread (another agent's): never stopped
        assert child.opened()
        assert _mine(strings, child.pid) == [(str(lib), 0), (str(other), 0)]

        child.open(other, "python")  # unknown, a thread of the job: stopped; killed so
        assert wait_until(lambda: child.state() == "T", timeout=10)
        child.proc.kill()
        child.proc.wait(10)
        assert child.pid not in pause_guard.paused_pids(paused)  # its exit took it out
    finally:
        child.proc.kill()
        child.proc.wait()
    assert (pause_guard.read_u64(stats, pause_guard.STOPPED) or 0) >= 2
    assert pause_guard.read_u64(stats, pause_guard.UNTRACKED) == 0


def test_the_guard_resumes_a_process_stopped_past_max_pause(host, tmp_path):
    """Nobody resumes it here but the guard (max_pause 2 s)."""
    bpf, _strings, _guard = host
    pause_guard.write_u32(int(bpf[b"pause_gate"].map_fd), 0, 1)
    lib = tmp_path / "libcudart.so.13"
    lib.write_bytes(b"")
    child = Child()
    try:
        child.open(lib)
        assert wait_until(lambda: child.state() == "T", timeout=10)
        assert child.opened(timeout=8)  # resumed after ~2 s
        assert (pause_guard.read_u64(int(bpf[b"pause_stats"].map_fd), pause_guard.TIMEOUTS) or 0) >= 1
    finally:
        child.proc.kill()
        child.proc.wait()
