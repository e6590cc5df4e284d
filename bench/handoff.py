"""Benchmark the hand-off tracepoints (bpf/common.h: handoff_wakeup) on a wakeup-heavy load.

    sudo .venv/bin/python bench/handoff.py [--rounds N] [--trips N] [--out FILE]

The workload is a C program built here: two threads of one process ping-pong a turn over a
futex, pinned to one CPU (``taskset -c 0``), so every round trip is two cross-thread wakeups of
the same process, the case the tracepoint records (and no socket syscall: the sockets family's
own probes stay out of the figures). Conditions, interleaved round by round in one invocation:

- ``none``: no BPF program;
- ``empty``: empty programs on sched_wakeup and sched_wakeup_new;
- ``sockets``: the sockets family as the agent builds it with ``handoffs: false``, the workload
  watched: the baseline the option adds to;
- ``untraced``: with ``handoffs: true``, nothing watched: what every other process's wakeups pay
  (one map lookup);
- ``traced``: the same with the workload watched: two lookups and a map write per wakeup.

Per condition: the median ns per round trip and the added ns per wakeup against ``none``,
``empty`` and ``sockets``; with ``kernel.bpf_stats_enabled`` on, the kernel's mean ns per run of
each sched program. Results: a table on stdout and bench/results/handoff-<date>.json; read in
docs/BENCHMARKS.md ("Hand-offs").
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

_spec = importlib.util.spec_from_file_location("bench_sched", REPO / "bench" / "sched.py")
assert _spec is not None and _spec.loader is not None
bench_sched = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_sched)  # its bpf_stats reader

FUTEX_PINGPONG_C = r"""
#include <linux/futex.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static volatile int turn;  /* 0: main's, 1: the echo thread's */
static long trips;

static void wait_for(int mine)
{
    while (__atomic_load_n(&turn, __ATOMIC_ACQUIRE) != mine)
        syscall(SYS_futex, &turn, FUTEX_WAIT_PRIVATE, !mine, NULL, NULL, 0);
}

static void give(int to)
{
    __atomic_store_n(&turn, to, __ATOMIC_RELEASE);
    syscall(SYS_futex, &turn, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

static void *echo(void *arg)
{
    (void)arg;
    for (long i = 0; i < trips; i++) {
        wait_for(1);
        give(0);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    trips = atol(argv[1]);
    char go[8];
    printf("ready\n");
    fflush(stdout);
    if (!fgets(go, sizeof(go), stdin))  /* the bench watches this pid first */
        return 1;
    pthread_t t;
    pthread_create(&t, NULL, echo, NULL);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < trips; i++) {
        give(1);
        wait_for(0);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    pthread_join(t, NULL);
    printf("%.1f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / trips);
    return 0;
}
"""

CONDITIONS = ("none", "empty", "sockets", "untraced", "traced")
WAKEUPS_PER_TRIP = 2


def build(workdir: Path) -> Path:
    src, exe = workdir / "futex_pingpong.c", workdir / "futex_pingpong"
    src.write_text(FUTEX_PINGPONG_C)
    subprocess.run(["cc", "-O2", "-pthread", "-o", str(exe), str(src)], check=True)
    return exe


@contextmanager
def loaded(condition: str) -> Iterator[object | None]:
    """The BPF object of ``condition`` (None for ``none``), unloaded after."""
    if condition == "none":
        yield None
        return
    from bcc import BPF

    if condition == "empty":
        bpf = BPF(
            text="\n".join(
                f"TRACEPOINT_PROBE(sched, {t}) {{ return 0; }}" for t in ("sched_wakeup", "sched_wakeup_new")
            )
        )
    else:
        from otelbpf.families.http.probes import socket_family
        from otelbpf.sensor import program

        fam = socket_family([], payload_bytes=4096, ring_bytes=1 << 20, handoffs=condition != "sockets")
        text, cflags = program.build([fam], filter_pids=True, events_ring_bytes=1 << 20)
        bpf = program.load(text, cflags, [fam])
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
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().startswith("ready")
        if condition in ("sockets", "traced"):
            watched = bpf["watched"]  # type: ignore[index]
            watched[watched.Key(proc.pid)] = watched.Leaf(1)
        before = knob.read_text().strip()
        if bpf is not None:
            knob.write_text("1")
        try:
            proc.stdin.write("go\n")
            proc.stdin.flush()
            out, _ = proc.communicate(timeout=600)
        finally:
            knob.write_text(before)
        result: dict = {"ns_per_trip": float(out)}
        if bpf is not None:
            result["programs"] = bench_sched._program_stats(bpf)
            if condition == "traced":
                result["threads_kept"] = len(bpf["handoffs"].items())  # type: ignore[index]
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--trips", type=int, default=200_000)
    ap.add_argument("--out")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (BPF)")
    runs: dict[str, list[dict]] = {c: [] for c in CONDITIONS}
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(Path(tmp))
        for r in range(args.rounds):
            order = CONDITIONS if r % 2 == 0 else CONDITIONS[::-1]
            for c in order:
                runs[c].append(one_run(exe, args.trips, c))
                print(f"round {r + 1} {c:>9}: {runs[c][-1]['ns_per_trip']:.0f} ns/trip", file=sys.stderr)
    med = {c: statistics.median(x["ns_per_trip"] for x in runs[c]) for c in CONDITIONS}
    summary: dict[str, dict] = {}
    print(f"\n{'condition':>9} {'ns/trip':>9} {'+ns/wakeup vs none':>19} {'vs empty':>9} {'vs sockets':>10}")
    for c in CONDITIONS:
        added = {b: (med[c] - med[b]) / WAKEUPS_PER_TRIP for b in ("none", "empty", "sockets")}
        summary[c] = {
            "median_ns_per_trip": round(med[c], 1),
            "ratio_to_none": round(med[c] / med["none"], 3),
            **{f"added_ns_per_wakeup_vs_{b}": round(v, 1) for b, v in added.items()},
        }
        print(f"{c:>9} {med[c]:>9.0f} {added['none']:>19.0f} {added['empty']:>9.0f} {added['sockets']:>10.0f}")
    for c in ("empty", "sockets", "untraced", "traced"):
        per_prog: dict[str, list[float]] = {}
        for x in runs[c]:
            for name, st in x.get("programs", {}).items():
                per_prog.setdefault(name, []).append(st["mean_ns"])
        summary[c]["bpf_mean_ns_per_run"] = {n: round(statistics.median(v), 1) for n, v in per_prog.items()}
        shown = {n: v for n, v in summary[c]["bpf_mean_ns_per_run"].items() if "sched" in n}
        print(f"{c:>9} bpf_stats mean ns per run: {shown}")
    doc = {
        "date": dt.datetime.now(dt.UTC).isoformat(),
        "kernel": os.uname().release,
        "cpus": os.cpu_count(),
        "load_avg": os.getloadavg(),
        "trips": args.trips,
        "rounds": args.rounds,
        "wakeups_per_trip": WAKEUPS_PER_TRIP,
        "summary": summary,
        "runs": runs,
    }
    out = Path(args.out or REPO / "bench" / "results" / f"handoff-{dt.date.today().isoformat()}.json")
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
