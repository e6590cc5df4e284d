"""The command's guard (otelbpf/jobguard.py) without BPF: it tells a dying agent from a live
one by the agent's state, since a killed agent's socket reads EOF only once its probes are
released (seconds later). The gate it then closes is tested with a loaded program in
tests/sensor/test_program.py, the whole in tests/test_run_command.py."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from harness.agent import wait_until
from otelbpf.jobguard import _agent_exiting


def state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0].decode()


def test_a_live_agent_is_not_exiting_a_stopped_one_neither() -> None:
    assert not _agent_exiting(os.getpid())
    child = subprocess.Popen(["sleep", "30"])
    try:
        os.kill(child.pid, signal.SIGSTOP)  # frozen (a debugger, a test): it may resume yet
        assert wait_until(lambda: state(child.pid) == "T", timeout=5)
        assert not _agent_exiting(child.pid)
    finally:
        child.kill()
        child.wait()


def test_a_killed_agent_is_exiting_before_it_is_reaped_and_after() -> None:
    child = subprocess.Popen(["sleep", "30"])
    child.kill()
    assert wait_until(lambda: state(child.pid) == "Z", timeout=5)  # not reaped yet
    assert _agent_exiting(child.pid)
    child.wait()
    assert _agent_exiting(child.pid)  # gone
