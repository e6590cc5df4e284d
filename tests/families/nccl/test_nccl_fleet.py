"""The per-rank signal a backend compares across nodes (``nccl.collective.wait``), the
communicator id that is the same on every host, live detection when nothing synchronizes (a
library that returns at completion), and the bad input that must not make a straggler:
synthetic events through the NCCL correlator. The rules that read the signal are tested in
tests/deploy/test_prometheus_rules.py; the real agent in tests/test_nccl_agent.py."""

from __future__ import annotations

import numpy as np
from test_nccl import ar_spans, findings, late_job

from harness.nccl_events import MS, blocking_job, correlator, expire, feed, slowest, torchrun, waits
from otelbpf.base.events import Kind
from otelbpf.families.nccl.correlator import COLLECTIVE_WAIT_BOUNDS, NcclCorrelator
from otelbpf.families.nccl.launch_env import Launch


def anomalies(c: NcclCorrelator) -> dict[str, int]:
    return {
        str(dp.attributes["reason"]): int(dp.value)
        for _, ms in c.collect()
        for m in ms
        if m.name == "otelbpf.nccl.anomalies"
        for dp in m.data.data_points
    }


# ---- the signal


def test_the_rank_the_others_wait_for_waits_least_whatever_observes_completion() -> None:
    """Synchronized (event query) and never synchronized (returns at completion): the late rank's
    mean wait is the transfer, the others' the lateness more; labelled for a rule."""
    for ev, timeout in ((late_job(12, 40, how="query"), 30_000 * MS), (blocking_job(12, 40), 500 * MS)):
        c, _ = correlator({100 + r: torchrun(r) for r in range(4)}, completion_timeout_ns=timeout)
        feed(c, ev)
        expire(c)
        w = waits(c)
        assert {r for _, r in w} == {0, 1, 2, 3} and len({comm for comm, _ in w}) == 1
        means = {r: total / n for (_, r), (n, total) in w.items()}
        assert means[2] < min(v for r, v in means.items() if r != 2) - 0.035
        assert slowest(w) == {(next(iter(w))[0], 2)}
    points = [dp for _, ms in c.collect() for m in ms if m.name == "nccl.collective.wait" for dp in m.data.data_points]
    attrs = dict(points[0].attributes)
    assert set(attrs) == {"nccl.comm.id", "nccl.rank", "nccl.job.id", "host.name"}
    assert attrs["nccl.job.id"] == "torchelastic:a"
    assert list(points[0].explicit_bounds) == list(COLLECTIVE_WAIT_BOUNDS)


def test_the_phase_before_each_collective_is_split_into_gpu_wait_and_host_time() -> None:
    ev = blocking_job(6, 40)
    c, _ = correlator({100 + r: torchrun(r) for r in range(4)}, completion_timeout_ns=500 * MS)
    feed(c, ev)
    expire(c)
    parts = {
        (int(dp.attributes["nccl.rank"]), str(dp.attributes["nccl.phase.part"])): dp.value
        for _, ms in c.collect()
        for m in ms
        if m.name == "nccl.collective.phase"
        for dp in m.data.data_points
    }
    assert parts[(0, "gpu_wait")] == 0
    # rank 2 enters 40 ms after the others' return: 40 ms more host time before each of 5 collectives
    assert abs(parts[(2, "host")] - parts[(0, "host")] - 5 * 0.04) < 1e-3


def test_a_communicator_created_before_the_probes_has_the_same_id_on_every_host() -> None:
    """Two agents, each seeing half the ranks of one torchrun job (two nodes): the same
    nccl.comm.id, and the signal names the late rank on the other node; a job known only by
    its parent process keeps ids that include the host."""
    ids, signal = [], {}
    for host, ranks in (("node-a", range(0, 2)), ("node-b", range(2, 4))):
        c, spans = correlator({100 + r: torchrun(r) for r in ranks}, host=host, completion_timeout_ns=500 * MS)
        feed(c, blocking_job(12, 40, ranks=ranks))
        expire(c)
        ids.append({s.attributes["nccl.comm.id"] for s in ar_spans(spans)})
        signal.update(waits(c))
        assert not findings(spans) or host == "node-b"
    assert ids[0] == ids[1] and len(ids[0]) == 1
    assert slowest(signal) == {(next(iter(ids[0])), 2)}
    local = []
    for host in ("node-a", "node-b"):
        c, spans = correlator({100: Launch(0, 2, "env:RANK", "parent:1")}, host=host)
        c.on_events(late_job(2, 0, ranks=1).array())
        local.append({s.attributes["nccl.comm.id"] for s in ar_spans(spans)})
    assert local[0] != local[1]


# ---- live, with no synchronize


def test_a_library_that_returns_at_completion_gets_its_straggler_named_live() -> None:
    """Ranks from the environment, no init, no synchronize: the returns place the collectives,
    and rank 2, 40 ms late on every collective, is named; the others are not."""
    ev = blocking_job(24, 40, jitter=lambda k, r: (k * 7 + r * 3) % 5 * MS)
    c, spans = correlator({100 + r: torchrun(r) for r in range(4)}, completion_timeout_ns=500 * MS)
    feed(c, ev)
    expire(c)
    found = findings(spans)
    assert found and {pid for pid, _ in found} == {102}
    assert len(found) >= 24 - 8
    assert all(0.035 < f["nccl.straggler.lateness"] < 0.045 for _, f in found)
    assert {s.attributes["nccl.comm.source"] for s in ar_spans(spans)} == {"aligned"}


def test_a_healthy_job_that_returns_at_completion_has_no_straggler() -> None:
    rnd = np.random.default_rng(5)
    table = rnd.uniform(0, 20 * MS, size=(40, 4))
    ev = blocking_job(40, 0, jitter=lambda k, r: float(table[k, r]))
    c, spans = correlator({100 + r: torchrun(r) for r in range(4)}, completion_timeout_ns=500 * MS)
    feed(c, ev)
    expire(c)
    assert len(ar_spans(spans)) == 160 and not findings(spans)
    assert not slowest(waits(c))


# ---- bad input


def test_a_rank_that_dies_mid_job_makes_no_straggler_and_its_collective_no_sample() -> None:
    ev = blocking_job(16, 0, stop={1: 8})
    c, spans = correlator({100 + r: torchrun(r) for r in range(4)}, completion_timeout_ns=500 * MS)
    feed(c, ev)
    expire(c)
    assert not findings(spans)
    w = waits(c)
    # its collectives pending at its exit give no sample: their completion is not known
    assert 0 < w[(next(iter(w))[0], 1)][0] <= 8
    assert not slowest(w)
    assert {s.attributes["nccl.completion"] for s in ar_spans(spans, 101)} == {"unobserved", "process_exited"}


def test_a_rank_restarted_under_a_new_pid_makes_no_straggler() -> None:
    """Elastic restart: rank 1 exits after collective 7 and comes back as pid 201, same job."""
    ev = blocking_job(20, 0, pid_of=lambda k, r: 201 if r == 1 and k >= 8 else 100 + r)
    ev.add((1000 + 7 * 300 + 100) * MS, 101, Kind.PROC_EXIT, 0)
    launches = {100 + r: torchrun(r) for r in range(4)} | {201: torchrun(1)}
    c, spans = correlator(launches, completion_timeout_ns=500 * MS)
    feed(c, ev)
    expire(c)
    assert not findings(spans)
    assert len({s.attributes["nccl.comm.id"] for s in ar_spans(spans)}) == 1
    assert not slowest(waits(c))
    counted = anomalies(c)
    assert "duplicate_rank" not in counted and counted["rank_restarted"] == 1


def test_two_jobs_on_one_node_are_compared_apart() -> None:
    a = blocking_job(16, 40)
    b = blocking_job(16, 0, pid_of=lambda k, r: 200 + r)
    a.rows += b.rows
    launches = {100 + r: torchrun(r, job="torchelastic:a") for r in range(4)}
    launches |= {200 + r: torchrun(r, job="torchelastic:b") for r in range(4)}
    c, spans = correlator(launches, completion_timeout_ns=500 * MS)
    feed(c, a)
    expire(c)
    assert {pid for pid, _ in findings(spans)} == {102}
    w = waits(c)
    assert len({comm for comm, _ in w}) == 2
    assert {r for _, r in slowest(w)} == {2}


def test_ranks_that_disagree_on_the_world_size_are_never_compared() -> None:
    """Rank 3 says WORLD_SIZE=8: another communicator, alone in it; the slow one (rank 3) is
    named by nobody, and the three that agree are healthy."""
    launches = {100 + r: torchrun(r) for r in range(3)} | {103: Launch(3, 8, "env:RANK", "torchelastic:a")}
    c, spans = correlator(launches, completion_timeout_ns=500 * MS)
    feed(c, blocking_job(16, 40, slow=3))
    expire(c)
    assert not findings(spans)
    w = waits(c)
    assert len({comm for comm, _ in w}) == 2
    assert not slowest(w)
    assert anomalies(c)["world_size_disagrees"] == 1


def test_a_communicator_used_by_one_rank_only_names_nobody() -> None:
    c, spans = correlator({100: torchrun(0, world=1)}, completion_timeout_ns=500 * MS)
    feed(c, blocking_job(10, 0, ranks=range(1), world=1, slow=-1))
    expire(c)
    assert not findings(spans) and not slowest(waits(c))
    assert len(waits(c)) == 1
