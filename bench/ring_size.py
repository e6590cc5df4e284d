"""What a BPF ring needs: records lost in the kernel against ``ring_buffer_size``, side by side
in one run, for the ``http`` receiver's ``sockdata`` ring or the shared ``events`` ring.

    sudo .venv/bin/python bench/ring_size.py [--sizes 1MiB,4MiB,16MiB] [--seconds 10] [--repeats 2]
    sudo .venv/bin/python bench/ring_size.py --ring events [--sizes 4MiB,16MiB] [--rates 100000,1000000]
        [--tree OTHER_CHECKOUT ...]

Every byte of a ring is resident memory of the agent (its pages are mapped whole), so the
default size is a trade: memory on every node against loss in a burst. For each size, in
every repeat, the real agent (``otelbpf run --pid SERVER``, the http receiver alone, spans and
metrics to files) watches build/bench/http_server under ``wrk -t2 -c32`` (keep-alive, as fast
as the two cores allow: the agent, the server and wrk share them, so the agent is as short of
CPU as it gets, and the ring fills fastest). Reported per size: requests served, records the
agent received, records lost in the kernel (``lost in kernel`` of its stop line), and the most
bytes that waited in the ring at a drain (``otelbpf.ring.usage``).

``--ring events``: the ring that carries CUDA (and NCCL, ibverbs, profiling) events, sized by
the cuda receiver's ``ring_buffer_size``. For each size and each of ``--rates``, the real agent
(host mode, the cuda receiver alone on a private copy of the stand-in runtime, with
``launch_sample_every: 1``: one 64-byte event per launch, the heaviest the ring gets) is left
idle for 2 s, so that its drain has backed off to its longest wait (8 drain intervals), then
``build/bench/launch_loop --rate R`` starts at once: a burst from idle. Reported as above, with
the launches made and the rate achieved. ``--spans 0`` builds no span (the agent's processing
is then cheap: what is lost is what the drain did not take in time). ``--tree`` (repeatable)
runs the same cases with the agent of other source trees (a ``git worktree`` of another
commit), interleaved with this one's. ``--per-call``: what a launch with its event costs the
traced program instead (launch_loop's loop mode, against no agent in the same rounds).

Results: a table on stdout and bench/results/ring_size-<date>.json; figures in
docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import footprint  # noqa: E402  (bench/ is not a package)
from cuda_launch import FAKE_CUDART, LAUNCH_LOOP, finish_paced, paced  # noqa: E402

_spec = importlib.util.spec_from_file_location("http_bench", Path(__file__).resolve().parent / "http.py")
assert _spec is not None and _spec.loader is not None
http_bench = importlib.util.module_from_spec(_spec)  # bench/http.py: `import http` is the stdlib's
_spec.loader.exec_module(http_bench)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench/results"


def _start_agent(run_args: list[str], tree: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``otelbpf run RUN_ARGS`` of ``tree`` (``-m`` puts the working directory first on
    sys.path: the agent is the tree's own), once it says it is running."""
    args = [sys.executable, "-m", "otelbpf.cli", "run", *run_args]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tree, env=env)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "otelbpf running" in line:
            return proc
    raise RuntimeError("the agent did not start")


def run_agent(workdir: Path, port: int, pid: int, ring: str, seconds: float, paced: int) -> dict:
    """One agent with ``ring_buffer_size: ring`` on the http receiver under wrk: at full speed,
    or with ``paced`` connections each waiting 1 ms between requests."""
    out = workdir / f"out-{time.monotonic_ns()}"
    cfg = workdir / "otelbpf.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "receivers": {"http": {"processes": "all", "ports": [port], "ring_buffer_size": ring}},
                "exporters": {"file": {"directory": str(out), "report": False}},
                "service": {
                    "pipelines": {p: {"receivers": ["http"], "exporters": ["file"]} for p in ("traces", "metrics")}
                },
            }
        )
    )
    proc = _start_agent(["-c", str(cfg), "--pid", str(pid)])
    t0 = time.time_ns()
    if paced:
        script = workdir / "paced.lua"
        script.write_text(http_bench.PACED_LUA)
        load = http_bench.wrk(port, seconds, 2, paced, script)
    else:
        load = http_bench.wrk(port, seconds, 2, 32)
    t1 = time.time_ns()
    received, spans, lost = _stop(proc)
    peaks = footprint.ring_peaks(out / "metrics.jsonl", [t0, t1 + 60 * 10**9])
    return {
        "requests": load["requests"],
        "requests_per_s": round(load["requests"] / seconds),
        "records_received": received,
        "spans": spans,
        "lost_in_kernel": lost,
        "ring_peak_mib": peaks.get("sockdata"),
    }


def _stop(proc: subprocess.Popen) -> tuple[int, int, int]:
    """SIGINT the agent; (records received, spans, lost in kernel) from its stop line."""
    proc.send_signal(signal.SIGINT)
    rest = proc.communicate(timeout=120)[0]
    m = re.search(r"events received (\d+), spans (\d+), lost in kernel (\d+)", rest)
    if m is None:
        raise RuntimeError(f"no stats line from the agent:\n{rest[-2000:]}")
    received, spans, lost = map(int, m.groups())
    return received, spans, lost


def run_events_agent(
    workdir: Path, lib: Path, ring: str, rate: int, seconds: float, tree: Path = ROOT, spans: int | None = None
) -> dict:
    """One agent of ``tree`` with the cuda receiver's ``ring_buffer_size: ring`` and an event per
    launch, idle for 2 s, then launch_loop at ``rate`` launches/s for ``seconds``."""
    out = workdir / f"out-{time.monotonic_ns()}"
    cfg = workdir / "otelbpf.yaml"
    cuda = {"search_paths": [str(lib)], "launch_sample_every": 1, "ring_buffer_size": ring}
    if spans is not None:
        cuda["max_spans_per_second"] = spans
    cfg.write_text(
        yaml.safe_dump(
            {
                "receivers": {"cuda": cuda},
                "exporters": {"file": {"directory": str(out), "report": False}},
                "service": {
                    "pipelines": {p: {"receivers": ["cuda"], "exporters": ["file"]} for p in ("traces", "metrics")},
                    "telemetry": {"metrics_interval": "1s"},  # otelbpf.ring.usage once a second
                },
            }
        )
    )
    proc = _start_agent(["-c", str(cfg)], tree)
    time.sleep(2.0)  # empty ticks: the drain waits its longest when the burst comes
    t0 = time.time_ns()
    loop, loop_out = paced(lib, rate, seconds)
    made = finish_paced(loop, loop_out)
    t1 = time.time_ns()
    time.sleep(0.5)
    received, spans, lost = _stop(proc)
    peaks = footprint.ring_peaks(out / "metrics.jsonl", [t0, t1 + 60 * 10**9])
    return {
        "rate_asked": rate,
        "launches": made["calls"],
        "rate_achieved": round(made["calls"] / seconds),
        "records_received": received,
        "spans": spans,
        "lost_in_kernel": lost,
        "ring_peak_mib": peaks.get("events"),
    }


def per_call_ns(workdir: Path, lib: Path, tree: Path | None) -> float:
    """Median ns per launch of launch_loop (5 runs of 100,000 calls) under the agent of ``tree``
    with an event per launch into a 64 MiB ring (500k events: none refused), no spans; or
    with no agent (``tree`` None)."""
    proc = None
    if tree is not None:
        cfg = workdir / "otelbpf-cost.yaml"
        cuda = {"search_paths": [str(lib)], "launch_sample_every": 1, "ring_buffer_size": "64MiB"}
        cfg.write_text(
            yaml.safe_dump(
                {
                    "receivers": {"cuda": {**cuda, "max_spans_per_second": 0}},
                    "exporters": {"file": {"directory": str(workdir / "out-cost"), "report": False}},
                    "service": {"pipelines": {"traces": {"receivers": ["cuda"], "exporters": ["file"]}}},
                }
            )
        )
        # OTELBPF_DETACH=wait: every probe is gone when it exits, none left for the next round
        proc = _start_agent(["-c", str(cfg)], tree, {**os.environ, "OTELBPF_DETACH": "wait"})
    try:
        out = subprocess.run(
            [str(LAUNCH_LOOP), "--lib", str(lib), "--calls", "100000", "--runs", "5"],
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
        return float(json.loads(out.stdout)["median_ns_per_call"])
    finally:
        if proc is not None:
            _stop(proc)


def events_main(a: argparse.Namespace) -> dict:
    """The ``--ring events`` runs: every size at every rate, ``--repeats`` times, interleaved."""
    for path in (LAUNCH_LOOP, FAKE_CUDART):
        if not path.exists():
            raise SystemExit(f"bench/ring_size.py: {path} is missing: run examples/build.sh")
    work = Path(tempfile.mkdtemp(prefix="otelbpf-bench-ring-"))
    lib = work / "lib" / FAKE_CUDART.name  # a private copy: uprobes belong to the inode
    lib.parent.mkdir()
    shutil.copy2(FAKE_CUDART, lib)
    rates = [int(r) for r in a.rates.split(",")]
    trees = [ROOT, *(t.resolve() for t in a.tree)]
    if a.per_call:
        cost: dict[str, list[float]] = {"no agent": [], **{str(t): [] for t in trees}}
        for _ in range(a.repeats):
            cost["no agent"].append(per_call_ns(work, lib, None))
            for tree in trees:
                cost[str(tree)].append(per_call_ns(work, lib, tree))
        print("| agent | ns per launch, median of rounds | rounds |")
        print("|---|---|---|")
        for name, values in cost.items():
            rounds = ", ".join(f"{v:.1f}" for v in values)
            print(f"| {Path(name).name} | {sorted(values)[len(values) // 2]:.1f} | {rounds} |")
        return {"ring": "events", "per_call_ns": cost}
    runs: dict[str, list[dict]] = {s: [] for s in a.sizes.split(",")}
    for _ in range(a.repeats):
        for rate in rates:
            for size in runs:
                for tree in trees:
                    r = {"tree": str(tree), **run_events_agent(work, lib, size, rate, a.seconds, tree, a.spans)}
                    runs[size].append(r)
                    print(f"{size:>6}: {json.dumps(r)}", file=sys.stderr)
    print("| tree | ring | launches/s asked | achieved | records received | lost in kernel | ring peak (MiB) |")
    print("|---|---|---|---|---|---|---|")
    for size, rs in runs.items():
        for r in sorted(rs, key=lambda r: (r["tree"], r["rate_asked"])):
            print(
                f"| {Path(r['tree']).name} | {size} | {r['rate_asked']:,} | {r['rate_achieved']:,} "
                f"| {r['records_received']:,} | {r['lost_in_kernel']:,} | {r['ring_peak_mib']} |"
            )
    return {
        "ring": "events",
        "seconds": a.seconds,
        "max_spans_per_second": a.spans,
        "trees": [str(t) for t in trees],
        "runs": runs,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1MiB,4MiB,16MiB", help="comma-separated ring_buffer_size values")
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument(
        "--paced",
        type=int,
        default=0,
        help="connections each waiting 1 ms between requests (24: ~20k requests/s here), not full speed",
    )
    ap.add_argument("--ring", choices=["sockdata", "events"], default="sockdata")
    ap.add_argument("--rates", default="100000,300000,1000000", help="--ring events: launches per second")
    ap.add_argument("--tree", type=Path, action="append", default=[], help="--ring events: another source tree")
    ap.add_argument(
        "--per-call",
        action="store_true",
        help="--ring events: ns per launch with an event per launch, per tree and with no agent (--repeats rounds)",
    )
    ap.add_argument(
        "--spans", type=int, help="--ring events: the cuda receiver's max_spans_per_second (0: events, no spans)"
    )
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    if a.ring == "events":
        res = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), **events_main(a)}
        return _write(a, res)
    http_bench.preflight("bench/ring_size.py")
    sizes = a.sizes.split(",")
    work = Path(tempfile.mkdtemp(prefix="otelbpf-bench-ring-"))
    port = http_bench.free_port()
    runs: dict[str, list[dict]] = {s: [] for s in sizes}
    with http_bench.process([str(http_bench.SERVER), str(port)]) as server:
        for _ in range(a.repeats):
            for size in sizes:
                r = run_agent(work, port, server.pid, size, a.seconds, a.paced)
                runs[size].append(r)
                print(f"{size:>6}: {json.dumps(r)}", file=sys.stderr)
    res = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "seconds": a.seconds,
        "paced_connections": a.paced,
        "runs": runs,
    }
    print("| ring | requests/s | records received | lost in kernel | ring peak (MiB) |")
    print("|---|---|---|---|---|")
    for size, rs in runs.items():
        for r in rs:
            print(
                f"| {size} | {r['requests_per_s']:,} | {r['records_received']:,} | {r['lost_in_kernel']:,} "
                f"| {r['ring_peak_mib']} |"
            )
    return _write(a, res)


def _write(a: argparse.Namespace, res: dict) -> int:
    RESULTS.mkdir(exist_ok=True)
    out = a.out or RESULTS / f"ring_size-{dt.date.today().isoformat()}.json"
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"results: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
