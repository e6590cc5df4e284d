"""The sched probe family: ``bpf/sched.c``, off-CPU time and run-queue latency of the
threads of traced processes, from the scheduler's tracepoints.

It probes no library: the tracepoints attach when the program loads. The kernel keeps
the aggregates (``sched_off``, ``sched_runq``: read for metrics) and puts only long
off-CPU intervals on the ``schedevents`` ring. What is configurable is compiled in: the
span threshold and the map sizes. The map reads the correlator needs beyond the sensor's
generic ones (kernel stacks by id, the drop counters) are here too: the correlator runs them
under the sensor's lock and sees only their results.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from otelbpf.sensor.family import ProbeFamily, RingSpec

RING = "schedevents"
OFF_MAP, RUNQ_MAP, STACK_MAP, STATS_MAP = "sched_off", "sched_runq", "sched_stacks", "sched_stats"
#: bpf/sched.c SCHED_SLOTS: run-queue histogram buckets, floor(log2(ns)).
SLOTS = 40
#: ``state`` bit: the thread left the CPU inside a CUDA API call (``inflight`` held one).
IN_CUDA = 0x100
#: sched_stats slots, in order (bpf/sched.c SCHED_STAT_*).
STATS = ("ring_full", "map_full", "stack_lost")


class State(enum.IntEnum):
    """Why a thread left the CPU, as the scheduler says (bpf/sched.c SCHED_*)."""

    preempted = 0  # still runnable: it waited on the run queue
    sleeping = 1  # S: waiting for an event (futex, pipe, socket, timer)
    disk = 2  # D: uninterruptible, mostly I/O
    other = 3
    new = 4


#: struct sched_rec
RECORD_DTYPE = np.dtype(
    [
        ("off_ts", "<u8"),
        ("end_ts", "<u8"),
        ("blocked_ns", "<u8"),
        ("runq_ns", "<u8"),
        ("tgid", "<u4"),
        ("tid", "<u4"),
        ("kstack", "<i4"),
        ("state", "<u4"),
        ("count", "<u4"),
        ("pad", "<u4"),
        ("comm", "S16"),
    ]
)
assert RECORD_DTYPE.itemsize == 72


def sched_family(
    *,
    span_threshold_ns: int,
    ring_bytes: int,
    aggregate_window_ns: int = 1_000_000,
    aggregate_min_ns: int = 50_000,
    thread_entries: int,
    off_entries: int,
    runq_entries: int,
    stack_entries: int,
    on_unload: Callable[[object], None] | None = None,
) -> ProbeFamily:
    """The family for these limits; ``on_unload`` gets the BCC object for a final read
    (kernel stacks are not a counting map the sensor keeps)."""
    return ProbeFamily(
        name="sched",
        c_file="sched.c",
        libraries=(),
        counting_maps=(OFF_MAP, RUNQ_MAP),
        cflags=(
            f"-DSCHED_SPAN_NS={int(span_threshold_ns)}ULL",
            f"-DSCHED_AGG_NS={int(aggregate_window_ns)}ULL",
            f"-DSCHED_AGG_MIN_NS={int(aggregate_min_ns)}ULL",
            f"-DSCHED_RING_PAGES={ring_bytes // 4096}",
            f"-DSCHED_THREAD_ENTRIES={thread_entries}",
            f"-DSCHED_OFF_ENTRIES={off_entries}",
            f"-DSCHED_RUNQ_ENTRIES={runq_entries}",
            f"-DSCHED_STACK_ENTRIES={stack_entries}",
            "-DSCHED_WAKEUP_PROBES=1",  # sched.c owns sched_wakeup(_new): sockets.c's hand-offs go through it
        ),
        rings=(RingSpec(RING, RECORD_DTYPE, ring_bytes),),
        on_unload=on_unload,
    )


def read_stacks(bpf: Any, ids: Iterable[int]) -> dict[int, list[int]]:
    """The kernel stacks ``ids`` as addresses, leaf first (one the map no longer holds: empty)."""
    table = bpf[STACK_MAP]
    out = {}
    for i in ids:
        try:
            out[i] = list(table.walk(i))
        except KeyError:
            out[i] = []
    return out


def counted_stacks(bpf: Any) -> set[int]:
    """The stack ids the off-CPU counts name."""
    return {int(k.kstack) for k, _v in bpf[OFF_MAP].items() if int(k.kstack) >= 0}


def read_stats(bpf: Any) -> dict[str, int]:
    """The kernel's drop counters by ``STATS`` name, summed over CPUs."""
    table = bpf[STATS_MAP]
    return {name: int(sum(table[table.Key(slot)])) for slot, name in enumerate(STATS)}
