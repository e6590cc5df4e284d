"""Host mode's pause guard: no process stays stopped by the pause at load longer than
``max_pause``, nor after the agent is gone.

In host mode the kernel stops a process at its open of a probed library the agent has not
attached yet (common.h ``PAUSE_NEW_ONLY``), and the agent resumes it once the probes are in.
There is no command tree to sweep as ``otelbpf run --``'s guard does (otelbpf/jobguard.py):
every stopped process is written, before it is stopped, in the ``paused`` map (pid -> when,
cgroup). This small process, started by the sensor once the program is loaded and before
the gate opens, holds three of the program's maps (``pause_gate``, ``paused``,
``pause_stats``) and:

- every ``WATCH_S``, resumes a process stopped for longer than ``max_pause`` (the attach is
  slow or stuck: the process runs on unprobed; counted, ``PAUSE_TIMEOUTS``);
- when the agent stops (its end of the pipe closes) or dies (its /proc state: a killed agent's
  pipe reads EOF only once its probes are released, seconds later), closes the gate, then
  resumes everything in ``paused`` (``PAUSE_ORPHANED``) until the agent has exited, and once
  more after (a program that read the gate open just before it closed).

It is its own interpreter (vfork+exec from the threaded agent, its own session: a terminal's
Ctrl-C for the agent does not end it) and imports nothing but the standard library, so it is
ready in a fraction of the agent's start. It talks to the maps with bpf(2) directly: no BCC.
"""

from __future__ import annotations

import ctypes
import os
import platform
import select
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

#: How often the guard looks at the agent and at how long each process has been stopped.
WATCH_S = 0.05
#: How often stopped processes are resumed once the agent is going, until it has exited.
SWEEP_S = 0.1
#: The kernel's flag of a task in its exit (include/linux/sched.h), in /proc/PID/stat.
_PF_EXITING = 0x4
#: bpf(2)'s number (otelbpf/doctor.py's table) and the map commands used here.
_BPF_SYSCALL_NR = {"x86_64": 321, "aarch64": 280}
_LOOKUP, _UPDATE, _DELETE, _NEXT_KEY = 1, 2, 3, 4
#: pause_stats slots (common.h PAUSE_*).
STOPPED, UNTRACKED, TIMEOUTS, ORPHANED = 0, 1, 2, 3
#: common.h ``struct paused_at``: since_ns, cgroup.
PAUSED_AT = struct.Struct("<QQ")
_libc = ctypes.CDLL(None, use_errno=True)


class _Attr(ctypes.Structure):
    """``union bpf_attr`` for the map element commands (value doubles as next_key)."""

    _fields_ = [
        ("map_fd", ctypes.c_uint32),
        ("key", ctypes.c_uint64),
        ("value", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
    ]


def _bpf(cmd: int, fd: int, key: ctypes.Array[ctypes.c_char] | None, value: ctypes.Array[ctypes.c_char] | None) -> int:
    """One bpf(2) map command; the errno, 0 on success."""
    nr = _BPF_SYSCALL_NR.get(platform.machine())
    if nr is None:
        raise OSError(f"no known bpf(2) syscall number for {platform.machine()}")
    attr = _Attr(
        fd,
        ctypes.addressof(key) if key is not None else 0,
        ctypes.addressof(value) if value is not None else 0,
        0,
    )
    if _libc.syscall(ctypes.c_long(nr), ctypes.c_long(cmd), ctypes.byref(attr), ctypes.sizeof(attr)):
        return ctypes.get_errno()
    return 0


def write_u32(fd: int, key: int, value: int) -> None:
    """``map[key] = value`` for a u32 -> u32 array (the pause gate). Raises OSError."""
    k, v = (
        ctypes.create_string_buffer(struct.pack("<I", key), 4),
        ctypes.create_string_buffer(struct.pack("<I", value), 4),
    )
    if err := _bpf(_UPDATE, fd, k, v):
        raise OSError(err, os.strerror(err))


def close_pause_gate(fd: int) -> None:
    """Write 0 into the pause gate (common.h ``pause_gate``): the kernel's pause at load stops
    nothing from here on. Raises OSError when it cannot."""
    write_u32(fd, 0, 0)


def read_u64(fd: int, slot: int) -> int | None:
    """``map[slot]`` of a u32 -> u64 array (pause_stats), None when it cannot be read."""
    k, v = ctypes.create_string_buffer(struct.pack("<I", slot), 4), ctypes.create_string_buffer(8)
    return struct.unpack("<Q", v.raw)[0] if _bpf(_LOOKUP, fd, k, v) == 0 else None


def add_u64(fd: int, slot: int, n: int) -> None:
    """``map[slot] += n`` in a u32 -> u64 array (pause_stats; only the guard writes its slots)."""
    value = read_u64(fd, slot)
    if value is not None:
        k = ctypes.create_string_buffer(struct.pack("<I", slot), 4)
        _bpf(_UPDATE, fd, k, ctypes.create_string_buffer(struct.pack("<Q", value + n), 8))


def paused_pids(fd: int) -> dict[int, tuple[int, int]]:
    """The ``paused`` map: pid -> (since_ns, cgroup)."""
    out: dict[int, tuple[int, int]] = {}
    key, nxt, value = ctypes.create_string_buffer(4), ctypes.create_string_buffer(4), ctypes.create_string_buffer(16)
    first = True
    while _bpf(_NEXT_KEY, fd, None if first else key, nxt) == 0:
        first = False
        ctypes.memmove(key, nxt, 4)
        if _bpf(_LOOKUP, fd, key, value) == 0:
            out[struct.unpack("<I", key.raw)[0]] = PAUSED_AT.unpack(value.raw)
        if len(out) > 1 << 16:  # a map changing under the walk cannot loop it forever
            break
    return out


def take(fd: int, pid: int) -> bool:
    """Take ``pid`` out of ``paused``: True for whoever took it (it resumes the process)."""
    return _bpf(_DELETE, fd, ctypes.create_string_buffer(struct.pack("<I", pid), 4), None) == 0


def agent_exiting(pid: int) -> bool:
    """Whether the agent has begun to exit (its main thread in or past its exit, or gone):
    what its pipe or socket says only once its probes are released."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return fields[0] in (b"Z", b"X") or bool(int(fields[6]) & _PF_EXITING)


def _resume(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


class PauseGuard:
    """The sensor's handle on its guard process."""

    def __init__(self, gate_fd: int, paused_fd: int, stats_fd: int, max_pause_s: float) -> None:
        """Start the guard with the three maps; ``ready`` waits for it."""
        root = str(Path(__file__).resolve().parents[2])  # the otelbpf package's folder, first on its path
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "otelbpf.sensor.pause_guard",
                str(os.getpid()),
                str(max_pause_s),
                str(gate_fd),
                str(paused_fd),
                str(stats_fd),
            ],
            pass_fds=(gate_fd, paused_fd, stats_fd),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
            env=env,
        )

    def ready(self, timeout_s: float) -> bool:
        """Wait for the guard to hold the maps; False if it did not say so in time."""
        assert self.process.stdout is not None
        if not select.select([self.process.stdout], [], [], timeout_s)[0]:
            return False
        return self.process.stdout.readline().strip() == b"ready"

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        """The agent stops (its gate already closed): the guard resumes what is still stopped
        and exits. Not waited for."""
        if self.process.stdin is not None:
            self.process.stdin.close()
        if self.process.stdout is not None:
            self.process.stdout.close()


def main(argv: list[str]) -> int:
    """The guard process: ``AGENT_PID MAX_PAUSE_S GATE_FD PAUSED_FD STATS_FD``."""
    agent, max_pause_s = int(argv[0]), float(argv[1])
    gate, paused, stats = (int(a) for a in argv[2:5])
    _libc.prctl(15, ctypes.c_char_p(b"otelbpf-pguard"), 0, 0, 0)  # PR_SET_NAME
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # it ends when the agent has
    agent_pidfd = os.pidfd_open(agent)
    max_pause_ns = int(max_pause_s * 1e9)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    life = select.poll()
    life.register(sys.stdin.fileno(), select.POLLIN)
    while not life.poll(WATCH_S * 1000) and not agent_exiting(agent):
        now = time.monotonic_ns()  # CLOCK_MONOTONIC: bpf_ktime_get_ns()'s clock
        for pid, (since, _) in paused_pids(paused).items():
            if now - since > max_pause_ns and take(paused, pid):
                add_u64(stats, TIMEOUTS, 1)
                _resume(pid)
                print(f"otelbpf pause guard: pid {pid} resumed after {max_pause_s:g}s, unprobed", file=sys.stderr)
    try:
        close_pause_gate(gate)
    except OSError as exc:
        print(f"otelbpf pause guard: cannot turn the pause at load off ({exc})", file=sys.stderr)
    exited = select.poll()
    exited.register(agent_pidfd, select.POLLIN)
    dying = agent_exiting(agent)
    while True:
        _resume_all(paused, stats)
        if not dying or exited.poll(SWEEP_S * 1000):
            break  # a stop: the gate is closed, one more sweep below; a death: until it has exited
    time.sleep(SWEEP_S)
    _resume_all(paused, stats)
    return 0


def _resume_all(paused: int, stats: int) -> None:
    for pid in paused_pids(paused):
        if take(paused, pid):
            add_u64(stats, ORPHANED, 1)
            _resume(pid)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
