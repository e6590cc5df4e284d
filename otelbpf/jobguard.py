"""`otelbpf run -- CMD`: the command runs under a small guard process that outlives the agent.

In command mode the kernel stops the job (SIGSTOP from the BPF program) when it opens a
library to probe, and the agent resumes it once the probes are attached. An agent killed in
that window (kill -9, the OOM killer) used to leave the job stopped forever, or, when its
process group became orphaned with a stopped member, killed by the kernel's SIGHUP.

So the agent does not start the command itself. It starts this guard, which:

- starts a session of its own (the kernel's orphaned-process-group SIGHUP needs the job in
  the agent's session) and becomes a child subreaper, so every descendant of the job,
  orphaned or not, stays in its process tree;
- forks the job, which waits at a gate (a pipe) until the agent has put its pid into the
  in-kernel filter and attached, then execs the command (same pid);
- reports the job's pid and, later, its exit status to the agent;
- holds the other end of a socket only the agent holds: the agent hands it the map that turns
  the kernel's pause at load on (``pause_gate``, bpf/common.h) before the command runs;
- when the agent is gone, or dying, the guard closes that gate (the pause programs outlive
  the agent: a dying agent's links go one grace period each, several seconds for a few
  hundred probes, and after a stop the background releaser holds them; with the gate closed
  they stop nothing), then sends SIGCONT to every stopped process in its tree, until the
  agent has exited and once more after (a stop a program sent as the gate closed). The job
  then runs on unwatched; the guard reaps it and every orphan of its tree, and exits.

The guard sees the agent dying at once, not when its socket closes: a killed agent's socket
reads EOF only after its probes are released, one grace period each (7 to 15 s after a kill -9
of an agent holding 120 probes). So it also reads the agent's state every ``_WATCH_S``.

Signals for the job are sent by the agent to the job's pid directly (``Job.signal``).
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable

from otelbpf.base.threadname import name_os_thread
from otelbpf.sensor.pause_guard import agent_exiting as _agent_exiting
from otelbpf.sensor.pause_guard import close_pause_gate

_PR_SET_CHILD_SUBREAPER = 36
#: How often stopped processes are looked for from the agent's end until it has exited: a
#: program may have read the gate open just before it closed, and with a gate the guard could
#: not close, the dead agent's programs stop the command until its last link is gone.
_SWEEP_S = 0.1
#: How often the guard looks at the agent's state (and reaps) while the agent lives: the
#: longest a job stays stopped after the agent's death, save for the sweep itself.
_WATCH_S = 0.05


class Job:
    """The agent's handle on a command run under the guard."""

    def __init__(self, command: list[str]) -> None:
        """Start the guard and, under it, ``command`` held at its gate."""
        #: Called (on a thread) when the command has exited.
        self.on_exit: Callable[[], None] = lambda: None
        self._life, life_guard = socket.socketpair()
        report_r, report_w = os.pipe()
        gate_r, self._gate_w = os.pipe()
        # Forked, not exec'd: the agent is one thread here (the CLI starts the job first), and
        # a new interpreter would need to read its own files again, which an agent without
        # CAP_DAC_READ_SEARCH may not (a pyenv python under /root).
        sys.stdout.flush()
        sys.stderr.flush()
        self._guard = os.fork()
        if self._guard == 0:
            code = 1
            try:
                self._life.close()
                os.close(self._gate_w)
                os.close(report_r)
                code = main(life_guard, report_w, gate_r, command)
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        life_guard.close()
        for fd in (report_w, gate_r):
            os.close(fd)
        self._report = os.fdopen(report_r, "r")
        line = self._report.readline().split()
        if line[:1] != ["pid"]:
            _, status = os.waitpid(self._guard, 0)
            raise OSError(f"the job guard did not start the command (exit {exit_code(status)})")
        self.pid = int(line[1])
        self.returncode: int | None = None
        self.exited = threading.Event()

    def _wait_exit(self) -> None:
        for line in self._report:
            kind, _, value = line.partition(" ")
            if kind == "exit":
                self.returncode = int(value)
                break
        else:
            self.returncode = 255  # the guard died without a word
        self.exited.set()
        self.on_exit()

    def release(self, pause_gate: int) -> None:
        """Let the command run (the agent watches its pid and has attached), the guard holding
        ``pause_gate``, the fd of the map that turns the kernel's pause at load on, to close it
        when the agent dies. The thread that waits for the command's exit starts here: until
        then the agent may be one thread (its capabilities are dropped, per thread, before it
        attaches: otelbpf/base/privileges.py)."""
        socket.send_fds(self._life, [b"gate"], [pause_gate])
        threading.Thread(target=self._wait_exit, name="otelbpf-job", daemon=True).start()
        os.write(self._gate_w, b"go")
        os.close(self._gate_w)
        self._gate_w = -1

    def signal(self, sig: int) -> None:
        if not self.exited.is_set():
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        """The agent is done (its probes detached): the guard resumes anything still stopped,
        and exits once the agent has and the command has (a command still running runs on,
        unwatched). Not waited for: the guard waits for the agent's exit."""
        if self._gate_w >= 0:  # never released: the command does not run
            os.close(self._gate_w)
            self._gate_w = -1
        self._life.close()


def exit_code(status: int) -> int:
    """A wait status as a shell reports it: the exit code, or 128 + the signal."""
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def _stopped_descendants(root: int) -> list[int]:
    """Processes in ``root``'s tree in state T (stopped by a signal, not by a tracer)."""
    children: dict[int, list[int]] = {}
    state: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry)
        state[pid] = fields[0].decode()
        children.setdefault(int(fields[1]), []).append(pid)
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if state.get(pid) == "T":
            out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _resume_all() -> None:
    for pid in _stopped_descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def _run_job(gate_fd: int, command: list[str]) -> None:
    """In the forked child: wait for the agent's go, then become the command."""
    # As the command would have them without the agent (Python ignores SIGPIPE and SIGXFSZ).
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)
    try:
        go = os.read(gate_fd, 2)
    except OSError:
        go = b""
    if go != b"go":
        os._exit(125)  # the agent failed to start: the command does not run unwatched
    os.close(gate_fd)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"otelbpf: cannot run {command[0]}: {exc}", file=sys.stderr)
        os._exit(127 if isinstance(exc, FileNotFoundError) else 126)


def main(life: socket.socket, report_fd: int, gate_fd: int, command: list[str]) -> int:
    """The guard, in the process forked by ``Job``; returns the command's exit status."""
    name_os_thread("otelbpf-guard")
    agent = os.getppid()
    agent_pidfd = os.pidfd_open(agent)
    os.setsid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    # The agent forwards what the job should get; the guard itself lives until its job ends.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    pid = os.fork()
    if pid == 0:
        life.close()
        os.close(report_fd)
        _run_job(gate_fd, command)
    os.close(gate_fd)
    os.write(report_fd, f"pid {pid}\n".encode())
    reaper = _Reaper(pid, report_fd)
    pause_gate: int | None = None
    poller = select.poll()
    poller.register(life, select.POLLIN)
    while True:  # the agent lives
        if poller.poll(_WATCH_S * 1000):
            message, fds, _, _ = socket.recv_fds(life, 16, 1)
            if not message:
                break  # the agent has stopped, or its files are closed as it dies
            if fds:
                pause_gate = fds[0]
        elif _agent_exiting(agent):
            break
        reaper.reap(block=False)
    # The agent has stopped, or is dying with its probes still attached: close the gate, then
    # resume what is stopped until the agent has exited (its pidfd turns readable once its
    # files are closed), and once more for a stop sent as the gate closed. A gate that could
    # not be closed leaves the dead agent's programs stopping the job until its links are
    # gone: the sweeps resume it every time.
    if pause_gate is not None:
        try:
            close_pause_gate(pause_gate)
        except OSError as exc:
            print(f"otelbpf guard: cannot turn the pause at load off ({exc})", file=sys.stderr)
    exited = select.poll()
    exited.register(agent_pidfd, select.POLLIN)
    while True:
        _resume_all()
        if exited.poll(_SWEEP_S * 1000):
            break
    time.sleep(_SWEEP_S)
    _resume_all()
    while reaper.reap(block=True):
        pass
    return reaper.job_status if reaper.job_status is not None else 0


class _Reaper:
    """Reaps the job (reporting its status) and any orphan of its tree (child subreaper)."""

    def __init__(self, job: int, report_fd: int) -> None:
        self.job, self.report_fd = job, report_fd
        self.job_status: int | None = None

    def reap(self, *, block: bool) -> bool:
        """Reap what has exited (waiting for one if ``block``); False once no child is left."""
        while True:
            try:
                reaped, status = os.waitpid(-1, 0 if block else os.WNOHANG)
            except ChildProcessError:
                return False
            if reaped == 0:
                return True
            if reaped == self.job:
                self.job_status = exit_code(status)
                try:
                    os.write(self.report_fd, f"exit {self.job_status}\n".encode())
                except OSError:
                    pass  # the agent is gone
            if block:
                return True
