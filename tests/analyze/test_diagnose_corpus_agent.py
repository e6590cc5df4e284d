"""The corpus of planted-cause jobs (jobs/train_job.py) under the real agent with its default
configuration (only the output folder moved): ``otelbpf run -- python train_job.py ...``, then
the diagnosis of what it wrote. Each job prints what it planted (seconds in the planted
function, on the CPU and in all), and the diagnosis must name that function with its share
within 25%: the expected answer comes from the job, never from the output.

Under the defaults the profiler is on and the sched receiver off: a planted function's time on
the CPU is what the CPU samples can show; its time blocked (the checkpoint's fsync, a queue or
GIL wait, a log's fsync) is reported as unexplained, with what would show it (the sched
receiver) and the code the process's other threads ran meanwhile (the producer, the thread
holding the GIL).

An estimate from CPU samples has a sampling error: one sample stands for one period (10.1 ms at
99 Hz), and n samples' count varies by about sqrt(n). Where few samples are expected the
tolerance is 25% plus two such standard deviations, computed from the CPU time the job
measured, not from the output."""

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
JOBS = {
    "healthy": 60,
    "checkpoint": 60,
    "tokenize": 60,
    "both": 60,
    "sync_per_layer": 150,
    "pageable": 60,
    "loader": 30,
    "gil": 60,
    "logging": 300,
    "churn": 30,
    "tiny": 40,
    "mix": 60,
}
TOLERANCE = 0.25
PERIOD_S = 1 / 99  # the profiler's default sample_rate


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


def _noise(cpu_s: float) -> float:
    """Two standard deviations of a sampled estimate of ``cpu_s`` seconds on the CPU."""
    return 2 * (max(cpu_s, PERIOD_S) / PERIOD_S) ** 0.5 * PERIOD_S


def _unexplained(findings: list[Finding]) -> Finding:
    [f] = [f for f in findings if f.cause == "unexplained"] or [None]
    assert f is not None, [(f.cause, f.cost_s) for f in findings]
    return f


def _no_invented_cause(findings: list[Finding], cpu_s: float, allowed: tuple[str, ...] = ()) -> None:
    """Nothing but the unexplained rest, the ``allowed`` causes and host code within the CPU time
    the job spent in its gaps."""
    for f in findings:
        if f.cause == "host_code" and f.evidence["function"] not in allowed:
            assert f.cost_s <= cpu_s + _noise(cpu_s), (f, cpu_s)
        else:
            assert f.cause in ("unexplained", "host_code", *allowed), [(f.cause, f.cost_s) for f in findings]


def test_a_slow_data_loader_is_off_cpu_time_told_with_the_producer_it_waited_for(traced) -> None:
    findings = _of(traced, "loader")
    planted = traced[2]["loader"]
    off = planted["gaps"]["wall_s"] - planted["gaps"]["cpu_s"]  # the waits on the queue, in the gaps
    u = _unexplained(findings)
    assert abs(u.cost_s - off) <= TOLERANCE * off + _noise(planted["gaps"]["cpu_s"]), (u.cost_s, planted)
    assert "the sched receiver is off" in u.summary and "sched" in u.fix and "--receivers" in u.fix
    producer = next(iter(u.evidence["other_threads_code"]))
    assert "load_batch (train_job.py)" in producer and "load_batch" in u.summary, u.evidence
    _no_invented_cause(findings, planted["gaps"]["cpu_s"])


def test_a_python_side_thread_holding_the_gil_is_named_beside_the_waits(traced) -> None:
    findings = _of(traced, "gil")
    planted = traced[2]["gil"]
    # The GIL waits lie in the gaps Python times, and after each synchronize returns, inside
    # the call as Python times it; that time holds the synchronize's own wait too, at most the
    # step's queued GPU work (20 kernels).
    off = planted["gaps"]["wall_s"] - planted["gaps"]["cpu_s"]
    most = off + planted["sync_wall_s"]
    least = most - (planted["steps"] - 1) * 20 * planted["kernel_us"] / 1e6
    u = _unexplained(findings)
    slack = _noise(planted["gaps"]["cpu_s"])
    assert (1 - TOLERANCE) * least - slack <= u.cost_s <= (1 + TOLERANCE) * most + slack, (u.cost_s, least, most)
    assert "update_stats (train_job.py)" in next(iter(u.evidence["other_threads_code"])), u.evidence
    prepare = _code(findings, "prepare_step")  # the training thread's own Python, on the CPU
    cpu = planted["planted"]["prepare_step"]["cpu_s"]
    assert abs(prepare.cost_s - cpu) <= TOLERANCE * cpu + _noise(cpu), (prepare.cost_s, cpu)
    _no_invented_cause(findings, planted["gaps"]["cpu_s"], ("prepare_step",))


def test_logging_with_an_fsync_per_step_is_off_cpu_time_not_a_sync_storm(traced) -> None:
    findings = _of(traced, "logging")
    planted = traced[2]["logging"]
    off = planted["gaps"]["wall_s"] - planted["gaps"]["cpu_s"]  # the fsyncs (and any wait for a CPU)
    logged = planted["planted"]["log_step"]
    assert logged["wall_s"] - logged["cpu_s"] >= 0.5 * off  # what was planted is most of it
    u = _unexplained(findings)
    # The time off the CPU, within the sampling error of the gaps' CPU time: a sample is placed
    # at its timeline bucket's middle (65 us), inside these ~0.5 ms gaps. With 1 ms buckets about
    # half the samples missed them and their CPU time read as unexplained too (141 ms for 95 ms).
    slack = _noise(planted["gaps"]["cpu_s"])
    assert (1 - TOLERANCE) * off - slack <= u.cost_s <= (1 + TOLERANCE) * off + slack, (u.cost_s, planted)
    assert "--receivers cuda,gpu,profiling,sched" in u.summary
    assert "sync_storm" not in {f.cause for f in findings}  # one synchronize a step: no storm
    _no_invented_cause(findings, planted["gaps"]["cpu_s"])


def test_allocator_churn_is_memory_churn_with_every_call(traced) -> None:
    findings = _of(traced, "churn")
    planted = traced[2]["churn"]
    [churn] = [f for f in findings if f.cause == "memory_churn"] or [None]
    assert churn is not None, [(f.cause, f.cost_s) for f in findings]
    calls = planted["calls"]
    assert churn.evidence["calls"] == sum(c["count"] for c in calls.values()), (churn.evidence, calls)
    timed = sum(c["seconds"] for c in calls.values())  # around each call, from Python: an upper bound
    assert 0.25 * timed <= churn.cost_s <= timed, (churn.cost_s, timed)
    # beside it at most the Python that made the calls (ctypes' own cost, between them, on the
    # CPU in the gaps): no sync_storm, nothing the job did not do
    assert "sync_storm" not in {f.cause for f in findings}, [(f.cause, f.cost_s) for f in findings]
    _no_invented_cause(findings, planted["gaps"]["cpu_s"], ("memory_churn",))


def test_tiny_kernels_are_launch_bound_with_every_launch(traced) -> None:
    findings = _of(traced, "tiny")
    assert findings and findings[0].cause == "launch_bound", [(f.cause, f.cost_s) for f in findings]
    assert findings[0].evidence["launches"] == traced[2]["tiny"]["launches"]
    # the gaps are the launching: no "host code while the GPU had nothing queued" beside it
    assert "host_code" not in {f.cause for f in findings}, [(f.cause, f.cost_s) for f in findings]


def test_two_causes_in_other_proportions_each_get_their_planted_share(traced) -> None:
    findings = _of(traced, "mix")
    planted = traced[2]["mix"]["planted"]
    checkpoint, tokenize = _code(findings, "save_checkpoint"), _code(findings, "tokenize_batch")
    for found, function in ((checkpoint, "save_checkpoint"), (tokenize, "tokenize_batch")):
        _close(found, planted[function])
        share = planted[function]["cpu_s"] / found.evidence["window_s"]  # the planted share of the window
        assert abs(found.share - share) <= TOLERANCE * share, (found.share, share)
    assert [f.evidence.get("function") for f in findings][:2] == ["save_checkpoint", "tokenize_batch"]
