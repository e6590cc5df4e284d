"""Clock offsets between hosts, measured from the collectives themselves.

Each host's agent stamps spans with its own clock, and clocks of different hosts disagree by
anything from microseconds (PTP) to seconds (no NTP). Comparing entry times across hosts
needs them on one clock. Nothing but the spans is needed: a collective is an exchange of
messages between every pair of ranks, which gives, as for NTP, an estimate and hard bounds.

For hosts R (the reference: the host of the lowest rank) and H, and δ = clock(H) - clock(R):

- **bounds** (causality): no rank observes a collective complete before every rank has
  entered it. For every collective both hosts observed, and ranks a on R, b on H:
  ``δ >= enter_b - completion_a`` and ``δ <= completion_b - enter_a``. The largest lower
  and the smallest upper bound over all collectives bracket δ; a straggler on either side
  makes one of them tight.
- **estimate**: a collective completes at (nearly) the same moment on every rank, so the
  median over collectives of (mean completion on H - mean completion on R) estimates δ. It
  is clamped into the bounds. This assumes each rank observes completion about equally
  soon after it happens (each synchronizes on the collective's stream after issuing it);
  a rank alone on its host whose every completion is observed late (communication-slow)
  is indistinguishable from a clock offset, as one-way delays are in NTP.

Hosts that share no collective with R are reached through hosts that do (offsets add up
along the way). Only collectives whose completion was observed are used.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Collectives used per estimate, at most (evenly spread over the run).
MAX_GROUPS = 4000


@dataclass
class HostOffset:
    host: str
    offset_ns: int  # subtract from this host's times to get the reference clock
    low_ns: int | None = None  # bounds on the offset (None: unbounded on that side)
    high_ns: int | None = None
    collectives: int = 0  # shared collectives the estimate used
    via: str = "reference"  # "reference", "direct", or the host it was reached through
    consistent: bool = True  # the bounds did not contradict each other


def estimate(
    hosts: list[str],
    host: np.ndarray,
    group: np.ndarray,
    enter: np.ndarray,
    completion: np.ndarray,
    observed: np.ndarray,
    reference: int,
) -> list[HostOffset]:
    """Offsets of every host relative to ``reference``, in the order of ``hosts`` (a host
    sharing no collective with any reached host is "unreachable", offset 0). Rows are
    collective spans: host index, collective (group) index, entry and completion times (ns)."""
    result = {reference: HostOffset(hosts[reference], 0)}
    if len(hosts) == 1:
        return [result[reference]]
    rows = observed
    groups, local = np.unique(group[rows], return_inverse=True)
    h = host[rows]
    spanning = np.zeros(len(groups), dtype=bool)
    first_host = np.full(len(groups), -1)
    np.maximum.at(first_host, local, h)
    np.logical_or.at(spanning, local, h != first_host[local])
    chosen = np.flatnonzero(spanning)
    if len(chosen) > MAX_GROUPS:
        chosen = chosen[np.linspace(0, len(chosen) - 1, MAX_GROUPS).astype(int)]
    slot = np.full(len(groups), -1)
    slot[chosen] = np.arange(len(chosen))
    keep = slot[local] >= 0
    g, hh = slot[local][keep], h[keep]
    e = enter[rows][keep].astype(np.float64)
    c = completion[rows][keep].astype(np.float64)
    shape = (len(chosen), len(hosts))
    total, count = np.zeros(shape), np.zeros(shape)
    min_c, max_e = np.full(shape, np.inf), np.full(shape, -np.inf)
    np.add.at(total, (g, hh), c)
    np.add.at(count, (g, hh), 1)
    np.minimum.at(min_c, (g, hh), c)
    np.maximum.at(max_e, (g, hh), e)
    with np.errstate(invalid="ignore"):
        mean_c = total / count

    def pair(a: int, b: int) -> HostOffset | None:
        both = (count[:, a] > 0) & (count[:, b] > 0)
        if not both.any():
            return None
        low = float(np.max(max_e[both, b] - min_c[both, a]))
        high = float(np.min(min_c[both, b] - max_e[both, a]))
        value = float(np.median(mean_c[both, b] - mean_c[both, a]))
        consistent = low <= high
        if consistent:
            value = min(max(value, low), high)
        return HostOffset(hosts[b], round(value), round(low), round(high), int(both.sum()), "direct", consistent)

    frontier = [reference]
    while frontier:
        nxt = []
        for known in frontier:
            for other in range(len(hosts)):
                if other in result:
                    continue
                found = pair(known, other)
                if found is None:
                    continue
                if known != reference:
                    base = result[known]
                    found.offset_ns += base.offset_ns
                    found.low_ns = _plus(found.low_ns, base.low_ns)
                    found.high_ns = _plus(found.high_ns, base.high_ns)
                    found.via = hosts[known]
                    found.consistent = found.consistent and base.consistent
                result[other] = found
                nxt.append(other)
        frontier = nxt
    return [result.get(i) or HostOffset(name, 0, via="unreachable") for i, name in enumerate(hosts)]


def _plus(a: int | None, b: int | None) -> int | None:
    """A bound through an intermediate host: unbounded when either leg is."""
    return None if a is None or b is None else a + b
