"""How long the profiler holds the sensor's lock, how long the agent's processing thread waits
behind it, and the agent's RssAnon, under a churn of short-lived processes (issue 14).

    sudo .venv/bin/python bench/profiler_lock.py [--seconds 300] [--every 30] [--out FILE]

The agent runs in this process in host mode with the profiling receiver alone (CPU samples,
Python frames; no CUDA memory: no cuda receiver), its file exporter in a temporary directory.
The sensor's lock is replaced before start by a lock that times each hold and each wait by
thread name (a bench-only stand-in: the same ``threading.Lock`` inside). The churn is one
process after another, ``python -c 'sum(range(10**6))'`` (each sampled, described, forgotten),
``--parallel`` at a time. Every ``--every`` seconds: RssAnon/RssFile of this process (the agent
with a few KiB of this bench) and the longest hold and wait since the previous sample.
The profiler's cache evictions (``otelbpf.cache.evictions{cache="profile_*"}``) are recorded with
each sample. With code that logs each round's holds (``profile round N: sensor lock held a/b/c ms``, at
debug level), the longest hold of each step too. Results: JSON, and a summary on stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from otelbpf.agent import Agent  # noqa: E402
from otelbpf.correlate import symbolizer  # noqa: E402
from otelbpf.families.registry import load_config_text  # noqa: E402


class TimedLock:
    """A lock that records, per thread name, the longest hold and wait (and their counts)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._acquired = 0.0
        self.holds: dict[str, list[float]] = {}  # thread -> [count, total s, max s]
        self.waits: dict[str, list[float]] = {}

    @staticmethod
    def _add(d: dict[str, list[float]], name: str, s: float) -> None:
        v = d.setdefault(name, [0, 0.0, 0.0])
        v[0] += 1
        v[1] += s
        v[2] = max(v[2], s)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        t0 = time.perf_counter()
        got = self._lock.acquire(blocking, timeout)
        if got:
            self._acquired = time.perf_counter()
            self._add(self.waits, threading.current_thread().name, self._acquired - t0)
        return got

    def release(self) -> None:
        self._add(self.holds, threading.current_thread().name, time.perf_counter() - self._acquired)
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def take(self) -> dict:
        """The figures since the last take, ms, and reset."""
        out = {
            kind: {
                t: {"n": int(v[0]), "total_ms": round(v[1] * 1e3, 1), "max_ms": round(v[2] * 1e3, 1)}
                for t, v in d.items()
            }
            for kind, d in (("holds", self.holds), ("waits", self.waits))
        }
        self.holds, self.waits = {}, {}
        return out


class RoundHolds(logging.Handler):
    """The longest hold of each step of a round, from the profiler's debug line."""

    LINE = re.compile(r"sensor lock held ([\d./]+) ms")

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.longest: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        m = self.LINE.search(record.getMessage())
        if m:
            steps = [float(x) for x in m.group(1).split("/")]
            self.longest = [max(a, b) for a, b in zip(steps, self.longest, strict=False)] or steps

    def take(self) -> list[float]:
        out, self.longest = self.longest, []
        return out


def memory() -> dict[str, float]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("RssAnon", "RssFile"):
            out[k] = round(int(v.split()[0]) / 1024, 1)
    return out


def churn(stop: threading.Event, parallel: int, started: list[int]) -> None:
    while not stop.is_set():
        procs = [subprocess.Popen([sys.executable, "-c", "sum(range(10**6))"]) for _ in range(parallel)]
        for p in procs:
            p.wait()
        started[0] += parallel


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=300)
    p.add_argument("--every", type=float, default=30)
    p.add_argument("--parallel", type=int, default=1)
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    steps = RoundHolds()
    profiles_log = logging.getLogger("otelbpf.families.profiling.profiler")
    profiles_log.setLevel(logging.DEBUG)
    profiles_log.addHandler(steps)
    profiles_log.propagate = False  # its other debug lines stay out of stderr
    work = Path(tempfile.mkdtemp(prefix="otelbpf-proflock-"))
    cfg = yaml.safe_load((ROOT / "otelbpf/config/otelbpf.yaml").read_text())
    cfg["exporters"]["file"]["directory"] = str(work / "out")
    cfg["receivers"]["profiling"]["cuda_memory"] = False
    pipes = cfg["service"]["pipelines"]
    for sig in [s for s in pipes if s != "profiles"]:
        del pipes[sig]
    os.chdir(work)
    agent = Agent(load_config_text(yaml.safe_dump(cfg)))
    timed = TimedLock()
    agent.sensor._lock = timed  # type: ignore[assignment]  (bench-only stand-in)
    agent.start()
    t0 = time.monotonic()
    stop, started = threading.Event(), [0]
    driver = threading.Thread(target=churn, args=(stop, a.parallel, started), daemon=True)
    driver.start()
    samples = [{"t": 0, "memory_mib": memory(), "lock": timed.take()}]
    try:
        while (t := time.monotonic() - t0) < a.seconds:
            time.sleep(min(a.every, a.seconds - t))
            s = {
                "t": round(time.monotonic() - t0),
                "memory_mib": memory(),
                "load": os.getloadavg()[0],
                "churn_processes": started[0],
                "lock": timed.take(),
                "step_holds_max_ms": steps.take(),
                "profile_cache_evictions": {k: v for k, v in symbolizer.EVICTIONS.items() if k.startswith("profile_")},
            }
            samples.append(s)
            lock = s["lock"]
            print(
                json.dumps(
                    {
                        "t": s["t"],
                        "mem": s["memory_mib"],
                        "load": s["load"],
                        "procs": s["churn_processes"],
                        "profiles_hold_max_ms": lock["holds"].get("otelbpf-profiles", {}).get("max_ms"),
                        "profiles_holds": lock["holds"].get("otelbpf-profiles", {}).get("n"),
                        "process_wait_max_ms": lock["waits"].get("otelbpf-process", {}).get("max_ms"),
                        "steps_max_ms": s["step_holds_max_ms"],
                        "evictions": s["profile_cache_evictions"],
                    }
                ),
                file=sys.stderr,
            )
    finally:
        stop.set()
        driver.join()
        agent.stop()
    out = a.out or ROOT / "bench/results" / f"profiler_lock-{time.strftime('%Y-%m-%d')}.json"
    out.write_text(json.dumps(samples, indent=1) + "\n")
    print(f"results: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
