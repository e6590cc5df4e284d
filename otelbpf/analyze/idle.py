"""Where the GPU's idle seconds went: every one charged once, to what the launching thread was doing.

The model (docs/gpu-idle.md). The host keeps a GPU busy by keeping work queued on it. Seen from
the host, a launching thread's GPU has nothing queued from the moment a synchronize (or a
blocking copy, which synchronizes too) returns until the thread issues its next CUDA call: the
queue was drained, and nothing new arrives. Those *gaps* are the idle budget, per launching
thread. Each nanosecond of a gap is charged to exactly one cause, by what the thread was doing:

1. inside a CUDA call that keeps the GPU idle (a device allocation or free in the gap): the
   call's own cause (``memory_churn``);
2. off the CPU (the ``sched`` receiver's ``off_cpu`` spans: one per interval above its span
   threshold, the shorter ones summed per thread and window in the kernel), by reason: file or
   block I/O -> ``blocking_io``; a futex, pipe, socket or poll -> ``input_starvation``;
   runnable but waiting for a CPU -> ``host_contention``; a sleep or another wait ->
   ``host_wait``;
3. on the CPU in a gap of at least ``SHORT_GAP_NS``: the code the CPU samples taken in the gap
   show (their innermost Python frame, else their native leaf) -> ``host_code``, one finding per
   function. A sample stands for one sampling period of CPU time (the usual estimate); the
   estimates are pooled per thread over all its gaps (a 14 ms gap gets one or two samples at
   99 Hz: per gap the estimate is noise, pooled it is unbiased) and scaled down if they exceed
   the on-CPU time they estimate;
4. on the CPU in a gap shorter than ``SHORT_GAP_NS`` after a call that drained a short queue:
   the cost of draining the queue itself, to the call that drained it (``sync_storm`` after a
   synchronize that waited at most ``SHORT_GAP_NS``: a layer's work, not a step's;
   ``pageable_copies`` or ``blocking_reads`` after such a copy). A short gap after a synchronize
   that waited for a step's work is what the host did next (a log line written and fsync'd),
   charged as in 3 and 5: it is no turnaround of a storm;
5. what is left is ``unexplained``, never dropped, with what could not be seen: off-CPU time
   without the sched receiver, on-CPU time without CPU samples (profiling off, or a process the
   profiler's timeline did not cover), on-CPU time not sampled. The CPU samples of the
   process's *other* threads taken in the gaps are kept beside it (``Account.others``): a data
   loader or a Python side thread the launching thread waited for, while the sched receiver is
   off, is named there.

The time spent *inside* pageable copies and small blocking reads is idle time too (the GPU
waits on a staged copy, or drains for a few bytes): charged to those causes as before, it lies
outside every gap (a gap starts when such a call returns), so nothing is charged twice. A gap
with no next call (the process exited, or the trace ends mid-gap) is not charged: it is counted
as ``open_gaps``. A gap ends at the next call the agent *saw*: launches are spans only with the
cuda receiver's ``launch_sample_every``, so by default a step's launches fall inside the gap
that ends at its copy or synchronize (docs/gpu-idle.md: what this cannot see).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

#: A gap shorter than this is the queue's draining cost: the host turned around at once.
SHORT_GAP_NS = 1_000_000

SYNCS = frozenset(
    {
        "cudaStreamSynchronize",
        "cudaStreamSynchronize_ptsz",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cuStreamSynchronize",
        "cuStreamSynchronize_ptsz",
        "cuCtxSynchronize",
        "cuEventSynchronize",
    }
)
ALLOCS = frozenset(
    {
        "cudaMalloc",
        "cudaFree",
        "cudaMallocAsync",
        "cudaFreeAsync",
        "cuMemAlloc_v2",
        "cuMemFree_v2",
        "cuMemAllocAsync",
        "cuMemFreeAsync",
    }
)
SMALL_READ = 64 << 10
INPUT_WAITS = frozenset({"futex", "pipe", "socket", "poll"})
#: The device a CUDA call was made for (the thread's current device: cudaSetDevice, or its
#: context's), where the span carries it. The budget is per (thread, device): absent, one
#: device per thread, as before.
DEVICE_ATTR = "cuda.device.id"


def device_of(s: SpanLike) -> object:
    """The call's device (``DEVICE_ATTR``), None where not known."""
    return s.attrs.get(DEVICE_ATTR)


class SpanLike(Protocol):
    """What the accounting reads of a CUDA or off-CPU span (diagnose._Span)."""

    @property
    def name(self) -> str: ...
    @property
    def start(self) -> int: ...
    @property
    def end(self) -> int: ...
    @property
    def tid(self) -> int: ...
    @property
    def attrs(self) -> Mapping[str, Any]: ...
    @property
    def span_id(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Where:
    """The code a CPU sample was in: its innermost Python frame (if any) and its native leaf."""

    function: str
    file: str = ""
    line: int = 0
    native: str = ""

    @property
    def key(self) -> str:
        """One finding per function: "tokenize (job.py)"; the line is the evidence's."""
        return f"{self.function} ({self.file.rsplit('/', 1)[-1]})" if self.file else self.function

    def label(self) -> str:
        base = f"{self.function} ({self.file.rsplit('/', 1)[-1]}:{self.line})" if self.file else self.function
        return f"{base} -> {self.native}" if self.native and self.file else base


@dataclass
class Timeline:
    """One process's CPU samples in time, per thread: (wall-clock time ns, count, index into
    ``stacks``), sorted by time. ``covered``: the intervals the profiler read (a gap outside
    them was not sampled at all: profiling off, or not yet started)."""

    period_ns: int
    bucket_ns: int = 0  # a sample's time is its bucket's start: it lies in [t, t + bucket_ns)
    stacks: list[Where] = field(default_factory=list)
    threads: dict[int, list[tuple[int, int, int]]] = field(default_factory=dict)
    covered: list[tuple[int, int]] = field(default_factory=list)

    def covers(self, start: int, end: int) -> bool:
        return any(a <= start and end <= b for a, b in self.covered)


@dataclass
class Charge:
    """One cause's share of the idle budget, with what shows it."""

    seconds: float = 0.0
    gaps: int = 0  # gaps (or calls) that contributed
    spans: list[SpanLike] = field(default_factory=list)  # the off-CPU spans or CUDA calls that show it
    by: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # reason -> s, or frame -> samples
    samples: int = 0
    #: off-CPU causes: seconds by the code the thread was sampled in during the same gaps
    beside: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def top(self, n: int | None = None) -> list[tuple[str, float]]:
        return sorted(self.by.items(), key=lambda kv: -kv[1])[:n]


@dataclass
class Account:
    """A process's idle budget and where it went (seconds)."""

    budget_s: float = 0.0  # gaps + time inside idle-making CUDA calls
    gaps: int = 0
    open_gaps: int = 0  # gaps the trace ends in (the process exited mid-gap): not charged
    charges: dict[str, Charge] = field(default_factory=lambda: defaultdict(Charge))
    code: dict[str, Charge] = field(default_factory=lambda: defaultdict(Charge))  # host_code by Where.key
    where: dict[str, Where] = field(default_factory=dict)
    unexplained_s: float = 0.0
    unseen: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # why unexplained -> s
    #: the unexplained on-CPU-or-unseen rest by the code sampled in the same gaps (its context, not its cause)
    near: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    threads: dict[int, str] = field(default_factory=dict)
    #: the CPU samples of the process's other threads taken in the gaps: (tid, Where.key) -> samples
    others: Counter[tuple[int, str]] = field(default_factory=Counter)
    period_s: float = 0.0  # the timeline's sampling period: a sample's CPU time
    carved: set[int] = field(default_factory=set)  # id() of the allocations and frees charged inside gaps

    @property
    def charged_s(self) -> float:
        return sum(c.seconds for c in self.charges.values()) + sum(c.seconds for c in self.code.values())

    def summary(self) -> dict[str, Any]:
        return {
            "idle_budget_s": round(self.budget_s, 6),
            "charged_s": round(self.charged_s, 6),
            "unexplained_s": round(self.unexplained_s, 6),
            "could_not_see": {
                k: round(v, 6) for k, v in sorted(self.unseen.items(), key=lambda kv: -kv[1]) if round(v, 6)
            },
            "gaps": self.gaps,
            "open_gaps": self.open_gaps,
        }


def launchers(spans: Iterable[SpanLike], share: float) -> set[int]:
    """The threads that issue the process's CUDA work: the busiest, and those with at least
    ``share`` of its calls."""
    calls = Counter(s.tid for s in spans)
    if not calls:
        return set()
    top = max(calls.values())
    return {tid for tid, n in calls.items() if n >= top * share}


def _drains(s: SpanLike) -> str | None:
    """The cause charged for the queue-draining cost after ``s``, if ``s`` drains the queue.
    A call that failed (``cuda.error.name``) drained nothing: it returned at once."""
    if "cuda.error.name" in s.attrs:
        return None
    if s.name in SYNCS:
        return "sync_storm"
    if "cuda.memcpy.direction" not in s.attrs:
        return None
    if s.attrs.get("cuda.memcpy.host_memory") == "pageable":
        # A blocking copy from pageable memory synchronizes the stream first; an asynchronous
        # one is staged without a device synchronize, and one to pageable memory waits for it.
        if not s.attrs.get("cuda.memcpy.async") or s.attrs.get("cuda.memcpy.direction") == "D2H":
            return "pageable_copies"
        return None
    if not s.attrs.get("cuda.memcpy.async"):
        small = s.attrs.get("cuda.memcpy.direction") == "D2H" and int(s.attrs.get("cuda.memcpy.bytes", 0)) <= SMALL_READ
        return "blocking_reads" if small else "sync_storm"
    return None


def _cause_of(reason: object) -> str:
    if reason == "io":
        return "blocking_io"
    if reason in INPUT_WAITS:
        return "input_starvation"
    return "host_wait"


def _clip(a: int, b: int, lo: int, hi: int) -> int:
    return max(0, min(b, hi) - max(a, lo))


@dataclass
class _ThreadCode:
    """One thread's pooled on-CPU time in long gaps and the samples taken in them."""

    on_cpu_ns: int = 0
    unsampled_ns: int = 0  # on-CPU time in gaps the timeline does not cover
    samples: Counter[int] = field(default_factory=Counter)  # stack index -> samples
    near: Counter[int] = field(default_factory=Counter)  # stack index -> ns not sampled in gaps where it was
    sched_on: bool = True  # off-CPU time was subtracted (else it is in on_cpu_ns, unseen)


def account(
    spans: Sequence[SpanLike],
    off_cpu: Sequence[SpanLike] | None,
    timeline: Timeline | None,
    *,
    launcher_share: float = 0.2,
    launch_ns: int = 0,
) -> Account:
    """The idle budget of one process's launching threads and each cause's share (module doc).
    ``off_cpu`` None: the sched receiver was off; ``timeline`` None: no CPU samples in time.
    ``launch_ns``: the host's launch time of a launch-bound process (diagnose: launches x 5 us
    when the GPU keeps up): the launches are no spans by default, so they lie in the gaps, and
    the gaps' on-CPU time up to it is charged to ``launch_bound`` before the samples split the
    rest (the GPU ran each tiny kernel as it came: that time is the launching, not other code)."""
    acc = Account()
    launch_left = [launch_ns]
    # per (thread, device): a device's gap runs from a drain on it to the thread's next call on
    # it; the thread's calls for its other devices inside that gap are carved out of it
    mine: dict[tuple[int, object], list[SpanLike]] = defaultdict(list)
    who = launchers(spans, launcher_share)
    for s in spans:
        if s.tid in who:
            mine[(s.tid, device_of(s))].append(s)
    devices: dict[int, set[object]] = defaultdict(set)
    for tid, dev in mine:
        devices[tid].add(dev)
    waits: dict[int, list[SpanLike]] = defaultdict(list)
    for o in off_cpu or ():
        if o.tid in who and o.attrs.get("otelbpf.sched.reason") != "cuda":
            waits[o.tid].append(o)
    if timeline is not None:
        acc.period_s = timeline.period_ns / 1e9
    gaps: list[tuple[int, int]] = []  # the sampled gaps of every launching thread
    for (tid, dev), calls in mine.items():
        calls.sort(key=lambda s: s.start)
        elsewhere = (
            sorted((s for d in devices[tid] - {dev} for s in mine[(tid, d)]), key=lambda s: s.start)
            if len(devices[tid]) > 1
            else []
        )
        ends = [n.end for n in elsewhere]  # one thread's calls do not overlap: sorted too
        mine_waits = sorted(waits.get(tid, []), key=lambda s: s.start)
        wait_ends = [w.end for w in mine_waits]  # waits of one thread do not overlap: sorted too
        if mine_waits:  # its latest name: a thread often names itself after its first waits
            acc.threads[tid] = str(mine_waits[-1].attrs.get("thread.name", ""))
        code = _ThreadCode(sched_on=off_cpu is not None)
        for i, s in enumerate(calls):
            if s.name in ALLOCS:
                continue  # in a gap: carved out of it below; outside one: the GPU had work queued
            drain = _drains(s)
            if drain is None:
                continue
            nxt = next(
                (calls[j] for j in range(i + 1, len(calls)) if calls[j].start >= s.end and calls[j].name not in ALLOCS),
                None,
            )
            if nxt is None:
                acc.open_gaps += 1
                continue
            if _gap(
                acc, code, s.end, nxt.start, drain, s, calls, i, mine_waits, wait_ends, timeline, tid, (elsewhere, ends)
            ):
                gaps.append((s.end, nxt.start))
        _charge_code(acc, code, timeline, launch_left)
    if timeline is not None and gaps:
        _other_threads(acc, timeline, gaps, who)
    for s in spans:  # time inside the CUDA calls that keep the GPU idle, wherever they are
        cause = None
        if "cuda.error.name" in s.attrs:
            continue  # it failed: nothing was copied, allocated or freed
        if s.attrs.get("cuda.memcpy.host_memory") == "pageable":
            cause = "pageable_copies"
        elif (
            s.attrs.get("cuda.memcpy.direction") == "D2H"
            and not s.attrs.get("cuda.memcpy.async")
            and int(s.attrs.get("cuda.memcpy.bytes", 0)) <= SMALL_READ
        ):
            cause = "blocking_reads"
        elif s.name in ALLOCS and id(s) not in acc.carved:
            cause = "memory_churn"
        if cause:
            c = acc.charges[cause]
            c.seconds += (s.end - s.start) / 1e9
            c.gaps += 1
            c.spans.append(s)
            acc.budget_s += (s.end - s.start) / 1e9
    return acc


def _gap(
    acc: Account,
    code: _ThreadCode,
    a: int,
    b: int,
    drain: str,
    opener: SpanLike,
    calls: list[SpanLike],
    i: int,
    waits: list[SpanLike],
    wait_ends: list[int],
    timeline: Timeline | None,
    tid: int,
    elsewhere: tuple[Sequence[SpanLike], list[int]] = ((), []),
) -> bool:
    """Charge the gap [a, b) of thread ``tid`` on one device, opened by ``opener`` (calls[i]).
    ``elsewhere``: the thread's calls for its other devices by start, and their ends: the time inside them is
    ``other_device`` (that device's work, not this one's idle cause). True if the timeline
    covers the gap (the other threads' samples in it are then its context)."""
    if b <= a:
        return False
    acc.gaps += 1
    acc.budget_s += (b - a) / 1e9
    left = b - a
    inside = 0  # in calls for another device
    others, other_ends = elsewhere
    for k in range(bisect_left(other_ends, a), len(others)):  # by index: a slice copies the rest
        n = others[k]
        if n.start >= b:
            break
        t = _clip(n.start, n.end, a, b)
        if t > 0:
            inside += t
            c = acc.charges["other_device"]
            c.by[f"device {device_of(n)}"] += t / 1e9
            if not c.spans or c.spans[-1] is not n:
                c.spans.append(n)
    if inside:
        c = acc.charges["other_device"]
        c.seconds += inside / 1e9
        c.gaps += 1
        left -= inside
    for j in range(i + 1, len(calls)):
        n = calls[j]
        if n.start >= b:
            break
        if n.name in ALLOCS and n.start >= a and "cuda.error.name" not in n.attrs:
            t = _clip(n.start, n.end, a, b)
            c = acc.charges["memory_churn"]
            c.seconds += t / 1e9
            c.gaps += 1
            c.spans.append(n)
            acc.carved.add(id(n))
            left -= t
    covered = timeline is not None and timeline.covers(a, b)
    seen: Counter[int] = Counter()
    if timeline is not None and covered:
        half = timeline.bucket_ns // 2
        rows = timeline.threads.get(tid, [])
        for k in range(bisect_left(rows, (a - half, -1, -1)), len(rows)):  # by index: a slice copies the rest
            t, count, stack = rows[k]
            if t + half >= b:
                break
            if t + half >= a:
                seen[stack] += count
    # the code the thread was seen in during this gap: the context of its off-CPU waits
    beside = timeline.stacks[seen.most_common(1)[0][0]].key if timeline is not None and seen else None
    off = 0
    for w in waits[bisect_left(wait_ends, a) :]:
        if w.start >= b:
            break
        for t, cause, reason in _off_parts(w, a, b):
            if t <= 0:
                continue
            c = acc.charges[cause]
            c.seconds += t / 1e9
            c.by[str(reason) if cause != "host_contention" else "runqueue"] += t / 1e9
            if beside:
                c.beside[beside] += t / 1e9
            if not c.spans or c.spans[-1] is not w:
                c.spans.append(w)
                c.gaps += 1
            off += t
    on_cpu = max(0, left - off)
    if b - a < SHORT_GAP_NS and (drain != "sync_storm" or opener.end - opener.start <= SHORT_GAP_NS):
        c = acc.charges[drain]
        c.seconds += on_cpu / 1e9
        c.gaps += 1
        if drain == "sync_storm":
            c.spans.append(opener)
        return covered
    if timeline is None or not covered:
        code.unsampled_ns += on_cpu
        return False
    code.on_cpu_ns += on_cpu
    code.samples.update(seen)
    if seen:
        # what the samples do not cover of this gap happened beside the code they show: the
        # context of the unexplained rest (a checkpoint's fsync, off the CPU, beside its write)
        top = seen.most_common(1)[0][0]
        code.near[top] += max(0, on_cpu - sum(seen.values()) * timeline.period_ns)
    return True


def _off_parts(w: SpanLike, a: int, b: int) -> tuple[tuple[int, str, object], ...]:
    """An off-CPU span's ns in the gap [a, b): (ns, cause, reason) for its blocked part and its
    run-queue part. One interval is blocked, then runnable: each part clipped to the gap. A
    window of short intervals summed in the kernel (``otelbpf.sched.intervals`` > 1) spans
    more than the time it holds, with the parts interleaved: each part is charged in the
    proportion of the span that lies in the gap."""
    blocked = int(w.attrs.get("otelbpf.sched.blocked_ns", 0))
    reason = w.attrs.get("otelbpf.sched.reason")
    if int(w.attrs.get("otelbpf.sched.intervals", 1)) > 1:
        length = w.end - w.start
        runq = int(w.attrs.get("otelbpf.sched.runqueue_ns", 0))
        inside = _clip(w.start, w.end, a, b) / length if length > 0 else 0.0
        return (round(blocked * inside), _cause_of(reason), reason), (round(runq * inside), "host_contention", reason)
    mid = w.start + blocked
    return (_clip(w.start, mid, a, b), _cause_of(reason), reason), (_clip(mid, w.end, a, b), "host_contention", reason)


def _other_threads(acc: Account, timeline: Timeline, gaps: list[tuple[int, int]], who: set[int]) -> None:
    """The samples of the process's other threads taken in the launching threads' sampled
    ``gaps`` (joined as the launching thread's are: a bucket by its middle), once each where
    gaps of two launching threads overlap: each row is looked up among the merged gaps, so the
    cost is the other threads' rows, not gaps x threads."""
    merged: list[tuple[int, int]] = []
    for a, b in sorted(gaps):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    starts = [a for a, _b in merged]
    half = timeline.bucket_ns // 2
    for tid, rows in timeline.threads.items():
        if tid in who:
            continue
        for t, count, stack in rows:
            i = bisect_right(starts, t + half) - 1
            if i >= 0 and t + half < merged[i][1]:
                acc.others[(tid, timeline.stacks[stack].key)] += count


def _charge_code(acc: Account, code: _ThreadCode, timeline: Timeline | None, launch_left: list[int]) -> None:
    """The pooled sampling estimate of one thread's on-CPU gap time, by code; the rest unexplained.
    ``launch_left``: the launch time still to charge to ``launch_bound`` (account's launch_ns)."""
    carve = min(launch_left[0], code.on_cpu_ns + code.unsampled_ns)
    if carve > 0:
        launch_left[0] -= carve
        c = acc.charges["launch_bound"]
        c.seconds += carve / 1e9
        c.gaps += 1
        part = min(carve, code.unsampled_ns)
        code.unsampled_ns -= part
        code.on_cpu_ns -= carve - part
    if code.unsampled_ns:
        why = (
            "on-CPU time without CPU samples (profiling off, or the process not in the profiler's timeline)"
            if code.sched_on
            else "time with neither CPU samples nor the sched receiver: on or off the CPU, doing what is not known"
        )
        acc.unseen[why] += code.unsampled_ns / 1e9
        acc.unexplained_s += code.unsampled_ns / 1e9
    if not code.on_cpu_ns:
        return
    period = timeline.period_ns if timeline else 0
    est = {stack: n * period for stack, n in code.samples.items()}
    total = sum(est.values())
    scale = min(1.0, code.on_cpu_ns / total) if total else 0.0
    charged = 0.0
    for stack, ns in est.items():
        assert timeline is not None
        where = timeline.stacks[stack]
        c = acc.code[where.key]
        c.seconds += ns * scale / 1e9
        c.samples += code.samples[stack]
        c.by[where.label()] += code.samples[stack]
        acc.where.setdefault(where.key, where)
        charged += ns * scale
    rest = (code.on_cpu_ns - charged) / 1e9
    if rest > 0:
        why = (
            "time no CPU sample shows (the thread was off the CPU, or between samples)"
            if code.sched_on
            else "time no CPU sample shows: off the CPU or between samples (the sched receiver is off)"
        )
        acc.unseen[why] += rest
        acc.unexplained_s += rest
        near = sum(code.near.values())
        for stack, ns in code.near.items() if near else ():
            assert timeline is not None
            acc.near[timeline.stacks[stack].key] += rest * ns / near


#: The most timeline bytes (decompressed) read from one folder: the profiler writes one file per
#: process and interval, bounded by its kernel map (bpf/profile.c TIME_ENTRIES).
MAX_TIMELINE_BYTES = 256 << 20


def timeline_of(docs: Iterable[Mapping[str, Any]]) -> dict[int, Timeline]:
    """Per pid, the timelines of ``docs`` (each a ``CpuTimeline.to_json()`` with its ``pid``,
    ``start_ns`` and ``end_ns``: a file the exporter wrote, or the live state's) merged: rows
    sorted, stacks numbered anew, adjacent intervals joined. A malformed document is skipped."""
    out: dict[int, Timeline] = {}
    index: dict[int, dict[Where, int]] = defaultdict(dict)
    for doc in docs:
        try:
            pid, period, bucket = int(doc["pid"]), int(doc["period_ns"]), int(doc["bucket_ns"])
            stacks = [Where(str(fn), str(file), int(line), str(native)) for fn, file, line, native in doc["stacks"]]
            rows = {int(tid): [(int(t), int(n), int(i)) for t, n, i in r] for tid, r in doc["threads"].items()}
            span = (int(doc["start_ns"]), int(doc["end_ns"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        tl = out.setdefault(pid, Timeline(period, bucket))
        ids = index[pid]
        remap = [ids.setdefault(w, len(ids)) for w in stacks]
        for tid, r in rows.items():
            tl.threads.setdefault(tid, []).extend((t, n, remap[i]) for t, n, i in r if 0 <= i < len(remap))
        tl.covered.append(span)
    for pid, tl in out.items():
        tl.stacks = list(index[pid])
        for r in tl.threads.values():
            r.sort()
        merged: list[tuple[int, int]] = []
        for a, b in sorted(tl.covered):
            if merged and a <= merged[-1][1] + tl.bucket_ns:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        tl.covered = merged
    return out


def load_timelines(directory: str) -> dict[int, Timeline]:
    """Per pid, the CPU samples in time the profiler wrote (``profiles/*.timeline.json.gz``),
    its intervals merged. Read as the other files of the folder are (``ReadDir``: regular files
    only, never through a link); a file that cannot be read is skipped (the diagnosis then says
    the gaps were not sampled): a timeline only refines the account."""
    import gzip
    import json

    from otelbpf.base.safe_files import ReadDir

    docs = []
    left = MAX_TIMELINE_BYTES
    try:
        folder = ReadDir(directory).subdir("profiles")
    except OSError:  # no profiles/ (profiling off), or it is a link (safe_files.UnsafeOutput)
        return {}
    with folder:
        for name in folder.names(lambda n: n.endswith(".timeline.json.gz")):
            if left <= 0:
                break
            try:
                with folder.open_binary(name) as raw, gzip.open(raw, "rb") as f:
                    body = f.read(left + 1)
                left -= len(body)
                docs.append(json.loads(body))
            except (OSError, ValueError, EOFError):  # OSError: UnsafeOutput too (a link, not a regular file)
                continue
    return timeline_of(d for d in docs if isinstance(d, dict))
