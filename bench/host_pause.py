"""Host mode's pause at a new library's open (issue 36): how long a process is stopped, and
what it costs the processes that load no probed library.

    sudo .venv/bin/python bench/host_pause.py [--new 36] [--starts 100] [--opens 200000]

The sensor in host mode (cuda receiver, cudart only, as the agent builds it) in this process;
NVIDIA's real libcudart.so.13 (/usr/local/cuda-13.0). Each start is a ``python -c`` that
dlopens the runtime, calls cudaMalloc once and exits; the pause is the sensor's own measure
(stopped in the kernel -> resumed by the agent, ``PauseStats``):

- ``new`` (``--new`` starts): every start on a fresh copy of the runtime (a new path and
  inode: the first job of a new image), so every pause is a whole attach (63 probes: 12
  starts by default, each copy's probes are held to the end and released after);
- ``new cgroup`` (``--starts``): the runtime attached already, every start in a new cgroup (a new container
  of a known image: the pause is the agent's look-up, then (cgroup, path) is known);
- ``known`` (``--starts``): the runtime attached and its path known in this cgroup: no
  pause (counted: any pause of the host's processes meanwhile).

The cost to others: ``--opens`` openat(2) of a file that is no library, timed in a child
process, with no agent, with the agent in host mode without the pause, and with it (each
its own sensor); and the wall time of ``python -c pass`` (100 each).

Results: a table on stdout and bench/results/host_pause-<date>.json; figures in
docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from otelbpf.base.health import Health
from otelbpf.families.cuda.probes import cuda_family
from otelbpf.sensor.program_cache import ProgramCache
from otelbpf.sensor.sensor import Sensor, SensorOptions

CUDART13 = Path("/usr/local/cuda-13.0/lib64/libcudart.so.13")
MALLOC_ONCE = (
    "import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); p = ctypes.c_void_p(); "
    "lib.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(1024))"
)
OPENS = (
    "import os, sys, time; n = int(sys.argv[1]); path = sys.argv[2]; t = time.perf_counter_ns()\n"
    "for _ in range(n): os.close(os.open(path, os.O_RDONLY))\n"
    "print((time.perf_counter_ns() - t) / n)"
)


def _cgroup2_root() -> Path:
    """Where cgroup v2 is mounted (bpf_get_current_cgroup_id() is its id): /sys/fs/cgroup, or
    /sys/fs/cgroup/unified on a hybrid host."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if fields[2] == "cgroup2":
            return Path(fields[1])
    raise SystemExit("no cgroup2 mount")


#: BCC refuses more than BCC_PROBE_LIMIT (1,000) open probes per process, and counts those a
#: stopped sensor handed to its releaser as open still: the cost rounds start sensors again.
os.environ.setdefault("BCC_PROBE_LIMIT", "100000")


def _sensor(pause: bool, cache: ProgramCache) -> Sensor:
    s = Sensor(
        SensorOptions(
            families=[cuda_family(["cudart"])], pause_new_libraries=pause, max_pause_s=10, program_cache=cache
        ),
        lambda _ring, _arr: None,
    )
    s.start()
    return s


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _summary(ms: list[float]) -> dict[str, float]:
    return {"n": len(ms), "p50_ms": _pct(ms, 0.5), "p99_ms": _pct(ms, 0.99), "max_ms": max(ms)} if ms else {"n": 0}


def _pauses(sensor: Sensor, since: int, expect: int = 0) -> list[float]:
    """The pauses measured since ``since``; waits up to 2 s for ``expect`` of them: the sensor
    records a pause after its SIGCONT, so the resumed start may exit before its pause is there
    (read at once, the last one of a run went missing and each went to the start after it)."""
    deadline = time.monotonic() + 2
    while len(sensor.pause_stats.durations_ns) - since < expect and time.monotonic() < deadline:
        time.sleep(0.005)
    return [d / 1e6 for d in list(sensor.pause_stats.durations_ns)[since:]]


def _in_cgroup(path: Path) -> None:
    (path / "cgroup.procs").write_text("0")


def bench_pauses(new_starts: int, starts: int, work: Path, cache: ProgramCache) -> dict[str, dict[str, float]]:
    """One sensor for the three cases (every sensor stopped releases its probes, each holding
    the kernel's uprobe mutex a grace period, which the next one's attaches wait behind)."""
    out = {}
    sensor = _sensor(True, cache)
    try:
        # new: a fresh copy per start; the first pause after each start is its own (the
        # sensor is host-wide: other processes of the machine may be stopped too)
        new: list[float] = []
        for i in range(new_starts):
            lib = work / f"new{i}" / "libcudart.so.13"
            lib.parent.mkdir()
            shutil.copy(CUDART13, lib)
            mark = len(sensor.pause_stats.durations_ns)
            subprocess.run([sys.executable, "-c", MALLOC_ONCE, str(lib)], check=True)
            new.extend(_pauses(sensor, mark, expect=1)[:1])
        out["new"] = _summary(new)
        # new cgroup: the first copy, attached; each start in a cgroup of its own
        known = work / "new0" / "libcudart.so.13"
        in_cgroups: list[float] = []
        made = []
        try:
            for i in range(starts):
                cg = _cgroup2_root() / f"otelbpf-bench-{os.getpid()}-{i}"
                cg.mkdir()
                made.append(cg)
                mark = len(sensor.pause_stats.durations_ns)
                subprocess.run(
                    [sys.executable, "-c", MALLOC_ONCE, str(known)],
                    check=True,
                    preexec_fn=functools.partial(_in_cgroup, cg),  # a write between fork and exec
                )
                in_cgroups.extend(_pauses(sensor, mark, expect=1)[:1])
        finally:
            for cg in made:
                for _ in range(50):
                    try:
                        cg.rmdir()
                        break
                    except OSError:
                        time.sleep(0.02)
        out["new_cgroup"] = _summary(in_cgroups)
        # known: same path, this cgroup (stopped: none expected)
        mark = len(sensor.pause_stats.durations_ns)
        for _ in range(starts):
            subprocess.run([sys.executable, "-c", MALLOC_ONCE, str(known)], check=True)
        out["known"] = {"starts": starts, "pauses_seen_on_the_host": len(_pauses(sensor, mark))}
        out["counts"] = sensor.pause_counts()  # type: ignore[assignment]
    finally:
        sensor.stop()
    return out


def _opens_ns(n: int, path: str) -> float:
    return float(
        subprocess.run([sys.executable, "-c", OPENS, str(n), path], capture_output=True, text=True, check=True).stdout
    )


def _start_ms(runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        out.append((time.perf_counter() - t) * 1e3)
    return out


def bench_cost(opens: int, cache: ProgramCache, rounds: int = 3) -> dict[str, dict[str, float]]:
    """Per openat and per interpreter start, interleaved rounds of each setting."""
    per_open: dict[str, list[float]] = {"no agent": [], "host, no pause": [], "host, pause": []}
    starts: dict[str, list[float]] = {k: [] for k in per_open}
    for _ in range(rounds):
        for setting in per_open:
            sensor = None if setting == "no agent" else _sensor(setting == "host, pause", cache)
            try:
                per_open[setting].append(_opens_ns(opens, "/etc/hostname"))
                starts[setting].extend(_start_ms(100 // rounds))
            finally:
                if sensor is not None:
                    sensor.stop()
    return {
        k: {
            "openat_ns_median": statistics.median(per_open[k]),
            "python_start_ms_p50": _pct(starts[k], 0.5),
            "python_start_ms_p99": _pct(starts[k], 0.99),
        }
        for k in per_open
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--starts", type=int, default=100)
    ap.add_argument("--new", type=int, default=12, help="starts on a never-seen copy (63 probes each, held to the end)")
    ap.add_argument("--opens", type=int, default=200_000, help="0: measure the pauses alone")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="otelbpf-pause-") as tmp:
        cache = ProgramCache(str(Path(tmp) / "cache"), 4, Health())
        result = {"pauses": bench_pauses(args.new, args.starts, Path(tmp), cache)}
        if args.opens:  # 0: the pauses alone
            result["cost"] = bench_cost(args.opens, cache)
    print(json.dumps(result, indent=2))
    out = Path(__file__).parent / "results" / f"host_pause-{dt.datetime.now():%Y-%m-%dT%H%M}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
