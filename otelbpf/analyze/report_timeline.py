"""The report's per-process timeline: one lane per kind of wait or work, from the spans in
the folder (off-CPU intervals of the sched receiver, CUDA API calls, synchronizes, copies,
NCCL collectives), laid on the process's own time axis.

Bounded: a lane keeps its ``MAX_PER_LANE`` longest spans (the ones that can be seen at the
page's scale); the page says, per lane, how many it holds of how many there were.
"""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from dataclasses import dataclass, field

from otelbpf.analyze.diagnose import _SYNCS
from otelbpf.analyze.summary import Json, ProcKey

MAX_PER_LANE = 2000
#: Lanes, top to bottom.
LANES = ("off-CPU", "CUDA API", "sync", "copies", "NCCL")
_SCOPES = {"otelbpf.sched": "off-CPU", "otelbpf.nccl": "NCCL"}


@dataclass
class Lane:
    name: str
    total: int = 0
    kept: list[tuple[int, int, int, str]] = field(default_factory=list)  # heap of (duration, seq, start, label)


class Timeline:
    """Span visitor: per process, lanes of (start, duration, label), the longest kept."""

    def __init__(self, max_per_lane: int | None = None) -> None:
        self.max_per_lane = max_per_lane or MAX_PER_LANE
        self._lanes: dict[int, dict[str, Lane]] = defaultdict(dict)
        self._seq = itertools.count()

    def span(self, key: ProcKey, scope: str | None, sp: Json, attrs: Json, duration_ns: int) -> None:
        which = self._lane(scope, str(sp.get("name", "")), attrs)
        if which is None:
            return
        name = str(sp.get("name", "?"))
        if which == "off-CPU":
            thread = attrs.get("thread.name") or attrs.get("thread.id", "?")
            name = f"{thread}: {attrs.get('otelbpf.sched.reason', '?')}"
        elif "cuda.kernel.name" in attrs:
            name = f"{name} {attrs['cuda.kernel.name']}"
        elif "cuda.memcpy.bytes" in attrs:
            name = f"{name} {attrs.get('cuda.memcpy.direction', '')} {attrs['cuda.memcpy.bytes']} B"
        lane = self._lanes[int(key[1] or 0)].setdefault(which, Lane(which))
        lane.total += 1
        item = (duration_ns, next(self._seq), int(sp["startTimeUnixNano"]), name)
        if len(lane.kept) < self.max_per_lane:
            heapq.heappush(lane.kept, item)
        elif item[0] > lane.kept[0][0]:
            heapq.heapreplace(lane.kept, item)

    @staticmethod
    def _lane(scope: str | None, name: str, attrs: Json) -> str | None:
        if scope in _SCOPES:
            return _SCOPES[scope]
        if scope != "otelbpf.cuda":
            return None
        if name in _SYNCS:
            return "sync"
        if "cuda.memcpy.bytes" in attrs:
            return "copies"
        return "CUDA API"

    def to_json(self, pid: int) -> Json | None:
        """{t0 (epoch ns), end (ms after t0), lanes: [{name, total, shown, spans: [[start ms, ms, label]]}]}."""
        lanes = self._lanes.get(pid)
        if not lanes:
            return None
        t0 = min(start for lane in lanes.values() for _d, _s, start, _n in lane.kept)
        out, end = [], 0.0
        for name in LANES:
            if name not in lanes:
                continue
            lane = lanes[name]
            spans = sorted(((start - t0) / 1e6, d / 1e6, label) for d, _s, start, label in lane.kept)
            end = max([end, *(s + d for s, d, _n in spans)])
            out.append(
                {
                    "name": name,
                    "total": lane.total,
                    "shown": len(spans),
                    "spans": [[round(s, 4), round(d, 4), n] for s, d, n in spans],
                }
            )
        return {"t0": t0, "end": round(end, 4), "lanes": out}
