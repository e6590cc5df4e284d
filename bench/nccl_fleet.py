"""Scale of the fleet straggler signal and its Prometheus rules (issue 35, docs/stragglers.md).

    .venv/bin/python bench/nccl_fleet.py [--ranks 1024] [--per-node 8] [--rounds 6] [--out FILE]

A job of ``--ranks`` ranks on nodes of ``--per-node``, each rank in 8 communicators (the world,
and groups of 8, 16, 32, ... ranks: tensor-, pipeline-, data-parallel style), ``--slow`` (517) late by
40 ms on every collective. Its NCCL events are generated (init seen, collectives that return at
completion) and fed, per node, to an NcclCorrelator as that node's agent runs it; each node's
metrics go through the real ``prometheus`` exporter (otelbpf/export/prometheus.py), one HTTP
endpoint per node. A real Prometheus (Debian's ``prometheus``) scrapes them every 15 s (a round
of events between scrapes) and evaluates deploy/prometheus/otelbpf-nccl.rules.yaml as often.
Reported: series exported and in Prometheus's head, series each rule records, each rule group's
evaluation time, the correlators' time per collective, and whether the alert names the planted
rank and its node.

Results: a table on stdout and bench/results/nccl_fleet-<date>.json; docs/BENCHMARKS.md, "NCCL
stragglers across nodes".
"""

# ruff: noqa: E402  # the imports follow the sys.path fix below

from __future__ import annotations

import sys
from pathlib import Path

# The script's own folder first on sys.path would let bench/http.py shadow the standard library's
# http (urllib.request needs http.client): the repository instead.
sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import datetime as dt
import hashlib
import json
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request

import numpy as np
import yaml
from opentelemetry.sdk.metrics.export import MetricsData, ResourceMetrics, ScopeMetrics

REPO = Path(__file__).resolve().parents[1]

from otelbpf.base.events import EVENT_DTYPE, Kind, NcclFunc  # noqa: E402
from otelbpf.correlate.base import CorrelatorSettings  # noqa: E402
from otelbpf.correlate.clock import MonotonicClock  # noqa: E402
from otelbpf.correlate.process_info import ProcessInfo  # noqa: E402
from otelbpf.export.prometheus import PrometheusExporter  # noqa: E402
from otelbpf.families.nccl.correlator import SCOPE, NcclCorrelator  # noqa: E402
from otelbpf.families.nccl.launch_env import Launch  # noqa: E402

RULES = REPO / "deploy" / "prometheus" / "otelbpf-nccl.rules.yaml"
MS = 1_000_000
LATE_MS = 40
#: Prometheus scrapes and evaluates this often; a round's data is left up for a scrape at least.
SCRAPE_S = 15
PERIOD_MS, PER_ROUND = 300, 10  # a collective per communicator every 300 ms (simulated), 10 a round
F32_SUM = 1024 | 7 << 48  # count 1024, float32, sum
STREAM = 0x6000
JOB = "torchelastic:bench"


def comms_of(rank: int, ranks: int) -> list[tuple[int, int, int]]:
    """(comm id, rank in it, size) of the 8 communicators ``rank`` is in."""
    out = []
    for kind in range(8):
        size = ranks if kind == 0 else min(ranks, 8 << (kind - 1))
        group = rank // size
        digest = hashlib.blake2b(repr((kind, group)).encode(), digest_size=8).digest()
        out.append((int.from_bytes(digest, "little"), rank % size, size))
    return out


def node_events(node: int, per_node: int, ranks: int, slow: int, round_: int, rnd: np.random.Generator) -> np.ndarray:
    """One round of a node's ranks: every communicator's PER_ROUND collectives, entry and
        return rows; a collective returns 50 us after its group's last entry (the slow rank's,
        in its groups). Each communicator's calls come from a thread of their own, so none overlaps
    another on one thread."""
    rows = []
    for rank in range(node * per_node, (node + 1) * per_node):
        pid = 10_000 + rank
        for kind, (comm, crank, size) in enumerate(comms_of(rank, ranks)):
            slow_in = slow // size == rank // size
            for k in range(PER_ROUND):
                seq = round_ * PER_ROUND + k + 1
                t0 = (1000 + seq * PERIOD_MS + kind * 20) * MS
                enter = t0 + (LATE_MS * MS if rank == slow else 0) + int(rnd.uniform(0, 2 * MS))
                done = t0 + (LATE_MS * MS if slow_in else 0) + 2 * MS + 50_000
                packed, tid = crank | size << 32, pid * 16 + kind  # a thread per process group: no overlap
                rows.append(
                    (
                        enter,
                        packed,
                        pid,
                        tid,
                        Kind.NCCL_ENTER,
                        NcclFunc.ncclAllReduce,
                        0,
                        -1,
                        comm,
                        seq,
                        F32_SUM,
                        STREAM,
                    )
                )
                rows.append(
                    (max(done, enter + 10_000), 0, pid, tid, Kind.NCCL_RETURN, NcclFunc.ncclAllReduce, 0, 0, 0, 0, 0, 0)
                )
    arr = np.array(rows, dtype=EVENT_DTYPE)
    return arr[np.argsort(arr["ts_ns"], kind="stable")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def query(port: int, expr: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=30) as r:
        return list(json.loads(r.read())["data"]["result"])


def scalar(port: int, expr: str) -> float:
    result = query(port, expr)
    return float(result[0]["value"][1]) if result else 0.0


def head_series(port: int) -> int:
    """Series in Prometheus's head block (the scraped ones and the recorded ones)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/status/tsdb", timeout=30) as r:
        return int(json.loads(r.read())["data"]["headStats"]["numSeries"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--per-node", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--slow", type=int, default=517, help="the rank 40 ms late on every collective")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    nodes = args.ranks // args.per_node
    rnd = np.random.default_rng(35)
    correlators, exporters = [], []
    for n in range(nodes):
        launches = {
            10_000 + r: Launch(r, args.ranks, "env:RANK", JOB)
            for r in range(n * args.per_node, (n + 1) * args.per_node)
        }
        settings = CorrelatorSettings(ProcessInfo({"host.name": f"node-{n:03d}"}), MonotonicClock(), lambda spans: None)
        c = NcclCorrelator(settings, launch_of=launches.get, completion_timeout_ns=500 * MS, max_spans_per_second=0)
        # init seen: each rank's ncclCommInitRank tells its 8 communicators (id, rank, size)
        inits = [
            (MS, 0, pid, pid, Kind.NCCL_COMM, NcclFunc.ncclCommInitRank, 0, 0, 0, comm, crank | size << 32, 0)
            for pid in launches
            for comm, crank, size in comms_of(pid - 10_000, args.ranks)
        ]
        c.on_events(np.array(inits, dtype=EVENT_DTYPE))
        correlators.append(c)
        exporters.append(PrometheusExporter("127.0.0.1", 0))
    work = Path(tempfile.mkdtemp(prefix="otelbpf-fleet-"))
    prom_port = free_port()
    (work / "prometheus.yml").write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"},
                "rule_files": [str(RULES)],
                "scrape_configs": [
                    {"job_name": "otelbpf", "static_configs": [{"targets": [f"127.0.0.1:{e.port}" for e in exporters]}]}
                ],
            }
        )
    )
    prom = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(work / "prometheus.log", "w"),  # noqa: SIM115
    )
    feed_s, collectives = 0.0, 0
    try:
        for round_ in range(args.rounds):
            started = time.monotonic()
            for n, (c, e) in enumerate(zip(correlators, exporters, strict=True)):
                arr = node_events(n, args.per_node, args.ranks, args.slow, round_, rnd)
                t = time.perf_counter()
                c.on_events(arr)
                feed_s += time.perf_counter() - t
                collectives += len(arr) // 2
                e.export(
                    MetricsData(
                        resource_metrics=[
                            ResourceMetrics(
                                schema_url="",
                                resource=res,
                                scope_metrics=[ScopeMetrics(scope=SCOPE, metrics=ms, schema_url="")],
                            )
                            for res, ms in c.collect()
                        ]
                    )
                )
            print(f"round {round_ + 1}/{args.rounds}: fed in {time.monotonic() - started:.1f}s", file=sys.stderr)
            time.sleep(SCRAPE_S + 1)  # scraped while nothing else runs: 128 endpoints share one process
        time.sleep(SCRAPE_S + 1)  # the rules evaluated once more after the last scrape
        with urllib.request.urlopen(f"http://127.0.0.1:{prom_port}/api/v1/rules", timeout=30) as r:
            groups = json.loads(r.read())["data"]["groups"]
        recorded = {
            rule["name"]: scalar(prom_port, f"count({rule['name']})")
            for g in groups
            for rule in g["rules"]
            if rule["type"] == "recording"
        }
        alerts = query(prom_port, 'ALERTS{alertname="NcclStraggler"}')
        result = {
            "date": dt.date.today().isoformat(),
            "ranks": args.ranks,
            "nodes": nodes,
            "communicators_per_rank": 8,
            "communicators": len({comm for r in range(args.ranks) for comm, _, _ in comms_of(r, args.ranks)}),
            "series_scraped": scalar(prom_port, 'sum(scrape_samples_scraped{job="otelbpf"})'),
            "series_signal": {
                name: scalar(prom_port, f'count({{__name__=~"{name}"}})')
                for name in (
                    "nccl_collective_wait_seconds_bucket",
                    "nccl_collective_wait_seconds_sum",
                    "nccl_collective_wait_seconds_count",
                    "nccl_collective_phase_seconds_total",
                )
            },
            "head_series": head_series(prom_port),
            "recorded_series": recorded,
            "rule_groups_s": {g["name"]: g["evaluationTime"] for g in groups},
            "scrape_duration_s_max": scalar(prom_port, 'max(scrape_duration_seconds{job="otelbpf"})'),
            "correlator_us_per_collective": 1e6 * feed_s / collectives,
            "alerts": [
                {k: a["metric"].get(k) for k in ("nccl_rank", "host_name", "nccl_comm_id", "nccl_straggler_class")}
                for a in alerts
            ],
        }
    finally:
        prom.terminate()
        prom.wait(30)
        for e in exporters:
            e.shutdown()
    print(json.dumps(result, indent=2))
    named = {(a["nccl_rank"], a["host_name"]) for a in result["alerts"]}
    slow_node = f"node-{args.slow // args.per_node:03d}"
    ok = bool(named) and all(host == slow_node for _, host in named)
    print(
        f"alert names only {slow_node}: {ok} ({len(result['alerts'])} alerts: one per communicator of rank {args.slow})"
    )
    out = args.out or REPO / "bench" / "results" / f"nccl_fleet-{result['date']}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
