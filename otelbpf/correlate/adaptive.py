"""The adaptive straggler test: is a rank late on a collective, and persistently so?

A fixed threshold is wrong both ways: 50 ms misses a rank 40 ms late on every 200 ms
collective, and anything small flags the noise of a jittery healthy job. So, per
communicator, on each collective that at least two ranks entered:

1. **deviation**: each rank's entry minus the median entry of the other ranks (a single
   late rank cannot move that median much);
2. **spread**: the robust standard deviation (1.4826 x MAD) of the *other* ranks'
   deviations over the last ``window`` collectives: how much ranks wander on this
   communicator when they are not the one being judged (with more than ``POOL_ABOVE``
   ranks, all ranks' deviations, which then differ by little and cost far less);
3. **late**: deviation > max(``spread_k`` x spread, ``duration_fraction`` x the
   communicator's typical collective duration (median over the window of completion
   minus the last entry), ``floor_ns``): the minimum scales with the collective's own
   duration, and the floor only keeps timer noise out;
4. **persistent**: late in at least ``share`` of the last ``window`` collectives the rank
   took part in, and compared on at least ``min_collectives`` of them.

Under no straggler, ranks are exchangeable: each is beyond the median of the others half
the time at most, and beyond a multiple of their spread far less, so ``share`` = 0.6 of a
window is not reached by jitter. A straggler is late every time, by much more than the
others wander.

Both the live correlator (families/nccl/correlator.py, one ``CommDetector`` per communicator) and the
offline report (analyze/stragglers.py) run this code, so they agree.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

#: MAD -> standard deviation for normally distributed noise.
MAD_SCALE = 1.4826
#: Above this many ranks in a collective, the spread pools every rank's deviations.
POOL_ABOVE = 16


@dataclass(frozen=True)
class Params:
    window: int = 20
    min_collectives: int = 5
    share: float = 0.6
    spread_k: float = 3.0
    duration_fraction: float = 0.1
    floor_ns: int = 1_000_000


#: What names a rank: (pid, rank) in the agent, a rank's row in the offline report.
M = TypeVar("M", bound=Hashable)


@dataclass(frozen=True)
class Verdict(Generic[M]):
    member: M
    deviation_ns: float  # entry minus the median entry of the others
    threshold_ns: float  # what late means on this collective
    spread_ns: float  # the others' robust spread over the window
    late: bool
    persistent: bool  # late now and in >= share of its window
    late_in_window: int
    window: int  # collectives of this rank in the window


class CommDetector(Generic[M]):
    """The test for one communicator; feed it its collectives in order."""

    def __init__(self, params: Params = Params()) -> None:
        self.params = params
        self._deviations: deque[dict[M, float]] = deque(maxlen=params.window)
        self._durations: deque[float] = deque(maxlen=params.window)
        self._late: dict[M, deque[bool]] = {}

    def note_duration(self, duration_ns: float) -> None:
        """A collective's own duration: its completion minus the last rank's entry."""
        if duration_ns >= 0:
            self._durations.append(float(duration_ns))

    def forget(self, member: M) -> None:
        """A rank left (its process exited): its history goes with it."""
        self._late.pop(member, None)

    def add(self, entries: Mapping[M, float]) -> list[Verdict[M]]:
        """Verdicts for every rank of one collective (entry times, one clock); none for fewer
        than two ranks."""
        if len(entries) < 2:
            return []
        members = list(entries)
        times = np.array([entries[m] for m in members], dtype=np.float64)
        deviation = {m: float(times[i] - np.median(np.delete(times, i))) for i, m in enumerate(members)}
        self._deviations.append(deviation)
        p = self.params
        duration_min = p.duration_fraction * float(np.median(self._durations)) if self._durations else 0.0
        pooled = len(members) > POOL_ABOVE
        if pooled:
            everyone = np.array([v for d in self._deviations for v in d.values()])
            common = _spread(everyone)
        out: list[Verdict[M]] = []
        for m in members:
            if pooled:
                spread = common
            else:
                spread = _spread(np.array([v for d in self._deviations for k, v in d.items() if k != m]))
            threshold = max(p.spread_k * spread, duration_min, float(p.floor_ns))
            late = deviation[m] > threshold
            history = self._late.setdefault(m, deque(maxlen=p.window))
            history.append(late)
            n_late = sum(history)
            persistent = late and len(history) >= p.min_collectives and n_late >= p.share * len(history)
            out.append(Verdict(m, deviation[m], threshold, spread, late, persistent, n_late, len(history)))
        return out


def _spread(values: np.ndarray) -> float:
    if len(values) < 2:
        return 0.0
    return MAD_SCALE * float(np.median(np.abs(values - np.median(values))))
