"""What a standalone agent's memory holds under footprint's mixed load: a census of its heap.

    sudo .venv/bin/python bench/heap_census.py [--seconds 360] [--every 60] [--grace 120] [--owners] [--trim]
        [--tracemalloc] [--load mixed|churn] [--out FILE]

One ``otelbpf run`` (the ``all`` config of bench/footprint.py: every receiver, host mode) in its
own process, as footprint.py runs it, under footprint's mixed load (50k launches/s, 500 HTTP
requests/s, the 2-rank NCCL job in a loop) or, with ``--load churn``, bench/churn.py's (a torch
job and a stream of short-lived Python processes) for ``--seconds``. Unlike bench/memory_where.py the
load does not share the agent's interpreter, so the agent keeps up as it does in production
(memory_where's in-process agent lags behind its own load generator). A thread started in the
agent's process before the agent itself writes, every ``--every`` seconds, to the agent's
stderr:

- RssAnon; the number of Python objects by type (``gc.get_objects``, the 15 most numerous);
- Python's small-object allocator (``sys._debugmallocstats``): arenas in use and bytes in
  allocated blocks: live Python objects, against the rest of RssAnon (glibc's heap: numpy
  arrays, large strings and lists, C libraries);
- with ``--tracemalloc``, the 25 largest allocation sites by file and by line (the agent runs
  slower and falls behind its load: where memory goes, not how much);
- with ``--owners``, the deep size of each part of the agent (what a part reaches that no part
  walked before it did; modules, classes, functions and bound methods are not followed);
- the ELF symbol tables held (``symbolizer.TABLES``, module-wide, so no owner's walk sees them):
  how many, and their arrays' MiB;
- with ``--trim``, RssAnon again after glibc's ``malloc_trim(0)``: how much of the rest is
  free heap glibc kept, not memory in use.

The agent's peak RSS (VmHWM) is read just before SIGINT and again until it exits: the stop,
and the report.html that follows it, can peak above the running agent.

``--grace`` sets how long what is known of an exited process is kept (``Symbolizer`` and
``ProcessInfo``'s ``gone_grace_s``, 120 s in the agent) to see what that retention costs.
RssAnon/RssFile are sampled every 10 s from outside. Results: JSON (the census lines and the
series) and a summary on stderr; docs/BENCHMARKS.md has the figures.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import footprint  # noqa: E402  (bench/ is not a package)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench/results"

#: Runs in the agent's process: the census thread, then the agent's CLI.
CENSUS = r"""
import collections, gc, os, sys, threading, time
sys.path.insert(0, os.environ["CENSUS_ROOT"])
grace = float(os.environ["CENSUS_GRACE"])
from otelbpf.correlate import process_info, symbolizer
for cls in (symbolizer.Symbolizer, process_info.ProcessInfo):
    def init(self, *a, _orig=cls.__init__, **k):
        k.setdefault("gone_grace_s", grace)
        _orig(self, *a, **k)
    cls.__init__ = init

def anon_mib():
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) // 1024 for ln in f if ln.startswith("RssAnon"))

def mallocstats():
    r, w = os.pipe()
    saved = os.dup(2)
    os.dup2(w, 2)
    try:
        sys._debugmallocstats()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(w)
    text = os.read(r, 1 << 20).decode(errors="replace")
    os.close(r)
    out = {}
    for ln in text.splitlines():
        for key, name in (("# arenas allocated current", "arenas"), ("# bytes in allocated blocks", "allocated_bytes")):
            if ln.startswith(key):
                out[name] = int(ln.split("=")[1].replace(",", ""))
    return out

def traced():
    import tracemalloc
    if not tracemalloc.is_tracing():
        return {}
    snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    by = {}
    for key in ("filename", "lineno"):
        by[key] = [
            [str(s.traceback[0]) if key == "lineno" else s.traceback[0].filename, s.size, s.count]
            for s in snap.statistics(key)[:25]
        ]
    return {"traced_mib": tracemalloc.get_traced_memory()[0] / 2**20, "traced_by": by}

def _f():
    pass

SKIP = (type, type(os), type(len), type(_f), type(_f.__code__), type(threading.Thread().start), threading.Thread)

def deep_size(root, seen):
    # Bytes of root and what it reaches that no earlier part reached (modules, classes,
    # functions and threads are not followed).
    total, todo = 0, [root]
    while todo:
        o = todo.pop()
        if id(o) in seen or isinstance(o, SKIP):
            continue
        seen.add(id(o))
        try:
            total += sys.getsizeof(o)
        except TypeError:
            continue
        todo.extend(gc.get_referents(o))
    return total

def owners():
    # Deep sizes of the agent's parts: its attributes, and each receiver's correlator's.
    if not os.environ.get("CENSUS_OWNERS"):
        return {}
    is_agent = lambda o: type(o).__name__ == "Agent" and type(o).__module__ == "otelbpf.agent"  # noqa: E731
    agent = next((o for o in gc.get_objects() if is_agent(o)), None)
    if agent is None:
        return {}
    seen = {id(agent)}
    parts = {}
    # The shared parts first, so that a receiver's share is what it alone holds.
    for k in ("symbolizer", "process_info", "live", "spans"):
        parts[k] = deep_size(getattr(agent, k, None), seen)
    for r in getattr(agent, "receivers", []):
        c = r.correlator
        seen.add(id(c))
        for k, v in vars(c).items() if hasattr(c, "__dict__") else ():
            parts[f"{r.name}.{k}"] = deep_size(v, seen)
    for k, v in vars(agent).items():
        if k != "receivers" and k not in parts:
            parts[k] = deep_size(v, seen)
    top = sorted(parts.items(), key=lambda kv: -kv[1])[:25]
    return {"owners_mib": [[k, round(v / 2**20, 2)] for k, v in top]}

def census():
    every = float(os.environ["CENSUS_EVERY"])
    while True:
        time.sleep(every)
        objs = gc.get_objects()
        top = collections.Counter(type(o).__name__ for o in objs).most_common(15)
        n = len(objs)
        del objs
        line = {"anon_mib": anon_mib(), "objects": n, "top": top, **mallocstats(), **traced(), **owners()}
        line["symbol_tables"] = [len(symbolizer.TABLES), round(symbolizer.TABLES.nbytes / 2**20, 2)]
        if os.environ.get("CENSUS_TRIM"):  # --trim
            import ctypes
            ctypes.CDLL("libc.so.6").malloc_trim(0)
            line["anon_after_trim_mib"] = anon_mib()
        print("CENSUS " + __import__("json").dumps(line), file=sys.stderr, flush=True)

threading.Thread(target=census, name="census", daemon=True).start()
from otelbpf import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def watch_stop(agent: subprocess.Popen, timeout: float) -> float | None:
    """Wait for the stopping agent; returns its peak RSS over its whole life, read every 0.1 s
    until it exits: the stop and report.html after it included."""
    peak, deadline = None, time.monotonic() + timeout
    while agent.poll() is None:
        if time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(agent.args, timeout)
        peak = footprint.peak_rss_mib(agent.pid) or peak
        time.sleep(0.1)
    return peak


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=360)
    p.add_argument("--every", type=float, default=60)
    p.add_argument("--grace", type=float, default=120)
    p.add_argument(
        "--tracemalloc",
        action="store_true",
        help="also trace the agent's allocations (PYTHONTRACEMALLOC=1): the 25 largest sites by file and by "
        "line at each census; the agent runs slower, so its figures are where memory goes, not how much",
    )
    p.add_argument(
        "--owners",
        action="store_true",
        help="also the deep size of each part of the agent (its attributes, each receiver's correlator's), "
        "at each census; the walk's own bookkeeping adds to RssAnon",
    )
    p.add_argument(
        "--trim",
        action="store_true",
        help="also RssAnon after malloc_trim(0) at each census (the trim gives that memory back: later figures "
        "are lower than an untrimmed agent's)",
    )
    p.add_argument(
        "--load",
        choices=("mixed", "churn"),
        default="mixed",
        help="footprint's mixed load, or bench/churn.py's (a torch job and short-lived Python processes)",
    )
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (the agent loads eBPF)")
    work = Path(tempfile.mkdtemp(prefix="otelbpf-census-"))
    lib = work / "lib" / "libcudart.so.12"  # a private inode: other agents' probes stay off it
    lib.parent.mkdir()
    shutil.copy2(footprint.FAKE_CUDART, lib)
    port = footprint.free_port()
    server = subprocess.Popen(
        [str(footprint.HTTP_SERVER), str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    config = footprint.config_for("all", work, lib, port)
    script = work / "census_agent.py"
    script.write_text(CENSUS)
    env = {
        **os.environ,
        "CENSUS_ROOT": str(ROOT),
        "CENSUS_EVERY": str(a.every),
        "CENSUS_GRACE": str(a.grace),
        **({"PYTHONTRACEMALLOC": "1"} if a.tracemalloc else {}),
        **({"CENSUS_OWNERS": "1"} if a.owners else {}),
        **({"CENSUS_TRIM": "1"} if a.trim else {}),
    }
    agent = subprocess.Popen(
        [sys.executable, str(script), "run", "-c", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=work / "all",
        env=env,
    )
    lines: list[str] = []
    running = threading.Event()

    def read() -> None:
        for ln in agent.stderr:  # type: ignore[union-attr]
            lines.append(ln.rstrip("\n"))
            if "otelbpf running" in ln:
                running.set()

    threading.Thread(target=read, daemon=True).start()
    series: list[tuple[int, int, int]] = []
    done = threading.Event()

    def sample() -> None:
        t0 = time.monotonic()
        while not done.wait(10):
            anon, file = footprint.rss_split_kib(agent.pid)
            series.append((round(time.monotonic() - t0), anon // 1024, file // 1024))

    load: dict = {}
    stop_peak_mib = running_peak_mib = None
    try:
        if not running.wait(600):
            raise SystemExit("the agent did not start:\n" + "\n".join(lines[-20:]))
        sampler = threading.Thread(target=sample)
        sampler.start()
        if a.load == "mixed":
            load = footprint.mixed(lib, 50_000, port, 500)(a.seconds)
        else:
            from churn import Churn

            churn = Churn(work / "churn")
            churn.start()
            try:
                time.sleep(a.seconds)
            finally:
                churn.stop()
            load = {"short_lived_processes": churn.started}
        done.set()
        sampler.join()
    finally:
        done.set()
        running_peak_mib = footprint.peak_rss_mib(agent.pid)
        agent.send_signal(2)  # SIGINT: stops, then writes report.html (its memory is the stop peak)
        try:
            stop_peak_mib = watch_stop(agent, 120)
        except subprocess.TimeoutExpired:  # the census lines already read are kept
            print("the agent did not stop within 120 s of SIGINT: killed", file=sys.stderr)
            agent.kill()
            agent.wait()
        server.terminate()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)
    census = [json.loads(ln.split("CENSUS ", 1)[1]) for ln in lines if "CENSUS " in ln]
    res = {
        "date": dt.date.today().isoformat(),
        "seconds": a.seconds,
        "load_kind": a.load,
        "grace_s": a.grace,
        "load": load,
        "rss_series_anon_file_mib": series,
        "census": census,
        "peak_rss_running_mib": running_peak_mib,
        "peak_rss_with_stop_mib": stop_peak_mib,
        "stop": next((ln for ln in lines if "otelbpf stopped in" in ln), None),
    }
    for c in census:
        arenas = c.get("arenas", 0)
        print(
            f"anon {c['anon_mib']} MiB, Python arenas {arenas} MiB, allocated blocks "
            f"{c.get('allocated_bytes', 0) / 2**20:.1f} MiB, {c['objects']} objects: "
            + ", ".join(f"{k} {n}" for k, n in c["top"][:8]),
            file=sys.stderr,
        )
    out = a.out or RESULTS / f"heap_census-{res['date']}.json"
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(
        f"peak RSS (VmHWM) running {running_peak_mib} MiB, with the stop and report.html {stop_peak_mib} MiB; "
        f"{res['stop']}",
        file=sys.stderr,
    )
    print(f"results: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
