"""The NCCL correlator on synthetic events: completion from CUDA events, communicators created
before the probes (ranks from the environment, collectives placed in rounds), the adaptive
live straggler test, and bad input. The agent-made inputs are in tests/test_nccl_agent.py."""

from __future__ import annotations

import numpy as np
import pytest

from harness.nccl_events import COMPUTE, F32, MS, STREAM, Events, args, pack
from otelbpf.base.events import CudaFunc, Kind, NcclFunc
from otelbpf.correlate.base import CorrelatorSettings
from otelbpf.correlate.clock import MonotonicClock
from otelbpf.correlate.process_info import ProcessInfo
from otelbpf.families.nccl.correlator import NcclCorrelator
from otelbpf.families.nccl.launch_env import Launch, parse


def correlator(launches: dict[int, Launch | None], **kw) -> tuple[NcclCorrelator, list]:
    spans: list = []
    settings = CorrelatorSettings(ProcessInfo(), MonotonicClock(), spans.extend)
    c = NcclCorrelator(settings, launch_of=launches.get, host="test", **kw)
    return c, spans


def torchrun(rank: int, world: int = 4, job: str = "torchelastic:a") -> Launch:
    return Launch(rank, world, "env:RANK", job)


def ar_spans(spans, pid=None):
    return [
        s for s in spans if s.name == "ncclAllReduce" and (pid is None or s.resource.attributes["process.pid"] == pid)
    ]


def findings(spans):
    return [
        (s.resource.attributes["process.pid"], dict(e.attributes))
        for s in spans
        for e in s.events
        if e.name == "nccl.straggler"
    ]


# ---- completion as PyTorch sees it


@pytest.mark.parametrize("how", ["query", "sync", "wait"])
def test_completion_is_observed_through_the_event_recorded_after_the_collective(how):
    ev = Events()
    pid, event = 100, 0xE1
    ev.allreduce(1000 * MS, pid, 0xC0)
    ev.add(1001 * MS, pid, Kind.CUDA_CALL, CudaFunc.cudaEventRecord, a0=event, a2=STREAM, dur=1000)
    ev.add(1002 * MS, pid, Kind.CUDA_CALL, CudaFunc.cudaEventQuery, a0=event, ret=600, dur=1000)  # not ready
    if how == "query":
        ev.add(1050 * MS, pid, Kind.CUDA_CALL, CudaFunc.cudaEventQuery, a0=event, dur=2000)
    elif how == "sync":
        ev.add(1010 * MS, pid, Kind.CUDA_SYNC, CudaFunc.cudaEventSynchronize, a0=event, a1=1, dur=40 * MS + 2000)
    else:
        ev.add(1003 * MS, pid, Kind.CUDA_CALL, CudaFunc.cudaStreamWaitEvent, a0=event, a2=COMPUTE, dur=1000)
        ev.add(1010 * MS, pid, Kind.CUDA_SYNC, CudaFunc.cudaStreamSynchronize, a0=COMPUTE, dur=40 * MS + 2000)
    c, spans = correlator({})
    c.on_events(ev.array())
    (span,) = ar_spans(spans)
    a = span.attributes
    method = {"query": "event_query", "sync": "event_sync", "wait": "stream_wait"}[how]
    assert (a["nccl.completion"], a["nccl.completion.method"], a["cuda.event"]) == ("observed", method, "0xe1")
    assert (
        a["nccl.sync.function"]
        == {"query": "cudaEventQuery", "sync": "cudaEventSynchronize", "wait": "cudaStreamSynchronize"}[how]
    )
    # the compute stream's synchronize also waited for the work behind the wait: only a bound
    assert a.get("nccl.completion.bound") == ("upper" if how == "wait" else None)
    assert span.end_time - span.start_time == 50 * MS + 2000
    assert a["nccl.enqueue.time_unix_nano"] - span.start_time == MS // 10


def test_an_event_recorded_on_another_stream_or_before_the_collective_observes_nothing():
    ev = Events()
    pid = 100
    ev.add(999 * MS, pid, Kind.CUDA_CALL, CudaFunc.cudaEventRecord, a0=0xE0, a2=STREAM)  # before it
    ev.allreduce(1000 * MS, pid, 0xC0)
    ev.add(1001 * MS, pid, Kind.CUDA_CALL, CudaFunc.cudaEventRecord, a0=0xE1, a2=COMPUTE)  # other stream
    ev.add(1002 * MS, pid, Kind.CUDA_CALL, CudaFunc.cudaEventQuery, a0=0xE0)
    ev.add(1003 * MS, pid, Kind.CUDA_SYNC, CudaFunc.cudaEventSynchronize, a0=0xE1, a1=1, dur=MS)
    c, spans = correlator({})
    c.on_events(ev.array())
    assert not ar_spans(spans), "still pending"
    ev = Events()
    ev.add(1100 * MS, pid, Kind.CUDA_SYNC, CudaFunc.cudaStreamSynchronize, a0=STREAM, dur=MS)
    c.on_events(ev.array())
    (span,) = ar_spans(spans)
    assert span.attributes["nccl.completion.method"] == "stream_sync"


# ---- ranks and communicators without init


def test_launcher_environment_is_parsed():
    assert parse({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "x"}, 7) == Launch(
        3, 8, "env:RANK", "torchelastic:x", 1
    )
    assert parse({"SLURM_PROCID": "2", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "9"}, 7) == Launch(
        2, 4, "env:SLURM_PROCID", "slurm:9.", -1
    )
    assert parse({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, 7).job == "parent:7"
    assert parse({"RANK": "5", "WORLD_SIZE": "4"}, 7) is None, "a rank outside the world is not believed"
    assert parse({"RANK": "x"}, 7) is None and parse({}, 7) is None


#: --completion of examples/nccl/nccl_job.c -> nccl.completion.method
METHODS = {"query": "event_query", "sync": "event_sync", "wait": "stream_wait", "stream": "stream_sync"}


def observe(ev: Events, how: str, pid: int, enqueued: int, done: int, event: int) -> None:
    """How a rank learns that its collective (enqueued at ``enqueued``) completed, as
    ProcessGroupNCCL does: the synchronize or query that sees it returns at ``done``."""
    if how == "stream":
        ev.add(enqueued + MS, pid, Kind.CUDA_SYNC, CudaFunc.cudaStreamSynchronize, a0=STREAM, dur=done - enqueued - MS)
        return
    ev.add(enqueued + MS // 2, pid, Kind.CUDA_CALL, CudaFunc.cudaEventRecord, a0=event, a2=STREAM, dur=1000)
    if how == "query":
        ev.add(enqueued + MS, pid, Kind.CUDA_CALL, CudaFunc.cudaEventQuery, a0=event, ret=600, dur=1000)  # not ready
        ev.add(done - 10_000, pid, Kind.CUDA_CALL, CudaFunc.cudaEventQuery, a0=event, dur=10_000)
    elif how == "sync":
        ev.add(
            enqueued + MS, pid, Kind.CUDA_SYNC, CudaFunc.cudaEventSynchronize, a0=event, a1=1, dur=done - enqueued - MS
        )
    else:  # wait: the compute stream waits; the host learns at its next compute synchronize
        ev.add(enqueued + MS, pid, Kind.CUDA_CALL, CudaFunc.cudaStreamWaitEvent, a0=event, a2=COMPUTE, dur=1000)
        ev.add(done - 10_000, pid, Kind.CUDA_SYNC, CudaFunc.cudaStreamSynchronize, a0=COMPUTE, dur=10_000)


def late_job(
    iterations: int,
    late_ms: float,
    *,
    slow: int = 2,
    ranks: int = 4,
    skip: dict | None = None,
    period_ms: float = 300,
    duration_ms: float = 200,
    jitter=None,
    how: str = "query",
    lag_ms=None,
) -> Events:
    """``ranks`` processes (pids 100+r), each with its own comm pointer, none seen at init;
    rank ``slow`` enters late_ms after the others; all observe completion duration_ms after the
    last entry (``how``: the way they observe it), plus ``lag_ms(r)`` for an observation that
    comes later than the completion (``wait``: the compute synchronize after more work).
    ``skip``: rank -> collectives it made before the probes (not in the events)."""
    ev = Events()
    skip = skip or {}
    for k in range(iterations):
        t0 = (1000 + k * period_ms) * MS
        entries = {r: t0 + (late_ms * MS if r == slow else 0) + (jitter(k, r) if jitter else 0) for r in range(ranks)}
        done = max(entries.values()) + duration_ms * MS
        for r, t in entries.items():
            if k < skip.get(r, 0):
                continue
            pid = 100 + r
            ev.allreduce(int(t), pid, 0xC000 + r)
            seen = int(done) + 50_000 * r + int((lag_ms(r) if lag_ms else 0) * MS)
            observe(ev, how, pid, int(t) + MS // 10, seen, 0xE000 + r)
    return ev


@pytest.mark.parametrize("how", sorted(METHODS))
def test_late_attached_ranks_are_identified_from_the_environment_and_compared(how):
    """Whichever way the ranks learn of completion; with ``wait`` each observes 5 ms after the
    collective ended (the compute work queued behind the wait), which alignment tolerates."""
    # rank 3 attached two collectives later than the others
    ev = late_job(12, 40, skip={3: 2}, how=how, lag_ms=(lambda r: 5) if how == "wait" else None)
    c, spans = correlator({100 + r: torchrun(r) for r in range(4)})
    c.on_events(ev.array())
    by_pid = {pid: sorted(ar_spans(spans, pid), key=lambda s: s.start_time) for pid in range(100, 104)}
    ids = {s.attributes["nccl.comm.id"] for ss in by_pid.values() for s in ss}
    assert len(ids) == 1, "one communicator across the four processes"
    for r in range(4):
        ss = by_pid[100 + r]
        assert [s.attributes["nccl.seq"] for s in ss] == list(range(1 + (2 if r == 3 else 0), 13))
        assert all(
            (
                s.attributes["nccl.rank"],
                s.attributes["nccl.nranks"],
                s.attributes["nccl.rank.source"],
                s.attributes["nccl.comm.source"],
            )
            == (r, 4, "env:RANK", "aligned")
            for s in ss
        )
        assert ss[0].attributes["nccl.comm.address"] == f"{0xC000 + r:#x}"
        assert {(s.attributes["nccl.completion.method"], s.attributes.get("nccl.completion.bound")) for s in ss} == {
            (METHODS[how], "upper" if how == "wait" else None)
        }
    found = findings(spans)
    assert found and {pid for pid, _ in found} == {102}
    assert len(found) >= 12 - 5
    f = found[-1][1]
    assert 0.039 < f["nccl.straggler.lateness"] < 0.041 and f["nccl.straggler.threshold"] < 0.04
    assert f["nccl.straggler.peers"] == 3


@pytest.mark.parametrize("how", ["query", "wait"])
def test_a_healthy_jittery_job_has_no_straggler(how):
    rnd = np.random.default_rng(3)
    table = rnd.uniform(0, 30 * MS, size=(60, 4))
    lags = rnd.uniform(0, 20, size=4)  # wait: each rank's compute after the wait, observed late by it
    ev = late_job(
        60, 0, jitter=lambda k, r: table[k, r], how=how, lag_ms=(lambda r: lags[r]) if how == "wait" else None
    )
    c, spans = correlator({100 + r: torchrun(r) for r in range(4)})
    c.on_events(ev.array())
    assert len(ar_spans(spans)) == 240 and not findings(spans)


def test_a_rank_that_observes_completion_after_the_others_entered_the_next_round_is_not_aligned():
    """``wait``: the slow rank learns of each collective 100 ms after it ended, by when the others
    have entered the next one: its collective fits either round (nothing the probes see tells
    a rank 40 ms late from one a whole collective ahead), so it is left unaligned, says so, and
    is compared with nobody; the other ranks are aligned and compared among themselves."""
    ev = late_job(12, 40, how="wait", lag_ms=lambda r: 100 if r == 2 else 2)
    c, spans = correlator({100 + r: torchrun(r) for r in range(4)})
    c.on_events(ev.array())
    *slow, last = sorted(ar_spans(spans, 102), key=lambda s: s.start_time)
    assert len(slow) == 11
    assert {s.attributes["nccl.comm.source"] for s in slow} == {"unaligned"}
    assert not any("nccl.seq" in s.attributes for s in slow)
    assert {s.attributes["nccl.completion.bound"] for s in slow} == {"upper"}
    # the others made no 13th: the last fits one round only, and is placed in it
    assert (last.attributes["nccl.comm.source"], last.attributes["nccl.seq"]) == ("aligned", 12)
    for pid in (100, 101, 103):
        assert [s.attributes["nccl.seq"] for s in sorted(ar_spans(spans, pid), key=lambda s: s.start_time)] == list(
            range(1, 13)
        )
    assert not findings(spans), "no straggler invented from a rank that cannot be placed"
    anomalies = {
        dict(dp.attributes)["reason"]: dp.value
        for _, ms in c.collect()
        for m in ms
        if m.name == "otelbpf.nccl.anomalies"
        for dp in m.data.data_points
    }
    assert anomalies.get("late_comm_ambiguous") == 11


def test_two_jobs_with_the_same_ranks_on_one_host_are_kept_apart():
    ev = late_job(10, 40)
    other = late_job(10, 0)
    for row in other.rows:
        row = list(row)
        row[2] += 100  # pids 200..203
        row[3] += 100
        other_pid_row = tuple(row)
        ev.rows.append(other_pid_row)
    launches = {100 + r: torchrun(r, job="torchelastic:a") for r in range(4)}
    launches.update({200 + r: torchrun(r, job="torchelastic:b") for r in range(4)})
    c, spans = correlator(launches)
    c.on_events(ev.array())
    assert len({s.attributes["nccl.comm.id"] for s in ar_spans(spans)}) == 2
    assert {pid for pid, _ in findings(spans)} == {102}


def test_the_same_rank_twice_in_one_group_is_reported_and_never_compared():
    ev = late_job(10, 40, ranks=2, slow=1)
    c, spans = correlator({100: torchrun(0, world=2, job="j"), 101: torchrun(0, world=2, job="j")})
    c.on_events(ev.array())
    assert not findings(spans)
    assert {s.attributes["nccl.comm.source"] for s in ar_spans(spans)} == {"conflicted"}
    anomalies = {
        dict(dp.attributes)["reason"]: dp.value
        for _, ms in c.collect()
        for m in ms
        if m.name == "otelbpf.nccl.anomalies"
        for dp in m.data.data_points
    }
    assert anomalies.get("duplicate_rank") == 1


def test_without_a_launcher_processes_are_not_matched():
    ev = late_job(10, 40)
    c, spans = correlator({})
    c.on_events(ev.array())
    assert len({s.attributes["nccl.comm.id"] for s in ar_spans(spans)}) == 4
    assert not findings(spans) and all("nccl.rank" not in s.attributes for s in ar_spans(spans))


def test_a_rank_dying_and_collectives_that_never_complete_invent_no_straggler():
    ev = late_job(8, 0)
    # rank 1 dies inside collective 9; the others enter it and never see it complete
    for r in range(4):
        ev.allreduce((1000 + 8 * 300) * MS, 100 + r, 0xC000 + r)
    ev.add((1000 + 8 * 300 + 5) * MS, 101, Kind.PROC_EXIT, 0)
    c, spans = correlator({100 + r: torchrun(r) for r in range(4)}, completion_timeout_ns=1000 * MS)
    c.on_events(ev.array())
    later = Events()
    later.add((1000 + 8 * 300 + 5000) * MS, 100, Kind.CUDA_CALL, CudaFunc.cudaEventRecord, a0=0xE0, a2=0x1)
    c.on_events(later.array())
    assert not findings(spans)
    unobserved = [s for s in ar_spans(spans) if s.attributes["nccl.completion"] == "unobserved"]
    assert len(unobserved) == 3


def test_known_communicators_say_their_rank_came_from_init():
    ev = Events()
    for r in range(2):
        ev.allreduce((1000 + r) * MS, 100 + r, 0xAA, unknown=False, seq=1, rank=r, nranks=2)
        ev.add(1100 * MS, 100 + r, Kind.CUDA_SYNC, CudaFunc.cudaStreamSynchronize, a0=STREAM, dur=MS)
    c, spans = correlator({})
    c.on_events(ev.array())
    assert {(s.attributes["nccl.rank.source"], s.attributes["nccl.comm.source"]) for s in ar_spans(spans)} == {
        ("init", "init")
    }


# ---- two ranks whose communicator was initialised under the probes: the spans' facts


COMM = 0x5EED_0000_0000_0042
F16, BCAST_ROOT = 6, 1


def init_rank(ev: Events, ts: int, pid: int, rank: int, nranks: int = 2) -> None:
    """ncclCommInitRank entered, the communicator known (id, rank, size), returned."""
    ev.add(ts, pid, Kind.NCCL_ENTER, NcclFunc.ncclCommInitRank, dur=pack(rank, nranks), ret=-1)
    ev.add(ts + MS, pid, Kind.NCCL_COMM, NcclFunc.ncclCommInitRank, a1=COMM, a2=pack(rank, nranks))
    ev.add(ts + 2 * MS, pid, Kind.NCCL_RETURN, NcclFunc.ncclCommInitRank)


def collective(
    ev: Events,
    ts: int,
    pid: int,
    rank: int,
    func: NcclFunc,
    seq: int,
    *,
    count: int = 1024,
    dtype: int = F32,
    op: int = 0,
    root: int = -1,
    ret: int = 0,
    nranks: int = 2,
) -> None:
    """An NCCL call on COMM entered at ``ts``, returned 0.1 ms later with ``ret``."""
    ev.add(
        ts,
        pid,
        Kind.NCCL_ENTER,
        func,
        dur=pack(rank, nranks),
        ret=root,
        a0=COMM,
        a1=seq,
        a2=args(count, dtype, op),
        a3=STREAM,
    )
    ev.add(ts + MS // 10, pid, Kind.NCCL_RETURN, func, ret=ret)


def stream_sync(ev: Events, ts: int, pid: int, dur: int) -> None:
    ev.add(ts, pid, Kind.CUDA_SYNC, CudaFunc.cudaStreamSynchronize, a0=STREAM, dur=dur)


def two_ranks() -> Events:
    """Ranks 0 and 1 (pids 100, 101): init, then AllReduce (seq 1), AllGather (2) and Broadcast (3),
    each waited for by a stream synchronize that returns 5 ms after the call."""
    ev = Events()
    for rank in range(2):
        pid, t = 100 + rank, 1000 * MS + rank * MS // 2
        init_rank(ev, t, pid, rank)
        collective(ev, t + 10 * MS, pid, rank, NcclFunc.ncclAllReduce, 1, op=2)
        stream_sync(ev, t + 11 * MS, pid, 4 * MS)
        collective(ev, t + 20 * MS, pid, rank, NcclFunc.ncclAllGather, 2, count=256, dtype=F16)
        stream_sync(ev, t + 21 * MS, pid, 4 * MS)
        collective(ev, t + 30 * MS, pid, rank, NcclFunc.ncclBroadcast, 3, count=10, root=BCAST_ROOT)
        stream_sync(ev, t + 31 * MS, pid, 4 * MS)
    return ev


def by_rank(spans: list) -> dict[int, dict[str, object]]:
    """rank -> {span name: span} of the collectives."""
    out: dict[int, dict[str, object]] = {}
    for s in spans:
        if "nccl.op" in s.attributes:
            out.setdefault(s.attributes["nccl.rank"], {})[s.name] = s
    return out


def test_collectives_of_two_ranks_carry_op_size_sequence_and_communicator() -> None:
    c, spans = correlator({})
    c.on_events(two_ranks().array())
    ranks = by_rank(spans)
    assert set(ranks) == {0, 1}
    for rank, calls in ranks.items():
        assert set(calls) == {"ncclAllReduce", "ncclAllGather", "ncclBroadcast"}
        ar, ag, bc = calls["ncclAllReduce"], calls["ncclAllGather"], calls["ncclBroadcast"]
        common = {
            "nccl.comm.id": f"{COMM:016x}",
            "nccl.comm.source": "init",
            "nccl.rank": rank,
            "nccl.rank.source": "init",
            "nccl.nranks": 2,
            "nccl.completion": "observed",
            "nccl.completion.method": "stream_sync",
            "nccl.sync.function": "cudaStreamSynchronize",
            "cuda.stream": f"{STREAM:#x}",
            "nccl.result": "ncclSuccess",
        }
        for span, expected in (
            (
                ar,
                {
                    "nccl.op": "AllReduce",
                    "nccl.seq": 1,
                    "nccl.count": 1024,
                    "nccl.datatype": "float32",
                    "nccl.bytes": 4096,
                    "nccl.reduction": "max",
                },
            ),
            # all-gather counts every rank's part: 256 float16 x 2 ranks
            (
                ag,
                {
                    "nccl.op": "AllGather",
                    "nccl.seq": 2,
                    "nccl.count": 256,
                    "nccl.datatype": "float16",
                    "nccl.bytes": 1024,
                },
            ),
            (bc, {"nccl.op": "Broadcast", "nccl.seq": 3, "nccl.bytes": 40, "nccl.root": BCAST_ROOT}),
        ):
            expected = {**common, **expected}
            assert {k: span.attributes.get(k) for k in expected} == expected
            assert "nccl.reduction" not in span.attributes or span is ar
            # Entered -> the synchronize that observed it returned: 1 ms + 4 ms after the call.
            assert span.end_time - span.start_time == 5 * MS
            assert span.attributes["nccl.enqueue.duration"] == pytest.approx(0.1e-3)
            assert span.attributes["nccl.wait.duration"] == pytest.approx(4.9e-3)
            assert span.status.is_ok
        assert ag.attributes["nccl.phase.duration"] == pytest.approx(5e-3)  # since the AllReduce completed
    inits = [s for s in spans if s.name == "ncclCommInitRank"]
    assert sorted(s.attributes["nccl.rank"] for s in inits) == [0, 1]
    assert {s.attributes["nccl.comm.id"] for s in inits} == {f"{COMM:016x}"}


def test_collective_metrics_count_calls_and_bytes_per_operation() -> None:
    c, _ = correlator({})
    c.on_events(two_ranks().array())
    for resource, metrics in c.collect():
        named = {metric.name: metric for metric in metrics}
        calls = {p.attributes["nccl.op"]: p.value for p in named["nccl.collectives"].data.data_points}
        sizes = {p.attributes["nccl.op"]: p.value for p in named["nccl.bytes"].data.data_points}
        assert calls == {"AllReduce": 1, "AllGather": 1, "Broadcast": 1}, resource.attributes
        assert sizes == {"AllReduce": 4096, "AllGather": 1024, "Broadcast": 40}
        waits = {p.attributes["nccl.op"]: p.count for p in named["nccl.wait.duration"].data.data_points}
        assert waits == {"AllReduce": 1, "AllGather": 1, "Broadcast": 1}


def test_a_collective_that_returns_an_error_is_a_failed_span_and_counted() -> None:
    ev = Events()
    init_rank(ev, 1000 * MS, 100, 0)
    collective(ev, 1010 * MS, 100, 0, NcclFunc.ncclAllReduce, 1, ret=4)
    c, spans = correlator({})
    c.on_events(ev.array())
    [span] = [s for s in spans if s.name == "ncclAllReduce"]
    assert span.status.status_code.name == "ERROR"
    assert span.status.description == "ncclAllReduce returned ncclInvalidArgument (4)"
    assert span.attributes["nccl.completion"] == "failed"
    [(_, metrics)] = c.collect()
    [errors] = [metric for metric in metrics if metric.name == "nccl.errors"]
    assert [(dict(p.attributes), p.value) for p in errors.data.data_points] == [
        ({"nccl.function": "ncclAllReduce", "nccl.result": "ncclInvalidArgument"}, 1)
    ]


def test_send_and_recv_in_a_group_are_children_of_one_group_span() -> None:
    ev = Events()
    init_rank(ev, 1000 * MS, 100, 0)
    ev.add(1010 * MS, 100, Kind.NCCL_ENTER, NcclFunc.ncclGroupStart)
    ev.add(1010 * MS + 1000, 100, Kind.NCCL_RETURN, NcclFunc.ncclGroupStart)
    collective(ev, 1011 * MS, 100, 0, NcclFunc.ncclSend, 7, count=64, root=1)
    collective(ev, 1012 * MS, 100, 0, NcclFunc.ncclRecv, 7, count=64, root=1)
    ev.add(1013 * MS, 100, Kind.NCCL_ENTER, NcclFunc.ncclGroupEnd)
    ev.add(1014 * MS, 100, Kind.NCCL_RETURN, NcclFunc.ncclGroupEnd)
    stream_sync(ev, 1015 * MS, 100, 2 * MS)
    c, spans = correlator({})
    c.on_events(ev.array())
    [group] = [s for s in spans if s.name == "ncclGroup"]
    members = [s for s in spans if s.name in ("ncclSend", "ncclRecv")]
    assert sorted(s.name for s in members) == ["ncclRecv", "ncclSend"]
    assert all(s.parent.span_id == group.context.span_id for s in members)
    assert group.attributes["nccl.group.size"] == 2
    entered = {"ncclSend": 1011 * MS, "ncclRecv": 1012 * MS}
    for s in members:
        assert (s.attributes["nccl.peer"], s.attributes["nccl.bytes"], s.attributes["nccl.seq"]) == (1, 256, 7)
        # Enqueued when the group ended (1014 ms): that is when NCCL launched the work.
        assert s.attributes["nccl.enqueue.time_unix_nano"] - s.start_time == 1014 * MS - entered[s.name]
    assert group.end_time == max(s.end_time for s in members)
