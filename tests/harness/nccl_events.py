"""Synthetic NCCL correlator input: ring-buffer rows as bpf/nccl.c and bpf/cuda.c write them,
and whole jobs of ranks built from them (tests/correlate/test_nccl*.py, tests/deploy/)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from otelbpf.base.events import EVENT_DTYPE, FLAG_NCCL_UNKNOWN_COMM, CudaFunc, Kind, NcclFunc
from otelbpf.correlate.base import CorrelatorSettings
from otelbpf.correlate.clock import MonotonicClock
from otelbpf.correlate.process_info import ProcessInfo
from otelbpf.families.nccl.correlator import NcclCorrelator
from otelbpf.families.nccl.launch_env import Launch

MS = 1_000_000
#: (comm id, rank) -> (collectives, seconds) of nccl.collective.wait
Waits = dict[tuple[str, int], tuple[int, float]]
STREAM, COMPUTE = 0x6000, 0x5000
F32 = 7


def pack(rank: int, nranks: int) -> int:
    return (rank & 0xFFFFFFFF) | (nranks & 0xFFFFFFFF) << 32


def args(count: int = 1024, dtype: int = F32, op: int = 0) -> int:
    return count | dtype << 48 | op << 56


class Events:
    def __init__(self) -> None:
        self.rows: list[tuple] = []

    def add(self, ts, pid, kind, func, *, dur=0, flags=0, ret=0, a0=0, a1=0, a2=0, a3=0, tid=None):
        self.rows.append((ts, dur, pid, tid or pid, kind, func, flags, ret, a0, a1, a2, a3))

    def allreduce(self, ts, pid, comm, *, enq=MS // 10, unknown=True, seq=0, rank=-1, nranks=-1, count=1024):
        flags = FLAG_NCCL_UNKNOWN_COMM if unknown else 0
        self.add(
            ts,
            pid,
            Kind.NCCL_ENTER,
            NcclFunc.ncclAllReduce,
            dur=pack(rank, nranks),
            flags=flags,
            ret=-1,
            a0=comm,
            a1=seq,
            a2=args(count),
            a3=STREAM,
        )
        self.add(ts + enq, pid, Kind.NCCL_RETURN, NcclFunc.ncclAllReduce)

    def array(self) -> np.ndarray:
        rows = sorted(self.rows, key=lambda r: r[0])
        return np.array(rows, dtype=EVENT_DTYPE)


def correlator(launches: dict[int, Launch | None], host: str = "node-a", **kw) -> tuple[NcclCorrelator, list]:
    """A correlator as the agent on ``host`` runs it (its processes' resources say that host)."""
    spans: list = []
    settings = CorrelatorSettings(ProcessInfo({"host.name": host}), MonotonicClock(), spans.extend)
    return NcclCorrelator(settings, launch_of=launches.get, host=host, **kw), spans


def torchrun(rank: int, world: int = 4, job: str = "torchelastic:a") -> Launch:
    return Launch(rank, world, "env:RANK", job)


def blocking_job(
    iterations: int,
    late_ms: float,
    *,
    slow: int = 2,
    ranks: range = range(4),
    world: int = 4,
    period_ms: float = 300,
    transfer_ms: float = 0.05,
    jitter: Callable[[int, int], float] | None = None,
    pid_of: Callable[[int, int], int] = lambda k, r: 100 + r,
    stop: dict[int, int] | None = None,
) -> Events:
    """A job whose collectives return at completion and are never synchronized on (a blocking
    wait, a CPU-side backend): every rank of ``world`` enters collective k at t0 (rank ``slow``
    ``late_ms`` later), and each call returns ``transfer_ms`` after the last entry. Only the
    ``ranks`` given are in the events (the others run on another node); ``stop``: rank -> the
    collective it dies in (entered, never returned)."""
    ev = Events()
    stop = stop or {}
    for k in range(iterations):
        t0 = (1000 + k * period_ms) * MS
        entries = {r: t0 + (late_ms * MS if r == slow else 0) + (jitter(k, r) if jitter else 0) for r in range(world)}
        live = [r for r in entries if k <= stop.get(r, iterations)]
        done = max(entries[r] for r in live) + transfer_ms * MS
        for r in ranks:
            if k > stop.get(r, iterations):
                continue
            t, pid = int(entries[r]), pid_of(k, r)
            if k == stop.get(r):
                ev.allreduce(t, pid, 0xC000 + r, enq=0)
                ev.rows.pop()  # entered, never returned
                ev.add(t + 5 * MS, pid, Kind.PROC_EXIT, 0)
                continue
            ev.allreduce(t, pid, 0xC000 + r, enq=int(done) - t)
    return ev


def feed(c: NcclCorrelator, ev: Events, batch_ms: int = 20) -> None:
    """The events in drains of ``batch_ms``, as the agent hands them over."""
    arr = ev.array()
    edges = np.arange(arr["ts_ns"][0], arr["ts_ns"][-1] + batch_ms * MS, batch_ms * MS)
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        c.on_events(arr[(arr["ts_ns"] >= lo) & (arr["ts_ns"] < hi)])
    c.on_events(arr[arr["ts_ns"] >= edges[-1]])


def expire(c: NcclCorrelator, pid: int = 100) -> None:
    """Ten seconds later (a synchronize of another stream that observes nothing): the collectives
    nobody synchronized on are past ``completion_timeout`` and finish at their return."""
    ev = Events()
    ev.add(10**13, pid, Kind.CUDA_SYNC, CudaFunc.cudaStreamSynchronize, a0=0x1, dur=1000)
    feed(c, ev)


def waits(c: NcclCorrelator) -> Waits:
    out: Waits = {}
    for _, metrics in c.collect():
        for metric in metrics:
            if metric.name == "nccl.collective.wait":
                for dp in metric.data.data_points:
                    key = (str(dp.attributes["nccl.comm.id"]), int(dp.attributes["nccl.rank"]))
                    n, total = out.get(key, (0, 0.0))
                    out[key] = (n + dp.count, total + dp.sum)
    return out


def slowest(w: Waits) -> set[tuple[str, int]]:
    """What the Prometheus rules conclude from the signal (deploy/prometheus/otelbpf-nccl.rules.yaml,
    ``NcclStraggler``): per communicator of two ranks or more, the rank whose mean wait lies
    below the median by more than 5 ms and a tenth of the median."""
    out = set()
    for comm in {c for c, _ in w}:
        means = {r: total / n for (c, r), (n, total) in w.items() if c == comm and n}
        if len(means) < 2:
            continue
        median = float(np.median(list(means.values())))
        out |= {(comm, r) for r, v in means.items() if median - v > max(5e-3, 0.1 * median)}
    return out
