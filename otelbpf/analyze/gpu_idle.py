"""How long did each GPU sit idle? The GPU's own account (the gpu receiver's NVML readings), told
before the diagnosis explains why.

Reads every ``hw.gpu.utilization`` point (``hw.gpu.task=general``) the file exporter wrote, per
device (``hw.id``). Each point is already the mean of the NVML samples taken in one metrics
interval (families/gpu/correlator.py), and the intervals are equal, so the run's mean utilization is
the mean of the points and the idle share is one minus it. A folder without the metric (no
driver, the receiver off) gives nothing, and the diagnosis goes on without it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TextIO

from otelbpf.analyze.summary import Json, _attrs, _num, _read

UTILIZATION = "hw.gpu.utilization"


@dataclass(frozen=True)
class GpuIdle:
    hw_id: str
    name: str  # "gpu0 NVIDIA H100 80GB HBM3"
    points: int  # metrics intervals measured
    seconds: float  # from the first point to the last
    mean_utilization: float

    @property
    def idle(self) -> float:
        return 1.0 - self.mean_utilization


def gpu_idle(directory: str, partial: list[str] | None = None) -> list[GpuIdle]:
    """Per GPU in ``directory``, in the order of their names. Raises ValueError on files that
    are not the agent's output, as the diagnosis does; ``partial``: see summary._read."""
    values: dict[str, list[tuple[int, float]]] = defaultdict(list)
    names: dict[str, str] = {}

    def add(req: Json) -> None:
        for rm in req.get("resourceMetrics", []):
            for sm in rm.get("scopeMetrics", []):
                for metric in sm.get("metrics", []):
                    if metric.get("name") != UTILIZATION or "gauge" not in metric:
                        continue
                    for dp in metric["gauge"].get("dataPoints", []):
                        a = _attrs(dp.get("attributes"))
                        if a.get("hw.gpu.task", "general") != "general" or "hw.id" not in a:
                            continue
                        hw_id = str(a["hw.id"])
                        values[hw_id].append((int(dp.get("timeUnixNano", 0)), float(_num(dp))))
                        names[hw_id] = " ".join(str(a[k]) for k in ("hw.name", "hw.model") if a.get(k)) or hw_id

    _read(directory, "metrics", add, partial)
    out = []
    for hw_id, points in values.items():
        times = [t for t, _v in points]
        mean = sum(v for _t, v in points) / len(points)
        out.append(GpuIdle(hw_id, names[hw_id], len(points), (max(times) - min(times)) / 1e9, mean))
    return sorted(out, key=lambda g: (g.name, g.hw_id))


def write_gpu_idle(idle: list[GpuIdle], out: TextIO) -> None:
    """The lines printed at the top of ``otelbpf diagnose``, one per GPU; nothing without NVML."""
    if not idle:
        return
    out.write("GPU idle time (NVML, 1 - mean utilization over the run):\n")
    for g in idle:
        out.write(
            f"  {g.name} ({g.hw_id}): idle {g.idle:.0%} of {g.seconds:.0f}s "
            f"(mean utilization {g.mean_utilization:.0%} over {g.points} metrics intervals)\n"
        )
    out.write("\n")
