"""Why is the GPU idle? Causes seen from the host, ranked by the time they cost.

Reads what the agent wrote (the file exporter's OTLP-JSON lines: CUDA spans and
metrics per process) and names the causes of GPU idle time that the CUDA API
shows, each with its evidence (counts, bytes, seconds, the span ids that show
it) and the usual fix:

- ``pageable_copies``: host<->device copies from pageable memory: staged through a
  bounce buffer, slower, and synchronous even when asked to be async;
- ``sync_storm``: synchronizes so frequent that draining and refilling the queue costs a
  share of the run (many gaps under 1 ms between a synchronize and the next launch);
- ``blocking_reads``: small blocking device-to-host copies (``loss.item()``,
  ``.cpu()``, printing a tensor): a synchronize in disguise;
- ``memory_churn``: device allocations and frees over and over, often of the same
  sizes (allocator cache misses, ``empty_cache``); ``cudaFree`` synchronizes;
- ``launch_bound``: launches so frequent and syncs so short that the GPU finishes
  each kernel before the next arrives (tiny kernels);
- ``cuda_errors``: most CUDA calls fail (no driver, wrong device): nothing runs at all;
- ``host_code``: the launching thread ran code on the CPU while the GPU had nothing queued,
  one finding per function the CPU samples show (``save_checkpoint (job.py:31)``);
- ``input_starvation``, ``blocking_io``, ``host_contention``, ``host_wait``: the launching
  thread was off the CPU while the GPU had nothing queued: waiting on another thread or
  process (a futex, pipe, socket or poll), in file-system or block I/O, runnable but
  waiting for a CPU, asleep; with the kernel stacks (the ``sched`` receiver's ``off_cpu``
  spans);
- ``unexplained``: the idle time charged to none of these, with what the agent could not see;
- ``nccl_straggler``: a rank the others waited for in NCCL collectives, persistently
  (analyze/stragglers.py over the folder's NCCL spans, as ``otelbpf stragglers`` says it).

Every cause but ``launch_bound`` and ``cuda_errors`` is a share of one idle budget, each
second charged once (analyze/idle.py, docs/gpu-idle.md): the gaps after a synchronize or
a blocking copy until the thread's next CUDA call, and the time inside the CUDA calls that
keep the GPU idle.

The costs are host-side estimates, documented per cause (``COSTS``): what the GPU
could have been doing while the host did this. Without a GPU's own account (NVML)
they say *why*, not *how long the GPU was idle in total*.

A share is a cost over the time it could have been spent in: the process's traced window
times the threads that made CUDA calls (two threads copying at once spend two seconds of
copies in one second of the window; over the window alone that read as 119%). A cost is
never more than that, so no share is above 100%, and the shares of one process add up to
at most 100% (each idle second is charged once).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from otelbpf.analyze.gpu_idle import gpu_idle, write_gpu_idle
from otelbpf.analyze.idle import (
    ALLOCS,
    SHORT_GAP_NS,
    SYNCS,
    Account,
    Charge,
    Timeline,
    account,
    device_of,
    load_timelines,
)
from otelbpf.analyze.summary import (
    Json,
    Latest,
    ProcKey,
    SeriesKey,
    _num,
    human_seconds,
    load_metrics,
    process_label,
    read_spans,
)

if TYPE_CHECKING:
    from otelbpf.analyze.collectives import Collectives
    from otelbpf.analyze.stragglers import Report

#: One process's latest metric points, read only: an entry of summary.load_metrics' answer, or the live
#: view's (whose kind may be missing).
Points = Mapping[SeriesKey, tuple[int, Json, str | None]]
#: _process_findings' ``add``: (cause, cost s, summary, evidence) -> kept if it weighs enough.
AddFinding = Callable[[str, float, str, dict[str, Any]], None]

#: How each cause's cost is estimated (printed with --explain, and in docs).
COSTS = {
    "cuda_errors": "the process's whole traced window: its CUDA calls fail, so no GPU work runs",
    "pageable_copies": "time the host spent in copies from or to pageable memory",
    "sync_storm": "the gaps under 1 ms after synchronizes, until the host's next CUDA call: the queue draining and "
    "refilling (a longer gap is charged to what the host did in it)",
    "blocking_reads": "time in blocking device-to-host copies of at most 64 KiB (each waits for the GPU to drain)",
    "memory_churn": "time in device allocation and free calls",
    "launch_bound": "when the GPU keeps up with the host: the launching thread's on-CPU time in the gaps (launches are "
    "in them by default), up to launches x 5 us, a typical host cost of one launch",
    "input_starvation": "time the launching thread waited on a futex, pipe, socket or poll while the GPU had nothing "
    "queued (off-CPU intervals above the sched receiver's span threshold: a lower bound)",
    "host_contention": "time the launching thread was runnable but waited for a CPU while the GPU had nothing queued "
    "(run-queue parts of its off-CPU intervals above the span threshold: a lower bound)",
    "blocking_io": "time the launching thread was blocked in file-system or block I/O while the GPU had nothing queued",
    "host_wait": "time the launching thread slept or waited otherwise while the GPU had nothing queued",
    "other_device": "time the launching thread spent inside CUDA calls for its other devices while this device had "
    "nothing queued (where the spans carry cuda.device.id: the budget is per thread and device)",
    "host_code": "the launching thread's on-CPU time while the GPU had nothing queued, split by the CPU samples taken "
    "then (one sampling period each, pooled over the gaps)",
    "unexplained": "the idle time charged to no cause: what the agent could not see (see could_not_see)",
    "nccl_straggler": "the rank's lateness summed over the collectives it entered last: the time the other ranks "
    "waited for it (its share: over the job's collective window)",
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
    "host_wait": "Do not sleep or wait in the training thread between steps; if it waits for something, "
    "prepare it ahead of time.",
    "other_device": "Drive each GPU from its own thread or process (one rank per GPU: torch.distributed/DDP), or "
    "queue every device's work before synchronizing any of them (synchronize last).",
    "host_code": "Move this work off the launching thread or overlap it with the GPU's: prepare batches in "
    "DataLoader workers or a background thread, checkpoint asynchronously, and queue the next step's GPU "
    "work before the host work (synchronize last).",
    "unexplained": "Turn on what the agent could not see: the sched receiver (off-CPU time by reason and kernel "
    "stack: `otelbpf run --receivers cuda,gpu,profiling,sched -- ...`, or add `sched` to the traces and metrics "
    "pipelines) and the profiling receiver (CPU samples in time; on by default).",
    "nccl_straggler": "Find what makes this rank late (its class says where): compare its CPU flame graph with the "
    "other ranks' (`otelbpf stragglers DIR --diff-dir D`), then balance its input (batch or sequence lengths per "
    "rank), free its host (data loading, CPU contention) or check its GPU and network path.",
    "blocking_io": "Take file I/O off the training thread: asynchronous checkpoints (torch.distributed.checkpoint."
    "async_save, or a background thread writing a CPU copy), buffered or asynchronous logging, "
    "no fsync per step; checkpoint every N steps to fast local storage.",
}

_SYNCS = SYNCS
_ALLOCS = ALLOCS
_SMALL_READ = 64 << 10
#: A finding below this share of the process's traced window, or below this many
#: seconds, is not reported (a 5 ms process is not a training job).
MIN_SHARE = 0.01
MIN_COST_S = 0.005
#: A cause made of calls (sync_storm, blocking_reads, memory_churn) needs at least this many:
#: two allocations in a short window are not churn, however long they took.
MIN_CALLS = 10
LAUNCH_COST_S = 5e-6
#: A function seen in fewer CPU samples than this in the gaps is no host_code finding: its
#: estimate's relative error is about 1/sqrt(samples) (2 samples: +-70%).
MIN_SAMPLES = 5
EVIDENCE_SPANS = 5
EVIDENCE_STACKS = 3
#: Threads that made at least this share of the busiest thread's CUDA calls launch work too.
LAUNCHER_SHARE = 0.2
SCHED_SCOPE = "otelbpf.sched"
#: How to turn the sched receiver on, as the unexplained finding says it when it was off.
SCHED_HINT = "turn on the sched receiver (otelbpf run --receivers cuda,gpu,profiling,sched -- ...)"
#: ``otelbpf stragglers``' defaults: late by at least 1 ms, on at least 30% of a rank's collectives
#: (and on ``stragglers.MIN_STRAGGLES``), so a rank late once or twice is no finding.
STRAGGLER_THRESHOLD_NS = 1_000_000
STRAGGLER_MIN_SHARE = 0.3
#: What makes a straggler late, by its class (correlate/lateness.py), before the common fix.
STRAGGLER_WHY = {
    "compute-slow": "its GPU work between collectives takes longer than the other ranks' (an uneven share of the "
    "batch, or a slower or throttled GPU: nvidia-smi -q for clocks, throttling and XID errors)",
    "host-slow": "its host reaches the collective late (data loading, CPU contention or Python work on that rank)",
    "communication-slow": "its previous collective finishes late (its network path: NIC, link errors, topology; "
    "NCCL_DEBUG=INFO)",
}


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
        "cuda.device.id",
        "cuda.error.name",
        "cuda.memory.bytes",
        "otelbpf.sched.blocked_ns",
        "otelbpf.sched.intervals",
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


def _rank(f: Finding) -> tuple[bool, float]:
    """Causes first, costliest first; then what no cause explains (it says what to turn on)."""
    return (f.cause == "unexplained", -f.cost_s)


def _ids(spans: Sequence[Any]) -> list[str]:
    return [s.span_id for s in sorted(spans, key=lambda s: s.start - s.end)[:EVIDENCE_SPANS]]


def _process_findings(
    label: str,
    spans: list[_Span],
    points: Points,
    off_cpu: list[_Span] | None = None,
    timeline: Timeline | None = None,
) -> list[Finding]:
    """One process's findings. ``off_cpu``: its sched spans (the receiver counts as on when the
    process has any, or its off-CPU metrics); ``timeline``: its CPU samples in time (None:
    profiling off, or the process not sampled)."""
    if not spans:
        return []
    window = max(1, max(s.end for s in spans) - min(s.start for s in spans)) / 1e9
    threads = len({s.tid for s in spans}) or 1
    # the budget is per thread and device where the spans say the device (idle.DEVICE_ATTR)
    capacity = window * (len({(s.tid, device_of(s)) for s in spans}) or 1)  # the module doc: what a share is of
    out: list[Finding] = []

    def add(cause: str, cost: float, summary: str, evidence: dict[str, Any]) -> None:
        cost = min(cost, capacity)  # an estimate (launch_bound) may exceed it: a share is at most 1
        if cost / capacity >= MIN_SHARE and cost >= MIN_COST_S:
            out.append(
                Finding(
                    cause,
                    label,
                    round(cost, 6),
                    round(cost / capacity, 4),
                    summary,
                    {"window_s": round(window, 3), **({"cuda_threads": threads} if threads > 1 else {}), **evidence},
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
    if not calls_total:  # no metrics (the metrics pipeline off, or not written yet): the spans say it
        calls_total = len(spans)
        failed = Counter((s.name, s.attrs["cuda.error.name"]) for s in spans if "cuda.error.name" in s.attrs)
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
    sched_on = bool(off_cpu) or bool(_metric(points, "otelbpf.thread.off_cpu.time"))
    syncs = [s for s in spans if s.name in _SYNCS]
    launches = sum(_num(dp) for _a, dp in _metric(points, "cuda.kernel.launches"))
    median_wait = statistics.median((s.end - s.start) / 1e9 for s in syncs) if syncs else 0.0
    launch_bound = bool(launches and syncs) and launches / window >= 20_000 and median_wait <= 2e-4
    acc = account(
        spans,
        off_cpu if sched_on else None,
        timeline,
        launcher_share=LAUNCHER_SHARE,
        launch_ns=int(launches * LAUNCH_COST_S * 1e9) if launch_bound else 0,
    )
    idle = acc.summary()

    def add_charged(cause: str, summary: str, evidence: dict[str, Any]) -> None:
        c = acc.charges.get(cause)
        if c is not None:
            add(cause, c.seconds, summary, {**evidence, "idle": idle})

    pageable = [s for s in spans if s.attrs.get("cuda.memcpy.host_memory") == "pageable"]
    if pageable:
        metric_bytes = sum(
            _num(dp) for _a, dp in _metric(points, "cuda.memcpy.host_bytes", **{"cuda.memcpy.host_memory": "pageable"})
        )
        nbytes = max(metric_bytes, sum(int(s.attrs.get("cuda.memcpy.bytes", 0)) for s in pageable))
        inside = sum(s.end - s.start for s in pageable) / 1e9
        add_charged(
            "pageable_copies",
            f"{len(pageable)} copies ({nbytes / 2**20:.1f} MiB) from or to pageable host memory",
            {"copies": len(pageable), "bytes": int(nbytes), "seconds": round(inside, 6), "span_ids": _ids(pageable)},
        )

    storm = acc.charges.get("sync_storm")
    if storm is not None and storm.gaps >= MIN_CALLS and len(syncs) / window >= 1:
        add_charged(
            "sync_storm",
            f"{len(syncs)} synchronizes ({len(syncs) / window:.1f}/s); {storm.gaps} of the gaps after them were "
            f"the queue draining and refilling (under {SHORT_GAP_NS / 1e6:.0f} ms each, "
            f"{human_seconds(storm.seconds)} in all)",
            {
                "syncs": len(syncs),
                "per_second": round(len(syncs) / window, 2),
                "by_function": dict(Counter(s.name for s in syncs)),
                "short_gaps": storm.gaps,
                "mean_gap_s": round(storm.seconds / storm.gaps, 6) if storm.gaps else 0.0,
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
    if len(reads) >= MIN_CALLS:
        add_charged(
            "blocking_reads",
            f"{len(reads)} small blocking device-to-host reads ({len(reads) / window:.1f}/s)",
            {
                "reads": len(reads),
                "bytes": sum(int(s.attrs.get("cuda.memcpy.bytes", 0)) for s in reads),
                "seconds": round(sum(s.end - s.start for s in reads) / 1e9, 6),
                "span_ids": _ids(reads),
            },
        )

    allocs = [s for s in spans if s.name in _ALLOCS]
    calls = {
        a["cuda.api.function"]: _num(dp)
        for a, dp in _metric(points, "cuda.api.calls")
        if a.get("cuda.api.function") in _ALLOCS
    }
    if len(allocs) >= MIN_CALLS and len(allocs) / window >= 1:
        sizes = Counter(
            int(s.attrs["cuda.memory.bytes"]) for s in allocs if "cuda.memory.bytes" in s.attrs and "Free" not in s.name
        )
        add_charged(
            "memory_churn",
            f"{len(allocs)} device allocations and frees ({len(allocs) / window:.1f}/s)"
            + (f", {sizes.most_common(1)[0][1]} of {sizes.most_common(1)[0][0]} bytes" if sizes else ""),
            {
                "calls": int(sum(calls.values())) or len(allocs),
                "by_function": calls or dict(Counter(s.name for s in allocs)),
                "repeated_sizes": dict(sizes.most_common(3)),
                "seconds": round(sum(s.end - s.start for s in allocs) / 1e9, 6),
                "span_ids": _ids(allocs),
            },
        )

    if launch_bound:
        # the gaps' on-CPU time up to launches x 5 us (idle.account's launch_ns), else the estimate
        charged = acc.charges.get("launch_bound")
        cost = charged.seconds if charged is not None else launches * LAUNCH_COST_S
        add(
            "launch_bound",
            cost,
            f"{launches:.0f} launches ({launches / window:.0f}/s) and syncs that return "
            f"in {median_wait * 1e6:.0f} us: the GPU keeps up with the host",
            {
                "launches": int(launches),
                "per_second": round(launches / window),
                "median_sync_wait_s": median_wait,
                **({"idle": idle} if charged is not None else {}),
            },
        )
    if (c := acc.charges.get("other_device")) is not None:
        add_charged(
            "other_device",
            f"the launching thread was inside CUDA calls for its other devices for {human_seconds(c.seconds)} "
            f"({', '.join(f'{d} {human_seconds(v)}' for d, v in c.top())}) while this device had nothing queued: "
            "one thread drives the devices one after the other",
            {
                "seconds": round(c.seconds, 6),
                "by_device": {d: round(v, 6) for d, v in c.top()},
                "span_ids": _ids(c.spans),
            },
        )
    if sched_on:
        _sched_findings(acc, points, add_charged)
    for key, c in sorted(acc.code.items(), key=lambda kv: -kv[1].seconds):
        if c.samples < MIN_SAMPLES:
            continue  # a sample or two: +-70%, noise, not a function's share
        where = acc.where[key]
        top = c.top(1)[0][0]
        add(
            "host_code",
            c.seconds,
            f"the launching thread ran {top} for ~{human_seconds(c.seconds)} while the GPU had nothing queued "
            f"({c.samples} CPU samples between a synchronize and the next launch)",
            {
                "function": where.function,
                "file": where.file,
                "top_frames": {k: int(v) for k, v in c.top(EVIDENCE_STACKS)},
                "samples": c.samples,
                "seconds": round(c.seconds, 6),
                "idle": idle,
            },
        )
    if acc.unexplained_s:
        near = sorted(acc.near.items(), key=lambda kv: -kv[1])[:EVIDENCE_STACKS]
        others = _others(acc)
        add(
            "unexplained",
            acc.unexplained_s,
            f"{human_seconds(acc.unexplained_s)} of the {human_seconds(acc.budget_s)} the GPU had nothing queued "
            "is charged to no cause: "
            + "; ".join(f"{why} {human_seconds(v)}" for why, v in sorted(acc.unseen.items(), key=lambda kv: -kv[1]))
            + (f"; {human_seconds(near[0][1])} of it in gaps where the thread ran {near[0][0]}" if near else "")
            + (
                f"; meanwhile {next(iter(others))} ran on the CPU for ~{human_seconds(next(iter(others.values())))}"
                if others
                else ""
            )
            + (
                f"; {SCHED_HINT} to charge its off-CPU time by reason (I/O, a futex or queue, the run queue)"
                if not sched_on
                else ""
            ),
            {"idle": idle, "beside_code": {k: round(v, 6) for k, v in near}, "other_threads_code": others},
        )
    return sorted(out, key=_rank)


def _others(acc: Account) -> dict[str, float]:
    """The code the process's other threads ran in the launching threads' gaps, costliest first:
    "thread 1650 in load_batch (job.py)" -> CPU seconds (samples x period). What the launching
    thread may have waited for (a data loader, a thread holding the GIL) when its own samples
    show nothing: the context of its unexplained or off-CPU time, not a cause."""
    return {
        f"thread {tid} in {key}": round(n * acc.period_s, 6)
        for (tid, key), n in acc.others.most_common(EVIDENCE_STACKS)
        if n * acc.period_s >= MIN_COST_S
    }


def _stacks(intervals: list[Any], part: str) -> list[dict[str, Any]]:
    """The kernel stacks that cost the most, with their seconds."""
    by: dict[tuple[str, ...], float] = defaultdict(float)
    for s in intervals:
        by[tuple(s.attrs.get("otelbpf.sched.kernel_stack") or ())] += int(s.attrs.get(part, 0)) / 1e9
    return [
        {"seconds": round(v, 6), "kernel_stack": list(k)}
        for k, v in sorted(by.items(), key=lambda kv: -kv[1])[:EVIDENCE_STACKS]
        if k
    ]


def _other_threads(points: Points, launcher_names: set[str]) -> dict[str, dict[str, float]]:
    """Off-CPU seconds of the process's other threads by reason (the data loaders: busy
    threads are seldom off the CPU; blocked ones are)."""
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for a, dp in _metric(points, "otelbpf.thread.off_cpu.time"):
        name = str(a.get("thread.name"))
        if name not in launcher_names:
            out[name][str(a.get("otelbpf.sched.reason"))] = round(_num(dp), 6)
    return dict(out)


def _waits(spans: list[Any]) -> int:
    """The off-CPU intervals of ``spans``: a span of short ones summed in the kernel holds
    ``otelbpf.sched.intervals`` of them."""
    return sum(int(s.attrs.get("otelbpf.sched.intervals", 1)) for s in spans)


def _sched_findings(acc: Account, points: Points, add: Callable[[str, str, dict[str, Any]], None]) -> None:
    """input_starvation, blocking_io, host_contention and host_wait: the off-CPU parts of the
    launching threads' idle gaps (idle.account), with the kernel stacks."""
    names = {str(t): n for t, n in acc.threads.items()}

    def common(c: Charge) -> dict[str, Any]:
        beside = sorted(c.beside.items(), key=lambda kv: -kv[1])[:EVIDENCE_STACKS]
        return {
            "waits": _waits(c.spans),
            "seconds": round(c.seconds, 6),
            "threads": names,
            "span_ids": _ids(c.spans),
            "beside_code": {k: round(v, 6) for k, v in beside},
            "other_threads_code": _others(acc),
        }

    if (c := acc.charges.get("input_starvation")) is not None:
        add(
            "input_starvation",
            f"the launching thread waited {human_seconds(c.seconds)} in {_waits(c.spans)} waits on other threads or "
            "processes "
            f"({', '.join(f'{r} {human_seconds(v)}' for r, v in c.top())}) while the GPU had nothing queued",
            {
                **common(c),
                "by_reason": {r: round(v, 6) for r, v in c.top()},
                "stacks": _stacks(c.spans, "otelbpf.sched.blocked_ns"),
                "other_threads": _other_threads(points, set(names.values())),
            },
        )
    if (c := acc.charges.get("blocking_io")) is not None:
        add(
            "blocking_io",
            f"the launching thread was blocked {human_seconds(c.seconds)} in {_waits(c.spans)} file-system or disk "
            "waits while the GPU had nothing queued",
            {**common(c), "stacks": _stacks(c.spans, "otelbpf.sched.blocked_ns")},
        )
    if (c := acc.charges.get("host_wait")) is not None:
        add(
            "host_wait",
            f"the launching thread was off the CPU {human_seconds(c.seconds)} "
            f"({', '.join(f'{r} {human_seconds(v)}' for r, v in c.top())}) while the GPU had nothing queued",
            {
                **common(c),
                "by_reason": {r: round(v, 6) for r, v in c.top()},
                "stacks": _stacks(c.spans, "otelbpf.sched.blocked_ns"),
            },
        )
    if (c := acc.charges.get("host_contention")) is not None:
        runq = sorted(int(s.attrs.get("otelbpf.sched.runqueue_ns", 0)) / 1e9 for s in c.spans)
        add(
            "host_contention",
            f"the launching thread waited {human_seconds(c.seconds)} for a CPU while runnable "
            f"({_waits(c.spans)} waits, longest {runq[-1] * 1e3:.1f} ms) while the GPU had nothing queued",
            {
                **common(c),
                "median_wait_s": round(statistics.median(runq), 6),
                "max_wait_s": round(runq[-1], 6),
                "preempted": sum(1 for s in c.spans if s.attrs.get("otelbpf.sched.reason") == "preempted"),
                "span_ids": [
                    s.span_id
                    for s in sorted(c.spans, key=lambda s: -int(s.attrs.get("otelbpf.sched.runqueue_ns", 0)))[
                        :EVIDENCE_SPANS
                    ]
                ],
            },
        )


def diagnose(directory: str, partial: list[str] | None = None) -> list[Finding]:
    """Findings of every process in ``directory``, causes costliest first, NCCL stragglers among
    them. Raises ValueError on files that are not the agent's output (naming file and line).
    ``partial``: collects the lines still being written instead (summary._read)."""
    procs: dict[ProcKey, Json] = {}
    latest = load_metrics(directory, procs, partial)
    loader = SpanLoader()
    read_spans(directory, [loader], partial, procs)
    found = findings_of(loader, latest, procs, load_timelines(directory))
    nccl = read_nccl(directory)
    return sorted(found + (straggler_findings(*nccl) if nccl else []), key=_rank)


def read_nccl(directory: str) -> tuple[Collectives, Report] | None:
    """(the folder's NCCL collectives, ``otelbpf stragglers``' report over them with its
    defaults), or None without collectives (or with files the span readers already named as
    unreadable). Imported here, not at the top: the live view (live/model.py) imports this
    module in the agent, which needs no offline straggler report."""
    from otelbpf.analyze import collectives, stragglers

    try:
        data = collectives.read([directory], workers=1)
    except (collectives.ReadError, OSError):
        return None
    if not len(data):
        return None
    return data, stragglers.analyze(data, threshold_ns=STRAGGLER_THRESHOLD_NS, min_share=STRAGGLER_MIN_SHARE)


def straggler_findings(data: Collectives, report: Report) -> list[Finding]:
    """One ``nccl_straggler`` finding per persistent straggler of ``report`` (stragglers.Report
    over ``data``, collectives.Collectives): its cost is the time the other ranks waited for
    it, its share that over the job's collective window."""
    window = max(1, int(data.end.max()) - int(data.start.min())) / 1e9
    out = []
    for r in report.stragglers:
        cost = min(r.lateness_total_ms / 1e3, window)
        why = STRAGGLER_WHY.get(r.cls, "what made it late is not known (no GPU-wait or phase attributes)")
        out.append(
            Finding(
                "nccl_straggler",
                process_label({"service.name": r.service, "process.pid": r.pid}),
                round(cost, 6),
                round(cost / window, 4),
                f"rank {r.rank} on {r.host} entered {r.straggled} of its {r.collectives} NCCL collectives last, "
                f"{r.lateness_mean_ms:.1f} ms late on average: the other ranks waited {human_seconds(cost)} for it; "
                f"{r.cls}: {why}",
                {
                    "window_s": round(window, 3),
                    "rank": r.rank,
                    "host": r.host,
                    "collectives": r.collectives,
                    "late_on": r.straggled,
                    "class": r.cls,
                    "late_mean_s": round(r.lateness_mean_ms / 1e3, 6),
                    "compute_s": round(r.compute_ms / 1e3, 6),
                    "host_s": round(r.host_ms / 1e3, 6),
                    "communication_s": round(r.communication_ms / 1e3, 6),
                },
                FIXES["nccl_straggler"],
            )
        )
    return out


def findings_of(
    loader: SpanLoader, latest: Latest, procs: dict[ProcKey, Json], timelines: Mapping[int, Timeline] | None = None
) -> list[Finding]:
    """Findings of every process read (``procs``: resources from the metrics and the spans),
    causes costliest first, then the unexplained rests. ``timelines``: the CPU samples in time by
    pid (idle.load_timelines)."""
    findings: list[Finding] = []
    for key, res in procs.items():
        if key[0] == "otelbpf":
            continue
        label = process_label(res)
        findings += _process_findings(
            label,
            loader.spans.get(key, []),
            latest.get(key, {}),
            loader.off_cpu.get(key, []),
            (timelines or {}).get(int(res.get("process.pid", key[1]) or 0)),
        )
    return sorted(findings, key=_rank)


def share_text(f: Finding) -> str:
    """What a finding's share is of, in words (the module doc)."""
    if f.cause == "nccl_straggler":
        return f"{f.share:.1%} of the job's collective window"
    threads = int(f.evidence.get("cuda_threads", 1) or 1)
    window = human_seconds(float(f.evidence.get("window_s", 0.0)))
    if threads > 1:
        return f"{f.share:.1%} of its {threads} CUDA threads' time, {window} each"
    return f"{f.share:.1%} of its traced window, {window}"


def headline(f: Finding) -> str:
    """A finding's first line: cause, process, cost and share."""
    return f"{f.cause}: {f.process}: ~{human_seconds(f.cost_s)} ({share_text(f)})"


def verdict(findings: Sequence[Finding]) -> str:
    """What costs most and its fix's first sentence, in one line (the report's first): the
    costliest cause, or, when no cause was found, the unexplained rest or that none was."""
    if not findings:
        return f"no cause of GPU idle time above {MIN_SHARE:.0%} of a process's traced window"
    top = findings[0]
    fix = top.fix.split(": ", 1)[0] if top.cause == "unexplained" else top.fix.split(". ", 1)[0].rstrip(".")
    return f"costs most: {headline(top)}. Fix: {fix}."


def write_report(findings: list[Finding], out: TextIO, as_json: bool = False) -> None:
    if as_json:
        json.dump([asdict(f) for f in findings], out, indent=1)
        out.write("\n")
        return
    if not findings:
        out.write(f"no cause of GPU idle time above {MIN_SHARE:.0%} of a process's traced window\n")
        return
    for i, f in enumerate(findings, 1):
        out.write(f"{i}. {headline(f)}\n")
        out.write(f"   {f.summary}\n")
        out.write(f"   cost: {COSTS[f.cause]}\n")
        evidence = {k: v for k, v in f.evidence.items() if k != "span_ids"}
        out.write(f"   evidence: {json.dumps(evidence, sort_keys=True)}\n")
        if f.evidence.get("span_ids"):
            out.write(f"   spans: {', '.join(f.evidence['span_ids'])}\n")
        out.write(f"   fix: {f.fix}\n")
    accounts: dict[str, dict[str, Any]] = {}
    for f in findings:
        if "idle" in f.evidence:
            accounts.setdefault(f.process, f.evidence["idle"])
    if accounts:
        out.write("\nwhere the idle time went (docs/gpu-idle.md):\n")
    for process, idle in accounts.items():
        out.write(
            f"  {process}: the GPU had nothing queued for {human_seconds(idle['idle_budget_s'])} ({idle['gaps']} gaps "
            "after a "
            f"synchronize, and time in copies and allocations): {human_seconds(idle['charged_s'])} charged to causes, "
            f"{human_seconds(idle['unexplained_s'])} unexplained"
            + (
                f"; {idle['open_gaps']} gap{'s' if idle['open_gaps'] != 1 else ''} the trace ended in (the process "
                "exited, or the trace stopped, before its next call): not charged, its length is not known"
                if idle.get("open_gaps")
                else ""
            )
            + "\n"
        )


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
