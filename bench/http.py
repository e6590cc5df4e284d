"""Benchmark the HTTP/gRPC socket probes: throughput and latency with and without the agent,
side by side in one run.

    sudo .venv/bin/python bench/http.py [--seconds 5] [--repeats 3] [--out FILE]
    sudo .venv/bin/python bench/http.py --tail 8,32,64,flood:32 [--seconds 5] [--repeats 3]

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

5. ``--tail 8,32,64,flood:32`` (that case alone): the tail apart from contention. The server,
   wrk (``-t1``) and the agent pinned to CPUs of their own where there are three or more; with
   two the server keeps CPU 0 alone and the agent shares CPU 1 with wrk (said in the output).
   Per load level (N paced connections at one request per ms each: ~N k requests/s offered;
   ``flood:N`` unpaced), without and with the agent: requests/s, p50/p99/p99.9 (wrk's own
   histogram, a ``done()`` script), and with the agent its CPU per request and per span built
   (/proc/PID/stat, every thread), the run time of its BPF programs per request
   (``kernel.bpf_stats_enabled``, the programs' fdinfo: the in-kernel cost), the requests it
   counted (``http.server.request.duration``) against wrk's, and its head-sampling decisions.

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
def agent(
    workdir: Path, ports: list[int], pids: list[int], cpus: set[int] | None = None, nice: int = 0
) -> Iterator[dict]:
    """The real agent with the http receiver; yields a dict (its ``pid`` at once) filled with its
    final counts on exit. ``cpus``: the agent's threads run there only, at ``nice``."""
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
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, preexec_fn=_pin(cpus, nice)
    )
    for line in proc.stdout:
        if "otelbpf running" in line:
            break
    else:
        raise RuntimeError("the agent did not start")
    stats: dict = {"pid": proc.pid}
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
    out |= _red_and_decisions(path)
    return out


def _red_and_decisions(path: Path) -> dict:
    """The server requests the agent counted (http.server.request.duration, all series) and its
    head-sampling decisions (otelbpf.http.sampled), last cumulative values."""
    counts: dict = {}
    decisions: dict = {}
    for line in path.read_text().splitlines() if path.exists() else ():
        for rm in json.loads(line).get("resourceMetrics", []):
            for sm in rm.get("scopeMetrics", []):
                for metric in sm.get("metrics", []):
                    points = metric.get("histogram", metric.get("sum", {})).get("dataPoints", [])
                    for p in points:
                        key = json.dumps(p.get("attributes", []), sort_keys=True)
                        if metric["name"] == "http.server.request.duration":
                            counts[key] = int(p["count"])
                        elif metric["name"] == "otelbpf.http.sampled":
                            attrs = {a["key"]: a["value"].get("stringValue") for a in p.get("attributes", [])}
                            decisions[attrs.get("decision")] = int(p.get("asInt", 0))
    return {"requests_counted": sum(counts.values()), "sampling_decisions": decisions}


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


def _pin(cpus: set[int] | None, nice: int = 0):
    """A preexec_fn that pins the child (and every thread it starts) to ``cpus``, at ``nice``."""
    if not cpus and not nice:
        return None

    def pin() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)
        if nice:
            os.nice(nice)

    return pin


def cpu_plan() -> dict:
    """Where the server, the load generator and the agent run: each on its own CPU when there
    are three; with two, the agent shares the load generator's (never the server's); else none."""
    n = len(os.sched_getaffinity(0))
    if n >= 3:
        return {"server": {0}, "load": {1}, "agent": set(range(2, n)), "note": f"{n} CPUs: each on its own"}
    if n == 2:
        return {
            "server": {0},
            "load": {1},
            "agent": {1},
            "note": "2 CPUs: the server alone on CPU 0; the agent shares CPU 1 with the load generator",
        }
    return {"server": None, "load": None, "agent": None, "note": f"{n} CPU: nothing pinned"}


def process_cpu_ns(pid: int) -> int:
    """User + system CPU of every thread of a process so far (/proc/PID/stat, in clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def agent_bpf_ns(pid: int) -> int:
    """run_time_ns summed over the BPF programs a process holds (kernel.bpf_stats_enabled on)."""
    total = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if "bpf-prog" not in os.readlink(fd):
                continue
            info = Path(f"/proc/{pid}/fdinfo/{fd.name}").read_text()
        except OSError:
            continue
        m = re.search(r"^run_time_ns:\s+(\d+)", info, re.M)
        total += int(m.group(1)) if m else 0
    return total


TAIL_LUA = """
{delay}
done = function(summary, latency, requests)
  io.write(string.format("TAIL %d %d %d %d %d\\n", summary.requests, latency:percentile(50),
                         latency:percentile(99), latency:percentile(99.9), latency.max))
end
"""


def wrk_tail(port: int, seconds: float, conns: int, paced: bool, cpus: set[int] | None, work: Path) -> dict:
    """wrk -t1 on ``cpus``: requests, p50/p99/p99.9/max in us (one request per connection per ms when ``paced``)."""
    script = work / f"tail-{int(paced)}.lua"
    script.write_text(TAIL_LUA.format(delay="function delay() return 1 end" if paced else ""))
    cmd = ["wrk", "-t1", f"-c{conns}", f"-d{seconds:g}s", "-s", str(script), f"http://127.0.0.1:{port}/"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, preexec_fn=_pin(cpus)).stdout
    n, p50, p99, p999, top = map(int, re.search(r"^TAIL (\d+) (\d+) (\d+) (\d+) (\d+)", out, re.M).groups())
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    return {"requests": n, "requests_per_s": rps, "p50_us": p50, "p99_us": p99, "p999_us": p999, "max_us": top}


def tail(work: Path, seconds: float, repeats: int, levels: list[str], nice: int = 0) -> dict:
    """The tail apart from contention: the server, the load and the agent pinned (cpu_plan), for
    each load level (``N`` paced connections, ~N k requests/s offered; ``flood:N`` unpaced), without
    and with the agent, back to back in every repeat. With the agent: its CPU per request and per
    span, the BPF programs' run time per request, the requests it counted against wrk's."""
    plan = cpu_plan()
    knob = Path("/proc/sys/kernel/bpf_stats_enabled")
    knob_before = knob.read_text().strip()
    knob.write_text("1")
    out: dict = {"plan": {k: sorted(v) if isinstance(v, set) else v for k, v in plan.items()}, "levels": []}
    out["agent_nice"] = nice
    try:
        for level in levels:
            paced = not level.startswith("flood:")
            conns = int(level.split(":")[-1])
            port = free_port()
            case: dict = {"level": level, "connections": conns, "paced": paced, "without": [], "with": []}
            with process([str(SERVER), str(port), "0"]) as server:
                if plan["server"]:
                    os.sched_setaffinity(server.pid, plan["server"])
                for _ in range(repeats):
                    case["without"].append(wrk_tail(port, seconds, conns, paced, plan["load"], work))
                    with agent(work, [port], [server.pid], plan["agent"], nice) as stats:
                        cpu0, bpf0, srv0 = process_cpu_ns(stats["pid"]), agent_bpf_ns(stats["pid"]), cpu_ns(server.pid)
                        run = wrk_tail(port, seconds, conns, paced, plan["load"], work)
                        cpu1, bpf1, srv1 = process_cpu_ns(stats["pid"]), agent_bpf_ns(stats["pid"]), cpu_ns(server.pid)
                        time.sleep(1.5)  # the agent's last drain and metrics export
                    n = max(1, run["requests"])
                    run |= {
                        "agent_cpu_us_per_request": (cpu1 - cpu0) / 1e3 / n,
                        "bpf_ns_per_request": (bpf1 - bpf0) / n,
                        "server_cpu_us_per_request": (srv1 - srv0) / 1e3 / n,
                        "agent": stats,
                    }
                    spans = stats.get("spans") or 0
                    run["agent_cpu_us_per_span"] = (cpu1 - cpu0) / 1e3 / spans if spans else None
                    case["with"].append(run)
            out["levels"].append(case)
    finally:
        knob.write_text(knob_before)
    return out


def report_tail(t: dict) -> None:
    print(f"Tail, pinned ({t['plan']['note']}; agent nice {t.get('agent_nice', 0)}); wrk -t1, medians over repeats")
    for case in t["levels"]:
        name = f"{case['connections']} conns, " + ("paced 1 ms" if case["paced"] else "unpaced")
        for side in ("without", "with"):
            runs = case[side]
            line = (
                f"  {name:22} {side:7} {_median(runs, 'requests_per_s'):8.0f} req/s  p50 {_median(runs, 'p50_us'):6.0f}"
                f"  p99 {_median(runs, 'p99_us'):6.0f}  p99.9 {_median(runs, 'p999_us'):6.0f} us"
            )
            if side == "with":
                per_span = [r["agent_cpu_us_per_span"] for r in runs if r["agent_cpu_us_per_span"]]
                line += (
                    f"  agent {_median(runs, 'agent_cpu_us_per_request'):5.2f} us CPU/req"
                    f" ({statistics.median(per_span) if per_span else 0:5.1f}/span)"
                    f"  BPF {_median(runs, 'bpf_ns_per_request'):5.0f} ns/req"
                )
            print(line)
        for r in case["with"]:
            a = r["agent"]
            print(
                f"    wrk {r['requests']} requests, agent counted {a.get('requests_counted')}, spans {a.get('spans')}, "
                f"lost in kernel {a.get('lost_in_kernel')}, decisions {a.get('sampling_decisions')}"
            )


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
    ap.add_argument(
        "--tail",
        default="",
        help="only the pinned tail case: comma-separated levels, N (N paced connections, ~N k req/s) or flood:N",
    )
    ap.add_argument("--agent-nice", type=int, default=0, help="the tail case's agent at this nice value")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    preflight("bench/http.py")
    work = Path(tempfile.mkdtemp(prefix="otelbpf-bench-http-"))
    results: dict = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "seconds": args.seconds}
    results["load_average"] = os.getloadavg()
    if args.tail:
        results["tail"] = tail(work, args.seconds, args.repeats, args.tail.split(","), args.agent_nice)
        results["load_average_after"] = os.getloadavg()
        report_tail(results["tail"])
        print(f"load average before {results['load_average']}, after {results['load_average_after']}")
        RESULTS.mkdir(exist_ok=True)
        out = args.out or RESULTS / f"http-tail-{dt.date.today().isoformat()}.json"
        out.write_text(json.dumps(results, indent=2))
        print(f"\nwrote {out}")
        return 0
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
