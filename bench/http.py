"""Benchmark the HTTP/gRPC socket probes: throughput and latency with and without the agent,
side by side in one run.

    sudo .venv/bin/python bench/http.py [--seconds 5] [--repeats 3] [--out FILE]

Measures, on this machine and in one invocation:

1. HTTP/1.1 keep-alive throughput: ``wrk -t2 -c32`` against build/bench/http_server (one
   thread, epoll, a read() and a write() per request), for each ``--work-us`` level (CPU the
   server spends per request: 0 is the bare server, larger values stand in for handlers that
   do something). In every repeat, back to back: without anything loaded; with **empty**
   programs on the same syscall tracepoints (the floor: what hooking these syscalls costs
   at all, whatever the programs do); with only the socket probes (loaded in this process,
   ring drained and discarded, kernel time per program from ``kernel.bpf_stats_enabled``);
   with the real agent (``otelbpf run --pid SERVER``, http receiver on the server's port,
   spans and metrics to files). Medians of requests/s, wrk's p50/p99, and the server's own
   CPU time per request (``/proc/PID/schedstat``): BPF programs run in the server's context,
   so their cost is in it, while the agent's parsing (another process) is not.
2. Unloaded latency: ``wrk -t1 -c1`` (one request at a time), without and with the agent:
   p50/p99, the closest wrk gets to "time added per request".
3. A paced load of about 20k requests/s (wrk's per-request ``delay()`` of 1 ms on
   ``--paced-connections`` connections, default 24: ~24k/s offered, ~20k/s served here)
   with the agent: requests made, server spans the agent built, events lost in the kernel
   and batches dropped before processing.
4. gRPC unary calls/s and per-call p50/p99 from a Python grpcio client against the
   harness's grpcio server (tests/harness/grpc_demo.py) over one channel, without and with the
   agent (host mode, the server's port: both ends traced).

Added time per traced syscall is derived from (1): (1/rate_with - 1/rate_without) / 2, the
server making two traced syscalls per request. On a machine whose cores are all busy (wrk,
the server and the agent share 2 here) the throughput change mixes three costs; the floor,
the probes-only case and the server's CPU per request separate them.
Results: a table on stdout and bench/results/http-<date>.json. Findings: docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "build/bench/http_server"
RESULTS = ROOT / "bench/results"
PACED_LUA = "function delay() return 1 end\n"
GRPC_CLIENT = """
import sys, time, grpc
sys.path.insert(0, {tests!r})
from harness import grpc_demo
port, seconds = int(sys.argv[1]), float(sys.argv[2])
lat = []
with grpc.insecure_channel(f"127.0.0.1:{{port}}") as ch:
    call = grpc_demo.unary(ch)
    for _ in range(200):
        call(b"warm")
    end = time.perf_counter() + seconds
    while (t0 := time.perf_counter()) < end:
        call(b"hello")
        lat.append(time.perf_counter() - t0)
lat.sort()
print(len(lat) / seconds, lat[len(lat) // 2] * 1e6, lat[int(len(lat) * 0.99)] * 1e6)
"""


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


def wrk(port: int, seconds: float, threads: int, conns: int, script: Path | None = None) -> dict:
    cmd = ["wrk", f"-t{threads}", f"-c{conns}", f"-d{seconds:g}s", "--latency", f"http://127.0.0.1:{port}/"]
    if script:
        cmd[1:1] = ["-s", str(script)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    pct = {m.group(1): _us(m.group(2)) for m in re.finditer(r"^\s+(50|99)%\s+(\S+)", out, re.M)}
    return {
        "requests_per_s": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
        "requests": int(re.search(r"(\d+) requests in", out).group(1)),
        "p50_us": pct["50"],
        "p99_us": pct["99"],
    }


def _us(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()
    return float(value) * {"us": 1, "ms": 1e3, "s": 1e6}[unit]


@contextmanager
def agent(workdir: Path, ports: list[int], pids: list[int]) -> Iterator[dict]:
    """The real agent with the http receiver; yields a dict filled with its final counts on exit."""
    out = workdir / f"out-{time.monotonic_ns()}"
    cfg = workdir / "otelbpf.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "receivers": {"http": {"processes": "all", "ports": ports}},
                "exporters": {"file": {"directory": str(out)}},
                "service": {
                    "pipelines": {p: {"receivers": ["http"], "exporters": ["file"]} for p in ("traces", "metrics")}
                },
            }
        )
    )
    args = [sys.executable, "-m", "otelbpf.cli", "run", "-c", str(cfg)] + [a for p in pids for a in ("--pid", str(p))]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    for line in proc.stdout:
        if "otelbpf running" in line:
            break
    else:
        raise RuntimeError("the agent did not start")
    stats: dict = {}
    try:
        yield stats
    finally:
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=120)[0]
        m = re.search(r"events received (\d+), spans (\d+), lost in kernel (\d+)", rest)
        if m:
            stats.update(zip(("events_received", "spans", "lost_in_kernel"), map(int, m.groups())))
        stats.update(_final_counts(out / "metrics.jsonl"))


def _final_counts(path: Path) -> dict:
    """The agent's last cumulative values of its drop counters, from its metrics file."""
    names = {
        "otelbpf.events.dropped": "dropped_before_processing",
        "otelbpf.export.dropped": "spans_dropped_at_export",
        "otelbpf.spans.sampled_out": "spans_sampled_out",
    }
    last: dict = {}
    for line in path.read_text().splitlines() if path.exists() else ():
        for rm in json.loads(line).get("resourceMetrics", []):
            for sm in rm.get("scopeMetrics", []):
                for metric in sm.get("metrics", []):
                    if metric["name"] in names:
                        for p in metric.get("sum", {}).get("dataPoints", []):
                            key = (metric["name"], json.dumps(p.get("attributes", []), sort_keys=True))
                            last[key] = int(p.get("asInt", p.get("asDouble", 0)))
    out = {v: 0 for v in names.values()}
    for (name, _), value in last.items():
        out[names[name]] += value
    return out


@contextmanager
def probes_only(port: int, pid: int) -> Iterator[dict]:
    """The agent's socket probes loaded here, the ring drained and discarded: the kernel-side cost alone."""
    import threading

    sys.path.insert(0, str(ROOT))
    from otelbpf.families.http.probes import socket_family
    from otelbpf.sensor import program
    from otelbpf.sensor.ringbuf import VariableRingReader

    fam = socket_family([port], payload_bytes=4096, ring_bytes=16 << 20)
    text, cflags = program.build([fam], filter_pids=True, events_ring_bytes=256 << 10)
    bpf = program.load(text, cflags, [fam])
    watched = bpf["watched"]
    watched[watched.Key(pid)] = watched.Leaf(1)
    reader = VariableRingReader(bpf["sockdata"].map_fd, 16 << 20, fam.rings[0].dtype)
    stop = threading.Event()
    stats = {"records": 0}

    def drain() -> None:
        while not stop.wait(0.02):
            stats["records"] += len(reader.drain())

    t = threading.Thread(target=drain)
    knob = Path("/proc/sys/kernel/bpf_stats_enabled")
    knob_before = knob.read_text().strip()
    knob.write_text("1")  # the kernel times every run of every BPF program
    t.start()
    try:
        yield stats
    finally:
        stop.set()
        t.join()
        stats["bpf_programs"] = _program_stats(bpf)
        knob.write_text(knob_before)
        table = bpf["stats"]
        stats["lost_in_kernel"] = int(sum(table[table.Key(4)]))
        reader.close()
        bpf.cleanup()


@contextmanager
def empty_tracepoints() -> Iterator[None]:
    """Empty programs on every tracepoint the socket probes use: the cost of hooking at all."""
    from bcc import BPF

    text = (ROOT / "bpf/sockets.c").read_text()
    points = re.findall(r"^TRACEPOINT_PROBE\((\w+),\s*(\w+)\)", text, re.M)
    assert points, "no TRACEPOINT_PROBE in sockets.c"
    bpf = BPF(text="\n".join(f"TRACEPOINT_PROBE({c}, {e}) {{ return 0; }}" for c, e in points))
    try:
        yield
    finally:
        bpf.cleanup()


def _program_stats(bpf) -> dict:
    """run_cnt and run_time_ns of each loaded program that ran (kernel.bpf_stats_enabled)."""
    out = {}
    for name, fn in bpf.funcs.items():
        info = dict(
            line.split(":\t", 1)
            for line in Path(f"/proc/self/fdinfo/{fn.fd}").read_text().splitlines()
            if ":\t" in line
        )
        if int(info.get("run_cnt", "0")):
            out[name.decode() if isinstance(name, bytes) else name] = {
                "runs": int(info["run_cnt"]),
                "run_time_ns": int(info["run_time_ns"]),
            }
    return out


@contextmanager
def process(cmd: list[str], **kw) -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, **kw)
    try:
        assert proc.stdout.readline().startswith("ready"), f"{cmd[0]} did not start"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def cpu_ns(pid: int) -> int:
    """CPU time the process's main thread has run (the bench server has one thread)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def measured(port: int, seconds: float, pid: int) -> dict:
    """wrk -t2 -c32 plus the server's CPU time per request over the run."""
    before = cpu_ns(pid)
    r = wrk(port, seconds, 2, 32)
    r["server_cpu_us_per_request"] = (cpu_ns(pid) - before) / 1e3 / max(1, r["requests"])
    return r


VARIANTS = ("without", "empty_tracepoints", "probes_only", "agent")


def throughput(work: Path, seconds: float, repeats: int, work_us: int) -> dict:
    """Case (1) for one server weight: the four variants back to back in every repeat."""
    port = free_port()
    out: dict = {v: [] for v in VARIANTS} | {"agent_stats": [], "probe_stats": [], "work_us": work_us}
    with process([str(SERVER), str(port), str(work_us)]) as server:
        for _ in range(repeats):
            out["without"].append(measured(port, seconds, server.pid))
            with empty_tracepoints():
                out["empty_tracepoints"].append(measured(port, seconds, server.pid))
            with probes_only(port, server.pid) as stats:
                out["probes_only"].append(measured(port, seconds, server.pid))
            out["probe_stats"].append(stats)
            with agent(work, [port], [server.pid]) as stats:
                out["agent"].append(measured(port, seconds, server.pid))
            out["agent_stats"].append(stats)
    return out


def grpc_calls(port: int, seconds: float) -> dict:
    code = GRPC_CLIENT.format(tests=str(ROOT / "tests"))
    out = subprocess.run(
        [sys.executable, "-c", code, str(port), str(seconds)], capture_output=True, text=True, check=True
    ).stdout.split()
    return {"calls_per_s": float(out[0]), "p50_us": float(out[1]), "p99_us": float(out[2])}


def preflight(bench: str) -> None:
    """Root, the bench programs built, and wrk installed, or exit saying which is missing."""
    if os.geteuid() != 0:
        sys.exit(f"{bench} loads eBPF programs: run it as root")
    subprocess.run(["bash", str(ROOT / "examples/build.sh")], check=True, stdout=subprocess.DEVNULL)
    if subprocess.run(["which", "wrk"], capture_output=True).returncode:
        sys.exit("wrk is not installed: apt-get install wrk")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--paced-connections", type=int, default=24, help="connections of the paced case (1 ms apart each)")
    ap.add_argument(
        "--work-us",
        default="0,20,100",
        help="comma-separated CPU microseconds the server spends per request, one throughput case each",
    )
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    preflight("bench/http.py")
    work = Path(tempfile.mkdtemp(prefix="otelbpf-bench-http-"))
    results: dict = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "seconds": args.seconds}
    results["throughput"] = [throughput(work, args.seconds, args.repeats, int(w)) for w in args.work_us.split(",")]
    port = free_port()
    with process([str(SERVER), str(port)]) as server:
        one_base = wrk(port, args.seconds, 1, 1)
        with agent(work, [port], [server.pid]) as stats:
            one_traced = wrk(port, args.seconds, 1, 1)
        results["latency_one_connection"] = {"without": one_base, "with": one_traced, "agent": stats}
        paced = work / "paced.lua"
        paced.write_text(PACED_LUA)
        paced_base = wrk(port, args.seconds, 2, args.paced_connections, paced)
        with agent(work, [port], [server.pid]) as stats:
            paced_traced = wrk(port, args.seconds, 2, args.paced_connections, paced)
        results["paced"] = {"without": paced_base, "with": paced_traced, "agent": stats}
        results["paced_connections"] = args.paced_connections
    gport = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests")}
    with process([sys.executable, "-m", "harness.grpc_demo", str(gport)], cwd=ROOT / "tests", env=env):
        g_base, g_traced, g_stats = [], [], []
        for _ in range(args.repeats):
            g_base.append(grpc_calls(gport, args.seconds))
            with agent(work, [gport], []) as stats:
                g_traced.append(grpc_calls(gport, args.seconds))
            g_stats.append(stats)
        results["grpc"] = {"without": g_base, "with": g_traced, "agent": g_stats}
    report(results)
    RESULTS.mkdir(exist_ok=True)
    out = args.out or RESULTS / f"http-{dt.date.today().isoformat()}.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {out}")
    return 0


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def _agent_line(s: dict) -> str:
    return (
        f"spans built {s.get('spans')}, records received {s.get('events_received')}, lost in kernel "
        f"{s.get('lost_in_kernel')}, dropped before processing {s.get('dropped_before_processing')}, spans dropped "
        f"at export {s.get('spans_dropped_at_export')}, sampled out {s.get('spans_sampled_out')}"
    )


def report(r: dict) -> None:
    for t in r["throughput"]:
        print(
            f"HTTP/1.1 keep-alive, wrk -t2 -c32, server work {t['work_us']} us/request, "
            f"{r['seconds']:g}s x {len(t['without'])} (median)"
        )
        rb = _median(t["without"], "requests_per_s")
        cb = _median(t["without"], "server_cpu_us_per_request")
        for v in VARIANTS:
            rv, cv = _median(t[v], "requests_per_s"), _median(t[v], "server_cpu_us_per_request")
            print(
                f"  {v:18} {rv:9.0f} req/s {100 * (rv / rb - 1):+6.1f}%   p50 {_median(t[v], 'p50_us'):6.0f} us   "
                f"p99 {_median(t[v], 'p99_us'):6.0f} us   server CPU {cv:6.2f} us/req {100 * (cv / cb - 1):+6.1f}% "
                f"({(cv - cb) * 1e3 / 2:+5.0f} ns/syscall)"
                f"   runs {[round(x['requests_per_s']) for x in t[v]]}"
            )
        for st, run in zip(t["probe_stats"], t["probes_only"]):
            total = sum(p["run_time_ns"] for p in st.get("bpf_programs", {}).values())
            print(
                f"    probes only: records {st['records']}, lost in kernel {st['lost_in_kernel']}, BPF run time "
                f"(bpf_stats) {total / max(1, run['requests']):.0f} ns per request, all socket programs "
                "(the server's read and write, entry and exit, and wrk's calls the pid filter drops)"
            )
        for st, run in zip(t["agent_stats"], t["agent"]):
            print(f"    agent: requests {run['requests']}, {_agent_line(st)}")
    one = r["latency_one_connection"]
    print("One connection, one request at a time (wrk -t1 -c1)")
    for side in ("without", "with"):
        x = one[side]
        print(
            f"  {side:7} agent  {x['requests_per_s']:10.0f} req/s   "
            f"p50 {x['p50_us']:8.0f} us   p99 {x['p99_us']:8.0f} us"
        )
    p = r["paced"]
    s = p["agent"]
    print(f"Paced (wrk delay 1 ms, {r.get('paced_connections', 20)} connections)")
    print(
        f"  without agent  {p['without']['requests_per_s']:10.0f} req/s   "
        f"with agent {p['with']['requests_per_s']:10.0f} req/s"
    )
    print(f"    agent: requests {p['with']['requests']}, {_agent_line(s)}")
    g = r["grpc"]
    gb, gw = _median(g["without"], "calls_per_s"), _median(g["with"], "calls_per_s")
    print("gRPC unary, one grpcio channel, calls in a loop (median)")
    for side, calls in (("without", gb), ("with", gw)):
        print(
            f"  {side + ' agent':14} {calls:10.0f} calls/s p50 {_median(g[side], 'p50_us'):8.0f} us   "
            f"p99 {_median(g[side], 'p99_us'):8.0f} us"
        )
    print(f"  throughput change {100 * (gw / gb - 1):+.1f}%")
    for st in g["agent"]:
        print(f"    agent: {_agent_line(st)}")


if __name__ == "__main__":
    sys.exit(main())
