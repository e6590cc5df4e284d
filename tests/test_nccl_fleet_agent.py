"""End to end across nodes: a real Prometheus (Debian's ``prometheus`` package) scrapes two real
agents, each watching half the ranks of one NCCL job as its own node (``host.name`` node-a and
node-b, through the ``prometheus`` exporter), and evaluates deploy/prometheus/otelbpf-nccl.rules.yaml:
the straggler on node-b (rank 2, 40 ms late on every collective) is named with its host by the
rules, by node-b's agent live, and by ``otelbpf stragglers`` over both nodes' files."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
import yaml

from harness.agent import BUILD, REPO, AgentProcess

pytestmark = [
    pytest.mark.bpf,
    pytest.mark.usefixtures("built"),
    # Under CI=true this must run: a missing prometheus fails there (scripts/setup.sh --test installs it).
    pytest.mark.skipif(
        shutil.which("prometheus") is None and os.environ.get("CI") != "true",
        reason="prometheus (Debian package: scripts/setup.sh --test) is not installed",
    ),
]

JOB = BUILD / "nccl_job"
RULES = REPO / "deploy" / "prometheus" / "otelbpf-nccl.rules.yaml"
SLOW = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def agent_config(tmp: Path, host: str, port: int) -> Path:
    pipeline = {"receivers": ["cuda", "nccl"], "processors": ["resource", "batch"]}
    doc = {
        "receivers": {"cuda": {"search_paths": []}, "nccl": {"search_paths": []}},
        "processors": {"batch": {"timeout": "100ms"}, "resource": {"attributes": {"host.name": host}}},
        "exporters": {"file": {"directory": str(tmp / host)}, "prometheus": {"endpoint": f"127.0.0.1:{port}"}},
        "service": {
            "pipelines": {
                "traces": {**pipeline, "exporters": ["file"]},
                "metrics": {**pipeline, "exporters": ["file", "prometheus"]},
            },
            "telemetry": {"metrics_interval": "500ms", "drain_interval": "20ms"},
        },
    }
    path = tmp / f"{host}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def ranks_of(job_pid: int, n: int, timeout: float = 30) -> dict[int, int]:
    """rank -> pid of the job's rank processes (its children, by their RANK)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = Path(f"/proc/{job_pid}/task/{job_pid}/children").read_text().split()
        ranks = {}
        for pid in map(int, children):
            env = dict(
                item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in item
            )
            if "RANK" in env:
                ranks[int(env["RANK"])] = pid
        if len(ranks) == n:
            return ranks
        time.sleep(0.1)
    raise AssertionError(f"job {job_pid} did not start {n} ranks")


def query(port: int, expr: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.loads(r.read())
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def test_prometheus_names_the_straggler_on_the_other_node(tmp_path):
    ports = {"node-a": free_port(), "node-b": free_port()}
    prom_port = free_port()
    (tmp_path / "prometheus.yml").write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(RULES)],
                "scrape_configs": [
                    {"job_name": "otelbpf", "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in ports.values()]}]}
                ],
            }
        )
    )
    job = subprocess.Popen(
        [
            str(JOB),
            *("--ranks", "4", "--iterations", "400", "--completion", "stream", "--hold-ms", "150000"),
            *("--jitter-ms", "3", "--slow-rank", str(SLOW), "--slow-kind", "host", "--slow-ms", "40"),
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    prom = None
    try:
        ranks = ranks_of(job.pid, 4)
        halves = {"node-a": (ranks[0], ranks[1]), "node-b": (ranks[2], ranks[3])}
        with (
            AgentProcess(
                ["-c", str(agent_config(tmp_path, "node-a", ports["node-a"]))]
                + [a for p in halves["node-a"] for a in ("--pid", str(p))]
            ) as a,
            AgentProcess(
                ["-c", str(agent_config(tmp_path, "node-b", ports["node-b"]))]
                + [a for p in halves["node-b"] for a in ("--pid", str(p))]
            ) as b,
        ):
            for agent in (a, b):
                agent.wait_ready()
                agent.wait_attached(BUILD / "fakenccl" / "libnccl.so.2")
            prom = subprocess.Popen(
                [
                    "prometheus",
                    f"--config.file={tmp_path / 'prometheus.yml'}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=open(tmp_path / "prometheus.log", "w"),  # noqa: SIM115  # closed with the process
            )
            os.killpg(job.pid, signal.SIGUSR1)  # the ranks start their collectives, probed on both nodes
            named: list[dict] = []
            pending: list[dict] = []
            reporting: list[dict] = []
            # Until both nodes' ranks have two scrapes each (a rate) and the rules named someone;
            # the job may end first: its series stay in the rules' 5-minute window.
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not (named and pending and len(reporting) == 1):
                time.sleep(1)
                try:
                    reporting = query(prom_port, "nccl_comm:ranks:count5m == 4")
                    named = query(prom_port, "nccl_rank:straggler_deficit_seconds:5m")
                    pending = query(prom_port, 'ALERTS{alertname="NcclStraggler"}')
                except OSError:
                    continue  # not listening yet
            reporting = query(prom_port, "nccl_comm:ranks:count5m")
            out, _ = job.communicate(timeout=120)
            a.stop()
            b.stop()
    finally:
        job.kill()
        if prom is not None:
            prom.terminate()
            prom.wait(30)
    assert [int(v["value"][1]) for v in reporting] == [4], reporting
    assert [(r["metric"]["nccl_rank"], r["metric"]["host_name"]) for r in named] == [(str(SLOW), "node-b")], (
        named,
        (tmp_path / "prometheus.log").read_text()[-2000:],
    )
    assert 0.02 < float(named[0]["value"][1]) < 0.06
    assert [(x["metric"]["nccl_rank"], x["metric"]["host_name"]) for x in pending] == [(str(SLOW), "node-b")]
    assert pending[0]["metric"]["nccl_straggler_class"] == "host-slow"
    summary = json.loads(out.strip().splitlines()[-1])
    assert all(r["ended"] == "completed" for r in summary["ranks"])
    # node-b's agent names it live; the offline report over both nodes names the same rank
    live: Counter[int] = Counter()
    for line in (tmp_path / "node-b" / "traces.jsonl").read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for sp in ss["spans"]:
                    if any(e["name"] == "nccl.straggler" for e in sp.get("events", [])):
                        live.update(
                            int(next(iter(x["value"].values()))) for x in sp["attributes"] if x["key"] == "nccl.rank"
                        )
    # the planted rank, collective after collective; another may be late once on a loaded host
    # (rank 3 once in a full run beside other work), never as often
    [(first, times), *others] = live.most_common()
    assert first == SLOW and all(n * 5 <= times for _, n in others), live
    report = subprocess.run(
        [
            sys.executable,
            "-m",
            "otelbpf.cli",
            "stragglers",
            str(tmp_path / "node-a"),
            str(tmp_path / "node-b"),
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr
    assert [r["rank"] for r in json.loads(report.stdout)["stragglers"]] == [SLOW]
