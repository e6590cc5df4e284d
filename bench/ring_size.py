"""What the ``http`` receiver's ``sockdata`` ring needs: records lost in the kernel against
``ring_buffer_size``, with the HTTP load at the agent's ceiling, side by side in one run.

    sudo .venv/bin/python bench/ring_size.py [--sizes 1MiB,4MiB,16MiB] [--seconds 10] [--repeats 2]

Every byte of a ring is resident memory of the agent (its pages are mapped whole), so the
default size is a trade: memory on every node against loss in a burst. For each size, in
every repeat, the real agent (``otelbpf run --pid SERVER``, the http receiver alone, spans and
metrics to files) watches build/bench/http_server under ``wrk -t2 -c32`` (keep-alive, as fast
as the two cores allow: the agent, the server and wrk share them, so the agent is as short of
CPU as it gets, and the ring fills fastest). Reported per size: requests served, records the
agent received, records lost in the kernel (``lost in kernel`` of its stop line), and the most
bytes that waited in the ring at a drain (``otelbpf.ring.usage``). Results: a table on stdout
and bench/results/ring_size-<date>.json; figures in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import footprint  # noqa: E402  (bench/ is not a package)

_spec = importlib.util.spec_from_file_location("http_bench", Path(__file__).resolve().parent / "http.py")
assert _spec is not None and _spec.loader is not None
http_bench = importlib.util.module_from_spec(_spec)  # bench/http.py: `import http` is the stdlib's
_spec.loader.exec_module(http_bench)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench/results"


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
    args = [sys.executable, "-m", "otelbpf.cli", "run", "-c", str(cfg), "--pid", str(pid)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "otelbpf running" in line:
            break
    else:
        raise RuntimeError("the agent did not start")
    t0 = time.time_ns()
    if paced:
        script = workdir / "paced.lua"
        script.write_text(http_bench.PACED_LUA)
        load = http_bench.wrk(port, seconds, 2, paced, script)
    else:
        load = http_bench.wrk(port, seconds, 2, 32)
    t1 = time.time_ns()
    proc.send_signal(signal.SIGINT)
    rest = proc.communicate(timeout=120)[0]
    m = re.search(r"events received (\d+), spans (\d+), lost in kernel (\d+)", rest)
    if m is None:
        raise RuntimeError(f"no stats line from the agent:\n{rest[-2000:]}")
    received, spans, lost = map(int, m.groups())
    peaks = footprint.ring_peaks(out / "metrics.jsonl", [t0, t1 + 60 * 10**9])
    return {
        "requests": load["requests"],
        "requests_per_s": round(load["requests"] / seconds),
        "records_received": received,
        "spans": spans,
        "lost_in_kernel": lost,
        "ring_peak_mib": peaks.get("sockdata"),
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
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
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
    RESULTS.mkdir(exist_ok=True)
    out = a.out or RESULTS / f"ring_size-{dt.date.today().isoformat()}.json"
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"results: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
