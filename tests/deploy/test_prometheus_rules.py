"""deploy/prometheus/otelbpf-nccl.rules.yaml under ``promtool test rules``, fed the series the
NCCL correlator really exports (synthetic events through NcclCorrelator, named as the
Collector's prometheus exporter names them: prometheus_names.py): two agents each watching half
the ranks of one job (two nodes), rank 2 late by 40 ms, make the alert name rank 2 and its host,
with its class; a healthy job, ranks disagreeing on the world size and a communicator of one
rank make none. promtool comes with Debian's ``prometheus`` package."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import pytest
import yaml
from prometheus_names import OtlpMetric, label_name, metric_name

from harness.nccl_events import MS, Events, blocking_job, correlator, feed, torchrun
from otelbpf.families.nccl.correlator import NcclCorrelator
from otelbpf.families.nccl.launch_env import Launch

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "otelbpf-nccl.rules.yaml"
PROMTOOL = shutil.which("promtool")
# Under CI=true the rules must be tested: a missing promtool fails there (scripts/setup.sh --test installs it).
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None and os.environ.get("CI") != "true",
    reason="promtool (Debian package prometheus: scripts/setup.sh --test) is not installed",
)

#: One scrape a minute, 12 minutes: the rules' [5m] rates see 5 samples at the end.
MINUTES = 12
#: The metrics the rules read.
SIGNAL = ("nccl.collective.wait", "nccl.collective.phase")

Series = dict[tuple[str, tuple[tuple[str, str], ...]], list[float]]  # (name, labels) -> a value a minute


def scrape(c: NcclCorrelator, into: Series, minute: int) -> None:
    """The signal's series as Prometheus would store them after this scrape."""
    for _, metrics in c.collect():
        for m in metrics:
            if m.name not in SIGNAL:
                continue
            histogram = m.name == "nccl.collective.wait"
            base = metric_name(OtlpMetric(m.name, m.unit, "histogram" if histogram else "sum", True))
            for dp in m.data.data_points:
                labels = tuple(sorted((label_name(k), str(v)) for k, v in dp.attributes.items()))
                values = {"_sum": dp.sum, "_count": dp.count} if histogram else {"": dp.value}
                for suffix, v in values.items():
                    into.setdefault((base + suffix, labels), [float("nan")] * MINUTES)[minute] = float(v)


def run_nodes(nodes: Iterable[tuple[str, dict[int, Launch]]], job: Callable[[range], Events]) -> Series:
    """One correlator (agent) per node, watching its ranks of ``job``; fed a twelfth of the job
    a minute and scraped after each."""
    series: Series = {}
    for host, launches in nodes:
        c, _ = correlator(launches, host=host, completion_timeout_ns=500 * MS)
        ranks = sorted(pid - 100 for pid in launches)
        arr = job(range(ranks[0], ranks[-1] + 1)).array()
        for minute, part in enumerate(np.array_split(arr, MINUTES)):
            one = Events()
            one.rows = [tuple(r) for r in part.tolist()]
            if one.rows:
                feed(c, one)
            scrape(c, series, minute)
    return series


def promtool_file(tmp: Path, series: Series, alerts: list[dict], ranks: int | None = None) -> Path:
    """A promtool unit test: the alerts expected at the end, and (``ranks``) that so many ranks
    have a mean wait then (the rules saw the data)."""

    def values(vs: list[float]) -> str:
        return " ".join("_" if v != v else repr(v) for v in vs)

    def selector(name: str, labels: tuple[tuple[str, str], ...]) -> str:
        return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}"

    doc = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": selector(n, ls), "values": values(vs)} for (n, ls), vs in series.items()],
                "alert_rule_test": [
                    {"eval_time": f"{MINUTES - 1}m", "alertname": "NcclStraggler", "exp_alerts": alerts}
                ],
                "promql_expr_test": [
                    {
                        "expr": "count(nccl_rank:collective_wait_seconds:mean5m)",
                        "eval_time": f"{MINUTES - 1}m",
                        "exp_samples": [{"labels": "{}", "value": ranks}],
                    }
                ]
                if ranks is not None
                else [],
            }
        ],
    }
    path = tmp / "nccl_rules_test.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None, "promtool is missing (Debian package prometheus: scripts/setup.sh --test)"
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120)


def two_nodes(world: int = 4) -> list[tuple[str, dict[int, Launch]]]:
    half = world // 2
    return [
        ("node-a", {100 + r: torchrun(r, world) for r in range(half)}),
        ("node-b", {100 + r: torchrun(r, world) for r in range(half, world)}),
    ]


@needs_promtool
def test_the_rules_file_is_valid() -> None:
    out = promtool("check", "rules", str(RULES))
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_rules_read_the_metrics_the_agent_exports_under_their_prometheus_names() -> None:
    c, _ = correlator({100 + r: torchrun(r) for r in range(4)}, completion_timeout_ns=500 * MS)
    feed(c, blocking_job(8, 0))
    exported: set[str] = set()
    for _, metrics in c.collect():
        for m in metrics:
            histogram = type(m.data).__name__ == "Histogram"
            base = metric_name(OtlpMetric(m.name, m.unit, "histogram" if histogram else "sum", True))
            exported |= {base + s for s in ("_sum", "_count", "_bucket")} if histogram else {base}
    # every name the expressions read that is not a label or a recorded series
    exprs = " ".join(r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"])
    labels = {"nccl_job_id", "nccl_comm_id", "nccl_rank", "nccl_phase_part", "nccl_straggler_class"}
    read = set(re.findall(r"(?<![:\w])(nccl_[a-z_]+)(?![:\w])", exprs)) - labels
    assert read == {
        "nccl_collective_wait_seconds_sum",
        "nccl_collective_wait_seconds_count",
        "nccl_collective_phase_seconds_total",
    }
    assert read <= exported, read - exported


@needs_promtool
def test_the_straggler_on_the_other_node_is_named_with_its_host_and_class(tmp_path: Path) -> None:
    series = run_nodes(two_nodes(), lambda ranks: blocking_job(240, 40, ranks=ranks))
    comm = {dict(ls)["nccl_comm_id"] for _, ls in series}
    assert len(comm) == 1, "one communicator across the two nodes"
    comm_id = comm.pop()
    alert = {
        "exp_labels": {
            "severity": "warning",
            "nccl_job_id": "torchelastic:a",
            "nccl_comm_id": comm_id,
            "nccl_rank": "2",
            "host_name": "node-b",
            "nccl_straggler_class": "host-slow",
        },
        "exp_annotations": {
            "summary": "NCCL straggler: rank 2 on node-b",
            "description": f"Rank 2 of communicator {comm_id} (job torchelastic:a) on host node-b arrives last at its "
            "collectives: it waits less per collective than the median rank, which waits for it, by the alert's "
            "value in seconds. Class: host-slow.",
        },
    }
    out = promtool("test", "rules", str(promtool_file(tmp_path, series, [alert], 4)))
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("case", ["healthy", "world_size_disagrees", "one_rank"])
@needs_promtool
def test_no_straggler_is_named(tmp_path: Path, case: str) -> None:
    rnd = np.random.default_rng(11)
    table = rnd.uniform(0, 20 * MS, size=(240, 4))
    if case == "healthy":
        series = run_nodes(
            two_nodes(), lambda ranks: blocking_job(240, 0, ranks=ranks, jitter=lambda k, r: table[k, r])
        )
    elif case == "world_size_disagrees":  # rank 3 (slow) says WORLD_SIZE=8: a communicator of its own
        nodes = two_nodes()
        nodes[1][1][103] = Launch(3, 8, "env:RANK", "torchelastic:a")
        series = run_nodes(nodes, lambda ranks: blocking_job(240, 40, slow=3, ranks=ranks))
    else:
        nodes = [("node-a", {100: torchrun(0, 1)})]
        series = run_nodes(nodes, lambda ranks: blocking_job(240, 0, ranks=ranks, world=1, slow=-1))
    assert series
    ranks = 1 if case == "one_rank" else 4
    out = promtool("test", "rules", str(promtool_file(tmp_path, series, [], ranks)))
    assert out.returncode == 0, out.stdout + out.stderr
