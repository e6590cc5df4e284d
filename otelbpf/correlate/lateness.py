"""Why a rank entered a collective late: the decomposition behind every straggler class.

Between two collectives a rank's host does three things, and the time it enters the next one
is their sum:

    enter = previous completion + phase
    phase = GPU wait (host blocked in CUDA synchronize calls) + host time (everything else:
            launching work, Python, data loading, being off CPU)

so, comparing the late rank with the mean of the others,

    lateness = Δ previous completion + Δ GPU wait + Δ host time

and the largest of the three names the class, the way operators tell stragglers apart:

- **communication-slow**: its previous collective completed later than the others' (its
  part of the collective itself ran long);
- **compute-slow**: its compute phase waited longer on the GPU;
- **host-slow**: its host took longer to get the work enqueued (long gaps between launches,
  time off CPU).

Both the live finding (families/nccl/correlator.py, one host, one clock) and the offline report
(analyze/stragglers.py, clock offsets corrected first) use these functions.
"""

from __future__ import annotations

import numpy as np

COMPUTE_SLOW = "compute-slow"
HOST_SLOW = "host-slow"
COMMUNICATION_SLOW = "communication-slow"
UNKNOWN = "unknown"
#: Index order of ``classify``'s result.
CLASSES = (COMPUTE_SLOW, HOST_SLOW, COMMUNICATION_SLOW)


def components(
    enter: float, phase: float, gpu_wait: float, others_enter: float, others_phase: float, others_gpu_wait: float
) -> tuple[float, float, float]:
    """(compute, host, communication) shares of ``enter - others_enter``; ``others_*`` are the
    other ranks' means. Any unit, as long as it is the same for all."""
    previous = (enter - phase) - (others_enter - others_phase)
    compute = gpu_wait - others_gpu_wait
    host = (phase - gpu_wait) - (others_phase - others_gpu_wait)
    return compute, host, previous


def classify(compute: float, host: float, communication: float) -> str:
    """The class whose share of the lateness is largest; ``unknown`` when none is positive."""
    shares = (compute, host, communication)
    best = max(range(3), key=lambda i: shares[i])
    return CLASSES[best] if shares[best] > 0 else UNKNOWN


def classify_many(compute: np.ndarray, host: np.ndarray, communication: np.ndarray) -> np.ndarray:
    """``classify`` over arrays: an index into ``CLASSES``, -1 for unknown (NaN counts as 0)."""
    stacked = np.nan_to_num(np.stack([compute, host, communication]), nan=0.0)
    best = stacked.argmax(axis=0)
    return np.where(stacked.max(axis=0) > 0, best, -1)
