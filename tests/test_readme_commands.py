"""Every `otelbpf ...` command the README's "Using it" shows, run as written, so the README
cannot drift from the CLI again (issue 33: every one of them had failed as written).

Unit tier: each command line parses with the CLI's own parser; those that read a folder run
against a folder written by the file exporter (a CUDA process and the agent, as after a run),
from a directory laid out like the clone's root (``otelbpf-out``, ``my.yaml``,
``otelbpf/config/otelbpf.yaml``). BPF tier: the same against what the demo's job really left,
under the real agent. Commands that watch live (``run`` without ``--print-config``, ``top``) are
checked to parse: they need root and run until stopped."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics.export import MetricsData, ResourceMetrics, ScopeMetrics
from opentelemetry.sdk.resources import Resource

from harness.agent import REPO, AgentProcess
from otelbpf.cli import _parser
from otelbpf.correlate import metrics as m
from otelbpf.correlate.spans import make_span, scope
from otelbpf.export.jsonfile import FileMetricExporter, FileSpanExporter

#: What each command may exit with, besides 0: diagnose's 1 means findings; stragglers' 1 says
#: the folder has no NCCL spans (the demo's job runs no NCCL); doctor's 1 names what is missing.
ALLOWED = {"diagnose": {0, 1}, "stragglers": {1}, "doctor": {0, 1}}
#: Commands that keep running (need root, watch until stopped): their arguments are checked.
LIVE = ("run", "top")


def readme_commands() -> list[list[str]]:
    """The ``otelbpf`` lines of the code blocks under "## Using it", comments removed."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("\n## Using it\n") :]
    section = section[: section.index("\n## ", 1)]
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", section, re.S):
        for line in block.replace("\\\n", " ").splitlines():  # continued lines joined
            words = shlex.split(line, comments=True)
            while words and "=" in words[0]:  # VAR=value prefixes: the command follows
                words.pop(0)
            if words[:1] == ["otelbpf"]:
                commands.append(words)
    return commands


def test_the_readme_shows_the_commands():
    shown = {c[1] for c in readme_commands()}
    assert {"doctor", "run", "summary", "diagnose", "report", "stragglers", "validate", "mcp", "top"} <= shown


@pytest.mark.parametrize("command", readme_commands(), ids=lambda c: " ".join(c[1:]))
def test_every_command_parses(command: list[str]) -> None:
    try:
        _parser().parse_args(command[1:])  # argparse exits 2 on a flag or argument the CLI lacks
    except SystemExit as exc:  # --version and --help exit 0 once printed
        assert exc.code == 0, shlex.join(command)


def clone_like(tmp_path: Path, out: Path | None = None) -> Path:
    """A working directory with what the README's commands name, as in the clone's root."""
    (tmp_path / "otelbpf" / "config").mkdir(parents=True)
    shutil.copy(REPO / "otelbpf" / "config" / "otelbpf.yaml", tmp_path / "otelbpf" / "config")
    shutil.copy(REPO / "otelbpf" / "config" / "otelbpf.yaml", tmp_path / "my.yaml")
    if out is not None:
        shutil.copytree(out, tmp_path / "otelbpf-out", symlinks=True)
    return tmp_path


def run_as_written(command: list[str], cwd: Path) -> None:
    """One command, with ``otelbpf`` this checkout's CLI; its exit status checked."""
    if command[1] in LIVE and "--print-config" not in command:
        return  # parsed by test_every_command_parses
    result = subprocess.run(
        [sys.executable, "-m", "otelbpf.cli", *command[1:]],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,  # mcp's stdio server ends at once
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    allowed = ALLOWED.get(command[1], set()) | {0}
    assert result.returncode in allowed, f"{shlex.join(command)}: exit {result.returncode}\n{result.stderr[-2000:]}"
    assert "Traceback" not in result.stderr, result.stderr


def test_the_commands_run_as_written_on_an_output_folder(tmp_path: Path) -> None:
    out = tmp_path / "written"
    job = Resource({"service.name": "cuda_workload", "process.pid": 4242})
    agent = Resource({"service.name": "otelbpf", "process.pid": 1})
    now = 1_700_000_010_000_000_000
    launches = m.cumulative_sum("cuda.kernel.launches", "{launch}", "", [({"cuda.api.function": "x"}, 5)], 0, now)
    events = m.cumulative_sum("otelbpf.events.received", "{event}", "", [({"ring": "events"}, 9)], 0, now)
    exporter = FileMetricExporter(str(out))
    exporter.export(
        MetricsData(
            [
                ResourceMetrics(job, [ScopeMetrics(scope("otelbpf.cuda"), [launches], "")], ""),
                ResourceMetrics(agent, [ScopeMetrics(scope("otelbpf"), [events], "")], ""),
            ]
        )
    )
    exporter.shutdown()
    spans = FileSpanExporter(str(out))
    sync = make_span(
        "cudaStreamSynchronize",
        resource=job,
        scope=scope("otelbpf.cuda"),
        start_ns=now - 5_000_000,
        end_ns=now,
        attributes={"cuda.api.function": "cudaStreamSynchronize"},
    )
    spans.export([sync])
    spans.shutdown()
    cwd = clone_like(tmp_path / "clone", out)
    for command in readme_commands():
        run_as_written(command, cwd)
    assert (cwd / "report.html").stat().st_size > 0


@pytest.mark.bpf
def test_the_commands_run_as_written_on_the_demos_output(tmp_path: Path) -> None:
    """The demo's job under the real agent (`otelbpf run -- examples/demo_job.sh`), then every
    command on what it wrote."""
    cwd = clone_like(tmp_path)
    cfg = tmp_path / "demo.yaml"
    cfg.write_text(
        (REPO / "otelbpf" / "config" / "otelbpf.yaml")
        .read_text()
        .replace("directory: ./otelbpf-out", f"directory: {cwd / 'otelbpf-out'}")
    )
    with AgentProcess(["-c", str(cfg), "--", str(REPO / "examples" / "demo_job.sh")]) as agent:
        assert agent.wait(300) == 0, agent.output
    for command in readme_commands():
        run_as_written(command, cwd)
