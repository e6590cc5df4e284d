"""`otelbpf run -- CMD` never hurts the job (issue 13, rows 11, 12 and 14; issue 31, item 6):
signals are forwarded and the agent waits for the command and exits with its status; a kill -9
of the agent while the kernel holds the command stopped for an attach resumes it at once; no
process of the command's tree is stopped after the agent has ended, a background job that
outlives the command included."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from harness.agent import FAKE_CUDA, FAKE_CUDART, AgentProcess, config, wait_until

pytestmark = pytest.mark.bpf

#: Waits for a file, then loads a library the cuda receiver probes: the openat that the
#: kernel answers with SIGSTOP in command mode. Writes a marker once it runs again.
LOADS_CUDART = """
import ctypes, os, sys, time
gate, marker = sys.argv[1], sys.argv[2]
while not os.path.exists(gate):
    time.sleep(0.01)
ctypes.CDLL(sys.argv[3])
open(marker, "w").write("resumed")
"""

#: Writes the signal it got, then exits 0 a little later (a job that cleans up).
CLEANS_UP = """
import signal, sys, time
def done(sig, _):
    open(sys.argv[1], "w").write(signal.Signals(sig).name)
    time.sleep(0.3)
    sys.exit(0)
signal.signal(signal.SIGTERM, done)
signal.signal(signal.SIGINT, done)
open(sys.argv[2], "w").write("ready")
time.sleep(120)
"""


#: A background job: reads a library the cuda receiver probes with a new process (an exec,
#: then the openat: both stop it in command mode) every 0.1 s, ``$4`` times, then touches ``$3``.
#: Its pid goes to ``$1``.
READS_CUDART_IN_A_LOOP = """
echo $$ > "$1"
i=0
while [ $i -lt "$4" ]; do
    cat "$2" > /dev/null
    i=$((i + 1))
    sleep 0.1
done
touch "$3"
"""


def file_config(tmp: Path) -> Path:
    return config({"name": "file", "directory": str(tmp / "out")}, tmp=tmp)


def probed_config(tmp: Path) -> Path:
    """``file_config`` with the stand-in CUDA libraries probed from the start: an agent that
    holds a few hundred uprobes, whose release takes seconds (one grace period each)."""
    paths = [str(FAKE_CUDART.parent / "libcudart*"), str(FAKE_CUDA.parent / "libcuda*")]
    return config({"name": "file", "directory": str(tmp / "out")}, tmp=tmp, cuda={"search_paths": paths})


def proc_state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0].decode()
    except OSError:
        return None


def tree(root: int) -> list[int]:
    """``root`` and its descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def pid_running(needle: str) -> int | None:
    """The pid of the job (not its guard) whose command line holds ``needle``."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if needle in cmdline and "otelbpf.jobguard" not in cmdline and "otelbpf.cli" not in cmdline:
                return int(entry)
    return None


def test_exit_status_of_the_command_is_the_agents(tmp_path: Path):
    cfg = file_config(tmp_path)
    with AgentProcess(["-c", str(cfg), "--", "sh", "-c", "exit 7"]) as agent:
        assert agent.wait(90) == 7, agent.output
    with AgentProcess(["-c", str(cfg), "--", "sh", "-c", "kill -TERM $$"]) as agent:
        assert agent.wait(90) == 128 + signal.SIGTERM, agent.output


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_is_forwarded_and_the_agent_waits_for_the_command(tmp_path: Path, sig: int):
    got, ready = tmp_path / "got", tmp_path / "ready"
    with AgentProcess(
        ["-c", str(file_config(tmp_path)), "--", sys.executable, "-c", CLEANS_UP, str(got), str(ready)]
    ) as agent:
        agent.wait_ready()
        assert wait_until(ready.exists, timeout=30), agent.output
        t0 = time.monotonic()
        rc = agent.stop(sig, timeout=30)
        took = time.monotonic() - t0
    assert rc == 0, agent.output  # the command's own status: it cleaned up and exited 0
    assert got.read_text() == signal.Signals(sig).name
    assert took >= 0.3, f"{took:.2f}s"  # it waited for the command's clean-up (stop time: bench/stop_time.py)
    assert (tmp_path / "out" / "metrics.jsonl").stat().st_size > 0  # flushed


def test_a_second_signal_kills_a_command_that_ignores_the_first(tmp_path: Path):
    ready = tmp_path / "ready"
    script = f"trap '' TERM; touch {ready}; while :; do sleep 0.1; done"
    with AgentProcess(["-c", str(file_config(tmp_path)), "--", "sh", "-c", script]) as agent:
        agent.wait_ready()
        assert wait_until(ready.exists, timeout=30), agent.output
        agent.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert agent.proc.poll() is None  # the command ignored it: the agent waits
        rc = agent.stop(signal.SIGTERM, timeout=30)
    assert rc == 128 + signal.SIGKILL, agent.output


def test_duration_ends_the_command(tmp_path: Path):
    with AgentProcess(["-c", str(file_config(tmp_path)), "--duration", "1", "--", "sleep", "60"]) as agent:
        agent.wait_ready()
        rc = agent.wait(60)
    assert rc == 128 + signal.SIGTERM, agent.output
    assert pid_running("sleep 60") is None


def test_kill_9_of_the_agent_while_it_holds_the_command_stopped(tmp_path: Path):
    """The kernel stops the command at its dlopen; the agent, frozen, never resumes it and is
    then killed: the guard resumes it at once (it sees the agent dying, not its files closed,
    which for an agent holding probes comes one grace period per probe later: 7.3 s once) and
    its pause programs, still attached while the dead agent's links go, stop nothing more."""
    gate, marker = tmp_path / "go", tmp_path / "resumed"
    args = [
        "-c",
        str(probed_config(tmp_path)),
        "--",
        sys.executable,
        "-c",
        LOADS_CUDART,
        str(gate),
        str(marker),
        str(FAKE_CUDART),
    ]
    with AgentProcess(args) as agent:
        agent.wait_ready()
        job = wait_until(lambda: pid_running(str(gate)), timeout=10)
        assert job, agent.output
        os.kill(agent.proc.pid, signal.SIGSTOP)  # the agent can no longer resume anything
        try:
            gate.touch()
            assert wait_until(lambda: proc_state(job) == "T", timeout=20), "the kernel never paused the command"
            time.sleep(0.3)
            assert proc_state(job) == "T" and not marker.exists()
        finally:
            os.kill(agent.proc.pid, signal.SIGKILL)
            killed = time.monotonic()
        resumed = wait_until(marker.exists, timeout=30, interval=0.01)
        took = time.monotonic() - killed
        agent.proc.wait(120)  # a dying agent closes its BPF links one grace period at a time
        assert resumed, f"the command stayed {proc_state(job)!r} after the agent's kill -9"
        assert took < 1.5, f"the command ran again {took:.2f}s after the agent's kill -9"
        assert wait_until(lambda: proc_state(job) is None, timeout=10)


def test_a_background_job_that_outlives_the_command_is_never_left_stopped(tmp_path: Path):
    """The command starts a job in the background and exits; the agent stops, its probes go
    to the background releaser, which holds the pause programs for a while after the agent
    and the guard's resume passes are gone. The job's every later exec and library open runs
    on: it ends its loop, no process of its tree stays stopped."""
    pidfile, finished, script = tmp_path / "pid", tmp_path / "finished", tmp_path / "loop.sh"
    script.write_text(READS_CUDART_IN_A_LOOP)
    loop = f"sh {script} {pidfile} {FAKE_CUDART} {finished} 60"
    command = f"{loop} & sleep 1.5"  # the probes on the library are attached before it exits
    agent_args = ["-c", str(probed_config(tmp_path)), "--", "sh", "-c", command]
    with AgentProcess(agent_args, env={"OTELBPF_DETACH": "background"}) as agent:
        agent.wait_ready()
        assert agent.wait(90) == 0, agent.output
    assert wait_until(pidfile.exists, timeout=5), agent.output
    background = int(pidfile.read_text())
    try:
        stopped: list[tuple[int, str | None]] = []

        def ended() -> bool:
            stopped[:] = [(pid, proc_state(pid)) for pid in tree(background) if proc_state(pid) == "T"]
            return finished.exists()

        assert wait_until(ended, timeout=30, interval=0.1), f"stopped after the agent ended: {stopped}\n{agent.output}"
    finally:
        for pid in reversed(tree(background)):  # a job left stopped must not outlive the test
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_kill_9_of_the_agent_leaves_a_running_command_running(tmp_path: Path):
    """No SIGHUP from an orphaned process group, no kill: the command finishes its work."""
    ready, done = tmp_path / "ready", tmp_path / "done"
    script = f"touch {ready}; sleep 1; touch {done}"
    with AgentProcess(["-c", str(file_config(tmp_path)), "--", "sh", "-c", script]) as agent:
        agent.wait_ready()
        assert wait_until(ready.exists, timeout=30), agent.output
        os.kill(agent.proc.pid, signal.SIGKILL)
        agent.proc.wait(120)
    assert wait_until(done.exists, timeout=10)


def test_the_command_gets_default_signal_dispositions(tmp_path: Path):
    """Python ignores SIGPIPE; the command must not inherit that (`yes | head` ends by it)."""
    out = tmp_path / "sigs"
    with AgentProcess(
        ["-c", str(file_config(tmp_path)), "--", "sh", "-c", f"grep SigIgn /proc/self/status > {out}"]
    ) as agent:
        assert agent.wait(90) == 0, agent.output
    ignored = int(out.read_text().split()[1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1)) and not ignored & (1 << (signal.SIGXFSZ - 1))
