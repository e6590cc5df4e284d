"""Cost of the tls receiver per TLS record, against an empty uprobe and uretprobe on the same
functions (the floor), in one run (needs root and the system's libssl.so.3).

A child process (Python's ``ssl``, the system OpenSSL) holds a TLS connection over a socketpair
and, in a timed loop, writes a 256-byte record with ``SSL_write`` on one end and reads it with
``SSL_read`` on the other: two TLS calls (and a write and a read syscall) per iteration. Run in
rounds with
  none     no probe;
  floor    an empty uprobe and an empty uretprobe on SSL_read, SSL_write, SSL_read_ex and
           SSL_write_ex: what any probe there costs;
  tls      the receiver's programs (bpf/tls.c): arguments kept at entry, the fd taken from the
           syscall inside the call (its sys_enter tracepoints attached too), 256 bytes of
           plaintext copied to the ring at return;
  filtered the receiver's programs for a process it does not trace (host mode, processes: gpu,
           a process that is no library user): the uprobes fire and return at once;
  elsewhere the receiver's programs attached for another process only (BCC's ``pid``: the
           kernel puts the breakpoints in that process's memory alone), what per-process
           attachment would cost a process that is not traced.
Prints ns per iteration (median of the rounds' best-of-5) and per TLS record (half of it), the
overhead against none, and the kernel's account of the receiver's programs
(``kernel.bpf_stats_enabled``). A second child times ``os.write`` to /dev/null with and without
the sys_enter programs: what every syscall on the host pays for the fd finder.

    sudo .venv/bin/python bench/tls.py [--iterations 20000] [--rounds 3]

``--load`` (that case alone): HTTPS under overload with the real agent, head sampling off and on
side by side. A keep-alive HTTPS server (tests/harness/tls_apps.py ``statuses``: Python's
``ssl``, a 404 for every fourth request) under two ``load`` client processes (3 connections
each, one request in flight on each, counting their own responses) for ``--seconds``; the agent
(``--pid`` on the server, http + tls receivers, metrics and spans to files) with the tls ring of
each ``--rings`` size, in three modes: ``before`` (the tree at ``--before``, default the commit
before TLS head sampling, extracted with ``git archive`` and run as it is: every plaintext
record goes to the ring), ``whole`` (this tree, probability 1, no adaptation, a backlog no ring
reaches: nothing shed but a kept request whose first record finds the ring full, counted in
the kernel) and ``sampled`` (this tree's defaults: adaptive head sampling, shed past half the
ring). Per run: requests
the clients made and the agent counted (``http.server.request.duration``, per status), server
spans built, TLS records lost in the kernel and shed there, the sampling decisions, requests/s,
and the run time of all the agent's BPF programs per request (``kernel.bpf_stats_enabled``:
the in-kernel cost, the socket path's ciphertext records included). And the requests/s with no
agent, as the baseline.

    sudo .venv/bin/python bench/tls.py --load [--seconds 5] [--rings 16KiB,8MiB] [--repeats 2] [--before REF]
"""

from __future__ import annotations

import argparse
import ctypes
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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml
from bcc import BPF

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from otelbpf.families.http.probes import socket_family  # noqa: E402
from otelbpf.families.tls.probes import (  # noqa: E402
    CLOSE_PROGRAM,
    SYSCALL_PROGRAM,
    SYSCALLS,
    Rejected,
    openssl_probes,
    tls_family,
)
from otelbpf.sensor import program  # noqa: E402

LIBSSL = "/usr/lib/x86_64-linux-gnu/libssl.so.3"
ROOT = Path(__file__).resolve().parents[1]
#: The tls receiver's programs, by the names the kernel keeps (15 characters).
TLS_PROGRAMS = {"uprobe_ssl_read", "uprobe_ssl_writ", "uretprobe_ssl", "tls_sys_enter"}
TESTS = ROOT / "tests"
RESULTS = ROOT / "bench/results"

CHILD = """
import math, socket, ssl, sys, threading, time
cert, key, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
sctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
sctx.load_cert_chain(cert, key)
cctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
cctx.check_hostname = False
cctx.verify_mode = ssl.CERT_NONE
a, b = socket.socketpair()
got = {}
t = threading.Thread(target=lambda: got.setdefault("s", sctx.wrap_socket(b, server_side=True)))
t.start()
c = cctx.wrap_socket(a, server_hostname="x")
t.join()
s = got["s"]
payload = b"x" * 256
def loop(k):
    for _ in range(k):
        c.sendall(payload)
        s.recv(256)
loop(2000)
best = math.inf
for _ in range(5):
    t0 = time.perf_counter_ns()
    loop(n)
    best = min(best, (time.perf_counter_ns() - t0) / n)
print(best)
"""

SYSCALL_CHILD = """
import math, os, sys, time
n = int(sys.argv[1])
fd = os.open("/dev/null", os.O_WRONLY)
b = b"x"
best = math.inf
for _ in range(5):
    t0 = time.perf_counter_ns()
    for _ in range(n):
        os.write(fd, b)
    best = min(best, (time.perf_counter_ns() - t0) / n)
print(best)
"""


def child(code: str, *args: str) -> float:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True, cwd="/")
    return float(out.stdout)


def program_stats(bpf: BPF) -> dict[str, dict[str, float]]:
    out = {}
    for name, fn in bpf.funcs.items():
        info = dict(
            line.split(":\t", 1)
            for line in Path(f"/proc/self/fdinfo/{fn.fd}").read_text().splitlines()
            if ":\t" in line
        )
        runs = int(info.get("run_cnt", "0"))
        if runs:
            key = name.decode() if isinstance(name, bytes) else name
            out[key] = {"runs": runs, "mean_ns": round(int(info["run_time_ns"]) / runs, 1)}
    return out


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


def harness(*args: str, **kw) -> subprocess.Popen:
    """A tests/harness/tls_apps.py process."""
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    return subprocess.Popen(
        [sys.executable, "-m", "harness.tls_apps", *args], cwd=TESTS, env=env, text=True, stdout=subprocess.PIPE, **kw
    )


@contextmanager
def https_server(port: int, certs: tuple[str, str]) -> Iterator[subprocess.Popen]:
    proc = harness("statuses", str(port), *certs)
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
        yield proc
    finally:
        proc.kill()
        proc.wait()


def load(port: int, seconds: float, ca: str) -> tuple[Counter[int], float]:
    """Two load processes of 3 connections each: the responses they read, by status, and the seconds taken."""
    t0 = time.monotonic()
    procs = [harness("load", str(port), "3", str(seconds), ca) for _ in range(2)]
    made: Counter[int] = Counter()
    for p in procs:
        made.update({int(k): v for k, v in json.loads(p.communicate(timeout=seconds + 60)[0]).items()})
    return made, time.monotonic() - t0


def agent_programs(pid: int) -> dict[str, list[int]]:
    """[runs, run_time_ns] of the BPF programs a process holds, by program name (the kernel keeps
    15 characters of it: every syscall tracepoint is ``tracepoint__sys``), with
    kernel.bpf_stats_enabled on. Names come from libbpf (``bpf_prog_get_fd_by_id``, then the
    program's info: ``name`` at offset 64 of ``struct bpf_prog_info``)."""
    libbpf = ctypes.CDLL("libbpf.so.1", use_errno=True)
    out: dict[str, list[int]] = {}
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if "bpf-prog" not in os.readlink(fd):
                continue
            info = Path(f"/proc/{pid}/fdinfo/{fd.name}").read_text()
        except OSError:
            continue
        fields = dict(re.findall(r"^(\w+):\s+(\S+)", info, re.M))
        name = "?"
        own = libbpf.bpf_prog_get_fd_by_id(ctypes.c_uint32(int(fields.get("prog_id", 0))))
        if own >= 0:
            buf = ctypes.create_string_buffer(256)
            size = ctypes.c_uint32(256)
            if libbpf.bpf_obj_get_info_by_fd(own, buf, ctypes.byref(size)) == 0:
                name = buf.raw[64:80].split(b"\0", 1)[0].decode() or "?"
            os.close(own)
        entry = out.setdefault(name, [0, 0])
        entry[0] += int(fields.get("run_cnt", 0))
        entry[1] += int(fields.get("run_time_ns", 0))
    return out


def programs_per_request(before: dict[str, list[int]], after: dict[str, list[int]], requests: int) -> dict:
    """Per program name: runs and ns per request over a run, and ns per run (those that ran)."""
    out = {}
    for name, (runs, ns) in sorted(after.items()):
        runs -= before.get(name, [0, 0])[0]
        ns -= before.get(name, [0, 0])[1]
        if runs > 0 and requests:
            out[name] = {
                "runs_per_request": round(runs / requests, 2),
                "ns_per_request": round(ns / requests, 1),
                "ns_per_run": round(ns / runs, 1),
            }
    return out


def last_points(path: Path) -> dict[tuple[str, str], dict]:
    """The last data point of every (metric, attributes) in the agent's metrics file."""
    last: dict[tuple[str, str], dict] = {}
    for line in path.read_text().splitlines() if path.exists() else ():
        for rm in json.loads(line).get("resourceMetrics", []):
            for sm in rm.get("scopeMetrics", []):
                for metric in sm.get("metrics", []):
                    body = metric.get("histogram") or metric.get("sum") or metric.get("gauge") or {}
                    for p in body.get("dataPoints", []):
                        attrs = {a["key"]: next(iter(a["value"].values())) for a in p.get("attributes", [])}
                        last[(metric["name"], json.dumps(attrs, sort_keys=True))] = p
    return last


def agent_counts(path: Path) -> dict:
    """What the agent exported about the run: requests counted per status, TLS calls by outcome,
    sampling decisions."""
    counted: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    decisions: Counter[str] = Counter()
    for (name, attrs_json), p in last_points(path).items():
        attrs = json.loads(attrs_json)
        value = int(p.get("asInt", p.get("count", 0)))
        if name == "http.server.request.duration":
            counted[str(attrs.get("http.response.status_code", "none"))] += int(p["count"])
        elif name == "otelbpf.tls.calls":
            calls[attrs["outcome"]] += value
        elif name == "otelbpf.http.sampled":
            decisions[attrs["decision"]] += value
    return {"counted": dict(counted), "tls_calls": dict(calls), "decisions": dict(decisions)}


def load_run(mode: str, ring: str, seconds: float, certs: tuple[str, str], work: Path, tree: Path = ROOT) -> dict:
    """One agent run under load (see the module's doc, ``--load``), of the agent in ``tree``."""
    port = free_port()
    out = work / f"{mode}-{ring}-{time.monotonic_ns()}"
    out.mkdir()
    http: dict = {"processes": "all", "ports": [port]}
    tls: dict = {"processes": "all", "ring_buffer_size": ring}
    if mode == "whole":
        http |= {"sampling_probability": 1.0, "adaptive_sampling": False}
        tls["sampling_backlog"] = "64GiB"  # no ring gets that far behind: nothing shed
    cfg = out / "otelbpf.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "receivers": {"http": http, "tls": tls},
                "exporters": {"file": {"directory": str(out)}},
                "service": {
                    "pipelines": {
                        p: {"receivers": ["http", "tls"], "exporters": ["file"]} for p in ("traces", "metrics")
                    }
                },
            }
        )
    )
    with https_server(port, certs) as server, (out / "agent.log").open("w") as log:
        args = [sys.executable, "-m", "otelbpf.cli", "run", "-c", str(cfg), "--pid", str(server.pid)]
        agent = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=tree)
        try:
            deadline = time.monotonic() + 300
            while "otelbpf running" not in (out / "agent.log").read_text():
                assert agent.poll() is None and time.monotonic() < deadline, (out / "agent.log").read_text()
                time.sleep(0.2)
            programs0 = agent_programs(agent.pid)
            made, took = load(port, seconds, certs[0])
            programs1 = agent_programs(agent.pid)
            time.sleep(2)  # the agent catches up with its queue
        finally:
            agent.send_signal(signal.SIGINT)
            agent.wait(timeout=180)
    text = (out / "agent.log").read_text()
    m = re.search(r"events received (\d+), spans (\d+), lost in kernel (\d+)", text)
    total = sum(made.values())
    programs = programs_per_request(programs0, programs1, total)
    tls_ns = sum(v["ns_per_request"] for k, v in programs.items() if k in TLS_PROGRAMS)
    return {
        "mode": mode,
        "ring": ring,
        "made": {str(k): v for k, v in sorted(made.items())},
        "requests_per_s": round(total / took, 1),
        "spans": int(m.group(2)) if m else None,
        # the tls receiver's own programs (other processes' TLS calls, few here, included)
        "tls_bpf_ns_per_request": round(tls_ns, 1),
        "bpf_ns_per_request": round(sum(v["ns_per_request"] for v in programs.values()), 1),
        "programs": programs,
        **agent_counts(out / "metrics.jsonl"),
    }


def load_main(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp())
    certs = make_certs(tmp)
    before_tree = tmp / "before"
    before_tree.mkdir()
    archive = subprocess.run(["git", "archive", args.before], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(before_tree)], input=archive, check=True)
    knob = Path("/proc/sys/kernel/bpf_stats_enabled")
    before = knob.read_text().strip()
    knob.write_text("1")
    runs = []
    baseline = []
    try:
        for _ in range(args.repeats):
            port = free_port()
            with https_server(port, certs):
                made, took = load(port, args.seconds, certs[0])
                baseline.append(round(sum(made.values()) / took, 1))
            for ring in args.rings.split(","):
                runs.append(load_run("before", ring, args.seconds, certs, tmp, before_tree))
                print(json.dumps(runs[-1]), flush=True)
                for mode in ("whole", "sampled"):
                    runs.append(load_run(mode, ring, args.seconds, certs, tmp))
                    print(json.dumps(runs[-1]), flush=True)
    finally:
        knob.write_text(before)
    result = {"before": args.before, "no_agent_requests_per_s": baseline, "runs": runs}
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"tls-load-{dt.date.today().isoformat()}.json"
    path.write_text(json.dumps(result, indent=1))
    print(f"no agent: {baseline} requests/s; raw: {path}")
    print(
        "| ring | mode | made | counted | spans | TLS records lost | shed | req/s | tls BPF ns/req | all BPF ns/req |"
    )
    for r in runs:
        made, counted = sum(r["made"].values()), sum(r["counted"].values())
        calls = r["tls_calls"]
        print(
            f"| {r['ring']} | {r['mode']} | {made} | {counted} | {r['spans']} | {calls.get('lost', 0)} "
            f"| {calls.get('shed', 0)} | {r['requests_per_s']} | {r['tls_bpf_ns_per_request']} "
            f"| {r['bpf_ns_per_request']} |"
        )


def make_certs(tmp: Path) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 (the load clients check it): (cert, key)."""
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-days", "2", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
         "-keyout", str(tmp / "k.pem"), "-out", str(tmp / "c.pem")],
        check=True, capture_output=True,
    )  # fmt: skip
    return str(tmp / "c.pem"), str(tmp / "k.pem")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--load", action="store_true", help="HTTPS under overload, head sampling off and on")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rings", default="16KiB,8MiB")
    ap.add_argument("--before", default="af0089f~1", help="the tree of the 'before' runs (a git revision)")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    if args.load:
        load_main(args)
        return
    probes = openssl_probes(LIBSSL, Rejected())
    certs = make_certs(Path(tempfile.mkdtemp()))

    def build(lib_users_only: bool) -> BPF:
        fam = tls_family(
            payload_bytes=4096,
            ring_bytes=64 << 20,
            max_connections=65536,
            lib_users_only=lib_users_only,
            rejected=Rejected(),
        )
        # tls.c uses sockets.c's sampling maps: compiled with it, its tracepoints detached so
        # that every condition pays only what it names
        sockets = socket_family([], payload_bytes=1024, ring_bytes=1 << 20)
        text, cflags = program.build([sockets, fam], filter_pids=False, events_ring_bytes=1 << 20)
        bpf = BPF(text=text, cflags=cflags)
        for tp in list(bpf.tracepoint_fds):
            bpf.detach_tracepoint(tp)
        return bpf

    empty = BPF(text="int empty(struct pt_regs *ctx) { return 0; }")
    full, filtered = build(False), build(True)

    bpfs = {"floor": empty, "tls": full, "filtered": filtered, "elsewhere": full}
    # elsewhere: the uprobes bound to this process (which makes no SSL call), not to the file
    pids = {"elsewhere": os.getpid()}

    def attach(mode: str) -> None:
        bpf, pid = bpfs[mode], pids.get(mode, -1)
        for p in probes:
            fn = "empty" if mode == "floor" else p.program
            if p.ret:
                bpf.attach_uretprobe(name=LIBSSL, addr=p.vaddr, fn_name=fn, pid=pid)
            else:
                bpf.attach_uprobe(name=LIBSSL, addr=p.vaddr, fn_name=fn, pid=pid)
        if mode != "floor":
            for sc in SYSCALLS:
                bpf.attach_tracepoint(tp=f"syscalls:sys_enter_{sc}", fn_name=SYSCALL_PROGRAM)
            bpf.attach_tracepoint(tp="syscalls:sys_enter_close", fn_name=CLOSE_PROGRAM)

    def detach(mode: str) -> None:
        bpf, pid = bpfs[mode], pids.get(mode, -1)
        for p in probes:
            if p.ret:
                bpf.detach_uretprobe(name=LIBSSL, addr=p.vaddr, pid=pid)
            else:
                bpf.detach_uprobe(name=LIBSSL, addr=p.vaddr, pid=pid)
        if mode != "floor":
            for sc in SYSCALLS:
                bpf.detach_tracepoint(tp=f"syscalls:sys_enter_{sc}")
            bpf.detach_tracepoint(tp="syscalls:sys_enter_close")

    modes = ("none", "floor", "tls", "filtered", "elsewhere")
    results: dict[str, list[float]] = {m: [] for m in modes}
    syscall: dict[str, list[float]] = {"none": [], "fd_finder": []}
    knob = Path("/proc/sys/kernel/bpf_stats_enabled")
    before = knob.read_text().strip()
    knob.write_text("1")
    try:
        for _ in range(args.rounds):
            for mode in modes:
                if mode != "none":
                    attach(mode)
                try:
                    results[mode].append(child(CHILD, *certs, str(args.iterations)))
                finally:
                    if mode != "none":
                        detach(mode)
            syscall["none"].append(child(SYSCALL_CHILD, str(args.iterations * 10)))
            for sc in SYSCALLS:
                full.attach_tracepoint(tp=f"syscalls:sys_enter_{sc}", fn_name=SYSCALL_PROGRAM)
            try:
                syscall["fd_finder"].append(child(SYSCALL_CHILD, str(args.iterations * 10)))
            finally:
                for sc in SYSCALLS:
                    full.detach_tracepoint(tp=f"syscalls:sys_enter_{sc}")
    finally:
        knob.write_text(before)
    med = {m: statistics.median(v) for m, v in results.items()}
    print(
        json.dumps(
            {
                "ns_per_iteration": {m: round(v, 1) for m, v in med.items()},
                "overhead_ns_per_record": {m: round((v - med["none"]) / 2, 1) for m, v in med.items() if m != "none"},
                "rounds": {m: [round(x, 1) for x in v] for m, v in results.items()},
                "write_syscall_ns": {m: round(statistics.median(v), 1) for m, v in syscall.items()},
                "tls_programs": program_stats(full),
                "filtered_programs": program_stats(filtered),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
