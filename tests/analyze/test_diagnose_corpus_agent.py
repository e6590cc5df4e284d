"""The corpus of planted-cause jobs (jobs/train_job.py) under the real agent with its default
configuration (only the output folder moved): ``otelbpf run -- python train_job.py ...``, then
the diagnosis of what it wrote. Each job prints what it planted (seconds in the planted
function, on the CPU and in all), and the diagnosis must name that function with its share
within 25%: the expected answer comes from the job, never from the output.

Under the defaults the profiler is on and the sched receiver off: a planted function's time on
the CPU is what the CPU samples can show; its time blocked (the checkpoint's fsync) is reported
as unexplained, with what would show it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from harness.agent import FAKE_CUDART, AgentProcess
from otelbpf.analyze.diagnose import Finding, diagnose
from otelbpf.config.default import DEFAULT_CONFIG_YAML

pytestmark = pytest.mark.bpf

JOB = Path(__file__).parent / "jobs" / "train_job.py"
JOBS = {"healthy": 60, "checkpoint": 60, "tokenize": 60, "both": 60, "sync_per_layer": 150, "pageable": 60}
TOLERANCE = 0.25


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Finding], dict[str, int], dict[str, dict]]:
    """One agent run over the jobs, one after the other: the findings, each job's pid and what it planted."""
    tmp = tmp_path_factory.mktemp("corpus")
    out = tmp / "out"
    cfg = yaml.safe_load(DEFAULT_CONFIG_YAML)
    cfg["exporters"]["file"]["directory"] = str(out)
    (tmp / "otelbpf.yaml").write_text(yaml.safe_dump(cfg))
    script = "; ".join(
        f"{sys.executable} {JOB} {mode} {FAKE_CUDART} {steps} {tmp} > {tmp}/{mode}.json & "
        f"echo {mode} $! >> {tmp}/pids; wait $!"
        for mode, steps in JOBS.items()
    )
    with AgentProcess(
        ["-c", str(tmp / "otelbpf.yaml"), "--", "/bin/sh", "-c", script], env={"FAKECUDA_KERNEL_US": "1500"}
    ) as agent:
        assert agent.wait(timeout=240) == 0, agent.output
    pids = {line.split()[0]: int(line.split()[1]) for line in (tmp / "pids").read_text().splitlines()}
    planted = {mode: json.loads((tmp / f"{mode}.json").read_text()) for mode in JOBS}
    assert os.listdir(out / "profiles")
    return diagnose(str(out)), pids, planted


def _of(traced: tuple, mode: str) -> list[Finding]:
    findings, pids, _ = traced
    return [f for f in findings if f.process.endswith(f"(pid {pids[mode]})")]


def _code(findings: list[Finding], function: str) -> Finding:
    [f] = [f for f in findings if f.cause == "host_code" and f.evidence["function"] == function] or [None]
    assert f is not None, [(f.cause, f.evidence.get("function"), f.cost_s) for f in findings]
    return f


def _close(found: Finding, planted: dict[str, float]) -> None:
    """The diagnosed CPU time of the planted function within TOLERANCE of the CPU time the job measured."""
    assert abs(found.cost_s - planted["cpu_s"]) <= TOLERANCE * planted["cpu_s"], (found.cost_s, planted, found)


def test_a_healthy_loop_has_no_finding_above_one_percent(traced) -> None:
    findings = _of(traced, "healthy")
    assert all(f.share <= 0.01 for f in findings), [(f.cause, f.share) for f in findings]


def test_an_inline_checkpoint_is_named_with_its_time_not_called_a_sync_storm(traced) -> None:
    findings = _of(traced, "checkpoint")
    found = _code(findings, "save_checkpoint")
    _close(found, traced[2]["checkpoint"]["planted"]["save_checkpoint"])
    assert "train_job.py:" in found.summary and found.evidence["file"].endswith("train_job.py")
    assert "sync_storm" not in {f.cause for f in findings}
    assert findings[0] is found, [(f.cause, f.cost_s) for f in findings]


def test_inline_tokenization_is_named_first_with_its_share(traced) -> None:
    findings = _of(traced, "tokenize")
    found = _code(findings, "tokenize_batch")
    _close(found, traced[2]["tokenize"]["planted"]["tokenize_batch"])
    assert findings[0] is found, [(f.cause, f.cost_s) for f in findings]
    assert "sync_storm" not in {f.cause for f in findings}


def test_two_causes_at_once_each_get_their_planted_share(traced) -> None:
    findings = _of(traced, "both")
    planted = traced[2]["both"]["planted"]
    _close(_code(findings, "tokenize_batch"), planted["tokenize_batch"])
    _close(_code(findings, "save_checkpoint"), planted["save_checkpoint"])
    assert [f.cause for f in findings][:2] == ["host_code", "host_code"]  # the causes first, the unexplained rest after
    budget = findings[0].evidence["idle"]
    # every idle second charged once: the causes and the unexplained rest make up the budget
    assert budget["charged_s"] + budget["unexplained_s"] <= budget["idle_budget_s"] * 1.001 + 1e-6


def test_a_synchronize_after_every_layer_is_a_sync_storm(traced) -> None:
    findings = _of(traced, "sync_per_layer")
    assert findings and findings[0].cause == "sync_storm", [(f.cause, f.cost_s) for f in findings]
    ev = findings[0].evidence
    assert ev["syncs"] == traced[2]["sync_per_layer"]["syncs"]
    assert ev["short_gaps"] >= 0.9 * ev["syncs"]  # nearly every gap is the queue draining and refilling


def test_pageable_copies_are_still_found_first(traced) -> None:
    findings = _of(traced, "pageable")
    assert findings and findings[0].cause == "pageable_copies", [(f.cause, f.cost_s) for f in findings]
    planted = traced[2]["pageable"]
    assert (
        findings[0].evidence["copies"] == planted["copies"] and findings[0].evidence["bytes"] >= planted["copy_bytes"]
    )
