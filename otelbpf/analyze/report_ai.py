"""The report's AI flame graph: CUDA API calls and kernels on top of the code that made them,
one graph per process with a switch between weights. What each weight rests on differs, and
the page says so in its legend (``Weight.rests_on``):

- ``launches``, ``copied``, ``sync``: the CUDA spans (sampled launches scaled by
  ``otelbpf.sample_every``; copies with their bytes; synchronize calls and blocking copies
  with the time they waited). CUDA spans carry no user stack, so the frames under the CUDA
  call are its span ancestry (the thread, the request it served, the torch operators around
  it: ``parentSpanId``), not Python lines. Spans are budgeted and short calls are not
  spans, so these graphs hold part of what the metrics counted (``Weight.counted``).
- ``copied``, ``sync``, ``launches`` from the profiling receiver's ``cuda_calls`` profiles, when
  the folder has them (``cuda_memory: true``, the default): every copy and synchronize on the
  merged Python + native stack that called it, weighted by the bytes it copied or the time the
  thread spent in it; one launch in ``launch_stack_every`` (64) per kernel on the stack that
  launched it, the kernel on top, counted that many times. These replace the span-based graphs
  of the same weight: they hold every call (launches: scaled samples of them), not the spans'
  budgeted part, and the code under it, not the span ancestry.
- ``allocated``: the profiling receiver's ``cuda_memory`` profiles: bytes allocated by
  each merged Python + native stack, with the allocating CUDA function as its leaf.
- ``cpu_in_cuda``: the CPU profiles' samples that were inside a CUDA, cuBLAS, cuDNN or NCCL
  API function: host CPU time spent launching, copying or spinning in a synchronize, on the
  full Python + native stack (time blocked off the CPU is not sampled).
"""

from __future__ import annotations

import glob
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field

from otelbpf.analyze.diagnose import _SYNCS
from otelbpf.analyze.report_tree import Node, read_profile
from otelbpf.analyze.summary import Json, ProcKey

#: A frame inside a GPU library's API (CPU samples whose stack holds one are kept).
CUDA_API = re.compile(r"^(cuda|cu[A-Z]|nccl|cublas|cudnn)\w*$")
PROFILE_NAME = re.compile(r"^(?P<service>.+)-(?P<pid>\d+)-(?P<kind>[a-z_]+)-(?P<ms>\d+)\.pb\.gz$")
#: Span ancestry walked at most this deep (a parent missing from the folder ends it).
MAX_ANCESTRY = 32
_CUDA, _SCHED = "otelbpf.cuda", "otelbpf.sched"

#: key -> (label, pprof-style unit, what it rests on); the switch's order.
WEIGHTS = {
    "launches": (
        "kernel launches",
        "launches/count",
        "CUDA launch spans (sampled ones scaled by their sample_every); frames under the CUDA call are "
        "the span's ancestry (thread, request, torch operators), not a Python stack: CUDA spans carry none",
    ),
    "copied": (
        "bytes copied",
        "copied/bytes",
        "cudaMemcpy* spans and their bytes, by direction and host memory; frames: the span's ancestry",
    ),
    "sync": (
        "time waiting for the GPU",
        "sync/nanoseconds",
        "synchronize calls and blocking (not async) copies: the time each waited; frames: the span's ancestry",
    ),
    "calls_launches": (
        "kernel launches",
        "launches/count",
        "one launch in launch_stack_every (64) per kernel, counted that many times, on the merged Python + native "
        "stack that launched it, the kernel on top (the profiling receiver's cuda_calls profiles)",
    ),
    "calls_copied": (
        "bytes copied",
        "copied/bytes",
        "every cudaMemcpy* call's bytes on the merged Python + native stack that called it (the profiling "
        "receiver's cuda_calls profiles)",
    ),
    "calls_sync": (
        "time waiting for the GPU",
        "sync/nanoseconds",
        "every synchronize and copy on the merged Python + native stack that called it, weighted by the time the "
        "thread spent in it (the profiling receiver's cuda_calls profiles; async copies return at once)",
    ),
    "allocated": (
        "bytes allocated",
        "allocated/bytes",
        "the profiling receiver's CUDA memory profiles: merged Python + native stacks, the allocating CUDA "
        "function on top",
    ),
    "cpu_in_cuda": (
        "CPU time in CUDA calls",
        "cpu/nanoseconds",
        "CPU profile samples inside a CUDA/cuBLAS/cuDNN/NCCL API function, on their merged Python + "
        "native stacks (time blocked off the CPU is not sampled)",
    ),
}


@dataclass
class Weight:
    key: str
    root: Node = field(default_factory=lambda: Node("all"))
    counted: float | None = None  # the same quantity as the metrics counted it (spans are a subset)
    comparable: int = 0  # the part of root.value the metrics count too (sync: not blocking copies)

    @property
    def label(self) -> str:
        return WEIGHTS[self.key][0]

    @property
    def unit(self) -> str:
        return WEIGHTS[self.key][1]

    @property
    def rests_on(self) -> str:
        return WEIGHTS[self.key][2]


class AiSpans:
    """Visits every span of the folder once; CUDA spans become (ancestry + CUDA frames, weight),
    resolved at the end since a parent may come after its child in the file."""

    def __init__(self) -> None:
        self._parents: dict[str, tuple[str, str]] = {}  # span id -> (name, parent span id)
        #: (pid, weight, thread frame or "", parent span id, frames above the ancestry, whether the metrics
        #: count it too) -> value: calls of one parent with the same frames summed as they come
        self._pending: dict[tuple[int, str, str, str, tuple[str, ...], bool], int] = defaultdict(int)

    def span(self, key: ProcKey, scope: str | None, sp: Json, attrs: Json, duration_ns: int) -> None:
        if scope == _SCHED:
            return
        if scope != _CUDA:
            self._parents[sp.get("spanId", "")] = (str(sp.get("name", "?")), sp.get("parentSpanId", ""))
            return
        pid, name, parent = int(key[1] or 0), str(sp.get("name", "?")), sp.get("parentSpanId", "")
        thread = attrs.get("thread.name") or attrs.get("thread.id")
        head = f"thread {thread}" if thread is not None else ""
        if "cuda.kernel.name" in attrs or "cuda.graph.exec" in attrs:
            kernel = attrs.get("cuda.kernel.name") or f"graph {attrs.get('cuda.graph.exec')}"
            self._pending[pid, "launches", head, parent, (name, str(kernel)), True] += int(
                attrs.get("otelbpf.sample_every", 1) or 1
            )
        elif "cuda.memcpy.bytes" in attrs:
            where = " ".join(
                str(x) for x in (attrs.get("cuda.memcpy.direction"), attrs.get("cuda.memcpy.host_memory")) if x
            )
            frames = (name, where or "?")
            self._pending[pid, "copied", head, parent, frames, True] += int(attrs["cuda.memcpy.bytes"])
            if not attrs.get("cuda.memcpy.async"):
                self._pending[pid, "sync", head, parent, frames, False] += duration_ns  # no metric times these
        elif name in _SYNCS:
            self._pending[pid, "sync", head, parent, (name,), True] += duration_ns

    def _ancestry(self, parent: str) -> list[str]:
        names: list[str] = []
        while parent and parent in self._parents and len(names) < MAX_ANCESTRY:
            name, parent = self._parents[parent]
            names.append(name)
        return names[::-1]

    def weights(self) -> dict[int, dict[str, Weight]]:
        out: dict[int, dict[str, Weight]] = defaultdict(dict)
        for (pid, key, head, parent, top, comparable), value in self._pending.items():
            w = out[pid].setdefault(key, Weight(key))
            w.root.add([*([head] if head else []), *self._ancestry(parent), *top], value)
            w.comparable += value if comparable else 0
        return out


def from_profiles(directory: str) -> dict[int, dict[str, Weight]]:
    """``allocated`` and ``cpu_in_cuda`` per process from the pprof files (a file that cannot be
    read is left out here: the CPU flame graphs already name it as a problem)."""
    out: dict[int, dict[str, Weight]] = defaultdict(dict)
    for path in sorted(glob.glob(os.path.join(directory, "profiles", "*.pb.gz"))):
        m = PROFILE_NAME.match(os.path.basename(path))
        if not m or m["kind"] not in ("cpu", "cuda_memory", "cuda_calls"):
            continue
        pid = int(m["pid"])
        if m["kind"] == "cuda_calls":
            _calls(path, out[pid])
            continue
        try:
            unit, samples = read_profile(path, prefer="alloc_space" if m["kind"] == "cuda_memory" else "cpu")
        except Exception:  # noqa: BLE001 - reported by the CPU flame graphs' reader
            continue
        if m["kind"] == "cuda_memory":
            if unit != "alloc_space/bytes":
                continue
            w = out[pid].setdefault("allocated", Weight("allocated"))
            for frames, value in samples:
                w.root.add(frames, value)
        else:
            w = out[pid].setdefault("cpu_in_cuda", Weight("cpu_in_cuda"))
            for frames, value in samples:
                if any(CUDA_API.match(f) for f in frames):
                    w.root.add(frames, value)
    return {pid: {k: w for k, w in ws.items() if w.root.value > 0} for pid, ws in out.items()}


#: A weight from the cuda_calls profiles -> the span-based weight it replaces.
REPLACES = {"calls_copied": "copied", "calls_sync": "sync", "calls_launches": "launches"}


def _calls(path: str, into: dict[str, Weight]) -> None:
    """A cuda_calls profile's bytes copied, time in calls and launches, added to ``into``'s
    ``calls_copied``, ``calls_sync`` and ``calls_launches`` (frames root first: the CUDA function,
    or a launch's kernel, is the last). A profile written before launches had stacks has no
    ``cuda_launches``: its launches keep the span-based graph."""
    for key, sample_type in (
        ("calls_copied", "cuda_copy"),
        ("calls_sync", "cuda_wait"),
        ("calls_launches", "cuda_launches"),
    ):
        try:
            unit, samples = read_profile(path, prefer=sample_type)
        except Exception:  # noqa: BLE001 - reported by the CPU flame graphs' reader
            return
        if not unit.startswith(sample_type + "/"):
            continue
        w = into.setdefault(key, Weight(key))
        for frames, value in samples:
            if value:
                w.root.add(frames, value)
                # what cuda.sync.duration counts too: the synchronize calls, not the copies' time
                w.comparable += value if key != "calls_sync" or (frames and frames[-1] in _SYNCS) else 0


def merge(*parts: dict[int, dict[str, Weight]]) -> dict[int, list[Weight]]:
    """Per process, its weights in the switch's order (those with no data left out; a span-based
    weight left out where the cuda_calls profiles give the same with the code under it)."""
    by_pid: dict[int, dict[str, Weight]] = defaultdict(dict)
    for part in parts:
        for pid, ws in part.items():
            by_pid[pid].update(ws)
    for ws in by_pid.values():
        for key, replaced in REPLACES.items():
            if key in ws:
                ws.pop(replaced, None)
    order = list(WEIGHTS)
    return {pid: sorted(ws.values(), key=lambda w: order.index(w.key)) for pid, ws in by_pid.items() if ws}
