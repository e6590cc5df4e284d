"""Placing a late-attached communicator's collectives in rounds across ranks, from entry and
observed-completion times alone. The completion a rank reports is always an upper bound of the
real one (a query, a synchronize, or the compute stream's synchronize after a stream wait,
which may come long after): placement must stay sound under any lag, and give up, counted,
where the times fit more than one round. The correlator's side is in tests/families/nccl/test_nccl.py."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from otelbpf.families.nccl.late_comms import LateComm, LateComms, Round, Signature
from otelbpf.families.nccl.launch_env import Launch

MS = 1_000_000
SIGNATURE: Signature = (1, 1024, 7, 0, -1)  # AllReduce of 1024 float32, sum


@dataclass(eq=False)
class Call:
    """What late_comms reads and sets on a collective (the fields of nccl.py's ``_Call``)."""

    pid: int
    enter: int
    completed: int | None = None
    comm: int = 0
    seq: int = 0
    rank: int = -1
    nranks: int = -1
    rank_source: str = ""
    known: bool = False
    late: LateComm | None = None
    round: Round | None = None
    signature: Signature = ()


class Job:
    """``ranks`` processes (pid 100 + rank) of one torchrun job, one late communicator each."""

    def __init__(self, ranks: int = 3) -> None:
        self.late = LateComms("host")
        self.anomalies: Counter[str] = Counter()
        self.launches = {100 + r: Launch(r, ranks, "env:RANK", "torchelastic:j") for r in range(ranks)}

    def enter(self, rank: int, at_ms: float) -> Call:
        pid = 100 + rank
        call = Call(pid, int(at_ms * MS))
        self.late.identify(call, 0xC000 + rank, self.launches[pid], self.anomalies)
        self.late.enter(call, SIGNATURE, self.anomalies)
        return call

    def observed(self, call: Call, at_ms: float) -> list[Call]:
        call.completed = int(at_ms * MS)
        placed = self.late.completed(call, self.anomalies)
        mine = [c for c in placed if isinstance(c, Call)]
        assert len(mine) == len(placed), "LateComms hands back the calls it was given"
        return mine


def rounds(job: Job, rank_rounds: dict[int, list[tuple[float, float]]]) -> dict[int, list[Call]]:
    """Feeds each rank's (enter, observed) collectives in time order; rank -> its calls."""
    timeline = sorted(
        [(t, 0, r, i) for r, cs in rank_rounds.items() for i, (t, _) in enumerate(cs)]
        + [(done, 1, r, i) for r, cs in rank_rounds.items() for i, (_, done) in enumerate(cs)]
    )
    calls: dict[int, list[Call]] = {r: [] for r in rank_rounds}
    for t, what, r, i in timeline:
        if what == 0:
            calls[r].append(job.enter(r, t))
        else:
            job.observed(calls[r][i], t)
    return calls


def schedule(
    n: int, late_ms: float, lag_ms: dict[int, float], period_ms: float = 300, duration_ms: float = 200
) -> dict[int, list[tuple[float, float]]]:
    """Rank 1 enters every collective ``late_ms`` after ranks 0 and 2; it ends ``duration_ms``
    after the last entry; rank r observes that ``lag_ms[r]`` later."""
    out: dict[int, list[tuple[float, float]]] = {r: [] for r in range(3)}
    for k in range(n):
        t0 = 1000 + k * period_ms
        end = t0 + late_ms + duration_ms
        for r in range(3):
            out[r].append((t0 + (late_ms if r == 1 else 0), end + lag_ms[r]))
    return out


def test_prompt_completions_place_every_rank_in_the_same_rounds():
    """Event query or synchronize: each rank sees the end within a fraction of a millisecond."""
    job = Job()
    calls = rounds(job, schedule(6, 40, {0: 0.1, 1: 0.2, 2: 0.3}))
    for r in range(3):
        assert [c.seq for c in calls[r]] == [1, 2, 3, 4, 5, 6]
        assert all(c.known and c.round is not None for c in calls[r])
    assert {calls[r][0].comm for r in range(3)} == {calls[0][0].comm}
    assert not job.anomalies


def test_a_completion_observed_late_is_still_placed_while_no_later_round_was_entered():
    """Stream wait: rank 1 learns of each end 50 ms late (its compute after the wait), still
    before the others enter the next collective (60 ms after the end): one round fits."""
    job = Job()
    calls = rounds(job, schedule(6, 40, {0: 1, 1: 50, 2: 1}))
    assert [c.seq for c in calls[1]] == [1, 2, 3, 4, 5, 6]
    assert not job.anomalies


def test_a_completion_observed_after_the_others_entered_the_next_round_fits_two_and_is_not_placed():
    """Rank 1 learns of each end 100 ms late, after ranks 0 and 2 entered the next collective
    (300 ms on): entering 40 ms late into round k, or 260 ms early into round k+1, explains its
    times alike. Each is left unplaced and counted, never guessed; the last one, with no round
    after it, fits one round and is placed there."""
    job = Job()
    calls = rounds(job, schedule(6, 40, {0: 1, 1: 100, 2: 1}))
    assert [c.seq for c in calls[1]] == [0, 0, 0, 0, 0, 6]
    assert [c.round is None for c in calls[1]] == [True] * 5 + [False]
    assert job.anomalies == Counter({"late_comm_ambiguous": 5})
    for r in (0, 2):
        assert [c.seq for c in calls[r]] == [1, 2, 3, 4, 5, 6]


def test_a_round_some_rank_saw_complete_before_this_rank_entered_is_not_its_round():
    """Rank 0 attached late: its first collective enters after ranks 1 and 2 saw round 1 end,
    so round 1 cannot be its (whatever its own completion's lag), and round 2 is."""
    job = Job()
    early = {r: [job.enter(r, 1000)] for r in (1, 2)}
    for r in (1, 2):
        job.observed(early[r][0], 1200)
    later = {r: job.enter(r, 1300) for r in (1, 2)}
    first = job.enter(0, 1300)
    for r in (1, 2):
        job.observed(later[r], 1500)
    assert job.observed(first, 1700) == [first]  # 200 ms late: still fits round 2 only
    assert (first.seq, later[1].seq, early[1][0].seq) == (2, 2, 1)
    assert not job.anomalies
