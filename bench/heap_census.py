"""What a standalone agent's memory holds under footprint's mixed load: a census of its heap.

    sudo .venv/bin/python bench/heap_census.py [--seconds 360] [--every 60] [--grace 120] [--out FILE]

One ``otelbpf run`` (the ``all`` config of bench/footprint.py: every receiver, host mode) in its
own process, as footprint.py runs it, under footprint's mixed load (50k launches/s, 500 HTTP
requests/s, the 2-rank NCCL job in a loop) for ``--seconds``. Unlike bench/memory_where.py the
load does not share the agent's interpreter, so the agent keeps up as it does in production
(memory_where's in-process agent lags behind its own load generator). A thread started in the
agent's process before the agent itself writes, every ``--every`` seconds, to the agent's
stderr:

- RssAnon; the number of Python objects by type (``gc.get_objects``, the 15 most numerous);
- Python's small-object allocator (``sys._debugmallocstats``): arenas in use and bytes in
  allocated blocks: live Python objects, against the rest of RssAnon (glibc's heap: numpy
  arrays, large strings and lists, C libraries).

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

def census():
    every = float(os.environ["CENSUS_EVERY"])
    while True:
        time.sleep(every)
        objs = gc.get_objects()
        top = collections.Counter(type(o).__name__ for o in objs).most_common(15)
        n = len(objs)
        del objs
        line = {"anon_mib": anon_mib(), "objects": n, "top": top, **mallocstats()}
        print("CENSUS " + __import__("json").dumps(line), file=sys.stderr, flush=True)

threading.Thread(target=census, name="census", daemon=True).start()
from otelbpf import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=360)
    p.add_argument("--every", type=float, default=60)
    p.add_argument("--grace", type=float, default=120)
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
    try:
        if not running.wait(600):
            raise SystemExit("the agent did not start:\n" + "\n".join(lines[-20:]))
        sampler = threading.Thread(target=sample)
        sampler.start()
        load = footprint.mixed(lib, 50_000, port, 500)(a.seconds)
        done.set()
        sampler.join()
    finally:
        done.set()
        agent.send_signal(2)  # SIGINT: stops without writing report.html
        agent.wait(120)
        server.terminate()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)
    census = [json.loads(ln.split("CENSUS ", 1)[1]) for ln in lines if "CENSUS " in ln]
    res = {
        "date": dt.date.today().isoformat(),
        "seconds": a.seconds,
        "grace_s": a.grace,
        "load": load,
        "rss_series_anon_file_mib": series,
        "census": census,
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
    print(f"results: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
