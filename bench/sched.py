"""Benchmark the sched receiver's kernel side (bpf/sched.c) on a context-switch-heavy load.

    sudo .venv/bin/python bench/sched.py [--rounds N] [--trips N] [--out FILE]

The workload is a C program built here: two threads ping-pong one byte over two pipes,
pinned to one CPU (``taskset -c 0``), so every round trip is two context switches and two
wakeups. It prints ns per round trip and the switches it made (getrusage). Conditions, run
interleaved round by round in one invocation (drift in the machine's load hits all alike):

- ``none``: no BPF program;
- ``empty``: empty programs on the three tracepoints the family uses (sched_switch,
  sched_wakeup, sched_wakeup_new): the cost of hooking them at all;
- ``discovery``: what every agent loads whatever its receivers (``program.build`` with no
  family: common.h and discovery.c, whose ``openat`` syscall tracepoints put every syscall
  of the host on the kernel's traced slow path): the floor the family adds to;
- ``untraced``: the sched family as the agent builds it (discovery.c and sched.c), nothing
  watched: what every other thread on the host pays (one map lookup at switch-out, one at
  switch-in, one per wakeup);
- ``traced``: the same with the workload's process watched: every switch-out reads the
  kernel stack and fills the thread's entry, every switch-in accounts an interval and adds it
  to the thread's window of short intervals (``aggregate_window``, 1 ms, for intervals of at
  least ``aggregate_min``, 50 us: one ring record per thread and window, drained here as the
  agent does);
- ``traced_nofloor``: ``traced`` with ``aggregate_min: 0``: every interval summed, the
  ping-pong's few-us waits too (the most records a thread can make: one per window);
- ``traced_unsummed``: ``traced`` with ``aggregate_window: 0`` (the family before short
  intervals were summed: nothing under ``span_threshold`` reaches the ring).

For the traced conditions the ring records per second (what the agent turns into spans) are
counted, and ``--userspace`` times the correlator's ``on_ring`` on summed records (µs per
record, spans made and handed on): the agent's CPU for those records.

Per condition: the median ns per round trip, and the added ns per context switch against
``none``, ``empty`` and ``discovery`` ((median - baseline) / switches per round trip). With
``kernel.bpf_stats_enabled`` on, for the BPF conditions also the kernel's own account: run
count and mean ns per run of each program (all the host's switches, not only the
workload's). Results: a table on stdout and bench/results/sched-<date>.json; the numbers
and how to read them are in docs/BENCHMARKS.md ("Scheduler context").
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
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PINGPONG_C = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/resource.h>

static int ab[2], ba[2];
static long trips;

static void *echo(void *arg)
{
    char c;
    (void)arg;
    for (long i = 0; i < trips; i++) {
        if (read(ab[0], &c, 1) != 1 || write(ba[1], &c, 1) != 1)
            exit(2);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    trips = atol(argv[1]);
    char go[8];
    if (pipe(ab) || pipe(ba))
        return 1;
    printf("ready\n");
    fflush(stdout);
    if (!fgets(go, sizeof(go), stdin))  /* the bench watches this pid first */
        return 1;
    pthread_t t;
    pthread_create(&t, NULL, echo, NULL);
    struct rusage r0, r1;
    struct timespec a, b;
    getrusage(RUSAGE_SELF, &r0);
    clock_gettime(CLOCK_MONOTONIC, &a);
    char c = 'x';
    for (long i = 0; i < trips; i++) {
        if (write(ab[1], &c, 1) != 1 || read(ba[0], &c, 1) != 1)
            return 2;
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    pthread_join(t, NULL);
    getrusage(RUSAGE_SELF, &r1);
    double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
    long sw = (r1.ru_nvcsw - r0.ru_nvcsw) + (r1.ru_nivcsw - r0.ru_nivcsw);
    printf("%.1f %.3f\n", ns / trips, (double)sw / trips);
    return 0;
}
"""

TRACEPOINTS = ("sched_switch", "sched_wakeup", "sched_wakeup_new")
CONDITIONS = ("none", "empty", "discovery", "untraced", "traced", "traced_nofloor", "traced_unsummed")


def build(workdir: Path) -> Path:
    src, exe = workdir / "pingpong.c", workdir / "pingpong"
    src.write_text(PINGPONG_C)
    subprocess.run(["cc", "-O2", "-pthread", "-o", str(exe), str(src)], check=True)
    return exe


def _program_stats(bpf) -> dict[str, dict[str, float]]:
    """run_cnt and mean ns per run of each program that ran (kernel.bpf_stats_enabled)."""
    out = {}
    for name, fn in bpf.funcs.items():
        info = dict(
            line.split(":\t", 1)
            for line in Path(f"/proc/self/fdinfo/{fn.fd}").read_text().splitlines()
            if ":\t" in line
        )
        runs = int(info.get("run_cnt", "0"))
        if runs:
            out[name.decode() if isinstance(name, bytes) else name] = {
                "runs": runs,
                "mean_ns": round(int(info["run_time_ns"]) / runs, 1),
            }
    return out


@contextmanager
def loaded(condition: str) -> Iterator[object | None]:
    """The BPF object of ``condition`` (None for ``none``), unloaded after."""
    if condition == "none":
        yield None
        return
    from bcc import BPF

    if condition == "empty":
        bpf = BPF(text="\n".join(f"TRACEPOINT_PROBE(sched, {t}) {{ return 0; }}" for t in TRACEPOINTS))
    else:
        from otelbpf.families.sched.probes import sched_family
        from otelbpf.sensor import program

        fam = sched_family(
            span_threshold_ns=1_000_000,
            ring_bytes=1 << 20,
            aggregate_window_ns=0 if condition == "traced_unsummed" else 1_000_000,
            aggregate_min_ns=0 if condition == "traced_nofloor" else 50_000,
            thread_entries=16384,
            off_entries=16384,
            runq_entries=65536,
            stack_entries=8192,
        )
        families = [] if condition == "discovery" else [fam]
        text, cflags = program.build(families, filter_pids=True, events_ring_bytes=1 << 20)
        bpf = BPF(text=text, cflags=cflags)
    try:
        yield bpf
    finally:
        bpf.cleanup()


def one_run(exe: Path, trips: int, condition: str) -> dict:
    knob = Path("/proc/sys/kernel/bpf_stats_enabled")
    with loaded(condition) as bpf:
        proc = subprocess.Popen(
            ["taskset", "-c", "0", str(exe), str(trips)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout.readline().startswith("ready")
        traced = condition.startswith("traced")
        got = [0]
        stop = threading.Event()
        poller = None
        if traced:
            watched = bpf["watched"]
            watched[watched.Key(proc.pid)] = watched.Leaf(1)

            def count(_ctx, _data, _size) -> int:
                got[0] += 1
                return 0

            bpf["schedevents"].open_ring_buffer(count)

            def poll() -> None:
                while not stop.is_set():
                    bpf.ring_buffer_poll(50)

            poller = threading.Thread(target=poll, daemon=True)
            poller.start()
        before = knob.read_text().strip()
        if bpf is not None:
            knob.write_text("1")
        t0 = time.monotonic()
        try:
            proc.stdin.write("go\n")
            proc.stdin.flush()
            out, _ = proc.communicate(timeout=600)
        finally:
            knob.write_text(before)
            secs = time.monotonic() - t0
            stop.set()
            if poller is not None:
                poller.join()
                bpf.ring_buffer_consume()
        ns, switches = (float(x) for x in out.split())
        result = {"ns_per_trip": ns, "switches_per_trip": switches}
        if bpf is not None:
            result["programs"] = _program_stats(bpf)
            if traced:
                result["ring_records"] = got[0]
                result["ring_records_per_s"] = round(got[0] / secs)
                result["switches_per_s"] = round(switches * trips / secs) if secs else 0
                result["threads_seen"] = len(bpf["sched_threads"].items())
                result["series"] = len(bpf["sched_off"].items())
    return result


def userspace_cost(n: int = 20_000, rounds: int = 5) -> dict:
    """µs per ring record in SchedCorrelator.on_ring: ``n`` summed records of 4 threads (a
    window of short intervals each), every one a span (the span budget set above ``n``), the
    spans handed to a list. Median of ``rounds``."""
    import numpy as np

    from otelbpf.correlate.base import CorrelatorSettings
    from otelbpf.correlate.clock import MonotonicClock
    from otelbpf.correlate.process_info import ProcessInfo
    from otelbpf.families.sched.correlator import SchedCorrelator
    from otelbpf.families.sched.probes import RECORD_DTYPE

    arr = np.zeros(n, RECORD_DTYPE)
    arr["off_ts"] = np.arange(n) * 1_000_000
    arr["end_ts"] = arr["off_ts"] + 900_000
    arr["blocked_ns"], arr["runq_ns"], arr["count"] = 400_000, 20_000, 40
    arr["tgid"], arr["tid"] = os.getpid(), os.getpid() + np.arange(n) % 4
    arr["kstack"], arr["state"], arr["comm"] = -1, 1, b"train"
    times = []
    for _ in range(rounds):
        spans: list = []
        corr = SchedCorrelator(
            CorrelatorSettings(ProcessInfo(), MonotonicClock(), spans.extend),
            lambda _name: [],
            lambda _name, _keys: None,
            lambda _fn: None,
            lambda *_a, **_k: None,
            traces=True,
            max_spans_per_second=10 * n,
        )
        t0 = time.perf_counter()
        corr.on_ring("schedevents", arr)
        times.append((time.perf_counter() - t0) / n * 1e6)
        assert len(spans) == n
    return {"records": n, "us_per_record": round(statistics.median(times), 2), "runs_us": [round(t, 2) for t in times]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--trips", type=int, default=200_000)
    ap.add_argument("--out")
    ap.add_argument("--conditions", default=",".join(CONDITIONS))
    ap.add_argument("--userspace", action="store_true", help="also time the correlator per ring record")
    args = ap.parse_args()
    conditions = tuple(c for c in CONDITIONS if c in args.conditions.split(","))
    if os.geteuid() != 0:
        sys.exit("needs root (BPF)")
    runs: dict[str, list[dict]] = {c: [] for c in conditions}
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(Path(tmp))
        for r in range(args.rounds):
            order = conditions if r % 2 == 0 else conditions[::-1]
            for c in order:
                runs[c].append(one_run(exe, args.trips, c))
                print(f"round {r + 1} {c:>9}: {runs[c][-1]['ns_per_trip']:.0f} ns/trip", file=sys.stderr)
    med = {c: statistics.median(x["ns_per_trip"] for x in runs[c]) for c in conditions}
    switches = statistics.median(x["switches_per_trip"] for c in conditions for x in runs[c])
    summary = {}
    print(f"\n{'condition':>9} {'ns/trip':>9} {'+ns/switch vs none':>19} {'vs empty':>9} {'vs discovery':>12}")
    bases = [b for b in ("none", "empty", "discovery") if b in med]
    for c in conditions:
        added = {b: (med[c] - med[b]) / switches for b in bases}
        summary[c] = {
            "median_ns_per_trip": round(med[c], 1),
            **{f"added_ns_per_switch_vs_{b}": round(v, 1) for b, v in added.items()},
        }
        print(f"{c:>9} {med[c]:>9.0f} " + " ".join(f"{b}:{v:+.0f}" for b, v in added.items()))
    for c in [c for c in conditions if c != "none"]:
        per_prog: dict[str, list[float]] = {}
        for x in runs[c]:
            for name, st in x.get("programs", {}).items():
                per_prog.setdefault(name, []).append(st["mean_ns"])
        summary[c]["bpf_mean_ns_per_run"] = {n: round(statistics.median(v), 1) for n, v in per_prog.items()}
        shown = {n: v for n, v in summary[c]["bpf_mean_ns_per_run"].items() if "sched" in n}
        print(f"{c:>9} bpf_stats mean ns per run: {shown}")
        if c.startswith("traced"):
            for k in ("ring_records_per_s", "switches_per_s"):
                summary[c][f"median_{k}"] = statistics.median(x[k] for x in runs[c])
            rec, sw = summary[c]["median_ring_records_per_s"], summary[c]["median_switches_per_s"]
            print(f"{c:>9} ring records/s {rec}, switches/s {sw}")
    doc = {
        "date": dt.datetime.now(dt.UTC).isoformat(),
        "kernel": os.uname().release,
        "cpus": os.cpu_count(),
        "load_avg": os.getloadavg(),
        "trips": args.trips,
        "rounds": args.rounds,
        "switches_per_trip": switches,
        "summary": summary,
        "runs": runs,
    }
    if args.userspace:
        doc["userspace"] = userspace_cost()
        print(f"correlator: {doc['userspace']['us_per_record']} us per ring record")
    out = Path(args.out or REPO / "bench" / "results" / f"sched-{dt.date.today().isoformat()}.json")
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
