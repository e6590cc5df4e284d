"""Where the agent's memory goes (issue 14): the agent in this process, with every receiver, in
host mode, under a churn of short-lived processes that load distinct libraries.

    sudo .venv/bin/python bench/memory_where.py [--seconds 120] [--every 20] [--out FILE]

Every ``--every`` seconds it records, for this process: RssAnon/RssFile (/proc/self/status) and
Anonymous/Pss_File (/proc/self/smaps_rollup); the symbolizer's caches (symbol tables by inode,
their numpy bytes, maps snapshots and the tables they still reference, resolved names); the
profiler's per-process state (processes, stacks, resolved stacks, code objects); and the
tracemalloc lines whose allocations grew most since the first sample (tracemalloc starts once
the agent runs: the compile's memory is LLVM's, not Python's; only with ``--tracemalloc``, whose
own tables cost memory), and what ``malloc_trim(0)`` gives back at each sample (heap glibc held
free: fragmentation, not live data). The churn is the one
bench/footprint.py ``--churn`` runs (``churn.py``). Results: JSON, and a summary on stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import footprint  # noqa: E402
from churn import Churn  # noqa: E402  (bench/ is not a package)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from otelbpf.agent import Agent  # noqa: E402
from otelbpf.base.resident import trim_heap  # noqa: E402
from otelbpf.correlate import symbolizer  # noqa: E402
from otelbpf.families.registry import load_config_text  # noqa: E402


def proc_memory() -> dict[str, float]:
    """MiB: RssAnon/RssFile from status, Anonymous/Pss_File from smaps_rollup."""
    out: dict[str, float] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
            out[k] = round(int(v.split()[0]) / 1024, 1)
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        k, _, v = line.partition(":")
        if k in ("Anonymous", "Pss_Anon", "Pss_File"):
            out[k] = round(int(v.split()[0]) / 1024, 1)
    return out


def caches(agent: Agent) -> dict[str, int | float]:
    profiler = next(r.correlator for r in agent.receivers if type(r.correlator).__name__ == "Profiler")
    tables = {id(t): t for t in list(symbolizer.TABLES._by_inode.values())}
    held = {}
    for sym in (agent.symbolizer, profiler._sym):
        for snap in list(sym._maps.values()):
            for t in list(snap.tables.values()):
                held[id(t)] = t
    nbytes = lambda ts: sum(t.addrs.nbytes + t._sizes.nbytes + t._names.nbytes for t in ts)  # noqa: E731
    return {
        "tables_cached": len(tables),
        "tables_cached_mib": round(nbytes(tables.values()) / 2**20, 1),
        "table_cache_bytes_mib": round(symbolizer.TABLES.nbytes / 2**20, 1),
        "tables_held_by_snapshots": len(held),
        "tables_held_not_cached_mib": round(nbytes(t for k, t in held.items() if k not in tables) / 2**20, 1),
        "agent_snapshots": len(agent.symbolizer._maps),
        "profiler_snapshots": len(profiler._sym._maps),
        "profiler_snapshot_mappings": sum(len(s.file_starts) for s in profiler._sym._maps.values()),
        "profiler_names": len(profiler._sym._names),
        "profiler_procs": len(profiler._procs),
        "profiler_stacks": len(profiler._stacks) + len(profiler._py_stacks),
        "profiler_resolved": len(profiler._resolved),
        "profiler_codes": len(profiler._codes),
        "process_info": len(agent.process_info),  # processes a resource or task name is held for
        "processing_queue_mib": round(agent._queued * 64 / 2**20, 1),  # drained, waiting for the processing thread
        "processing_queue_max_mib": round(agent._queued_max * 64 / 2**20, 1),
        "evictions": dict(symbolizer.EVICTIONS),
    }


class MixedLoad:
    """footprint.py's mixed window on a thread: launches on a private copy of the stand-in
    runtime, paced HTTP/1.1 to the bench server, the 2-rank NCCL job in a loop."""

    def __init__(self, work: Path, seconds: float) -> None:
        self.lib = work / "lib" / "libcudart.so.12"  # a private inode: other agents' probes stay off it
        self.lib.parent.mkdir(parents=True)
        shutil.copy2(footprint.FAKE_CUDART, self.lib)
        self.port = footprint.free_port()
        self.seconds = seconds
        self.started = 0  # no short-lived processes counted here
        self._server: subprocess.Popen[bytes] | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._server = subprocess.Popen(
            [str(footprint.HTTP_SERVER), str(self.port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        time.sleep(0.3)
        run = footprint.mixed(self.lib, 50_000, self.port, 500)
        self._thread = threading.Thread(target=run, args=(self.seconds,), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._thread.join()
        if self._server is not None:
            self._server.terminate()
            self._server.wait()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=120)
    p.add_argument("--every", type=float, default=20)
    p.add_argument("--out", type=Path)
    p.add_argument("--tracemalloc", action="store_true", help="trace Python allocations (costs memory itself)")
    p.add_argument(
        "--load",
        choices=("churn", "mixed"),
        default="churn",
        help="churn: short-lived processes (churn.py); mixed: footprint.py's mixed window "
        "(50k launches/s, 500 HTTP req/s, a 2-rank NCCL job) for the whole run",
    )
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="otelbpf-memwhere-"))
    if a.load == "mixed":
        load = MixedLoad(work, a.seconds)
        cfg = yaml.safe_load(footprint.config_for("all", work, load.lib, load.port).read_text())
    else:
        load = Churn(work / "churn")
        cfg = yaml.safe_load((ROOT / "otelbpf/config/otelbpf.yaml").read_text())
        for sig in ("traces", "metrics"):
            cfg["service"]["pipelines"][sig]["receivers"] = ["cuda", "nccl", "ibverbs", "http"]
    cfg["exporters"]["file"]["directory"] = str(work / "out")
    os.chdir(work)
    agent = Agent(load_config_text(yaml.safe_dump(cfg)))
    agent.start()
    if a.tracemalloc:
        tracemalloc.start(8)
    base = tracemalloc.take_snapshot() if a.tracemalloc else None
    samples = []
    t0 = time.monotonic()
    try:
        load.start()
        while (t := time.monotonic() - t0) < a.seconds:
            time.sleep(min(a.every, a.seconds - t))
            top = tracemalloc.take_snapshot().compare_to(base, "traceback")[:12] if base is not None else []
            memory = proc_memory()
            trim_heap()  # what glibc held free: the rest is in use (or Python's own free lists)
            s = {
                "t": round(time.monotonic() - t0),
                "memory_mib": memory,
                "after_malloc_trim_mib": proc_memory(),
                "caches": caches(agent),
                "churn_processes": load.started,
                "traced_mib": round(tracemalloc.get_traced_memory()[0] / 2**20, 1),
                "top_growth": [
                    {
                        "kib": round(d.size_diff / 1024),
                        "count": d.count_diff,
                        "where": [f"{f.filename.removeprefix(str(ROOT) + '/')}:{f.lineno}" for f in d.traceback[-4:]],
                    }
                    for d in top
                ],
            }
            samples.append(s)
            shown = ("t", "memory_mib", "after_malloc_trim_mib", "caches", "traced_mib")
            print(json.dumps({k: s[k] for k in shown}), file=sys.stderr)
            for d in s["top_growth"][:6]:
                print(f"   {d['kib']:7} KiB {d['count']:6}  {' < '.join(reversed(d['where']))}", file=sys.stderr)
    finally:
        load.stop()
        agent.stop()
    out = a.out or ROOT / "bench/results" / f"memory_where-{time.strftime('%Y-%m-%d')}.json"
    out.write_text(json.dumps(samples, indent=1) + "\n")
    print(f"results: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
