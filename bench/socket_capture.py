"""In-kernel cost of the socket probes per traced request: the capture inlined in each of the
eight data exits (the sources of an earlier revision) against the capture tail-called from
them (this checkout's bpf/, issue 14), side by side in one run.

    sudo .venv/bin/python bench/socket_capture.py [--base 41c02d3] [--requests 20000] [--rounds 4]

Each round loads the socket family's program built from one set of sources (rounds alternate
between the two), watches a child process that talks HTTP-sized messages to itself over
loopback (``--requests`` request/response pairs of 100 and 300 bytes: a write and a read
traced on each side), drains the ring, and reads every program's ``run_time_ns`` from
``kernel.bpf_stats_enabled``: the time the probes add inside the traced process's syscalls,
not the agent's parsing. A tail-called program's time is counted in its caller's. Results: a
table on stdout and bench/results/socket_capture-<date>.json; figures in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from otelbpf.families.http.probes import socket_family  # noqa: E402
from otelbpf.sensor import program  # noqa: E402
from otelbpf.sensor.ringbuf import VariableRingReader  # noqa: E402

RING = 16 << 20
#: Waits for a line on stdin (its pid is watched by then), then N request/response pairs.
TALK = r"""
import socket, sys
n = int(sys.argv[1])
sys.stdin.readline()
with socket.create_server(("127.0.0.1", 0)) as server:
    client = socket.create_connection(server.getsockname())
    conn, _ = server.accept()
    req, resp = b"q" * 100, b"r" * 300
    for _ in range(n):
        client.sendall(req)
        got = 0
        while got < len(req):
            got += len(conn.recv(65536))
        conn.sendall(resp)
        got = 0
        while got < len(resp):
            got += len(client.recv(65536))
print("done")
"""


def sources_of(rev: str, into: Path) -> Path:
    """bpf/ as it was at ``rev``, written under ``into``."""
    names = subprocess.run(
        ["git", "ls-tree", "--name-only", rev, "bpf/"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split()
    for name in names:
        text = subprocess.run(["git", "show", f"{rev}:{name}"], cwd=ROOT, check=True, capture_output=True, text=True)
        (into / Path(name).name).write_text(text.stdout)
    return into


def one_round(bpf_dir: Path, tail_called: bool, requests: int) -> dict:
    fam = socket_family([], payload_bytes=4096, ring_bytes=RING)
    program._bpf_source = lambda name: (bpf_dir / name).read_text()  # type: ignore[assignment]
    text, cflags = program.build([fam], filter_pids=True, events_ring_bytes=256 << 10)
    if "AGENT_PID" in (bpf_dir / "sockets.c").read_text():  # sources before the agent_self map
        cflags.append(f"-DAGENT_PID={os.getpid()}")
    bpf = program.load(text, cflags, [fam] if tail_called else [])
    knob = Path("/proc/sys/kernel/bpf_stats_enabled")
    before = knob.read_text().strip()
    reader = VariableRingReader(bpf["sockdata"].map_fd, RING, fam.rings[0].dtype)
    records = 0
    stop = threading.Event()

    def drain() -> None:
        nonlocal records
        while not stop.wait(0.02):
            records += len(reader.drain())

    t = threading.Thread(target=drain)
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", TALK, str(requests)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        watched = bpf["watched"]
        watched[watched.Key(child.pid)] = watched.Leaf(1)
        knob.write_text("1")
        t.start()
        out, _ = child.communicate("go\n", timeout=600)
        assert out.strip() == "done", out
        stop.set()
        t.join()
        records += len(reader.drain())
        total = runs = 0
        for fn in bpf.funcs.values():
            info = dict(
                line.split(":\t", 1)
                for line in Path(f"/proc/self/fdinfo/{fn.fd}").read_text().splitlines()
                if ":\t" in line
            )
            total += int(info.get("run_time_ns", "0"))
            runs += int(info.get("run_cnt", "0"))
        stats = bpf["stats"]
        lost = int(sum(stats[stats.Key(4)]))
    finally:
        knob.write_text(before)
        stop.set()
        reader.close()
        bpf.cleanup()
    return {"ns_per_request": total / requests, "program_runs": runs, "records": records, "lost": lost}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="41c02d3", help="the revision whose bpf/ inlines the capture")
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument(
        "--base-tail-called",
        action="store_true",
        help="the base's capture is tail-called too (a base after the tail call, e.g. before a probe change)",
    )
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = sources_of(a.base, Path(tmp))
        results: dict[str, list[dict]] = {"inlined": [], "tail_called": []}
        for i in range(a.rounds):
            for name in ("inlined", "tail_called") if i % 2 == 0 else ("tail_called", "inlined"):
                is_base = name == "inlined"
                r = one_round(base if is_base else ROOT / "bpf", not is_base or a.base_tail_called, a.requests)
                results[name].append(r)
                print(f"round {i + 1} {name:12} {r['ns_per_request']:7.0f} ns/request  {r}", flush=True)
    med = {k: statistics.median(r["ns_per_request"] for r in v) for k, v in results.items()}
    print(
        f"median: inlined {med['inlined']:.0f} ns, tail-called {med['tail_called']:.0f} ns per request "
        f"({med['tail_called'] - med['inlined']:+.0f} ns)"
    )
    out = a.out or ROOT / "bench" / "results" / f"socket_capture-{dt.date.today()}.json"
    doc = {"base": a.base, "base_tail_called": a.base_tail_called, "requests": a.requests}
    out.write_text(json.dumps({**doc, "results": results, "median": med}, indent=1))
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
