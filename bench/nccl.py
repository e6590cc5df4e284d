"""Benchmark the NCCL probes and the offline straggler report, side by side in one run.

    sudo .venv/bin/python bench/nccl.py [--quick] [--out FILE] [--keep-workdir]

1. **Per-collective probe cost**: build/bench/nccl_loop times ncclAllReduce calls from C on
   - the stand-in (a one-rank communicator: the success path; CET-built, so the probes sit
     at sym+4, on ``push %rbp``), and
   - NVIDIA's libnccl.so.2 (a NULL communicator, rejected at once: the real function's
     prologue, ``push %rbp`` at sym+0),
   in three cases: ``a`` no probe (a private copy under a name the agent does not match);
   ``b`` the NCCL probes only (a Sensor in this process whose drained events are dropped:
   uprobe + uretprobe + BPF + two ring-buffer records per call, and draining); ``c`` the agent
   (``otelbpf run`` with the nccl receiver, spans to the file exporter). Both watch only this
   process and its children (``--pid``: the in-kernel pid filter), so other programs on the
   machine that map NCCL stay out of the numbers. ``a`` is measured in
   rounds interleaved with ``b``, then with ``c`` (a b a b ..., a c a c ...), so each
   difference compares numbers taken under the same load. Each value is the median of
   ``rounds`` rounds, each the median of ``runs`` nccl_loop runs of ``calls`` calls.
2. **Agent user-space cost per collective**: the NCCL correlator's time per collective
   (entry, return, two synchronizes), measured while building the dataset below.
3. **Offline report**: 8 ranks x 100,000 collectives, exported as the agent exports them (the
   NCCL correlator's spans through the OTLP-JSON file exporter; two "hosts" of four ranks, the
   second's clock 123.456 ms ahead; rank 5 compute-slow by 1.5 ms per step). Times the
   command a user runs, ``otelbpf stragglers DIR DIR --json`` (a fresh process: imports,
   reading, clock offsets, analysis), median of 3, and, in this process, reading vs analysis.
   The report must name rank 5, compute-slow, and measure the offset.

Results: a table on stdout and bench/results/nccl-<date>.json; numbers and what they mean in
docs/BENCHMARKS.md, "NCCL".
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from otelbpf.base.events import EVENT_DTYPE, CudaFunc, Kind, NcclFunc  # noqa: E402
from otelbpf.correlate.base import CorrelatorSettings  # noqa: E402
from otelbpf.correlate.clock import MonotonicClock  # noqa: E402
from otelbpf.correlate.process_info import ProcessInfo  # noqa: E402
from otelbpf.export.jsonfile import FileSpanExporter  # noqa: E402
from otelbpf.families.nccl.correlator import NcclCorrelator  # noqa: E402

NCCL_LOOP = ROOT / "build/bench/nccl_loop"
FAKE_NCCL = ROOT / "build/examples/fakenccl/libnccl.so.2"
FAKE_CUDART = ROOT / "build/examples/fakecudart/libcudart.so.12"
RESULTS = ROOT / "bench/results"
UPROBE_EVENTS = Path("/sys/kernel/tracing/uprobe_events")


class BenchError(Exception):
    """The benchmark cannot run or a measurement is invalid; the message says why."""


@dataclass(frozen=True)
class Plan:
    calls: int
    runs: int
    rounds: int
    ranks: int
    collectives: int  # per rank, in the offline dataset
    report_runs: int


FULL = Plan(calls=100_000, runs=3, rounds=5, ranks=8, collectives=100_000, report_runs=3)
QUICK = Plan(calls=20_000, runs=3, rounds=2, ranks=8, collectives=5_000, report_runs=1)


def real_nccl() -> Path:
    import nvidia.nccl

    return Path(list(nvidia.nccl.__path__)[0]) / "lib" / "libnccl.so.2"


# ---- 1. per-collective probe cost ------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One library to call: a probed copy and an unprobed one."""

    name: str
    mode: str  # nccl_loop --mode
    probed: Path
    plain: Path
    cudart: Path | None


def make_targets(work: Path) -> list[Target]:
    """Private copies: uprobes belong to inodes, so copies keep other probes out of the numbers.
    The stand-in finds its runtime through RUNPATH $ORIGIN/../fakecudart."""
    targets = []
    for label in ("probed", "plain"):
        (work / label / "fakenccl").mkdir(parents=True)
        (work / label / "fakecudart").mkdir()
        shutil.copy(FAKE_CUDART, work / label / "fakecudart" / "libcudart.so.12")
    shutil.copy(FAKE_NCCL, work / "probed" / "fakenccl" / "libnccl.so.2")
    shutil.copy(FAKE_NCCL, work / "plain" / "fakenccl" / "libnccl-plain.so.2")  # no libnccl.so* name
    targets.append(
        Target(
            "stand-in, 1-rank communicator",
            "comm",
            work / "probed/fakenccl/libnccl.so.2",
            work / "plain/fakenccl/libnccl-plain.so.2",
            work / "probed/fakecudart/libcudart.so.12",
        )
    )
    real = real_nccl()
    (work / "real").mkdir()
    shutil.copy(real, work / "real" / "libnccl.so.2")
    shutil.copy(real, work / "real" / "libnccl-plain.so.2")
    targets.append(
        Target(
            f"NVIDIA libnccl {_version(real)}, NULL communicator",
            "null",
            work / "real/libnccl.so.2",
            work / "real/libnccl-plain.so.2",
            None,
        )
    )
    return targets


def _version(lib: Path) -> str:
    import ctypes

    v = ctypes.c_int()
    ctypes.CDLL(str(lib)).ncclGetVersion(ctypes.byref(v))
    return f"{v.value // 10000}.{v.value // 100 % 100}.{v.value % 100}"


def loop(target: Target, lib: Path, plan: Plan) -> float:
    cmd = [
        str(NCCL_LOOP),
        "--lib",
        str(lib),
        "--mode",
        target.mode,
        "--calls",
        str(plan.calls),
        "--runs",
        str(plan.runs),
    ]
    if target.cudart:
        cmd += ["--cudart", str(lib.parent.parent / "fakecudart" / "libcudart.so.12")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "FAKENCCL_LINK_US": "0"})
    if out.returncode != 0:
        raise BenchError(f"{' '.join(cmd)} failed: {out.stderr}")
    result = json.loads(out.stdout)
    expected = 0 if target.mode == "comm" else 4
    if result["return_code"] != expected:
        raise BenchError(f"{target.name}: ncclAllReduce returned {result['return_code']}, expected {expected}")
    return result["median_ns_per_call"]


def interleaved(targets: list[Target], plan: Plan, case: str) -> dict[str, dict[str, float]]:
    """Rounds of (a, case) per target; medians of the rounds."""
    values: dict[str, dict[str, list[float]]] = {t.name: {"a": [], case: []} for t in targets}
    for _ in range(plan.rounds):
        for t in targets:
            values[t.name]["a"].append(loop(t, t.plain, plan))
            values[t.name][case].append(loop(t, t.probed, plan))
    return {name: {k: statistics.median(v) for k, v in cases.items()} for name, cases in values.items()}


def probes_only(targets: list[Target], plan: Plan) -> tuple[dict, dict]:
    from otelbpf.families.nccl.probes import nccl_family
    from otelbpf.sensor.sensor import Sensor, SensorOptions

    received = {"events": 0}
    sensor = Sensor(
        SensorOptions(
            families=[nccl_family()],
            pids=[os.getpid()],
            search_globs=[str(t.probed) for t in targets],
            drain_interval_s=0.02,
        ),
        lambda ring, arr: received.__setitem__("events", received["events"] + len(arr)) if ring == "events" else None,
    )
    sensor.start()
    try:
        probes = sensor.attach_stats.probes
        result = interleaved(targets, plan, "b")
    finally:
        sensor.stop()
    return result, {"probes": probes, "events": received["events"], "lost": sensor.kernel_stats()}


def agent_case(targets: list[Target], plan: Plan, work: Path) -> tuple[dict, str]:
    cfg = work / "agent.yaml"
    pipeline = {"receivers": ["nccl"], "processors": ["batch"], "exporters": ["file"]}
    cfg.write_text(
        yaml.safe_dump(
            {
                "receivers": {"nccl": {"search_paths": [str(t.probed) for t in targets]}},
                "processors": {"batch": {}},
                "exporters": {"file": {"directory": str(work / "agent-out")}},
                "service": {"pipelines": {"traces": pipeline, "metrics": pipeline}},
            }
        )
    )
    agent = subprocess.Popen(
        [sys.executable, "-m", "otelbpf.cli", "run", "-c", str(cfg), "--pid", str(os.getpid())],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    lines = []
    try:
        for line in agent.stdout:
            lines.append(line)
            if "otelbpf running" in line:
                break
        else:
            raise BenchError("the agent did not start:\n" + "".join(lines))
        result = interleaved(targets, plan, "c")
    finally:
        agent.send_signal(signal.SIGINT)
        rest, _ = agent.communicate(timeout=60)
    stats = next((line for line in (rest or "").splitlines() if line.startswith("otelbpf: events received")), "")
    return result, stats


# ---- 2 and 3. the offline report over a synthetic 8-rank run --------------------------


@dataclass
class Timeline:
    """A training loop's all-reduces seen from every rank (CLOCK_MONOTONIC ns, rows: ranks)."""

    enter: np.ndarray
    done: np.ndarray  # when the rank's synchronize observed completion
    gpu: np.ndarray  # compute phase: waiting on the GPU
    host: np.ndarray  # compute phase: the rest
    base: int


def timeline(nranks: int, n: int, slow: int, rng: np.random.Generator, base: int = 10**12) -> Timeline:
    """Each rank's step k starts when it saw step k-1 complete, waits ~6 ms on its GPU and
    ~0.5 ms on its host, then enters; the collective completes 0.1 ms after the last rank
    entered, and each rank sees that ~20 us later. ``slow`` waits 1.5 ms longer on its GPU."""
    ms = 1_000_000
    gpu = rng.normal(6 * ms, 0.1 * ms, size=(nranks, n)).clip(1 * ms)
    gpu[slow] += 1.5 * ms
    host = rng.normal(0.5 * ms, 0.05 * ms, size=(nranks, n)).clip(0.1 * ms)
    enter = np.empty((nranks, n))
    done = np.empty((nranks, n))
    start = np.full(nranks, float(base))
    for k in range(n):
        enter[:, k] = start + gpu[:, k] + host[:, k]
        done[:, k] = enter[:, k].max() + 0.1 * ms + rng.normal(20_000, 2_000, size=nranks).clip(1_000)
        start = done[:, k]
    return Timeline(enter, done, gpu, host, base)


def rank_events(t: Timeline, rank: int, comm: int, pid: int) -> np.ndarray:
    """The records one rank's agent drains: init, then per step a compute synchronize, the
    all-reduce's entry and return, and the synchronize that observes its completion."""
    nranks, n = t.enter.shape
    ms, base = 1_000_000, t.base
    e, d, g = t.enter[rank], t.done[rank], t.gpu[rank]
    recs = np.zeros(4 * n + 2, dtype=EVENT_DTYPE)
    recs["pid"] = recs["tid"] = pid
    recs[0] = (
        base - 10 * ms,
        0,
        pid,
        pid,
        Kind.NCCL_COMM,
        NcclFunc.ncclCommInitRank,
        0,
        0,
        0x7F00 + rank,
        comm,
        rank | nranks << 32,
        0,
    )
    recs[1] = (base - 10 * ms, 0, pid, pid, Kind.NCCL_RETURN, NcclFunc.ncclCommInitRank, 0, 0, 0, 0, 0, 0)
    body = recs[2:].reshape(n, 4)
    prev = np.r_[base, d[:-1]]
    sync = body[:, 0]
    sync["ts_ns"], sync["duration_ns"] = prev + t.host[rank], g
    sync["kind"], sync["func"], sync["a0"] = Kind.CUDA_SYNC, CudaFunc.cudaStreamSynchronize, 0x5000
    ent = body[:, 1]
    ent["ts_ns"], ent["kind"], ent["func"] = e, Kind.NCCL_ENTER, NcclFunc.ncclAllReduce
    ent["duration_ns"] = rank | nranks << 32
    ent["a0"], ent["a1"], ent["a2"], ent["a3"] = comm, np.arange(1, n + 1), 1024 | 7 << 48, 0x6000
    ent["ret"] = -1
    ret = body[:, 2]
    ret["ts_ns"], ret["kind"], ret["func"] = e + 8_000, Kind.NCCL_RETURN, NcclFunc.ncclAllReduce
    done_sync = body[:, 3]
    done_sync["ts_ns"], done_sync["duration_ns"] = e + 15_000, d - (e + 15_000)
    done_sync["kind"], done_sync["func"], done_sync["a0"] = Kind.CUDA_SYNC, CudaFunc.cudaStreamSynchronize, 0x6000
    # ring order: a synchronize's record is written when it returns
    emitted = recs["ts_ns"] + np.where(recs["kind"] == Kind.CUDA_SYNC, recs["duration_ns"], 0)
    return recs[np.argsort(emitted, kind="stable")]


def build_dataset(plan: Plan, work: Path) -> tuple[list[Path], dict]:
    """Two hosts of ranks/2 ranks each, exported the way each host's agent exports them."""
    comm, per_host = 0x1234_5678_9ABC_DEF0, plan.ranks // 2
    steps = timeline(plan.ranks, plan.collectives, slow=5, rng=np.random.default_rng(7))
    dirs, spent, collectives = [], 0.0, 0
    for h, skew in enumerate((0, 123_456_000)):
        host = f"node{h}"
        out = work / host
        clock = MonotonicClock()
        clock.offset_ns += skew
        exporter = FileSpanExporter(str(out))
        spans: list = []
        correlator = NcclCorrelator(
            CorrelatorSettings(ProcessInfo({"host.name": host}), clock, spans.extend),
            straggler_threshold_ns=10**9,
            max_spans_per_second=10**9,
        )
        records = np.concatenate(
            [rank_events(steps, r, comm, 4_000_000 + r) for r in range(h * per_host, (h + 1) * per_host)]
        )
        emitted = records["ts_ns"] + np.where(records["kind"] == Kind.CUDA_SYNC, records["duration_ns"], 0)
        records = records[np.argsort(emitted, kind="stable")]
        for i in range(0, len(records), 65_536):
            t0 = time.perf_counter()
            correlator.on_events(records[i : i + 65_536])
            spent += time.perf_counter() - t0
            for j in range(0, len(spans), 512):
                exporter.export(spans[j : j + 512])
            collectives += len(spans)
            spans.clear()
        exporter.shutdown()
        dirs.append(out)
    size = sum(f.stat().st_size for d in dirs for f in d.iterdir())
    return dirs, {"collectives": collectives, "correlator_us_per_collective": spent / collectives * 1e6, "bytes": size}


#: Reading vs analysis, timed in a fresh process (as the command runs): prints [read_s, analyze_s].
_SPLIT = """
import json, sys, time
from otelbpf.analyze.collectives import read
from otelbpf.analyze.stragglers import analyze
t0 = time.perf_counter()
data = read(sys.argv[1:])
t1 = time.perf_counter()
analyze(data, threshold_ns=1_000_000, min_share=0.3)
print(json.dumps([t1 - t0, time.perf_counter() - t1]))
"""


def time_report(dirs: list[Path], plan: Plan) -> dict:
    walls, report = [], None
    for _ in range(plan.report_runs):
        t0 = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-m", "otelbpf.cli", "stragglers", *map(str, dirs), "--json", "--threshold", "1ms"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        walls.append(time.perf_counter() - t0)
        if out.returncode != 0:
            raise BenchError(f"otelbpf stragglers failed: {out.stderr}")
        report = json.loads(out.stdout)
    split = subprocess.run(
        [sys.executable, "-c", _SPLIT, *map(str, dirs)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if split.returncode != 0:
        raise BenchError(f"timing read and analysis failed: {split.stderr}")
    t_read, t_analyze = json.loads(split.stdout)
    top = report["stragglers"][0] if report["stragglers"] else {}
    offset = next(h for h in report["hosts"] if h["host"] == "node1")
    if (top.get("rank"), top.get("cls")) != (5, "compute-slow") or abs(offset["offset_ms"] - 123.456) > 1:
        raise BenchError(f"the report did not find what the dataset holds: {top}, offset {offset}")
    return {
        "wall_s": walls,
        "wall_median_s": statistics.median(walls),
        "read_s": t_read,
        "analyze_s": t_analyze,
        "spans": report["spans"],
        "straggler": {k: top[k] for k in ("rank", "cls", "straggled", "collectives")},
        "offset_ms": offset["offset_ms"],
        "offset_bounds_ms": [offset["low_ms"], offset["high_ms"]],
    }


# ---- driver --------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke check, not numbers to report")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--keep-workdir", action="store_true")
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    if os.geteuid() != 0:
        raise BenchError("run as root: the benchmark loads eBPF programs")
    subprocess.run([str(ROOT / "examples/build.sh")], check=True, capture_output=True)
    work = Path(tempfile.mkdtemp(prefix="nccl-bench-"))
    results: dict = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "quick": args.quick,
        "plan": plan.__dict__,
        "machine": {"kernel": platform.release(), "cpus": os.cpu_count(), "load_before": os.getloadavg()},
    }
    try:
        targets = make_targets(work)
        b, sensor_stats = probes_only(targets, plan)
        c, agent_stats = agent_case(targets, plan, work)
        results["per_call_ns"] = {
            t.name: {"a_with_b": b[t.name]["a"], "b": b[t.name]["b"], "a_with_c": c[t.name]["a"], "c": c[t.name]["c"]}
            for t in targets
        }
        results["sensor"] = sensor_stats
        results["agent"] = agent_stats
        dirs, dataset = build_dataset(plan, work)
        results["dataset"] = dataset
        results["report"] = time_report(dirs, plan)
        results["machine"]["load_after"] = os.getloadavg()
    finally:
        if not args.keep_workdir:
            shutil.rmtree(work, ignore_errors=True)
    leftover = UPROBE_EVENTS.read_text().strip() if UPROBE_EVENTS.exists() else ""
    if leftover:
        raise BenchError(f"uprobes left behind in {UPROBE_EVENTS}:\n{leftover}")
    out = args.out or RESULTS / f"nccl-{dt.date.today().isoformat()}{'-quick' if args.quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"per ncclAllReduce call (ns, median of {plan.rounds} rounds x {plan.runs} runs x {plan.calls} calls):")
    print(f"  {'library':<44} {'a no probe':>10} {'b probes':>9} {'b-a':>7} {'a':>7} {'c agent':>8} {'c-a':>7}")
    for name, v in results["per_call_ns"].items():
        print(
            f"  {name:<44} {v['a_with_b']:>10.0f} {v['b']:>9.0f} {v['b'] - v['a_with_b']:>7.0f} "
            f"{v['a_with_c']:>7.0f} {v['c']:>8.0f} {v['c'] - v['a_with_c']:>7.0f}"
        )
    d, r = results["dataset"], results["report"]
    print(f"correlator: {d['correlator_us_per_collective']:.1f} us per collective ({d['collectives']} spans built)")
    print(
        f"otelbpf stragglers, {plan.ranks} ranks x {plan.collectives} collectives ({d['bytes'] / 2**20:.0f} MiB "
        f"OTLP-JSON): {r['wall_median_s']:.2f} s wall (read {r['read_s']:.2f} s, analyze {r['analyze_s']:.2f} s); "
        f"found rank {r['straggler']['rank']} {r['straggler']['cls']}, offset {r['offset_ms']:.3f} ms"
    )
    print(f"results: {out}")


if __name__ == "__main__":
    try:
        main()
    except BenchError as exc:
        print(f"bench/nccl.py: {exc}", file=sys.stderr)
        sys.exit(1)
