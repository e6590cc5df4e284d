"""End to end: the real agent, real eBPF, multi-process NCCL jobs, a real collector.

Every test runs `otelbpf run -- nccl_job ...` (examples/nccl/: ranks are processes that meet
in shared memory, so a collective really waits for the last rank) with the cuda and nccl
receivers, exporting both to rotel (OTLP/gRPC) and to OTLP-JSON files, then checks what
reached the collector against what the job says it did, and runs `otelbpf stragglers` on
the files.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from harness.agent import BUILD, REPO, AgentProcess
from otelbpf.correlate.adaptive import Params
from otelbpf.families.nccl.probes import comm_id, split_comm_id

pytestmark = [pytest.mark.bpf, pytest.mark.usefixtures("built")]

JOB = BUILD / "nccl_job"
REAL_NCCL_PY = REPO / "examples" / "nccl" / "real_nccl.py"


def write_config(tmp: Path, collector=None, threshold: str | None = "10ms", profiling: bool = False) -> Path:
    exporters: dict = {"file": {"directory": str(tmp / "out")}}
    if collector is not None:
        exporters["otlp"] = {"endpoint": collector.grpc_endpoint, "timeout": "2s"}
    pipeline = {"receivers": ["cuda", "nccl"], "processors": ["batch"], "exporters": list(exporters)}
    doc = {
        "receivers": {
            "cuda": {"search_paths": []},
            "nccl": {"search_paths": [], **({"straggler_threshold": threshold} if threshold else {})},
            **({"profiling": {"interval": "1s", "cuda_memory": False}} if profiling else {}),
        },
        "processors": {"batch": {"timeout": "100ms"}},
        "exporters": exporters,
        "service": {
            "pipelines": {"traces": pipeline, "metrics": pipeline},
            "telemetry": {"metrics_interval": "300ms", "drain_interval": "20ms", "log_level": "info"},
        },
    }
    if profiling:
        doc["service"]["pipelines"]["profiles"] = {"receivers": ["profiling"], "exporters": ["file"]}
    path = tmp / "otelbpf.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def run_job(tmp: Path, collector, *args: object, threshold: str = "10ms", profiling: bool = False) -> dict:
    """Run nccl_job under the agent (command mode); its JSON summary."""
    cfg = write_config(tmp, collector, threshold, profiling)
    with AgentProcess(["-c", str(cfg), "--", str(JOB), *map(str, args)]) as agent:
        assert agent.wait(120) == 0, agent.output
    line = next((x for x in agent.output.splitlines() if x.startswith('{"workload":"nccl_job"')), None)
    assert line, agent.output
    return json.loads(line)


def stragglers(*paths: Path, extra: tuple[str, ...] = ()) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "otelbpf.cli", "stragglers", *map(str, paths), "--json", *extra],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def nccl_spans(collector, pid: int, name: str | None = None):
    return [s for s in collector.spans(name) if s.scope_name == "otelbpf.nccl" and s.resource.get("process.pid") == pid]


def by_rank(job: dict) -> dict[int, int]:
    return {r["rank"]: r["pid"] for r in job["ranks"]}


def findings(spans) -> list[dict]:
    return [attrs for s in spans for name, attrs in s.events if name == "nccl.straggler"]


def value(collector, name: str, **filters) -> float | None:
    """The newest value (a histogram's count) of the one series matching; None before any."""
    points = collector.latest_points(name, **filters)
    assert len(points) <= 1, f"{name} {filters}: {points}"
    if not points:
        return None
    return points[0].value if points[0].kind != "histogram" else points[0].count


# ---- one slow rank: named, and classified, live and offline


@pytest.mark.parametrize("kind, slow, expected", [("compute", 2, "compute-slow"), ("host", 1, "host-slow")])
def test_a_slow_rank_is_named_with_its_class_live_and_offline(otlp_collector, tmp_path, kind, slow, expected):
    iters = 12
    job = run_job(
        tmp_path,
        otlp_collector,
        "--ranks",
        4,
        "--iterations",
        iters,
        "--slow-rank",
        slow,
        "--slow-kind",
        kind,
        "--slow-ms",
        40,
    )
    pids = by_rank(job)
    c = otlp_collector
    c.wait_for(
        lambda: all(len(nccl_spans(c, pid, "ncclAllReduce")) == iters for pid in pids.values()),
        what=f"{iters} ncclAllReduce spans per rank",
    )
    world = comm_id(bytes.fromhex(job["unique_id"]))
    waits = {}
    for rank, pid in pids.items():
        spans = sorted(nccl_spans(c, pid, "ncclAllReduce"), key=lambda s: s.attributes["nccl.seq"])
        assert [s.attributes["nccl.seq"] for s in spans] == list(range(1, iters + 1))
        for s in spans:
            a = s.attributes
            assert (a["nccl.comm.id"], a["nccl.rank"], a["nccl.nranks"]) == (f"{world:016x}", rank, 4)
            assert (a["nccl.op"], a["nccl.count"], a["nccl.datatype"], a["nccl.bytes"]) == (
                "AllReduce",
                1024,
                "float32",
                4096,
            )
            assert (a["nccl.reduction"], a["cuda.stream"], a["nccl.completion"]) == ("sum", "0x6000", "observed")
            assert a["nccl.sync.function"] == "cudaStreamSynchronize" and a["nccl.result"] == "ncclSuccess"
            assert s.start_ns < s.end_ns and s.status_code != "STATUS_CODE_ERROR"
        waits[rank] = statistics.median(s.attributes["nccl.wait.duration"] for s in spans)
        found = findings(spans)
        if rank == slow:
            assert len(found) >= iters - Params().min_collectives, "late in every collective once the window holds"
            assert {f["nccl.straggler.class"] for f in found} == {expected}
            assert all(f["nccl.straggler.lateness"] > 0.02 and f["nccl.straggler.peers"] == 3 for f in found)
        else:
            assert not found
    assert waits[slow] < min(w for r, w in waits.items() if r != slow) / 3, "the others wait for the slow rank"

    c.wait_for(lambda: c.latest_points("nccl.straggler", **{"process.pid": pids[slow]}), what="straggler metric")
    for rank, pid in pids.items():
        f = {"process.pid": pid, "nccl.op": "AllReduce"}
        c.wait_for(lambda f=f: value(c, "nccl.wait.duration", **f) == iters, what=f"rank {rank} final metrics")
        assert value(c, "nccl.collectives", **f) == iters
        assert value(c, "nccl.bytes", **f) == iters * 4096
        assert value(c, "nccl.algorithm.bandwidth", **f) == iters
    # live findings start once the detector's window holds min_collectives comparisons
    assert (
        value(c, "nccl.straggler", **{"process.pid": pids[slow], "nccl.straggler.class": expected})
        >= iters - Params().min_collectives
    )

    report = stragglers(tmp_path / "out")
    assert [(r["rank"], r["cls"]) for r in report["stragglers"]] == [(slow, expected)]
    top = report["stragglers"][0]
    assert top["pid"] == pids[slow] and top["straggled"] >= iters - 1 and top["collectives"] == iters
    assert report["ranks"][0]["rank"] == slow and not report["stopped"]
    text = subprocess.run(
        [sys.executable, "-m", "otelbpf.cli", "stragglers", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    ).stdout
    assert f"1. rank {slow} (" in text and f"{expected}, last in" in text


def test_a_communication_slow_rank_is_named_offline(tmp_path):
    """Its side of each collective completes late, so it enters the next one late, with a
    normal compute phase: the previous collective's completion explains the lateness."""
    job = run_job(
        tmp_path, None, "--ranks", 3, "--iterations", 12, "--slow-rank", 0, "--slow-kind", "comm", "--slow-ms", 40
    )
    report = stragglers(tmp_path / "out")
    assert [(r["rank"], r["cls"], r["pid"]) for r in report["stragglers"]] == [
        (0, "communication-slow", by_rank(job)[0])
    ]


def test_the_differential_flame_graph_names_the_frame_planted_on_the_slow_rank(tmp_path):
    """Rank 1 burns its extra host time on the CPU in prepare_batch_on_host(); the healthy
    ranks never call it. With CPU profiles beside the spans, the straggler report names that
    function, and the pprof pair it writes reads back as a diff in go tool pprof."""
    slow = 1
    job = run_job(
        tmp_path,
        None,
        "--ranks",
        3,
        "--iterations",
        16,
        "--slow-rank",
        slow,
        "--slow-kind",
        "host",
        "--slow-ms",
        60,
        "--host-work",
        "spin",
        profiling=True,
    )
    report = stragglers(tmp_path / "out", extra=("--diff-profiles", str(tmp_path / "diff")))
    pids = by_rank(job)
    [straggler] = report["stragglers"]
    assert (straggler["rank"], straggler["pid"], straggler["cls"]) == (slow, pids[slow], "host-slow")
    frames = [f["function"] for f in straggler["explaining_frames"]]
    assert frames and frames[0] == "prepare_batch_on_host", straggler["explaining_frames"]
    # ~60 ms of wall time each iteration, spun on the CPU: its CPU share is what the host grants
    # (a fraction of it on a loaded 2-core VM); the healthy ranks never run it.
    assert straggler["explaining_frames"][0]["self_ms_per_s"] > 5
    [d] = report["profile_diffs"]
    assert d["slow_pid"] == pids[slow] and sorted(d["base_pids"]) == sorted(p for r, p in pids.items() if r != slow)
    assert "load_batch" not in frames  # every rank loads its batches alike
    top = subprocess.run(
        ["go", "tool", "pprof", "-top", "-diff_base", d["base_pprof"], d["slow_pprof"]],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert top.returncode == 0, top.stderr
    first = next(line for line in top.stdout.splitlines() if line.strip().endswith("prepare_batch_on_host"))
    assert not first.split()[0].startswith("-"), top.stdout
    # The HTML report carries the same comparison as a differential flame graph.
    page = tmp_path / "report.html"
    made = subprocess.run(
        [sys.executable, "-m", "otelbpf.cli", "report", str(tmp_path / "out"), "-o", str(page)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr
    text = page.read_text()
    data = json.loads(text.split("id='otelbpf-data'>", 1)[1].split("</script>", 1)[0].replace("\\u003c", "<"))
    [diff] = [f for f in data["flames"] if f["differential"]]

    def nodes(n):
        yield n
        for c in n["children"]:
            yield from nodes(c)

    planted = [n for n in nodes(diff["weights"][0]["tree"]) if n["name"] == "prepare_batch_on_host"]
    assert planted and all(n["delta"] > 0 for n in planted)
    assert f"rank {slow}" in text and "prepare_batch_on_host +" in text


# ---- attached late, completion through CUDA events, defaults


LATE_ITERS, LATE_SLOW = 24, 1
#: --completion -> (nccl.completion.method, nccl.completion.bound)
COMPLETIONS = {"query": ("event_query", None), "sync": ("event_sync", None), "wait": ("stream_wait", "upper")}


@pytest.fixture(scope="module")
def late_attached(tmp_path_factory):
    """Three jobs, one per completion method, each held after every rank's ncclCommInitRank; one
    agent (default straggler settings) attaches to all of them (one BCC compile), then each job
    is released in turn (one at a time: a job's lateness is its own). Per method: the job's
    summary, its ranks' ncclAllReduce spans (OTLP-JSON, by pid), the offline report, the log."""
    tmp = tmp_path_factory.mktemp("late")
    env = {**os.environ, "FAKENCCL_LINK_US": "200000"}
    jobs = {
        completion: subprocess.Popen(
            [
                str(JOB),
                "--ranks",
                "3",
                "--iterations",
                str(LATE_ITERS),
                "--completion",
                completion,
                "--hold-ms",
                "150000",
                "--jitter-ms",
                "5",
                "--slow-rank",
                str(LATE_SLOW),
                "--slow-kind",
                "host",
                "--slow-ms",
                "40",
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        for completion in COMPLETIONS
    }
    outs = {}
    try:
        cfg = write_config(tmp, None, threshold=None)
        with AgentProcess(["-c", str(cfg), *(a for j in jobs.values() for a in ("--pid", str(j.pid)))]) as agent:
            agent.wait_ready()
            for lib in (BUILD / "fakenccl" / "libnccl.so.2", BUILD / "fakecudart" / "libcudart.so.12"):
                agent.wait_attached(lib)
            for completion, job in jobs.items():
                os.killpg(job.pid, signal.SIGUSR1)  # ends the ranks' --hold-ms: they start after init, probed
                outs[completion], _ = job.communicate(timeout=120)
            agent.stop()
    finally:
        for job in jobs.values():
            job.kill()
    spans = defaultdict(list)
    for line in (tmp / "out" / "traces.jsonl").read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            res = {a["key"]: a["value"] for a in rs["resource"]["attributes"]}
            pid = int(res["process.pid"]["intValue"])
            for ss in rs["scopeSpans"]:
                spans[pid] += [sp for sp in ss["spans"] if sp["name"] == "ncclAllReduce"]
    report = stragglers(tmp / "out")
    return {c: (json.loads(out.strip().splitlines()[-1]), spans, report, agent.output) for c, out in outs.items()}


@pytest.mark.parametrize("completion", sorted(COMPLETIONS))
def test_attached_after_init_ranks_from_the_environment_a_40ms_straggler_with_defaults(late_attached, completion):
    """The job runs first; the agent attaches after every rank's ncclCommInitRank. Ranks come
    from torchrun's variables, collectives are matched by order, completion is what the CUDA
    events say (with ``wait``, the compute stream's later synchronize: an upper bound, said
    so), and the rank 40 ms late on every ~200 ms collective is named, live and offline; the
    healthy jittery ranks are not."""
    summary, spans, report, log = late_attached[completion]
    method, bound = COMPLETIONS[completion]
    iters, slow, pids = LATE_ITERS, LATE_SLOW, by_rank(summary)

    def attr(sp, key):
        for a in sp["attributes"]:
            if a["key"] == key:
                return next(iter(a["value"].values()))
        return None

    ids = set()
    for rank, pid in pids.items():
        mine = spans[pid]
        assert len(mine) == iters, f"rank {rank}: {len(mine)} spans; {sorted(spans)} {pids}\n{log[-3000:]}"
        assert {attr(s, "nccl.rank") for s in mine} == {str(rank)} or {attr(s, "nccl.rank") for s in mine} == {rank}
        assert {attr(s, "nccl.rank.source") for s in mine} == {"env:RANK"}
        sources = {int(attr(s, "nccl.seq")): attr(s, "nccl.comm.source") for s in mine}
        aligned = [q for q, src in sources.items() if src == "aligned"]
        assert aligned, f"rank {rank}: no collective placed: {sources}"
        placed = min(aligned)
        unplaced = {q: src for q, src in sources.items() if src != "aligned"}
        # late_comms.py: a completion known late (``wait``: at the next compute synchronize) can
        # leave a rank's first collectives unplaced, never one after the rank is placed.
        assert set(unplaced.values()) <= {"unaligned"} and all(q < placed for q in unplaced), sources
        assert not unplaced or completion == "wait", sources
        assert {attr(s, "nccl.completion.method") for s in mine} == {method}
        assert {attr(s, "nccl.completion.bound") for s in mine} == {bound}
        seqs = sorted(int(attr(s, "nccl.seq")) for s in mine)
        assert seqs == list(range(1, iters + 1))
        ids |= {attr(s, "nccl.comm.id") for s in mine}
        late = [s for s in mine for e in s.get("events", []) if e["name"] == "nccl.straggler"]
        if rank == slow:
            assert len(late) >= iters - Params().min_collectives - 2
        else:
            assert not late, f"rank {rank} is healthy"
    assert len(ids) == 1
    mine = set(pids.values())
    assert [(r["rank"], r["pid"]) for r in report["stragglers"] if r["pid"] in mine] == [(slow, pids[slow])]


# ---- what the spans say about groups, splits and every operation


def test_groups_splits_and_every_operation(otlp_collector, tmp_path):
    iters = 2
    job = run_job(
        tmp_path,
        otlp_collector,
        "--ranks",
        4,
        "--iterations",
        iters,
        "--group",
        "--split",
        "--ops",
        "allreduce,allgather,reducescatter,broadcast,reduce,sendrecv",
    )
    c = otlp_collector
    world = comm_id(bytes.fromhex(job["unique_id"]))
    c.wait_for(
        lambda: sum(len(nccl_spans(c, pid, "ncclCommDestroy")) for pid in by_rank(job).values()) == 8,
        what="both destroys of every rank",
    )
    for rank, pid in by_rank(job).items():
        spans = nccl_spans(c, pid)
        names = defaultdict(list)
        for s in spans:
            names[s.name].append(s)
        (init,) = names["ncclCommInitRank"]
        assert (init.attributes["nccl.comm.id"], init.attributes["nccl.rank"]) == (f"{world:016x}", rank)
        (split,) = names["ncclCommSplit"]
        half = split_comm_id(world, 0, rank % 2)
        assert split.attributes["nccl.comm.id"] == f"{half:016x}"
        assert split.attributes["nccl.comm.parent_id"] == f"{world:016x}"
        groups = names["ncclGroup"]
        assert len(groups) == iters and all(g.attributes["nccl.group.size"] == 8 for g in groups)
        children = defaultdict(list)
        for s in spans:
            if s.parent_span_id:
                children[s.parent_span_id].append(s)
        for g in groups:
            kids = children[g.span_id]
            assert sorted(k.name for k in kids) == sorted(
                [
                    "ncclAllReduce",
                    "ncclAllGather",
                    "ncclReduceScatter",
                    "ncclBroadcast",
                    "ncclReduce",
                    "ncclSend",
                    "ncclRecv",
                    "ncclAllReduce",
                ]
            )
            assert all(k.trace_id == g.trace_id and g.start_ns <= k.start_ns and k.end_ns <= g.end_ns for k in kids)
            assert all(k.attributes["nccl.completion"] == "observed" for k in kids)
        on_world = sorted(
            s.attributes["nccl.seq"]
            for s in spans
            if s.attributes.get("nccl.comm.id") == f"{world:016x}"
            and s.name not in ("ncclSend", "ncclRecv")
            and "nccl.seq" in s.attributes
        )
        assert on_world == list(range(1, 5 * iters + 1))
        halves = [s for s in names["ncclAllReduce"] if s.attributes["nccl.comm.id"] == f"{half:016x}"]
        assert sorted(s.attributes["nccl.seq"] for s in halves) == [1, 2]
        assert all((s.attributes["nccl.rank"], s.attributes["nccl.nranks"]) == (rank // 2, 2) for s in halves), (
            "a split's rank and size, learned from ncclCommUserRank/ncclCommCount"
        )
        (send,) = {s.attributes["nccl.peer"] for s in names["ncclSend"]}
        (recv,) = {s.attributes["nccl.peer"] for s in names["ncclRecv"]}
        assert (send, recv) == ((rank + 1) % 4, (rank + 3) % 4)
        assert sorted(s.attributes["nccl.seq"] for s in names["ncclSend"]) == [1, 2]
        assert all(s.attributes["nccl.bytes"] == 4 * 4096 for s in names["ncclAllGather"] + names["ncclReduceScatter"])
        assert {s.attributes["nccl.root"] for s in names["ncclBroadcast"] + names["ncclReduce"]} == {0}
        assert "nccl.reduction" not in names["ncclBroadcast"][0].attributes
        assert len(names["ncclCommDestroy"]) == 2


# ---- the real libnccl, no GPU


def test_real_libnccl_calls_become_spans_and_error_counts(otlp_collector, tmp_path):
    cfg = write_config(tmp_path, otlp_collector)
    with AgentProcess(["-c", str(cfg), "--", sys.executable, str(REAL_NCCL_PY)]) as agent:
        assert agent.wait(120) == 0, agent.output
    ran = json.loads(next(x for x in agent.output.splitlines() if x.startswith('{"lib"')))
    c = otlp_collector
    pid = ran["pid"]
    c.wait_for(lambda: nccl_spans(c, pid, "ncclGroup"), what="the group span")
    (init,) = nccl_spans(c, pid, "ncclCommInitRank")
    assert init.attributes["nccl.comm.id"] == f"{comm_id(bytes.fromhex(ran['unique_id'])):016x}"
    assert (init.attributes["nccl.rank"], init.attributes["nccl.nranks"]) == (2, 4)
    assert init.attributes["nccl.result"] == "ncclUnhandledCudaError" and init.status_code == "STATUS_CODE_ERROR"
    (allreduce,) = nccl_spans(c, pid, "ncclAllReduce")
    a = allreduce.attributes
    assert (a["nccl.result"], a["nccl.completion"], a["cuda.stream"]) == ("ncclInvalidArgument", "failed", "0xabc0")
    assert (a["nccl.count"], a["nccl.datatype"], a["nccl.reduction"]) == (1024, "float32", "max")
    assert "nccl.comm.id" not in a and "nccl.seq" not in a, "a NULL communicator has no id"
    (group,) = nccl_spans(c, pid, "ncclGroup")
    assert group.attributes["nccl.group.size"] == 0 and group.attributes["nccl.result"] == "ncclSuccess"
    c.wait_for(
        lambda: c.latest_points("nccl.errors", **{"process.pid": pid, "nccl.function": "ncclBroadcast"}),
        what="error counts",
    )
    for func in ("ncclAllReduce", "ncclBroadcast"):
        assert value(c, "nccl.errors", **{"process.pid": pid, "nccl.function": func}) == 1


# ---- bad input: a rank dies, a communicator goes away under its collectives, clocks disagree


def test_a_rank_dying_inside_a_collective(otlp_collector, tmp_path):
    job = run_job(tmp_path, otlp_collector, "--ranks", 4, "--iterations", 6, "--crash-rank", 2, "--crash-iter", 3)
    pids = by_rank(job)
    assert job["ranks"][2]["signal"] == 9
    c = otlp_collector
    c.wait_for(lambda: all(nccl_spans(c, pids[r], "ncclCommAbort") for r in (0, 1, 3)), what="the survivors' aborts")
    dead = sorted(nccl_spans(c, pids[2], "ncclAllReduce"), key=lambda s: s.attributes["nccl.seq"])
    assert [s.attributes["nccl.seq"] for s in dead] == [1, 2, 3, 4]
    last = dead[-1].attributes
    assert last["otelbpf.incomplete"] is True and last["nccl.completion"] == "process_exited"
    assert dead[-1].status_code == "STATUS_CODE_ERROR"
    for r in (0, 1, 3):
        spans = nccl_spans(c, pids[r], "ncclAllReduce")
        assert sorted(s.attributes["nccl.seq"] for s in spans) == [1, 2, 3, 4]
        assert all(s.attributes["nccl.completion"] == "observed" for s in spans)
    c.wait_for(lambda: c.latest_points("otelbpf.nccl.anomalies", **{"process.pid": pids[2]}), what="anomaly count")
    assert value(c, "otelbpf.nccl.anomalies", **{"process.pid": pids[2], "reason": "incomplete"}) == 1
    report = stragglers(tmp_path / "out")
    assert [(s["rank"], s["last_seq"], s["how"]) for s in report["stopped"]] == [(2, 4, "its process exited during it")]


@pytest.mark.parametrize("how", ["destroy", "abort"])
def test_a_communicator_ended_while_its_collectives_are_in_flight(otlp_collector, tmp_path, how):
    """Rank 1 ends the communicator right after enqueuing seq 3, which waits for slow rank 2:
    destroy waits for it to complete, abort fails it at every rank."""
    job = run_job(
        tmp_path,
        otlp_collector,
        "--ranks",
        3,
        "--iterations",
        5,
        "--end-rank",
        1,
        "--end-iter",
        2,
        "--end-how",
        how,
        "--slow-rank",
        2,
        "--slow-kind",
        "compute",
        "--slow-ms",
        60,
    )
    pids = by_rank(job)
    c = otlp_collector
    end_name = "ncclCommDestroy" if how == "destroy" else "ncclCommAbort"
    c.wait_for(
        lambda: (
            all(nccl_spans(c, pid, "ncclCommAbort") for pid in (pids[0], pids[2])) and nccl_spans(c, pids[1], end_name)
        ),
        what="every rank's end",
    )
    ranks1 = sorted(nccl_spans(c, pids[1], "ncclAllReduce"), key=lambda s: s.attributes["nccl.seq"])
    assert [s.attributes["nccl.seq"] for s in ranks1] == [1, 2, 3]
    in_flight = ranks1[-1]
    (end,) = nccl_spans(c, pids[1], end_name)
    world = f"{comm_id(bytes.fromhex(job['unique_id'])):016x}"
    assert (end.attributes["nccl.comm.id"], end.attributes["nccl.rank"]) == (world, 1)
    assert end.attributes["nccl.result"] == "ncclSuccess"
    assert in_flight.start_ns < end.start_ns and end.end_ns <= in_flight.end_ns, (
        "ended after the collective was enqueued, before its completion was observed"
    )
    assert in_flight.attributes["nccl.completion"] == "observed"
    late = {s.attributes["nccl.seq"] for s in nccl_spans(c, pids[2], "ncclAllReduce") if findings([s])}
    # five collectives at most: fewer than the adaptive detector needs before it calls a rank
    # persistently late (Params().min_collectives), so no finding, and none invented from the
    # collectives the end left incomplete
    assert late == set()
    if how == "abort":
        # the abort failed seq 3 at rank 0, which stopped there
        assert sorted(s.attributes["nccl.seq"] for s in nccl_spans(c, pids[0], "ncclAllReduce")) == [1, 2, 3]
    c.wait_for(lambda: c.latest_points("nccl.collectives", **{"process.pid": pids[1]}), what="metrics of rank 1")
    assert not c.latest_points("otelbpf.nccl.anomalies", **{"process.pid": pids[1]})


def test_skewed_clocks_are_measured_and_removed(tmp_path):
    """One run, its spans split per rank as if each rank's agent ran on its own host with its
    own clock: offsets injected, then measured back from the collectives."""
    slow = 3
    job = run_job(
        tmp_path, None, "--ranks", 4, "--iterations", 12, "--slow-rank", slow, "--slow-kind", "compute", "--slow-ms", 40
    )
    rank_of = {r["pid"]: r["rank"] for r in job["ranks"]}
    skew_ns = {0: 0, 1: 700_000_000, 2: -420_000_000, 3: -1_000_000_000}
    dirs = {r: tmp_path / f"node{r}" for r in skew_ns}
    for d in dirs.values():
        d.mkdir()
    for line in (tmp_path / "out" / "traces.jsonl").read_text().splitlines():
        req = json.loads(line)
        for rs in req["resourceSpans"]:
            attrs = {a["key"]: a["value"] for a in rs["resource"]["attributes"]}
            rank = rank_of.get(int(attrs["process.pid"]["intValue"]))
            if rank is None:
                continue
            for a in rs["resource"]["attributes"]:
                if a["key"] == "host.name":
                    a["value"] = {"stringValue": f"node{rank}"}
            for ss in rs["scopeSpans"]:
                for sp in ss["spans"]:
                    for key in ("startTimeUnixNano", "endTimeUnixNano"):
                        sp[key] = str(int(sp[key]) + skew_ns[rank])
            with (dirs[rank] / "traces.jsonl").open("a") as f:
                f.write(json.dumps({"resourceSpans": [rs]}) + "\n")

    report = stragglers(*dirs.values())
    assert [(r["rank"], r["cls"]) for r in report["stragglers"]] == [(slow, "compute-slow")]
    offsets = {h["host"]: h for h in report["hosts"]}
    assert offsets["node0"]["via"] == "reference"
    for rank, skew in skew_ns.items():
        h = offsets[f"node{rank}"]
        assert abs(h["offset_ms"] - skew / 1e6) < 5, h
        if rank:
            assert h["consistent"] and h["low_ms"] <= skew / 1e6 <= h["high_ms"], h

    raw = stragglers(*dirs.values(), extra=("--no-clock-correction",))
    # uncorrected, the clocks' spread (up to 1.7 s) drowns the 40 ms straggler
    assert [r["rank"] for r in raw["stragglers"]] != [slow]


# ---- returns at completion, never synchronized: live, and the fleet signal


def wait_means(metrics_jsonl: Path) -> dict[tuple[str, int], float]:
    """(nccl.comm.id, nccl.rank) -> mean nccl.collective.wait (seconds), from the newest
    cumulative point of each series in the file exporter's metrics."""
    newest: dict[tuple[str, int], tuple[int, float]] = {}
    for line in metrics_jsonl.read_text().splitlines():
        for rm in json.loads(line)["resourceMetrics"]:
            for sm in rm["scopeMetrics"]:
                for metric in sm["metrics"]:
                    if metric["name"] != "nccl.collective.wait":
                        continue
                    for dp in metric["histogram"]["dataPoints"]:
                        attrs = {a["key"]: next(iter(a["value"].values())) for a in dp["attributes"]}
                        key = (attrs["nccl.comm.id"], int(attrs["nccl.rank"]))
                        newest[key] = (int(dp["count"]), float(dp["sum"]))
    return {k: total / n for k, (n, total) in newest.items() if n}


@pytest.mark.parametrize("attach", ["after_init", "before_init"])
def test_returns_at_completion_never_synchronized_a_40ms_straggler(tmp_path, attach):
    """The job's collectives return at completion (``--completion return``: a blocking wait, a
    CPU-side backend) and nothing synchronizes on them. ``after_init``: the agent attaches after
    every rank's init, so ranks come from torchrun's variables only; ``before_init``: it sees
    the inits. Rank 2, 40 ms late on every collective, is named live, on defaults but a short
    completion_timeout (the returns expire into spans); and it waits least in
    nccl.collective.wait, where the others wait ~40 ms."""
    iters, slow = 30, 2
    argv = [
        str(JOB),
        *("--ranks", "4", "--iterations", str(iters), "--completion", "return"),
        *("--jitter-ms", "3", "--slow-rank", str(slow), "--slow-kind", "host", "--slow-ms", "40"),
    ]
    cfg = write_config(tmp_path, None, threshold=None)
    doc = yaml.safe_load(cfg.read_text())
    doc["receivers"]["nccl"]["completion_timeout"] = "1s"
    cfg.write_text(yaml.safe_dump(doc))
    if attach == "before_init":
        with AgentProcess(["-c", str(cfg), "--", *argv]) as agent:
            assert agent.wait(120) == 0, agent.output
        out = next(x for x in agent.output.splitlines() if x.startswith('{"workload":"nccl_job"'))
    else:
        job = subprocess.Popen(
            [*argv, "--hold-ms", "150000"], stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        try:
            with AgentProcess(["-c", str(cfg), "--pid", str(job.pid)]) as agent:
                agent.wait_ready()
                agent.wait_attached(BUILD / "fakenccl" / "libnccl.so.2")
                os.killpg(job.pid, signal.SIGUSR1)
                out, _ = job.communicate(timeout=120)
                agent.stop()
        finally:
            job.kill()
    summary = json.loads(out.strip().splitlines()[-1])
    pids = by_rank(summary)
    spans = defaultdict(list)
    for line in (tmp_path / "out" / "traces.jsonl").read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            res = {a["key"]: a["value"] for a in rs["resource"]["attributes"]}
            pid = int(res["process.pid"]["intValue"])
            for ss in rs["scopeSpans"]:
                spans[pid] += [sp for sp in ss["spans"] if sp["name"] == "ncclAllReduce"]
    named = {
        rank
        for rank, pid in pids.items()
        for sp in spans[pid]
        for e in sp.get("events", [])
        if e["name"] == "nccl.straggler"
    }
    assert named == {slow}, (named, {r: len(spans[p]) for r, p in pids.items()}, agent.output[-3000:])
    means = wait_means(tmp_path / "out" / "metrics.jsonl")
    assert len({comm for comm, _ in means}) == 1 and {r for _, r in means} == set(pids)
    by = {r: v for (_, r), v in means.items()}
    assert by[slow] < 0.01 and min(v for r, v in by.items() if r != slow) > 0.03, by
