"""Which request a thread was serving at a given moment: the parent of what it did.

A synchronous server reads a request, works on it (downstream calls, CUDA)
and writes the response on one thread, then takes the next request. So every
span a thread produces between a server span's request-in and response-out
is that server span's child, and the time sequence partitions a thread that
serves requests one after another.

Thread pools handing work to other threads, and event loops (asyncio, gRPC's
completion queues) serving several requests on one thread, break that
assumption. What can be detected is detected: when a thread has more than one
request open at a moment, a lookup at that moment answers "no parent" (and is
counted) rather than picking one; the requests involved are marked.

Work handed to another thread is followed by wake-ups (``woken``, ``handed``): a
thread with no request of its own, last woken by a thread of its process that
was then serving exactly one request R, still open when the woken thread acts,
works for R (the pool worker a request handler submitted to). When the waker
served none, the waker's own waker at that time is asked the same (one hop:
handler -> dispatcher -> worker). A waker with several requests open (an event
loop) gives no parent: that is a step serving many, linked below. A wake-up is
evidence, not proof (a lock hand-off such as Python's GIL, or an interrupt, can
name another thread): the kernel keeps, per thread, the wake-up that ended its
longest wait since it last handed a result back (bpf/common.h), the waker must
still be serving R alone at the act, and every span says how it was tied.

Instead, what has no single parent is linked: ``in_flight`` answers every request
of the process open at that moment, on any thread, so a CUDA call made by an
event loop's step or a batching engine's loop (which serves every request in
its batch at once) gets an OTel span link to each, rather than an invented
parent. At most ``MAX_LINKS``, the most recent first.

Inside a request, finer scopes of work nest (a torch operator, the operators it calls):
``scope`` records one, closed, and a lookup inside it answers the innermost scope before
any request, so request -> operator -> CUDA call nests. Scopes on one thread nest
properly (they come from a call stack), so the innermost is the latest-starting one.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass

from opentelemetry.trace import SpanContext

#: Closed intervals are kept this long (in event time) for late lookups:
#: another ring's events may be processed a little after the request ended.
RETENTION_NS = 30 * 10**9
#: ... and at most this many per thread (the most recent): a thread serving 20k requests/s
#: would otherwise hold 600k intervals. Lookups further back find no parent.
MAX_PER_THREAD = 1 << 16
#: A lookup inspects at most this many closed intervals before the time asked.
_SCAN = 64
#: Requests in flight a span is linked to, at most (the most recently started).
MAX_LINKS = 32
#: Wake-ups kept per thread (the latest): a lookup wants the last one before an event
#: processed a few drains late.
MAX_WAKES = 64


@dataclass(frozen=True, slots=True)
class Wake:
    """Thread ``waker`` woke a thread at ``ts_ns``; ``hop`` (0: none) had last woken ``waker``
    at ``hop_ts_ns`` (bpf/common.h: struct handoff)."""

    ts_ns: int
    waker: int
    hop: int = 0
    hop_ts_ns: int = 0


@dataclass(slots=True, eq=False)
class Interval:
    """One server span on one thread: request-in .. response-out (None while open).
    Compared and hashed by identity: it is one request."""

    start_ns: int
    context: SpanContext
    end_ns: int | None = None
    concurrent: bool = False  # another request was open on the thread meanwhile

    def contains(self, ts_ns: int) -> bool:
        return self.start_ns <= ts_ns and (self.end_ns is None or ts_ns <= self.end_ns)


class _Thread:
    def __init__(self) -> None:
        self.starts: list[int] = []
        self.intervals: list[Interval] = []
        #: Open intervals in the order they opened (a dict: closing one is not a scan of the others).
        self.open: dict[Interval, None] = {}
        self.prune_at = 0  # event time of the next prune: removing from a list's front moves all of it
        #: Closed nested scopes (``Causality.scope``), by start.
        self.scope_starts: list[int] = []
        self.scopes: list[tuple[int, int, SpanContext]] = []
        #: Its last wake-ups by other threads of its process, by time (``Causality.woken``).
        self.wake_times: list[int] = []
        self.wakes: list[Wake] = []


class Causality:
    """Per-(pid, tid) intervals of server spans, queried by (pid, tid, time)."""

    def __init__(self, retention_ns: int = RETENTION_NS) -> None:
        self._retention = retention_ns
        self._threads: dict[tuple[int, int], _Thread] = {}
        #: Every thread's intervals of a process together (by pid), for ``in_flight``.
        self._procs: dict[int, _Thread] = {}
        self._lock = threading.Lock()
        #: Lookups that found several open requests and so gave no parent.
        self.ambiguous_lookups = 0
        self._opens = 0

    def open(self, pid: int, tid: int, start_ns: int, context: SpanContext) -> Interval:
        """A server span began on this thread; close the returned interval when it ends."""
        interval = Interval(start_ns, context)
        with self._lock:
            self._opens += 1
            if self._opens % 4096 == 0:
                self._sweep(start_ns)
            t = self._threads.get((pid, tid))
            if t is None:
                t = self._threads[(pid, tid)] = _Thread()
            self._prune(t, start_ns)
            if t.open:
                # Once two are open every open interval is marked: only a lone one can be unmarked
                # (the first), so an event loop's many open requests are not all visited per request.
                next(iter(t.open)).concurrent = interval.concurrent = True
            for rec in (t, self._process(pid, start_ns)):
                rec.open[interval] = None
                i = bisect.bisect_right(rec.starts, start_ns)
                rec.starts.insert(i, start_ns)
                rec.intervals.insert(i, interval)
        return interval

    def _process(self, pid: int, now_ns: int) -> _Thread:
        p = self._procs.get(pid)
        if p is None:
            p = self._procs[pid] = _Thread()
        self._prune(p, now_ns)
        return p

    def close(self, pid: int, tid: int, interval: Interval, end_ns: int) -> None:
        with self._lock:
            interval.end_ns = end_ns if end_ns > interval.start_ns else interval.start_ns
            for rec in (self._threads.get((pid, tid)), self._procs.get(pid)):
                if rec is not None:
                    rec.open.pop(interval, None)

    def scope(self, pid: int, tid: int, start_ns: int, end_ns: int, context: SpanContext) -> None:
        """A finished scope of work on this thread (a torch operator): what the thread did
        inside it is its child, before any request it served."""
        with self._lock:
            t = self._threads.get((pid, tid))
            if t is None:
                t = self._threads[(pid, tid)] = _Thread()
            self._prune(t, start_ns)
            i = bisect.bisect_right(t.scope_starts, start_ns)
            t.scope_starts.insert(i, start_ns)
            t.scopes.insert(i, (start_ns, end_ns, context))

    def parent(self, pid: int, tid: int, ts_ns: int) -> SpanContext | None:
        """The innermost scope around ``ts_ns`` on (pid, tid), else the server span open
        then, if exactly one was."""
        with self._lock:
            t = self._threads.get((pid, tid))
            if t is None:
                return None
            i = bisect.bisect_right(t.scope_starts, ts_ns)
            for start, end, context in reversed(t.scopes[max(0, i - _SCAN) : i]):
                if start <= ts_ns <= end:
                    return context
            hits = self._open_at(t, ts_ns)
            return hits[0].context if len(hits) == 1 else None

    def _open_at(self, t: _Thread, ts_ns: int) -> list[Interval]:
        """The requests thread ``t`` had open at ``ts_ns``; several are counted and marked."""
        hits = [iv for iv in t.open if iv.contains(ts_ns)]
        i = bisect.bisect_right(t.starts, ts_ns)
        for iv in reversed(t.intervals[max(0, i - _SCAN) : i]):
            if iv.end_ns is not None and iv.contains(ts_ns):
                hits.append(iv)
        if len(hits) > 1:
            self.ambiguous_lookups += 1
            for iv in hits:
                iv.concurrent = True
        return hits

    def woken(self, pid: int, tid: int, wake: Wake) -> None:
        """Thread (pid, tid) was woken by another thread of its process (an EV_HANDOFF)."""
        with self._lock:
            t = self._threads.get((pid, tid))
            if t is None:
                t = self._threads[(pid, tid)] = _Thread()
            i = bisect.bisect_right(t.wake_times, wake.ts_ns)
            t.wake_times.insert(i, wake.ts_ns)
            t.wakes.insert(i, wake)
            if len(t.wakes) > MAX_WAKES:
                del t.wake_times[0], t.wakes[0]

    def handed(self, pid: int, tid: int, ts_ns: int) -> SpanContext | None:
        """The request that handed (pid, tid) what it did at ``ts_ns``: asked where ``parent``
        gave none. The wake-up that handed the thread its work (the last one reported before
        ``ts_ns``: the kernel keeps the one that ended its wait for work, not a lock's) names
        the one request its waker was serving then, or, when the waker served none, its own
        waker's (one hop). The waker must still be serving that request alone at ``ts_ns``: a
        waker that serves several meanwhile (an event loop that read more requests, whose work
        a batching thread serves together) gives no parent rather than a guess."""
        with self._lock:
            t = self._threads.get((pid, tid))
            if t is None or not t.wakes:
                return None
            i = bisect.bisect_right(t.wake_times, ts_ns)
            found = self._handed_by(pid, t.wakes[i - 1]) if i else None
            if found is None:
                return None
            iv, waker = found
            return iv.context if self._open_at(waker, ts_ns) == [iv] else None

    def _handed_by(self, pid: int, wake: Wake) -> tuple[Interval, _Thread] | None:
        """The one request the waker (else its own waker) had open at the wake-up, and that
        thread; None when it had none, or several."""
        for waker, at in ((wake.waker, wake.ts_ns), (wake.hop, wake.hop_ts_ns)):
            w = self._threads.get((pid, waker)) if waker else None
            if w is None:
                continue
            hits = self._open_at(w, at)
            if len(hits) > 1:
                return None
            if hits:
                return hits[0], w
        return None

    def in_flight(self, pid: int, tid: int, ts_ns: int) -> list[SpanContext]:
        """The requests of process ``pid`` open at ``ts_ns`` on any thread (what a step that serves
        many at once serves), the most recent first, at most MAX_LINKS: the links of what (pid,
        tid) did then, asked where ``parent`` gave none. ``tid`` is not used to choose: a batching
        thread serves requests other threads read."""
        with self._lock:
            p = self._procs.get(pid)
            if p is None:
                return []
            hits = []
            for iv in reversed(p.open):  # newest first; an event loop may hold thousands
                if iv.contains(ts_ns):
                    hits.append(iv)
                    if len(hits) == MAX_LINKS:
                        break
            i = bisect.bisect_right(p.starts, ts_ns)
            for iv in reversed(p.intervals[max(0, i - _SCAN) : i]):
                if len(hits) >= MAX_LINKS:
                    break
                if iv.end_ns is not None and iv.contains(ts_ns):
                    hits.append(iv)
        return [iv.context for iv in hits]

    def forget_process(self, pid: int) -> None:
        with self._lock:
            for key in [k for k in self._threads if k[0] == pid]:
                del self._threads[key]
            self._procs.pop(pid, None)

    def _sweep(self, now_ns: int) -> None:
        """Forget threads with nothing open and nothing recent (thread-per-connection servers make many)."""
        for key, t in list(self._threads.items()):
            self._prune(t, now_ns)
            if not t.open and not t.intervals and not t.scopes and not t.wakes:
                del self._threads[key]
        for pid, p in list(self._procs.items()):
            self._prune(p, now_ns)
            if not p.open and not p.intervals:
                del self._procs[pid]

    def _prune(self, t: _Thread, now_ns: int) -> None:
        """Drop intervals that ended before the retention window, a few times per window (each
        prune costs the list's length, so pruning at every open would cost that per request),
        and the oldest beyond MAX_PER_THREAD."""
        if now_ns < t.prune_at and max(len(t.intervals), len(t.scopes)) <= MAX_PER_THREAD + MAX_PER_THREAD // 4:
            return
        t.prune_at = now_ns + self._retention // 4
        horizon = now_ns - self._retention
        gone = max(bisect.bisect_left(t.scope_starts, horizon), len(t.scopes) - MAX_PER_THREAD)
        if gone > 0:
            del t.scope_starts[:gone]
            del t.scopes[:gone]
        stale = bisect.bisect_left(t.wake_times, horizon)
        if stale:
            del t.wake_times[:stale]
            del t.wakes[:stale]
        old = bisect.bisect_left(t.starts, horizon)  # started before the window: ended too, mostly
        keep = [iv for iv in t.intervals[:old] if iv.end_ns is None or iv.end_ns >= horizon]
        t.intervals[:old] = keep
        t.starts[:old] = [iv.start_ns for iv in keep]
        extra = len(t.intervals) - MAX_PER_THREAD
        if extra > 0:
            del t.starts[:extra]
            del t.intervals[:extra]
