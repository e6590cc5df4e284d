"""Why is the GPU idle? Causes seen from the host, ranked by the time they cost.

Reads what the agent wrote (the file exporter's OTLP-JSON lines: CUDA spans and
metrics per process) and names the causes of GPU idle time that the CUDA API
shows, each with its evidence (counts, bytes, seconds, the span ids that show
it) and the usual fix:

- ``pageable_copies``: host<->device copies from pageable memory: staged through a
  bounce buffer, slower, and synchronous even when asked to be async;
- ``sync_storm``: frequent synchronizes; each drains the GPU's queue, and the GPU
  then waits for the host to launch the next work;
- ``blocking_reads``: small blocking device-to-host copies (``loss.item()``,
  ``.cpu()``, printing a tensor): a synchronize in disguise;
- ``memory_churn``: device allocations and frees over and over, often of the same
  sizes (allocator cache misses, ``empty_cache``); ``cudaFree`` synchronizes;
- ``launch_bound``: launches so frequent and syncs so short that the GPU finishes
  each kernel before the next arrives (tiny kernels);
- ``cuda_errors``: most CUDA calls fail (no driver, wrong device): nothing runs at all;
- ``input_starvation``: the thread that launches GPU work is off the CPU waiting for
  another thread or process (a futex: a lock or a queue; a pipe; a socket; a poll)
  outside any CUDA call: the GPU's next work is not ready (a slow data loader);
- ``host_contention``: the launching thread is runnable but waits for a CPU (run-queue
  latency, sched_wakeup or preemption -> sched_switch): other work shares its cores;
- ``blocking_io``: the launching thread is blocked in file-system or block I/O
  (``torch.save``, ``fsync``, synchronous logging), with the kernel stacks.

The last three need the ``sched`` receiver's ``off_cpu`` spans (long off-CPU intervals
of every traced thread, with the reason and the kernel stack), joined here with the
CUDA spans by thread id.

The costs are host-side estimates, documented per cause (``COSTS``): what the GPU
could have been doing while the host did this. Without a GPU's own account (NVML)
they say *why*, not *how long the GPU was idle in total*.
"""

from __future__ import annotations

import json
import statistics
import sys
from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

from otelbpf.analyze.gpu_idle import gpu_idle, write_gpu_idle
from otelbpf.analyze.summary import (
    Json,
    Latest,
    ProcKey,
    SeriesKey,
    _num,
    load_metrics,
    process_label,
    read_spans,
)

#: One process's latest metric points, read only: an entry of summary.load_metrics' answer, or the live
#: view's (whose kind may be missing).
Points = Mapping[SeriesKey, tuple[int, Json, str | None]]
#: _process_findings' ``add``: (cause, cost s, summary, evidence) -> kept if it weighs enough.
AddFinding = Callable[[str, float, str, dict[str, Any]], None]

#: How each cause's cost is estimated (printed with --explain, and in docs).
COSTS = {
    "cuda_errors": "the process's whole traced window: its CUDA calls fail, so no GPU work runs",
    "pageable_copies": "time the host spent in copies from or to pageable memory",
    "sync_storm": "for each synchronize, the gap until the host issued its next CUDA call (the GPU's queue was empty)",
    "blocking_reads": "time in blocking device-to-host copies of at most 64 KiB (each waits for the GPU to drain)",
    "memory_churn": "time in device allocation and free calls",
    "launch_bound": "launches x 5 us, a typical host cost of one launch, when the GPU keeps up with the host",
    "input_starvation": "time the launching thread waited on a futex, pipe, socket or poll outside CUDA calls (off-CPU "
    "intervals above the sched receiver's span threshold: a lower bound)",
    "host_contention": "time the launching thread was runnable but waited for a CPU (run-queue parts of its off-CPU "
    "intervals above the span threshold: a lower bound)",
    "blocking_io": "time the launching thread was blocked in file-system or block I/O outside CUDA calls",
}

FIXES = {
    "cuda_errors": "Check the driver and the device the process sees (nvidia-smi, CUDA_VISIBLE_DEVICES, the "
    "container's GPU runtime); cudaErrorInsufficientDriver means no usable driver.",
    "pageable_copies": "Allocate host buffers pinned: DataLoader(pin_memory=True) or tensor.pin_memory(), then "
    "copy with .to('cuda', non_blocking=True); or cudaHostRegister the buffer once.",
    "sync_storm": "Remove per-step synchronizes (torch.cuda.synchronize(), loss.item(), tensor printing); record a "
    "CUDA event and check it every N steps instead.",
    "blocking_reads": "Keep values on the GPU; read them back every N steps (accumulate loss in a tensor), or copy "
    "non_blocking into pinned memory and wait on an event.",
    "memory_churn": "Keep the caching allocator warm: avoid torch.cuda.empty_cache() in the loop, reuse buffers, set "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True for varying sizes.",
    "launch_bound": "Fuse small kernels: CUDA graphs (torch.cuda.graphs / torch.compile(mode='reduce-overhead')) "
    "or larger batches.",
    "input_starvation": "Feed the GPU ahead of time: more DataLoader workers (num_workers), prefetch_factor, "
    "persistent_workers=True, pin_memory=True; move decoding/augmentation off the training "
    "thread (or onto the GPU: DALI); cache preprocessed data.",
    "host_contention": "Give the job its own cores: fewer competing processes, CPU requests = limits with the static "
    "CPU manager (Kubernetes) or taskset/cpusets; cap OMP_NUM_THREADS and DataLoader workers to "
    "the cores the job has.",
    "blocking_io": "Take file I/O off the training thread: asynchronous checkpoints (torch.distributed.checkpoint."
    "async_save, or a background thread writing a CPU copy), buffered or asynchronous logging, "
    "no fsync per step; checkpoint every N steps to fast local storage.",
}

_SYNCS = {
    "cudaStreamSynchronize",
    "cudaStreamSynchronize_ptsz",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cuStreamSynchronize",
    "cuStreamSynchronize_ptsz",
    "cuCtxSynchronize",
    "cuEventSynchronize",
}
_ALLOCS = {
    "cudaMalloc",
    "cudaFree",
    "cudaMallocAsync",
    "cudaFreeAsync",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemAllocAsync",
    "cuMemFreeAsync",
}
_SMALL_READ = 64 << 10
#: A finding below this share of the process's traced window, or below this many
#: seconds, is not reported (a 5 ms process is not a training job).
MIN_SHARE = 0.01
MIN_COST_S = 0.005
LAUNCH_COST_S = 5e-6
SYNC_GAP_CAP_S = 0.1
EVIDENCE_SPANS = 5
EVIDENCE_STACKS = 3
#: Threads that made at least this share of the busiest thread's CUDA calls launch work too.
LAUNCHER_SHARE = 0.2
_INPUT_WAITS = {"futex", "pipe", "socket", "poll"}
SCHED_SCOPE = "otelbpf.sched"


@dataclass
class Finding:
    cause: str
    process: str
    cost_s: float  # estimated seconds (see COSTS)
    share: float  # cost / the process's traced window
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)  # JSON: span ids, figures, stacks
    fix: str = ""


#: The span attributes the findings read. ``SpanLoader`` keeps these alone: a folder holds up to
#: the file exporter's ``report_max_input`` (256 MiB) of spans, and every CUDA and off-CPU span
#: is held until the findings are made. With all their attributes that was ~2.5 times the
#: folder's size (504 MiB for 200 MiB of spans). The keys kept are this set's own strings, and
#: spans that carry the same of these share a dict (``_KeptAttrs``).
_READ_ATTRS = frozenset(
    {
        "cuda.memcpy.async",
        "cuda.memcpy.bytes",
        "cuda.memcpy.direction",
        "cuda.memcpy.host_memory",
        "cuda.memory.bytes",
        "otelbpf.sched.blocked_ns",
        "otelbpf.sched.kernel_stack",
        "otelbpf.sched.reason",
        "otelbpf.sched.runqueue_ns",
        "thread.name",
    }
)
_NO_ATTRS: Json = {}


def _shared(value: object) -> object:
    """A string value as one shared object ("D2H", "pageable", a reason): each line's JSON
    decoding makes its own copy, and hundreds of thousands of spans hold the same few."""
    return sys.intern(value) if isinstance(value, str) else value


class _KeptAttrs:
    """The ``_READ_ATTRS`` a span carries, as one dict per distinct set: a training step's
    copies and allocations repeat the same sizes, directions and memory kinds, so most spans
    share a dict. At most ``bound`` sets are pooled (an off-CPU span's blocked time is unique
    to it); a set past that, or one holding a list (a kernel stack), gets its own dict."""

    def __init__(self, bound: int = 4096) -> None:
        self._pool: dict[tuple[tuple[str, type, object], ...], Json] = {}
        self._bound = bound

    def __call__(self, attrs: Json) -> Json:
        # The value's type is part of the key: True == 1 == 1.0 as keys, not as attributes.
        items = tuple((k, type(attrs[k]), attrs[k]) for k in _READ_ATTRS if k in attrs)
        if not items:
            return _NO_ATTRS
        try:
            kept = self._pool.get(items)
        except TypeError:  # a list value cannot be a key
            return {k: _shared(v) for k, _t, v in items}
        if kept is None:
            kept = {k: _shared(v) for k, _t, v in items}
            if len(self._pool) < self._bound:
                self._pool[items] = kept
        return kept


@dataclass(slots=True)
class _Span:
    name: str
    start: int
    end: int
    tid: int
    attrs: Json
    span_id: str


class SpanLoader:
    """Span visitor (summary.read_spans): the CUDA and off-CPU spans the findings read, per
    process, each with the ``_READ_ATTRS`` alone. The report's page reads the folder once for
    its charts and this together."""

    def __init__(self) -> None:
        self.spans: dict[ProcKey, list[_Span]] = defaultdict(list)
        self.off_cpu: dict[ProcKey, list[_Span]] = defaultdict(list)
        self._kept = _KeptAttrs()

    def span(self, key: ProcKey, scope: str | None, sp: Json, a: Json, d: int) -> None:
        into = self.spans if scope == "otelbpf.cuda" else self.off_cpu if scope == SCHED_SCOPE else None
        if into is None:
            return
        into[key].append(
            _Span(
                sys.intern(sp["name"]),
                int(sp["startTimeUnixNano"]),
                int(sp["endTimeUnixNano"]),
                int(a.get("thread.id", 0) or 0),
                self._kept(a),
                sp.get("spanId", ""),
            )
        )


def _metric(points: Points, name: str, **match: object) -> list[tuple[Json, Json]]:
    return [
        (dict(a), dp)
        for (n, a), (_t, dp, _kind) in points.items()
        if n == name and all(dict(a).get(k) == v for k, v in match.items())
    ]


def _ids(spans: list[_Span]) -> list[str]:
    return [s.span_id for s in sorted(spans, key=lambda s: s.start - s.end)[:EVIDENCE_SPANS]]


def _process_findings(
    label: str, spans: list[_Span], points: Points, off_cpu: list[_Span] | None = None
) -> list[Finding]:
    if not spans:
        return []
    window = max(1, max(s.end for s in spans) - min(s.start for s in spans)) / 1e9
    out: list[Finding] = []

    def add(cause: str, cost: float, summary: str, evidence: dict[str, Any]) -> None:
        if cost / window >= MIN_SHARE and cost >= MIN_COST_S:
            out.append(
                Finding(
                    cause,
                    label,
                    round(cost, 6),
                    round(cost / window, 4),
                    summary,
                    {"window_s": round(window, 3), **evidence},
                    FIXES[cause],
                )
            )

    calls_total = sum(_num(dp) for _a, dp in _metric(points, "cuda.api.calls"))
    failed = Counter(
        {
            (a.get("cuda.api.function"), a.get("cuda.error.name")): _num(dp)
            for a, dp in _metric(points, "cuda.api.errors")
        }
    )
    if calls_total and sum(failed.values()) >= calls_total / 2:
        # Most calls fail: nothing reaches a GPU, whatever else the calls look like.
        (func, name), n = failed.most_common(1)[0]
        out.append(
            Finding(
                "cuda_errors",
                label,
                round(window, 6),
                1.0,
                f"{sum(failed.values()):.0f} of {calls_total:.0f} CUDA calls failed, most with {name} "
                f"({func} x{n:.0f}): no work reaches a GPU",
                {
                    "window_s": round(window, 3),
                    "calls": int(calls_total),
                    "failed": {f"{f} {e}": int(c) for (f, e), c in failed.most_common(5)},
                },
                FIXES["cuda_errors"],
            )
        )
        return out
    pageable = [s for s in spans if s.attrs.get("cuda.memcpy.host_memory") == "pageable"]
    if pageable:
        metric_bytes = sum(
            _num(dp) for _a, dp in _metric(points, "cuda.memcpy.host_bytes", **{"cuda.memcpy.host_memory": "pageable"})
        )
        nbytes = max(metric_bytes, sum(int(s.attrs.get("cuda.memcpy.bytes", 0)) for s in pageable))
        cost = sum(s.end - s.start for s in pageable) / 1e9
        add(
            "pageable_copies",
            cost,
            f"{len(pageable)} copies ({nbytes / 2**20:.1f} MiB) from or to pageable host memory",
            {"copies": len(pageable), "bytes": int(nbytes), "seconds": round(cost, 6), "span_ids": _ids(pageable)},
        )

    by_thread: dict[int, list[_Span]] = defaultdict(list)
    for s in spans:
        by_thread[s.tid].append(s)
    # Time in a gap after a synchronize in which the thread was blocked on its input or on
    # I/O, or waited for a CPU, is charged to that cause (input_starvation, blocking_io,
    # host_contention), not to the synchronize.
    blocked = _blocked_intervals(off_cpu or [])
    syncs, gaps = [], []
    for tid, mine in by_thread.items():
        mine.sort(key=lambda s: s.start)
        for i, s in enumerate(mine):
            if s.name in _SYNCS:
                syncs.append(s)
                nxt = next((n for n in mine[i + 1 :] if n.start >= s.end), None)
                if nxt is not None:
                    gap = (nxt.start - s.end - _overlap(s.end, nxt.start, blocked.get(tid, []))) / 1e9
                    gaps.append(min(max(gap, 0.0), SYNC_GAP_CAP_S))
    if syncs and len(syncs) / window >= 1:
        cost = sum(gaps)
        funcs = Counter(s.name for s in syncs)
        add(
            "sync_storm",
            cost,
            f"{len(syncs)} synchronizes ({len(syncs) / window:.1f}/s); the GPU waited {cost:.3f}s for the next work",
            {
                "syncs": len(syncs),
                "per_second": round(len(syncs) / window, 2),
                "by_function": dict(funcs),
                "median_gap_s": round(statistics.median(gaps), 6) if gaps else 0.0,
                "waited_s": round(sum(s.end - s.start for s in syncs) / 1e9, 6),
                "span_ids": _ids(syncs),
            },
        )

    reads = [
        s
        for s in spans
        if s.attrs.get("cuda.memcpy.direction") == "D2H"
        and not s.attrs.get("cuda.memcpy.async")
        and int(s.attrs.get("cuda.memcpy.bytes", 0)) <= _SMALL_READ
    ]
    if reads:
        cost = sum(s.end - s.start for s in reads) / 1e9
        add(
            "blocking_reads",
            cost,
            f"{len(reads)} small blocking device-to-host reads ({len(reads) / window:.1f}/s)",
            {
                "reads": len(reads),
                "bytes": sum(int(s.attrs.get("cuda.memcpy.bytes", 0)) for s in reads),
                "seconds": round(cost, 6),
                "span_ids": _ids(reads),
            },
        )

    allocs = [s for s in spans if s.name in _ALLOCS]
    calls = {
        a["cuda.api.function"]: _num(dp)
        for a, dp in _metric(points, "cuda.api.calls")
        if a.get("cuda.api.function") in _ALLOCS
    }
    if allocs and len(allocs) / window >= 1:
        sizes = Counter(
            int(s.attrs["cuda.memory.bytes"]) for s in allocs if "cuda.memory.bytes" in s.attrs and "Free" not in s.name
        )
        cost = sum(s.end - s.start for s in allocs) / 1e9
        add(
            "memory_churn",
            cost,
            f"{len(allocs)} device allocations and frees ({len(allocs) / window:.1f}/s)"
            + (f", {sizes.most_common(1)[0][1]} of {sizes.most_common(1)[0][0]} bytes" if sizes else ""),
            {
                "calls": int(sum(calls.values())) or len(allocs),
                "by_function": calls or dict(Counter(s.name for s in allocs)),
                "repeated_sizes": dict(sizes.most_common(3)),
                "seconds": round(cost, 6),
                "span_ids": _ids(allocs),
            },
        )

    launches = sum(_num(dp) for _a, dp in _metric(points, "cuda.kernel.launches"))
    if launches and syncs:
        median_wait = statistics.median((s.end - s.start) / 1e9 for s in syncs)
        if launches / window >= 20_000 and median_wait <= 2e-4:
            cost = launches * LAUNCH_COST_S
            add(
                "launch_bound",
                cost,
                f"{launches:.0f} launches ({launches / window:.0f}/s) and syncs that return "
                f"in {median_wait * 1e6:.0f} us: the GPU keeps up with the host",
                {"launches": int(launches), "per_second": round(launches / window), "median_sync_wait_s": median_wait},
            )
    if off_cpu:
        _sched_findings(spans, points, off_cpu, window, add)
    return out


def _blocked_intervals(off_cpu: list[_Span]) -> dict[int, list[tuple[int, int]]]:
    """Per thread, the off-CPU time another cause accounts for: the blocked part of waits for
    input or I/O, and the run-queue part of every wait outside a CUDA call."""
    out: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for s in off_cpu:
        reason = s.attrs.get("otelbpf.sched.reason")
        if reason == "cuda":
            continue
        mid = s.start + int(s.attrs.get("otelbpf.sched.blocked_ns", 0))
        if reason in _INPUT_WAITS or reason == "io":
            out[s.tid].append((s.start, mid))
        if int(s.attrs.get("otelbpf.sched.runqueue_ns", 0)):
            out[s.tid].append((mid, s.end))
    return out


def _overlap(start: int, end: int, intervals: list[tuple[int, int]]) -> int:
    """Nanoseconds of [start, end) covered by ``intervals`` (disjoint: one thread's)."""
    return sum(max(0, min(end, b) - max(start, a)) for a, b in intervals if a < end and b > start)


def _by_value(d: dict[str, float]) -> list[tuple[str, float]]:
    return sorted(d.items(), key=lambda kv: -kv[1])


def _launchers(spans: list[_Span]) -> set[int]:
    """The threads that issue the process's CUDA work: the busiest, and those with at least
    LAUNCHER_SHARE of its calls."""
    calls = Counter(s.tid for s in spans)
    top = max(calls.values())
    return {tid for tid, n in calls.items() if n >= top * LAUNCHER_SHARE}


def _inside_cuda(interval: _Span, calls: list[_Span], starts: list[int]) -> bool:
    """Does the off-CPU interval overlap a CUDA call of its thread (sorted by start)? One
    thread's calls follow each other: only the last to start before the interval ends can."""
    i = bisect_left(starts, interval.end)
    return i > 0 and calls[i - 1].end > interval.start


def _stacks(intervals: list[_Span], part: str) -> list[dict[str, Any]]:
    """The kernel stacks that cost the most, with their seconds."""
    by: dict[tuple[str, ...], float] = defaultdict(float)
    for s in intervals:
        by[tuple(s.attrs.get("otelbpf.sched.kernel_stack") or ())] += int(s.attrs.get(part, 0)) / 1e9
    return [
        {"seconds": round(v, 6), "kernel_stack": list(k)}
        for k, v in sorted(by.items(), key=lambda kv: -kv[1])[:EVIDENCE_STACKS]
        if k
    ]


def _thread_names(intervals: list[_Span]) -> dict[str, str]:
    return {str(s.tid): str(s.attrs.get("thread.name", "")) for s in intervals}


def _other_threads(points: Points, launcher_names: set[str]) -> dict[str, dict[str, float]]:
    """Off-CPU seconds of the process's other threads by reason (the data loaders: busy
    threads are seldom off the CPU; blocked ones are)."""
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for a, dp in _metric(points, "otelbpf.thread.off_cpu.time"):
        name = str(a.get("thread.name"))
        if name not in launcher_names:
            out[name][str(a.get("otelbpf.sched.reason"))] = round(_num(dp), 6)
    return dict(out)


def _sched_findings(spans: list[_Span], points: Points, off_cpu: list[_Span], window: float, add: AddFinding) -> None:
    """input_starvation, host_contention and blocking_io from the launching threads'
    off-CPU intervals within the CUDA window."""
    launchers = _launchers(spans)
    t0, t1 = min(s.start for s in spans), max(s.end for s in spans)
    calls: dict[int, list[_Span]] = defaultdict(list)
    for s in spans:
        if s.tid in launchers:
            calls[s.tid].append(s)
    starts = {}
    for tid, mine in calls.items():
        mine.sort(key=lambda s: s.start)
        starts[tid] = [s.start for s in mine]
    waits = [s for s in off_cpu if s.tid in launchers and s.end > t0 and s.start < t1]
    outside = [
        s
        for s in waits
        if s.attrs.get("otelbpf.sched.reason") != "cuda" and not _inside_cuda(s, calls[s.tid], starts[s.tid])
    ]

    def blocked(s: _Span) -> float:
        return int(s.attrs.get("otelbpf.sched.blocked_ns", 0)) / 1e9

    names = _thread_names(waits)
    starved = [s for s in outside if s.attrs.get("otelbpf.sched.reason") in _INPUT_WAITS]
    if starved:
        cost = sum(blocked(s) for s in starved)
        reasons: dict[str, float] = defaultdict(float)
        for s in starved:
            reasons[s.attrs["otelbpf.sched.reason"]] += blocked(s)
        add(
            "input_starvation",
            cost,
            f"the launching thread waited {cost:.3f}s in {len(starved)} waits on other threads or processes "
            f"({', '.join(f'{r} {v:.3f}s' for r, v in _by_value(reasons))}) while no CUDA call was in progress",
            {
                "waits": len(starved),
                "seconds": round(cost, 6),
                "by_reason": {r: round(v, 6) for r, v in _by_value(reasons)},
                "threads": names,
                "stacks": _stacks(starved, "otelbpf.sched.blocked_ns"),
                "other_threads": _other_threads(points, set(names.values())),
                "span_ids": _ids(starved),
            },
        )
    io = [s for s in outside if s.attrs.get("otelbpf.sched.reason") == "io"]
    if io:
        cost = sum(blocked(s) for s in io)
        add(
            "blocking_io",
            cost,
            f"the launching thread was blocked {cost:.3f}s in {len(io)} file-system or disk waits",
            {
                "waits": len(io),
                "seconds": round(cost, 6),
                "threads": names,
                "stacks": _stacks(io, "otelbpf.sched.blocked_ns"),
                "span_ids": _ids(io),
            },
        )
    queued = [s for s in waits if int(s.attrs.get("otelbpf.sched.runqueue_ns", 0)) > 0]
    if queued:
        runq = sorted(int(s.attrs["otelbpf.sched.runqueue_ns"]) / 1e9 for s in queued)
        cost = sum(runq)
        add(
            "host_contention",
            cost,
            f"the launching thread waited {cost:.3f}s for a CPU while runnable ({len(queued)} waits, "
            f"longest {runq[-1] * 1e3:.1f} ms)",
            {
                "waits": len(queued),
                "seconds": round(cost, 6),
                "median_wait_s": round(statistics.median(runq), 6),
                "max_wait_s": round(runq[-1], 6),
                "threads": names,
                "preempted": sum(1 for s in queued if s.attrs.get("otelbpf.sched.reason") == "preempted"),
                "span_ids": [
                    s.span_id
                    for s in sorted(queued, key=lambda s: -int(s.attrs["otelbpf.sched.runqueue_ns"]))[:EVIDENCE_SPANS]
                ],
            },
        )


def diagnose(directory: str, partial: list[str] | None = None) -> list[Finding]:
    """Findings of every process in ``directory``, costliest first. Raises ValueError on
    files that are not the agent's output (naming file and line). ``partial``: collects the
    lines still being written instead (summary._read)."""
    procs: dict[ProcKey, Json] = {}
    latest = load_metrics(directory, procs, partial)
    loader = SpanLoader()
    read_spans(directory, [loader], partial, procs)
    return findings_of(loader, latest, procs)


def findings_of(loader: SpanLoader, latest: Latest, procs: dict[ProcKey, Json]) -> list[Finding]:
    """Findings of every process read (``procs``: resources from the metrics and the spans),
    costliest first."""
    findings: list[Finding] = []
    for key, res in procs.items():
        if key[0] == "otelbpf":
            continue
        label = process_label(res)
        findings += _process_findings(
            label, loader.spans.get(key, []), latest.get(key, {}), loader.off_cpu.get(key, [])
        )
    return sorted(findings, key=lambda f: -f.cost_s)


def write_report(findings: list[Finding], out: TextIO, as_json: bool = False) -> None:
    if as_json:
        json.dump([asdict(f) for f in findings], out, indent=1)
        out.write("\n")
        return
    if not findings:
        out.write(f"no cause of GPU idle time above {MIN_SHARE:.0%} of a process's traced window\n")
        return
    for i, f in enumerate(findings, 1):
        out.write(f"{i}. {f.cause}: {f.process}: ~{f.cost_s:.3f}s ({f.share:.1%} of its traced window)\n")
        out.write(f"   {f.summary}\n")
        out.write(f"   cost: {COSTS[f.cause]}\n")
        evidence = {k: v for k, v in f.evidence.items() if k != "span_ids"}
        out.write(f"   evidence: {json.dumps(evidence, sort_keys=True)}\n")
        if f.evidence.get("span_ids"):
            out.write(f"   spans: {', '.join(f.evidence['span_ids'])}\n")
        out.write(f"   fix: {f.fix}\n")


def run(directory: str, out: TextIO, err: TextIO, as_json: bool = False) -> int:
    """``otelbpf diagnose DIR``: 0 with no finding, 1 with findings, 2 on unreadable input."""
    import os

    if not os.path.isdir(directory):
        err.write(f"otelbpf diagnose: {directory} does not exist (run the agent with the file exporter first)\n")
        return 2
    try:
        findings = diagnose(directory)
        idle = gpu_idle(directory)  # the GPU's own account (NVML) before the causes
    except ValueError as exc:
        err.write(f"otelbpf diagnose: {exc}\n")
        return 2
    if not as_json:
        write_gpu_idle(idle, out)
    write_report(findings, out, as_json)
    return 1 if findings else 0
