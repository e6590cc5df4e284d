"""HTTP/2 under overload (issue 38): the streams the agent counts against the clients' own count,
the records the ring lost, where the streams were counted, and what the kernel's frame walk costs.

    sudo .venv/bin/python bench/http2_load.py [--server nghttpd|h2] [--requests 500000] [--seconds 5]
                                              [--repeats 2] [--rings 64KiB,16MiB] [--compare /work/main]
                                              [--probes-only] [--shift K] [--out FILE]

Two servers, two loads:

- ``nghttpd`` (the default; Debian's nghttp2-server, C, one event loop) serving a file (200) and
  a missing one (404, a quarter of the streams), loaded by ``h2load`` (nghttp2-client, C)
  with ``--requests`` streams on 8 connections, 8 at a time on each: far more streams a second
  than the agent parses, as a fast server's load is; h2load's own count of 2xx and 4xx is the
  truth;
- ``h2``: tests/harness/h2_apps.py (the ``h2`` library, Python, a thread per connection: 200,
  404, 500 and RST_STREAM by path), loaded by ``--loads`` processes of ``--conns`` HTTP/2
  connections each, ``--batch`` streams at a time on each, for ``--seconds``, every process
  counting how its own streams ended.

The server runs on a CPU of its own where there are two or more; the load and the agent share
the rest.

Per tree (this checkout, and with ``--compare`` another checkout, e.g. main, side by side in one
run), per ring size, per repeat, back to back on one server:

- the real agent of that tree (``otelbpf run --pid SERVER``, the http receiver alone, file
  exporter): streams the clients made (by outcome) against ``http.server.request.duration``'s
  count (by status), records lost in the kernel, batches dropped before processing, spans
  built, the sampling decisions (``otelbpf.http.sampled``: kept and shed in user space, counted
  in the kernel), connections switched to counting, the agent's CPU per stream;
- that tree's socket probes alone (loaded by a helper process, ring drained and discarded,
  ``kernel.bpf_stats_enabled``): the BPF run time per stream, every socket program (tail-called
  programs, the capture and this branch's HTTP/2 walk, count in the tracepoint that called them:
  the kernel's statistics do not split them), at sampling shift ``--shift`` (0: every stream
  kept; K: kept with probability 2^-K, the kernel deciding a walked server's streams and the
  threads serving them, which costs more for a shed stream than for a kept one).
``--probes-only`` runs the second alone.

A connection the server's accept() returned from a call made before the agent started is
neither parsed nor walked (its beginning was not seen): one throwaway connection takes it.
Results: a table on stdout and bench/results/http2-load-<date>.json. Findings: docs/BENCHMARKS.md.
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
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench/results"
TESTS = ROOT / "tests"

#: One load process (harness.h2_apps.H2Client): prints {outcome: streams} as JSON.
LOAD = r"""
import json, sys, time
from collections import Counter
from harness.h2_apps import H2Client
port, conns, batch, seconds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
PATHS = ["/ok"] * 5 + ["/missing", "/fail", "/reset"]
clients = [H2Client(port) for _ in range(conns)]
done = Counter()
end = time.monotonic() + seconds
i = 0
while time.monotonic() < end:
    for c in clients:
        done.update(c.run([PATHS[(i + k) % 8] for k in range(batch)]))
        i += 1
for c in clients:
    c.close()
print(json.dumps(done))
"""

#: A tree's socket probes alone (run with that tree first on sys.path): loaded, the server's pid
#: watched, the ring drained and discarded; a line on stdin ends it, and it prints each program's
#: runs and run time (bpf_stats) as JSON.
PROBES = r"""
import json, sys, threading
from pathlib import Path
from otelbpf.families.http.probes import socket_family
from otelbpf.sensor import program
from otelbpf.sensor.ringbuf import VariableRingReader
port, pid, shift = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
fam = socket_family([port], payload_bytes=4096, ring_bytes=16 << 20)
text, cflags = program.build([fam], filter_pids=True, events_ring_bytes=256 << 10)
bpf = program.load(text, cflags, [fam])
bpf["watched"][bpf["watched"].Key(pid)] = bpf["watched"].Leaf(1)
sampling = bpf["http_sampling"]
sampling[sampling.Key(0)] = sampling.Leaf(shift)  # SAMPLING_SHIFT
reader = VariableRingReader(bpf["sockdata"].map_fd, 16 << 20, fam.rings[0].dtype)
stop = threading.Event()
records = [0]
def drain():
    while not stop.wait(0.02):
        records[0] += len(reader.drain())
t = threading.Thread(target=drain)
t.start()
print("ready", flush=True)
sys.stdin.readline()
stop.set()
t.join()
out = {}
for name, fn in bpf.funcs.items():
    info = dict(l.split(":\t", 1) for l in Path(f"/proc/self/fdinfo/{fn.fd}").read_text().splitlines() if ":\t" in l)
    if int(info.get("run_cnt", "0")):
        out[name.decode() if isinstance(name, bytes) else name] = [int(info["run_cnt"]), int(info["run_time_ns"])]
lost = int(sum(bpf["stats"][bpf["stats"].Key(4)]))
print(json.dumps({"programs": out, "records": records[0], "lost_in_kernel": lost}), flush=True)
reader.close()
bpf.cleanup()
"""


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


def cpu_plan() -> dict:
    """The server on a CPU of its own when there are two or more; the load and the agent on the rest."""
    n = len(os.sched_getaffinity(0))
    if n >= 2:
        return {"server": {0}, "rest": set(range(1, n)), "note": f"{n} CPUs: the server alone on CPU 0"}
    return {"server": None, "rest": None, "note": "1 CPU: nothing pinned"}


def _pin(cpus: set[int] | None):
    return (lambda: os.sched_setaffinity(0, cpus)) if cpus else None


def process_cpu_ns(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def take_the_accept_from_before(port: int) -> None:
    socket.create_connection(("127.0.0.1", port)).close()
    time.sleep(0.2)


def h2load(port: int, args: argparse.Namespace, cpus: set[int] | None) -> Counter:
    """h2load's streams to nghttpd, by status class as 200 (2xx) and 404 (4xx)."""
    uris = [f"http://127.0.0.1:{port}/ok"] * 3 + [f"http://127.0.0.1:{port}/missing"]
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(uris) + "\n")
    cmd = ["h2load", "-n", str(args.requests), "-c", "8", "-m", "8", "-t", "1", "-i", f.name]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, preexec_fn=_pin(cpus)).stdout
    os.unlink(f.name)
    m = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out)
    rate = re.search(r"finished in [\d.]+\w+, ([\d.]+) req/s", out)
    assert m and rate, out
    made = Counter({k: n for k, n in (("200", int(m.group(1))), ("404", int(m.group(3)))) if n})
    made["rate"] = int(float(rate.group(1)))  # not a stream outcome: taken out by the caller
    return made


def load(port: int, args: argparse.Namespace, cpus: set[int] | None) -> Counter:
    if args.server == "nghttpd":
        return h2load(port, args, cpus)
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", LOAD, str(port), str(args.conns), str(args.batch), str(args.seconds)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            preexec_fn=_pin(cpus),
        )
        for _ in range(args.loads)
    ]
    made: Counter = Counter()
    for p in procs:
        made.update(json.loads(p.communicate(timeout=600)[0]))
    return made


def run_agent(tree: Path, port: int, server_pid: int, ring: str, args: argparse.Namespace, cpus) -> dict:
    """The agent of ``tree`` during one load: what the clients made and what it counted."""
    work = Path(tempfile.mkdtemp(prefix="otelbpf-bench-h2-"))
    out = work / "out"
    cfg = work / "otelbpf.yaml"
    http = {"processes": "all", "ports": [port], "ring_buffer_size": ring}
    cfg.write_text(
        yaml.safe_dump(
            {
                "receivers": {"http": http},
                "exporters": {"file": {"directory": str(out)}},
                "service": {
                    "pipelines": {p: {"receivers": ["http"], "exporters": ["file"]} for p in ("traces", "metrics")},
                    "telemetry": {"metrics_interval": "1s"},
                },
            }
        )
    )
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-m", "otelbpf.cli", "run", "-c", str(cfg), "--pid", str(server_pid)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tree, env=env, preexec_fn=_pin(cpus)
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if "otelbpf running" in line:
            break
    else:
        raise RuntimeError(f"the agent of {tree} did not start")
    take_the_accept_from_before(port)
    cpu0 = process_cpu_ns(proc.pid)
    made = load(port, args, cpus)
    rate = made.pop("rate", 0)
    cpu1 = process_cpu_ns(proc.pid)
    time.sleep(2.5)  # the last drains and two metric exports
    proc.send_signal(signal.SIGINT)
    rest = proc.communicate(timeout=120)[0]
    res: dict = {"made": dict(made), "streams": sum(made.values()), "agent_cpu_ns": cpu1 - cpu0, "rate": rate}
    m = re.search(r"events received (\d+), spans (\d+), lost in kernel (\d+)", rest)
    if m:
        res.update(zip(("records_received", "spans", "lost_in_kernel"), map(int, m.groups())))
    res |= read_metrics(out / "metrics.jsonl", server_pid)
    res["agent_cpu_us_per_stream"] = res["agent_cpu_ns"] / 1e3 / max(1, res["streams"])
    return res


def read_metrics(path: Path, pid: int) -> dict:
    """Last cumulative values: the server's streams counted by outcome, decisions, losses."""
    counted: dict = {}
    sums: dict = {}
    for line in path.read_text().splitlines() if path.exists() else ():
        for rm in json.loads(line).get("resourceMetrics", []):
            resource = {a["key"]: a["value"] for a in rm.get("resource", {}).get("attributes", [])}
            for sm in rm.get("scopeMetrics", []):
                for metric in sm.get("metrics", []):
                    name = metric["name"]
                    for p in metric.get("histogram", metric.get("sum", {})).get("dataPoints", []):
                        attrs = {a["key"]: next(iter(a["value"].values())) for a in p.get("attributes", [])}
                        if name == "http.server.request.duration":
                            if str(resource.get("process.pid", {}).get("intValue", "")) != str(pid):
                                continue
                            status = (
                                "reset"
                                if attrs.get("error.type") == "reset"
                                else attrs.get("http.response.status_code", "none")
                            )
                            counted[json.dumps(attrs, sort_keys=True)] = (str(status), int(p["count"]))
                        elif name in ("otelbpf.http.sampled", "otelbpf.events.lost", "otelbpf.events.dropped"):
                            key = (name, json.dumps(attrs, sort_keys=True))
                            sums[key] = int(p.get("asInt", 0))
                        elif name == "otelbpf.http.h2.counted_connections":
                            sums[(name, "")] = int(p.get("asInt", 0))
    by_status: Counter = Counter()
    for status, n in counted.values():
        by_status[status] += n
    decisions: Counter = Counter()
    lost = dropped = switched = 0
    for (name, attrs_json), value in sums.items():
        attrs = json.loads(attrs_json) if attrs_json else {}
        if name == "otelbpf.http.sampled":
            decisions[f"{attrs.get('protocol', '?')}:{attrs.get('decision')}"] += value
        elif name == "otelbpf.events.lost" and attrs.get("reason") == "socket_ring_full":
            lost += value
        elif name == "otelbpf.events.dropped":
            dropped += value
        elif name == "otelbpf.http.h2.counted_connections":
            switched += value
    return {
        "counted": dict(by_status),
        "counted_total": sum(by_status.values()),
        "decisions": dict(decisions),
        "socket_ring_full": lost,
        "dropped_before_processing": dropped,
        "connections_switched": switched,
    }


def run_probes(tree: Path, port: int, server_pid: int, args: argparse.Namespace, cpus) -> dict:
    """That tree's socket probes alone during one load: BPF run time per stream."""
    knob = Path("/proc/sys/kernel/bpf_stats_enabled")
    before = knob.read_text().strip()
    knob.write_text("1")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    helper = subprocess.Popen(
        [sys.executable, "-c", PROBES, str(port), str(server_pid), str(args.shift)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=tree,
        env=env,
    )
    try:
        assert helper.stdout is not None and helper.stdin is not None
        assert helper.stdout.readline().startswith("ready"), "the probes did not load"
        take_the_accept_from_before(port)
        made = load(port, args, cpus)
        rate = made.pop("rate", 0)
        helper.stdin.write("\n")
        helper.stdin.flush()
        stats = json.loads(helper.stdout.readline())
        helper.wait(timeout=60)
    finally:
        knob.write_text(before)
        helper.kill()
    streams = max(1, sum(made.values()))
    progs = stats["programs"]
    total = sum(ns for _, ns in progs.values())
    return {
        "streams": sum(made.values()),
        "rate": rate,
        "bpf_ns_per_stream": total / streams,
        "programs": progs,
        "lost_in_kernel": stats["lost_in_kernel"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", choices=("nghttpd", "h2"), default="nghttpd")
    ap.add_argument("--requests", type=int, default=500_000, help="nghttpd: streams h2load makes")
    ap.add_argument("--seconds", type=float, default=5, help="h2: seconds of load")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--rings", default="64KiB,16MiB", help="comma-separated ring_buffer_size values, one case each")
    ap.add_argument("--loads", type=int, default=2, help="load processes")
    ap.add_argument("--conns", type=int, default=4, help="connections per load process")
    ap.add_argument("--batch", type=int, default=8, help="streams at a time on each connection")
    ap.add_argument("--compare", type=Path, help="another checkout (main) run side by side")
    ap.add_argument("--probes-only", action="store_true", help="only each tree's socket probes, no agent")
    ap.add_argument("--shift", type=int, default=0, help="probes: the sampling shift (streams kept at 2^-shift)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/http2_load.py loads eBPF programs: run it as root")
    plan = cpu_plan()
    trees = [("this", ROOT)] + ([("compare", args.compare.resolve())] if args.compare else [])
    results: dict = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "args": {k: str(v) for k, v in vars(args).items()},
        "plan": plan["note"],
        "load_average": os.getloadavg(),
        "trees": {name: str(tree) for name, tree in trees},
        "cases": [],
    }
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    if args.server == "nghttpd":
        docroot = Path(tempfile.mkdtemp(prefix="otelbpf-bench-h2root-"))
        (docroot / "ok").write_bytes(b"ok")
        cmd = ["nghttpd", "--no-tls", "-d", str(docroot), str(port)]
    else:
        cmd = [sys.executable, "-m", "harness.h2_apps", "server", str(port)]
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, preexec_fn=_pin(plan["server"]))
    try:
        if args.server == "nghttpd":
            deadline = time.monotonic() + 10
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port)).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline, "nghttpd did not listen"
                    time.sleep(0.05)
        else:
            assert server.stdout is not None and server.stdout.readline().startswith("ready")
        for _ in range(args.repeats):
            if args.server == "nghttpd":
                base = h2load(port, args, plan["rest"])
                results["cases"].append({"tree": "none", "without": {"rate": base["rate"]}})
                print(f"  without agent: {base['rate']} streams/s")
            for name, tree in trees:
                for ring in [] if args.probes_only else args.rings.split(","):
                    r = run_agent(tree, port, server.pid, ring, args, plan["rest"])
                    results["cases"].append({"tree": name, "ring": ring, "agent": r})
                    report_agent(name, ring, r)
                p = run_probes(tree, port, server.pid, args, plan["rest"])
                results["cases"].append({"tree": name, "probes": p})
                print(
                    f"  {name:8} probes only: {p['rate']} streams/s, BPF {p['bpf_ns_per_stream']:.0f} ns/stream, "
                    f"lost {p['lost_in_kernel']}"
                )
    finally:
        server.kill()
        server.wait()
    results["load_average_after"] = os.getloadavg()
    summary(results)
    RESULTS.mkdir(exist_ok=True)
    out = args.out or RESULTS / f"http2-load-{dt.date.today().isoformat()}.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {out}")
    return 0


def report_agent(name: str, ring: str, r: dict) -> None:
    print(
        f"  {name:8} ring {ring:7} {r['rate']:7} streams/s made {r['streams']:7} counted {r['counted_total']:7} "
        f"({100 * r['counted_total'] / max(1, r['streams']):5.1f}%)  records lost {r['socket_ring_full']:7}  "
        f"dropped {r['dropped_before_processing']}  spans {r.get('spans')}  switched {r['connections_switched']}  "
        f"agent {r['agent_cpu_us_per_stream']:.1f} us CPU/stream  decisions {r['decisions']}"
    )
    if r["counted"] != r["made"]:
        print(f"           by outcome: made {r['made']} counted {r['counted']}")


def summary(results: dict) -> None:
    print("\nMedians over repeats")
    keys = sorted({(c["tree"], c.get("ring", "probes")) for c in results["cases"] if "without" not in c})
    base = [c["without"]["rate"] for c in results["cases"] if "without" in c]
    if base:
        print(f"  without agent: {statistics.median(base):.0f} streams/s")
    for tree, ring in keys:
        runs = [c for c in results["cases"] if c["tree"] == tree and c.get("ring", "probes") == ring]
        if ring == "probes":
            ns = statistics.median(c["probes"]["bpf_ns_per_stream"] for c in runs)
            rate = statistics.median(c["probes"]["rate"] for c in runs)
            print(
                f"  {tree:8} probes only: {rate:.0f} streams/s, BPF {ns:.0f} ns/stream "
                "(every socket program, the server's calls)"
            )
            continue
        share = statistics.median(c["agent"]["counted_total"] / max(1, c["agent"]["streams"]) for c in runs)
        lost = statistics.median(c["agent"]["socket_ring_full"] for c in runs)
        cpu = statistics.median(c["agent"]["agent_cpu_us_per_stream"] for c in runs)
        rate = statistics.median(c["agent"]["rate"] for c in runs)
        print(
            f"  {tree:8} ring {ring:7} {rate:7.0f} streams/s  counted/made {100 * share:5.1f}%  "
            f"records lost {lost:.0f}  agent {cpu:.1f} us/stream"
        )


if __name__ == "__main__":
    sys.exit(main())
