"""The adaptive straggler test (correlate/adaptive.py) on synthetic entry times whose answer is known."""

from __future__ import annotations

import random

import pytest

from otelbpf.correlate.adaptive import CommDetector, Params

MS = 1_000_000


def run(
    n_ranks: int,
    collectives: int,
    late_rank: int | None,
    late_ms: float,
    jitter_ms: float,
    duration_ms: float = 200,
    seed: int = 1,
) -> dict[int, int]:
    """Findings (late and persistent) per rank; every rank enters near t, the late one late_ms later."""
    rnd = random.Random(seed)
    det = CommDetector()
    found = {r: 0 for r in range(n_ranks)}
    t = 0.0
    for _ in range(collectives):
        entries = {
            r: t + rnd.uniform(0, jitter_ms) * MS + (late_ms * MS if r == late_rank else 0) for r in range(n_ranks)
        }
        for v in det.add(entries):
            found[v.member] += v.persistent
        det.note_duration(duration_ms * MS)
        t += (duration_ms + 300) * MS
    return found


@pytest.mark.parametrize("n_ranks", [2, 3, 4, 8])
def test_a_40ms_straggler_on_200ms_collectives_is_found(n_ranks):
    found = run(n_ranks, 30, late_rank=1, late_ms=40, jitter_ms=2)
    assert found[1] >= 30 - Params().min_collectives
    assert all(n == 0 for r, n in found.items() if r != 1)


@pytest.mark.parametrize("n_ranks", [2, 4, 8])
@pytest.mark.parametrize("seed", range(5))
def test_jitter_on_a_healthy_job_is_not_a_straggler(n_ranks, seed):
    assert sum(run(n_ranks, 200, late_rank=None, late_ms=0, jitter_ms=30, seed=seed).values()) == 0


def test_the_minimum_scales_with_the_collective_duration():
    """5 ms late is a straggler on 10 ms collectives, not on 2 s ones (no jitter either way)."""
    assert run(4, 30, late_rank=2, late_ms=5, jitter_ms=0.1, duration_ms=10)[2] > 20
    assert run(4, 30, late_rank=2, late_ms=5, jitter_ms=0.1, duration_ms=2000)[2] == 0


def test_a_single_late_collective_is_not_persistent():
    det = CommDetector()
    verdicts = []
    for k in range(20):
        late = 100 * MS if k == 10 else 0
        verdicts += det.add({0: k * 1e9, 1: k * 1e9 + 0.1 * MS, 2: k * 1e9 + late})
    assert any(v.late for v in verdicts) and not any(v.persistent for v in verdicts)


def test_fewer_than_two_ranks_gives_no_verdict():
    assert CommDetector().add({0: 1.0}) == []
