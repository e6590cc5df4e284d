"""What the agent reads of a process at its exec report (no BPF: the sensor's callback alone).

A process is described on the discovery thread while the kernel holds it stopped at its exec
or library open. ``env OTEL_SERVICE_NAME=trainer cmd`` execs twice under one pid: what was read
at ``env``'s exec must give way to ``cmd`` there and then. Left to the correlator's exec event,
a one-call program under load had exited before it was read again, and its spans carried
``env``'s successor's bare task name (``cuda_workload``) instead of its ``OTEL_SERVICE_NAME``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from types import SimpleNamespace

from harness.agent import wait_until
from otelbpf.agent import Agent
from otelbpf.correlate.process_info import ProcessInfo
from otelbpf.correlate.symbolizer import Symbolizer

SLEEP = shutil.which("sleep")
ENV = shutil.which("env")


def wait_for_exec(pid: int, program: str) -> None:
    """Until /proc shows ``program`` with its arguments in place (they follow /proc/PID/exe)."""

    def done() -> bool:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return os.readlink(f"/proc/{pid}/exe") == os.path.realpath(program) and f.read() != b""

    assert wait_until(done)


def test_an_exec_report_replaces_what_was_read_of_the_program_before(tmp_path) -> None:
    go = tmp_path / "go"
    proc = subprocess.Popen(
        ["/bin/sh", "-c", f"while [ ! -e {go} ]; do sleep 0.01; done; exec {ENV} OTEL_SERVICE_NAME=trainer {SLEEP} 30"]
    )
    try:
        wait_for_exec(proc.pid, "/bin/sh")
        agent = SimpleNamespace(process_info=ProcessInfo(), symbolizer=Symbolizer())
        Agent._describe_process(agent, proc.pid)  # type: ignore[arg-type]
        assert agent.process_info.resource(proc.pid).attributes["service.name"] != "trainer"
        go.touch()
        wait_for_exec(proc.pid, SLEEP)
        exec_ns = time.monotonic_ns()  # the exec report's time: after what was read first
        # a library open: no news of the program
        Agent._describe_process(agent, proc.pid)  # type: ignore[arg-type]
        assert agent.process_info.resource(proc.pid).attributes["service.name"] != "trainer"
        Agent._describe_process(agent, proc.pid, exec_ns)  # type: ignore[arg-type]
        proc.kill()
        proc.wait()
        described = agent.process_info.resource(proc.pid).attributes  # read while it lived
        assert described["service.name"] == "trainer"
        assert described["process.executable.name"] == "sleep"
        assert "otelbpf.process.exited" not in described
    finally:
        proc.kill()
        proc.wait()
