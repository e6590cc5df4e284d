"""The OpenTelemetry resource of a watched process, read from /proc of real processes."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from harness.agent import wait_until
from otelbpf import __version__
from otelbpf.correlate.process_info import ProcessInfo, agent_resource
from otelbpf.correlate.symbolizer import EVICTIONS

SLEEP = shutil.which("sleep")


def spawn(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    proc = subprocess.Popen(list(args), env=env)
    wait_for_exec(proc.pid, args[0])
    return proc


def wait_for_exec(pid: int, program: str) -> None:
    """Popen returns after fork: wait until /proc shows the new program. /proc/PID/exe
    changes a moment before its arguments and environment are in place, so wait for both."""

    def done() -> bool:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return os.readlink(f"/proc/{pid}/exe") == os.path.realpath(program) and f.read() != b""

    assert wait_until(done)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen]:
    proc = spawn(
        SLEEP,
        "30",
        env={
            "PATH": "/usr/bin:/bin",
            "OTEL_SERVICE_NAME": "checkout",
            "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod, team=ml%2Cinfra,"
            "host.name=spoofed,process.pid=1,=x,bare",
            "NOT_OTEL": "ignored",
        },
    )
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_resource_of_a_live_process(sleeper: subprocess.Popen) -> None:
    attrs = dict(ProcessInfo().resource(sleeper.pid).attributes)
    exe = os.path.realpath(SLEEP)
    assert attrs == {
        "host.name": socket.gethostname(),  # never the target's own claim
        "process.pid": sleeper.pid,
        "process.executable.path": exe,
        "process.executable.name": os.path.basename(exe),
        "process.command_line": f"{SLEEP} 30",
        "process.command_args": (SLEEP, "30"),
        "deployment.environment": "prod",
        "team": "ml,infra",  # %-decoded
        "service.name": "checkout",
    }


def test_service_name_from_the_target_resource_attributes() -> None:
    proc = spawn(SLEEP, "30", env={"OTEL_RESOURCE_ATTRIBUTES": "service.name=trainer,k=v"})
    try:
        attrs = ProcessInfo().resource(proc.pid).attributes
        assert (attrs["service.name"], attrs["k"]) == ("trainer", "v")
    finally:
        proc.kill()
        proc.wait()


def test_service_name_falls_back_to_the_executable_name() -> None:
    proc = spawn(SLEEP, "30", env={})
    try:
        assert ProcessInfo().resource(proc.pid).attributes["service.name"] == os.path.basename(os.path.realpath(SLEEP))
    finally:
        proc.kill()
        proc.wait()


def test_configured_attributes_win(sleeper: subprocess.Popen) -> None:
    info = ProcessInfo({"service.name": "fleet", "deployment.environment": "staging", "k8s.node.name": "n1"})
    attrs = info.resource(sleeper.pid).attributes
    assert attrs["service.name"] == "fleet"
    assert attrs["deployment.environment"] == "staging"
    assert attrs["k8s.node.name"] == "n1"
    assert attrs["team"] == "ml,infra"


def test_exited_process_is_named_by_its_comm_when_known() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    info = ProcessInfo()
    info.note_comm(proc.pid, "trainer")
    info.note_comm(proc.pid, "")  # an empty name never replaces a known one
    attrs = dict(info.resource(proc.pid).attributes)
    assert attrs == {
        "host.name": socket.gethostname(),
        "process.pid": proc.pid,
        "otelbpf.process.exited": True,
        "process.executable.name": "trainer",
        "service.name": "trainer",
    }


def test_exited_process_without_a_comm_is_named_by_pid() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    attrs = ProcessInfo().resource(proc.pid).attributes
    assert attrs["service.name"] == f"pid-{proc.pid}"
    assert attrs["otelbpf.process.exited"] is True
    assert "process.executable.name" not in attrs


def never_a_pid(n: int) -> list[int]:
    """Numbers above the kernel's pid_max: no process can have them."""
    with open("/proc/sys/kernel/pid_max") as f:
        pid_max = int(f.read())
    return list(range(pid_max + 1, pid_max + 1 + n))


def test_comms_are_kept_for_the_most_recent_processes_only() -> None:
    """Every exec and exit on the host notes a comm: the table is bounded like the cache."""
    info = ProcessInfo(max_processes=3)
    pids = never_a_pid(5)
    for i, pid in enumerate(pids):
        info.note_comm(pid, f"job{i}")
    info.note_comm(pids[2], "job2")  # noted again: most recent now
    names = [info.resource(pid).attributes["service.name"] for pid in pids]
    assert names == [f"pid-{pids[0]}", f"pid-{pids[1]}", "job2", "job3", "job4"]


def test_the_resource_cache_is_bounded() -> None:
    info = ProcessInfo(max_processes=2)
    a, b, c = never_a_pid(3)
    first = info.resource(a)
    info.resource(b)
    assert info.resource(a) is first  # a used again: b is now the oldest
    info.resource(c)
    assert info.resource(a) is first
    info.note_comm(b, "late")
    assert info.resource(b).attributes["service.name"] == "late"  # b was evicted and read again


def test_resource_is_read_once_and_outlives_the_process(sleeper: subprocess.Popen) -> None:
    info = ProcessInfo()
    first = info.resource(sleeper.pid)
    sleeper.kill()
    sleeper.wait()
    assert info.resource(sleeper.pid) is first


def test_an_ended_process_keeps_its_resource_for_every_correlator(sleeper: subprocess.Popen) -> None:
    """One correlator forgetting an ended process must not rename it for the others: read
    again from the gone process, the resource fell back to the task name, two services for
    one pid (CI: ``python3.11`` and ``python`` for the same job)."""
    info = ProcessInfo()
    info.note_comm(sleeper.pid, "sleepy")
    first = info.resource(sleeper.pid)
    sleeper.kill()
    sleeper.wait()
    info.forget(sleeper.pid)  # the cuda correlator is done with it
    assert info.resource(sleeper.pid) is first  # the sched correlator's last points


def test_a_live_process_under_a_forgotten_pid_is_read_afresh(sleeper: subprocess.Popen) -> None:
    info = ProcessInfo()
    first = info.resource(sleeper.pid)
    info.forget(sleeper.pid)
    again = info.resource(sleeper.pid)  # a program under the pid: whatever it is now, read from /proc
    assert again is not first and again.attributes == first.attributes
    info.forget(sleeper.pid, before_ns=time.monotonic_ns())  # an exec drops what was kept too
    sleeper.kill()
    sleeper.wait()
    assert info.resource(sleeper.pid).attributes["otelbpf.process.exited"] is True


def test_forget_before_an_exec_rereads_only_older_resources(tmp_path) -> None:
    go = tmp_path / "go"
    proc = spawn(
        "/bin/sh", "-c", f"while [ ! -e {go} ]; do sleep 0.01; done; exec {SLEEP} 30", env={"OTEL_SERVICE_NAME": "svc"}
    )
    try:
        info = ProcessInfo()
        before_read = time.monotonic_ns()
        old = info.resource(proc.pid)
        assert old.attributes["process.executable.name"] != "sleep"
        go.touch()
        wait_for_exec(proc.pid, SLEEP)
        info.forget(proc.pid, before_ns=before_read)  # an exec older than what we read: keep it
        assert info.resource(proc.pid) is old
        info.forget(proc.pid, before_ns=time.monotonic_ns())  # the exec came after: read again
        new = info.resource(proc.pid).attributes
        assert new["process.executable.name"] == "sleep"
        assert new["process.command_args"] == (SLEEP, "30")
        assert new["service.name"] == "svc"
    finally:
        proc.kill()
        proc.wait()


def test_agent_resource_keeps_its_own_service_name() -> None:
    attrs = agent_resource({"service.name": "not-me", "deployment.environment": "prod"}).attributes
    assert attrs["service.name"] == "otelbpf"
    assert attrs["service.version"] == __version__
    assert attrs["process.pid"] == os.getpid()
    assert attrs["deployment.environment"] == "prod"


def test_what_is_held_for_exited_processes_is_released_after_a_grace(sleeper: subprocess.Popen) -> None:
    """The agent describes every process it sees start: held until the LRU's bound, the
    entries of exited ones were memory that grew with the host's process churn."""
    info = ProcessInfo(gone_grace_s=60, sweep_s=3600)
    info.resource(sleeper.pid)
    exited, first = [], None
    for _ in range(20):
        proc = subprocess.Popen(["true"])
        first = first or info.resource(proc.pid)
        info.note_comm(proc.pid, "true")
        proc.wait()
        exited.append(proc.pid)
        info.note_comm(proc.pid, "true")  # its exit seen
    assert len(info) == 21
    t0 = time.monotonic_ns()
    info.release_exited(t0)  # found gone now: its last spans may still be exported
    assert len(info) == 21
    assert info.resource(exited[0]) is first
    info.release_exited(t0 + 59 * 10**9)
    assert len(info) == 21
    info.release_exited(t0 + 60 * 10**9)
    assert len(info) == 1  # the live process only
    assert info.resource(sleeper.pid).attributes["service.name"] == "checkout"


def test_the_sweep_runs_by_itself_as_processes_are_described(sleeper: subprocess.Popen) -> None:
    info = ProcessInfo(gone_grace_s=0, sweep_s=0)
    proc = subprocess.Popen(["true"])
    info.resource(proc.pid)
    proc.wait()
    info.resource(sleeper.pid)  # a new process described: the sweep finds the first gone
    assert len(info) == 1


def test_evictions_are_counted() -> None:
    info = ProcessInfo(max_processes=2)
    before = Counter(EVICTIONS)
    pids = never_a_pid(5)
    for pid in pids:
        info.resource(pid)
        info.note_comm(pid, "x")
    assert EVICTIONS["process_info"] - before["process_info"] == 3  # their task names go with them
    assert len(info) == 2
    for pid in never_a_pid(3):
        info.note_comm(pid, "exec seen, never described")
    assert EVICTIONS["process_names"] - before["process_names"] == 3


SECRET = "s3cr3tVALUE"
#: A real process whose command line gives secrets in the shapes command lines do (python ignores
#: the arguments after -c's code), beside arguments that are none.
SECRET_ARGS = (
    sys.executable,
    "-c",
    "import time; time.sleep(30)",
    f"--api-key={SECRET}",
    "-H",
    f"Authorization: Bearer {SECRET}",
    f"postgres://trainer:{SECRET}@db:5432/runs",
    f"HF_TOKEN={SECRET}",
    "--lr",
    "3e-4",
)


@pytest.fixture
def secretive() -> Iterator[subprocess.Popen]:
    proc = spawn(*SECRET_ARGS)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_the_command_line_is_redacted_where_it_is_read(secretive: subprocess.Popen) -> None:
    attrs = ProcessInfo().resource(secretive.pid).attributes
    assert attrs["process.command_args"] == (
        *SECRET_ARGS[:3],
        "--api-key=REDACTED",
        "-H",
        "Authorization: REDACTED",
        "postgres://trainer:REDACTED@db:5432/runs",
        "HF_TOKEN=REDACTED",
        "--lr",
        "3e-4",
    )
    assert attrs["process.command_line"] == " ".join(attrs["process.command_args"])
    assert SECRET not in str(dict(attrs))


def test_the_command_line_whole_or_as_the_command_alone(secretive: subprocess.Popen) -> None:
    whole = ProcessInfo(command_line="full").resource(secretive.pid).attributes
    assert whole["process.command_args"] == SECRET_ARGS
    assert whole["process.command_line"] == " ".join(SECRET_ARGS)

    command = ProcessInfo(command_line="command").resource(secretive.pid).attributes
    assert (command["process.command"], command["process.args_count"]) == (sys.executable, len(SECRET_ARGS))
    assert "process.command_line" not in command and "process.command_args" not in command


def test_the_agent_describes_processes_as_targets_command_line_says(secretive, monkeypatch, tmp_path) -> None:
    from otelbpf.agent import Agent
    from otelbpf.config.default import DEFAULT_CONFIG_YAML
    from otelbpf.families.registry import load_config_text

    monkeypatch.chdir(tmp_path)  # the default file exporter's ./otelbpf-out
    for mode, args in (("redacted", "--api-key=REDACTED"), ("full", f"--api-key={SECRET}")):
        text = DEFAULT_CONFIG_YAML.replace("command_line: redacted", f"command_line: {mode}", 1)
        agent = Agent(load_config_text(text, env={}))
        assert args in agent.process_info.resource(secretive.pid).attributes["process.command_args"]


def test_what_the_file_exporter_writes_and_summary_prints_is_the_redacted_command_line(secretive, tmp_path) -> None:
    """Redacted where it is read, the command line is redacted in every consumer of the resource:
    here the OTLP-JSON file (which the report and MCP read too) and ``otelbpf summary``."""
    import io

    from otelbpf.analyze.summary import summarize
    from otelbpf.correlate.spans import make_span, scope
    from otelbpf.export.jsonfile import FileSpanExporter

    resource = ProcessInfo().resource(secretive.pid)
    now = time.time_ns()
    span = make_span(
        "cudaMemcpy", resource=resource, scope=scope("otelbpf.cuda"), start_ns=now, end_ns=now + 1000, attributes={}
    )
    exporter = FileSpanExporter(str(tmp_path))
    exporter.export([span])
    exporter.shutdown()
    written = "".join(p.read_text() for p in tmp_path.rglob("*.jsonl"))
    assert "--api-key=REDACTED" in written and SECRET not in written

    out = io.StringIO()
    summarize(str(tmp_path), out)
    assert "--api-key=REDACTED" in out.getvalue() and SECRET not in out.getvalue()
