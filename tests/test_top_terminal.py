"""`otelbpf top` typed into and read back from a real terminal (tmux), on real workloads: the
demo traffic (HTTP and gRPC requests that call CUDA, cuda_workload, a 2-rank NCCL job with a
slow rank 1) watched by a standalone `otelbpf top --pid` (its agent in-process), and a second
`otelbpf top` attached to that agent's state socket. One agent serves both: its compile is the
slow part."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time

import pytest
import yaml

from harness.agent import BUILD, REPO

pytestmark = [
    pytest.mark.bpf,
    pytest.mark.skipif(
        shutil.which("tmux") is None and os.environ.get("CI") != "true", reason="needs tmux (scripts/setup.sh --test)"
    ),
]


class Pane:
    """A detached tmux session running one command, 160x50; what it shows, keys sent to it."""

    def __init__(self, name: str, command: str, env: dict[str, str]) -> None:
        self.name = f"otelbpf-test-{name}-{os.getpid()}"
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        # the pane's own size, not the COLUMNS/LINES this process may carry (Rich reads them first)
        shell = (
            f"cd {shlex.quote(str(REPO))} && env -u COLUMNS -u LINES {exports} {command}; "
            "echo TOP-EXITED rc=$?; sleep 600"
        )
        subprocess.run(["tmux", "new-session", "-d", "-s", self.name, "-x", "160", "-y", "50", shell], check=True)

    def screen(self) -> str:
        return subprocess.run(
            ["tmux", "capture-pane", "-p", "-t", self.name], capture_output=True, text=True, check=True
        ).stdout

    def keys(self, *keys: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.name, *keys], check=True)

    def wait_for(self, pattern: str, timeout: float = 90) -> str:
        deadline = time.monotonic() + timeout
        while True:
            shown = self.screen()
            if re.search(pattern, shown):
                return shown
            if time.monotonic() > deadline:
                raise AssertionError(f"{pattern!r} not on screen within {timeout}s:\n{shown}")
            time.sleep(0.5)

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)


def rows(shown: str, title: str) -> list[list[str]]:
    """The data rows of one table on the screen (under its title and header line)."""
    lines = shown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == title) + 2
    out = []
    for line in lines[start:]:
        cells = line.split()
        if not cells or not cells[0].isdigit():
            break
        out.append(cells)
    return out


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("top")
    run = tmp / "run"
    receivers = ["cuda", "http", "nccl"]
    doc = {
        "receivers": {"cuda": {"search_paths": []}, "http": {}, "nccl": {"search_paths": []}},
        "processors": {"batch": {"timeout": "100ms"}},
        "exporters": {"file": {"directory": str(tmp / "out")}},
        "service": {
            "pipelines": {
                "traces": {"receivers": receivers, "processors": ["batch"], "exporters": ["file"]},
                "metrics": {"receivers": receivers, "processors": ["batch"], "exporters": ["file"]},
            },
            "telemetry": {"metrics_interval": "500ms", "drain_interval": "20ms"},
        },
    }
    cfg = tmp / "otelbpf.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    traffic = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "deploy" / "demo" / "traffic.py"),
            "--build",
            str(BUILD),
            "--rounds",
            "0",
            "--pause",
            "0.5",
            "--requests",
            "5",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    panes: list[Pane] = []
    yield {"cfg": cfg, "run": run, "traffic": traffic, "panes": panes}
    for pane in panes:
        pane.close()
    traffic.terminate()
    traffic.wait(30)


def test_top_standalone_and_attached_in_a_terminal(job) -> None:
    env = {"OTELBPF_RUN_DIR": str(job["run"])}
    pid = job["traffic"].pid
    alone = Pane("alone", f"{sys.executable} -m otelbpf.cli top --pid {pid} -c {job['cfg']}", env)
    job["panes"].append(alone)
    # the traffic's requests with their CUDA calls, its NCCL job with the slow rank named, the agent's own line
    shown = alone.wait_for(r"(?s)GET /predict.*", timeout=180)
    shown = alone.wait_for(r"(?s)NCCL ranks.*<- now", timeout=90)
    assert re.search(r"agent: [\d.k]+ events/s \(\d+ received\), lost 0, dropped 0, CPU [\d.]+%, RSS [\d.]+MiB", shown)
    procs = rows(shown, "processes")
    assert procs and procs[0][2] == "yes", shown  # GPU processes first
    assert any(r[1] == "nccl_job" for r in procs) and str(pid) in {r[0] for r in procs}
    [late] = [r for r in rows(shown, "NCCL ranks") if r[-2:] == ["<-", "now"]]
    assert late[0] == "1" and "compute-slow" in late
    # the table holds the recent spans' APIs: the NCCL job's synchronizes may fill it for a
    # refresh or two between the traffic's requests (each a cudaMalloc and cudaMemcpy, every 0.5 s)
    deadline = time.monotonic() + 60
    while not {"cudaMemcpy", "cudaMalloc"} <= (
        apis := {r[1] for r in rows(shown, "CUDA API (latency: recent spans, ms)")}
    ):
        assert time.monotonic() < deadline, f"{apis} on screen for 60 s:\n{shown}"
        time.sleep(0.5)
        shown = alone.screen()

    # a second view, attached to that agent's state socket (the standalone agent serves one too)
    [sock] = [str(p) for p in job["run"].glob("agent-*.sock")]
    attached = Pane("attached", f"{sys.executable} -m otelbpf.cli top --socket {sock}", env)
    job["panes"].append(attached)
    attached.wait_for(r"(?s)processes.*GET /predict")

    # keys: a pid filter, a sort, freeze, quit
    attached.keys("p", *str(pid), "Enter")
    shown = attached.wait_for(rf"pid filter: {pid}(?!_)")
    time.sleep(1.5)
    shown = attached.screen()
    assert {r[0] for r in rows(shown, "processes")} == {str(pid)}
    assert "NCCL ranks" not in shown  # the ranks are other processes
    attached.keys("s")
    attached.wait_for(r"sort: calls/s")
    attached.keys("f")
    frozen = attached.wait_for("FROZEN")
    time.sleep(2.5)
    assert attached.screen() == frozen
    attached.keys("f", "Escape")
    attached.wait_for(r"(?s)NCCL ranks.*")

    # quitting the standalone view stops its agent: the attached view says the socket is gone
    alone.keys("q")
    alone.wait_for(r"TOP-EXITED rc=0", timeout=180)  # the probes' release waits on the kernel's uprobe lock
    attached.wait_for(r"no such socket \(is the agent running\?\)", timeout=30)
    assert not os.path.exists(sock)
    attached.keys("q")
    attached.wait_for(r"TOP-EXITED rc=0")
