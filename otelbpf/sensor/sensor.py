"""The sensor: load the BPF program, keep probes attached to every matching
library, and drain the ring buffers on a timer.

Threads, each with one job:
- drain: every ``drain_interval``, or as soon as a ring is another eighth
  full (the BPF side wakes it: common.h ``ring_wake``), copies all records out
  of the event ring and the families' own rings and hands the arrays to
  ``deliver`` (which must only enqueue): family rings first, then ``events``,
  drained in the opposite order, so that a family record (a request read) that
  happened before an event (a CUDA call it caused) is never delivered after it.
  The rings are drained one after another, so one ring's batch can hold a
  record (an HTTPS call, on the TLS ring) later than what another ring was
  drained up to (the plain request it was made for, on the socket ring): so a
  tick takes its ``mark`` (CLOCK_MONOTONIC, the probes' clock) once ``events``
  is drained and before any family ring, the records of ``RingSpec.cut`` rings
  written at or after it wait for the next tick, and ``deliver(TICK, ...)`` ends
  the tick. Each tick is then a cut: every such record written before its mark,
  of every ring, delivered, none after, and every event delivered was written
  before the mark; a correlator that reads two rings merges a tick's batches by
  time;
- discovery: woken by epoll on the string ring, attaches to library files
  as processes open them and to executables as they start (and on /proc
  rescans), then resumes a process the kernel paused at that open or exec; a
  slow attach never delays draining. Attaches that fail are retried on this
  thread with back-off; only a library whose every probe is in place counts
  as attached.
Knows nothing of spans or OTLP.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import queue
import select
import signal
import subprocess
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from otelbpf.base.events import EVENT_DTYPE, STREVENT_DTYPE, Stat, StrKind
from otelbpf.base.threadname import name_os_thread
from otelbpf.sensor import compiler_memory, elf, kernel_headers, libraries, pause_guard, program, uprobe_links
from otelbpf.sensor.family import LibraryKind, MapEntries, ProbeAt, ProbeFamily, RingSpec
from otelbpf.sensor.libraries import LibraryFile
from otelbpf.sensor.program_cache import ProgramCache
from otelbpf.sensor.ringbuf import RingBufferReader, VariableRingReader

log = logging.getLogger(__name__)

Deliver = Callable[[str, np.ndarray], None]
#: Once the rings are found empty, the drain's wait grows to this many drain intervals (at the
#: default 50 ms: 0.4 s). A burst does not wait that long: the record that fills an eighth of a
#: ring wakes the drain (common.h ``ring_wake``), and the first records seen bring the interval
#: back.
IDLE_DRAIN_FACTOR = 8
EMPTY_EVENTS = np.zeros(0, dtype=EVENT_DTYPE)
#: The name ``deliver`` is called with, an empty array, after each drain tick that delivered
#: something: every ``RingSpec.cut`` ring's records written before the tick's mark are in.
TICK = "tick"
T = TypeVar("T")


class SensorError(Exception):
    """The sensor cannot run here; the message says why and what to do."""


@dataclass
class SensorOptions:
    families: list[ProbeFamily]
    pids: list[int] = field(default_factory=list)  # empty: whole host
    search_globs: list[str] = field(default_factory=list)
    drain_interval_s: float = 0.02
    events_ring_bytes: int = 8 << 20
    str_ring_bytes: int = 256 << 10  # the strevents ring (service.telemetry.string_ring_size)
    rescan_interval_s: float = 30.0  # safety net only: openat events find new libraries
    #: Stop a watched process at its first successful open of a probed
    #: library until the probes are attached (no call is missed). Only for
    #: processes the agent started itself: a stopped child confuses a shell's
    #: job control.
    pause_on_load: bool = False
    #: Host mode's pause (common.h ``PAUSE_NEW_ONLY``): stop a process at its open of a
    #: library path not known to be attached until the probes are in, at most
    #: ``max_pause_s``; a guard process (pause_guard.py) resumes it past that, or at once
    #: when the agent dies. Never at an exec, never a process that opens no probed library.
    pause_new_libraries: bool = False
    max_pause_s: float = 5.0
    #: Compiled programs kept between starts (None: compile at every start).
    program_cache: ProgramCache | None = None


@dataclass
class AttachStats:
    libraries: int = 0  # files with every probe in place
    probes: int = 0
    failures: int = 0  # failed attempts, all reasons
    last_error: str = ""
    #: reason -> count: ``symbols`` (the file's symbols could not be read), ``attach`` (one
    #: probe), ``gone`` (the file vanished before a retry: given up), ``gave_up`` (still
    #: failing after every retry), ``no_symbols`` (a stripped executable), ``runtime``
    #: (a family's run-time targets), ``discovery`` (handling a process failed).
    by_reason: Counter[str] = field(default_factory=Counter)
    retrying: int = 0  # files waiting for a retry now


@dataclass
class PauseStats:
    """Host mode's pause at load: what the agent resumed (the guard's and the kernel's own
    counts are in ``Sensor.pause_counts``)."""

    probed: int = 0  # resumed with every probe of its library in place
    unprobed: int = 0  # resumed with the attach failed (retrying): it ran unprobed
    #: the last pauses, in ns (stopped -> resumed by the agent): the bench's figures
    durations_ns: deque[int] = field(default_factory=lambda: deque(maxlen=4096))


#: Outcomes of host mode's pause counted in the kernel and by the guard (common.h PAUSE_*).
PAUSE_KERNEL_OUTCOMES = ("stopped", "untracked", "timeout", "orphaned")
#: How long the sensor's start waits for its pause guard to hold the maps before it opens
#: the gate (an interpreter start: ~0.1 s here); without it the pause stays off.
GUARD_READY_S = 10.0

#: Retry back-off: first retry after RETRY_FIRST_S, doubling up to RETRY_MAX_S, at most
#: RETRY_ATTEMPTS attempts (~6 minutes) before giving up on a file until it is seen again.
RETRY_FIRST_S = 0.1
RETRY_MAX_S = 30.0
RETRY_ATTEMPTS = 20

#: A view of string records' flag bytes (``pad`` in common.h's struct strevent):
#: pad[0] the process was paused, pad[1] a LIB_OPEN that is an exec (discovery.c).
_STR_FLAGS = np.dtype(
    {"names": ["paused", "exec"], "formats": ["u1", "u1"], "offsets": [5, 6], "itemsize": STREVENT_DTYPE.itemsize}
)


@dataclass
class _Retry:
    lib: LibraryFile
    attempts: int
    due: float
    last: float  # when the last attempt failed


class Sensor:
    def __init__(self, options: SensorOptions, deliver: Deliver, backlogged: Callable[[], bool] | None = None) -> None:
        self.options = options
        self._deliver = deliver
        #: True while what was delivered waits unprocessed past the consumer's mark: the drain
        #: loop then leaves the records in the kernel's rings (see _drain_loop).
        self._backlogged = backlogged or (lambda: False)
        self.drain_pauses = 0  # drain ticks skipped because the consumer was behind
        self.fill_wakeups = 0  # wake-ups by a ring's filling (common.h ring_wake), not the timer
        self._bpf: Any | None = None  # the loaded bcc.BPF (untyped); None before start and after stop
        self._lock = threading.Lock()  # serialises BCC object use across threads
        # Serialises ring draining: the drain thread's timer and a metrics export's
        # sync() (see Agent.sync) may both drain, and a ring reader is single-consumer.
        self._drain_lock = threading.Lock()
        self._attached: dict[tuple[int, int], LibraryFile] = {}  # every probe in place
        self._probes: set[tuple[int, int, int, str]] = set()  # (dev, inode, vaddr, program) attached
        self._retry: dict[tuple[int, int], _Retry] = {}
        self._unprobeable: set[tuple[int, int]] = set()  # stripped: nothing to retry
        self._left_alone: set[tuple[int, int]] = set()  # users_only files no library user mapped yet (said once)
        #: Host mode with a ``users_only`` library kind (LibraryKind.users_only): a process that
        #: becomes a library user has those of its libraries probed then.
        self._users_only_kinds = not options.pids and any(k.users_only for f in options.families for k in f.libraries)
        self._own_pid = os.getpid()
        self._work: queue.Queue[int | None] = queue.Queue()  # pids to rescan
        self._stop = threading.Event()
        #: the drain thread's (start() to stop()): written by stop() to end its wait in epoll at once
        self._wake_fd: int | None = None
        self._threads: list[threading.Thread] = []
        self._readers: dict[str, RingBufferReader | VariableRingReader] = {}
        #: Records of ``cut`` rings written after the last tick's mark, for the next (drain_tick).
        self._held: dict[str, np.ndarray] = {}
        self._skipped: dict[str, int] = {}
        self.attach_stats = AttachStats()
        self.compile_seconds = 0.0
        self.programs_cached = False  # loaded from the program cache, not compiled
        self.attach_seconds = 0.0
        self.records_received = {"events": 0, "strevents": 0}
        self.records_received.update({r.name: 0 for f in options.families for r in f.rings})
        #: Called on the discovery thread when a process opens a probed
        #: library or execs, before a paused process is resumed: the moment it is
        #: certainly alive, to read what /proc says about it. The second argument
        #: is the exec's CLOCK_MONOTONIC time for an exec report (what was read of
        #: the pid before it described the program it replaced), else None.
        self.on_process: Callable[[int, int | None], None] | None = None
        #: the process releasing the probes after stop() (detach_in_background), if any
        self.detacher_pid: int | None = None
        self._final: dict[str, MapEntries] = {}
        self._final_stats: dict[str, int] = {}
        self._final_rings: list[tuple[str, int, int]] = []
        #: host mode's pause: on when asked for and not ``run --``'s (which stops at every open)
        self._host_pause = options.pause_new_libraries and not options.pause_on_load
        self._pause_guard: pause_guard.PauseGuard | None = None
        #: uprobes as uprobe-multi links (set at start where the kernel has them), else None:
        #: BCC's perf events
        self._links: uprobe_links.Links | None = None
        self.pause_stats = PauseStats()
        self._final_pause_counts: dict[str, int] = {}

    # -- life cycle -------------------------------------------------------

    def start(self) -> None:
        # Named as the agent's other threads while it reads and attaches libraries: an agent
        # is never stopped at a library open (common.h agent_thread), its own nor another's.
        with _thread_named("otelbpf-start"):
            self._start()

    def _start(self) -> None:
        if (note := kernel_headers.fallback()) is not None:  # a node image without headers
            log.warning("%s", note)
        text, cflags = program.build(
            self.options.families,
            filter_pids=bool(self.options.pids),
            pause_on_load=self.options.pause_on_load,
            pause_new_only=self._host_pause,
            events_ring_bytes=self.options.events_ring_bytes,
            str_ring_bytes=self.options.str_ring_bytes,
        )
        self._links = uprobe_links.Links() if uprobe_links.supported() else None
        t0 = time.monotonic()
        try:
            self._bpf = bpf = program.load(
                text, cflags, self.options.families, self.options.program_cache, uprobe_multi=self._links is not None
            )
        except Exception as exc:
            raise SensorError(
                f"could not compile/load the BPF program: {exc}. Run `otelbpf doctor` to see what this host lacks."
            ) from exc
        self.compile_seconds = time.monotonic() - t0
        self.programs_cached = bool(getattr(bpf, "from_cache", False))  # a CachedBPF
        watched = bpf["watched"]
        for pid in self.options.pids:
            watched[watched.Key(pid)] = watched.Leaf(1)
        if self.options.pause_on_load:
            self.update_map("pause_gate", [(0, 1)])  # closed again first thing in stop()
        if self._host_pause:  # the guard first: the gate opens once it holds the maps (below)
            gate, paused, counts = (int(bpf[m].map_fd) for m in ("pause_gate", "paused", "pause_stats"))
            self._pause_guard = pause_guard.PauseGuard(gate, paused, counts, self.options.max_pause_s)
        self._readers = {
            "events": RingBufferReader(bpf["events"].map_fd, self.options.events_ring_bytes, EVENT_DTYPE),
            "strevents": RingBufferReader(bpf["strevents"].map_fd, self.options.str_ring_bytes, STREVENT_DTYPE),
        }
        for ring in self._family_rings():
            reader = VariableRingReader if ring.variable else RingBufferReader
            self._readers[ring.name] = reader(bpf[ring.name].map_fd, ring.size_bytes, ring.dtype)
        t0 = time.monotonic()
        for lib in libraries.from_globs(self.options.search_globs, self.options.families):
            self._attach(lib)
        self._rescan()
        for fam in self.options.families:
            if fam.on_load is not None:
                with self._lock:
                    try:
                        fam.on_load(bpf)
                    except Exception as exc:
                        raise SensorError(f"{fam.name}: {exc}") from exc
        self.attach_seconds = time.monotonic() - t0
        compiler_memory.release(bpf)  # the compile's memory: nothing compiles again
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        for target, name in ((self._drain_loop, "otelbpf-drain"), (self._discovery_loop, "otelbpf-discovery")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        if self._pause_guard is not None:
            if self._pause_guard.ready(GUARD_READY_S):
                self.update_map("pause_gate", [(0, 1)])  # closed again first thing in stop()
            else:
                log.warning("the pause guard did not start: a library opened from now on runs unprobed until attached")

    def stop(self) -> None:
        """Detach every probe, deliver what is left, keep the final counts.

        Order matters: probes go first so nothing fires after the last drain;
        the counting maps are snapshotted before the program is unloaded so a
        final metrics export still sees them.
        """
        self._stop.set()
        if self.options.pause_on_load or self._pause_guard is not None:
            self.update_map("pause_gate", [(0, 0)])  # nothing is resumed from here on
        if self._wake_fd is not None:
            os.eventfd_write(self._wake_fd, 1)
        self._work.put(None)
        for t in self._threads:
            t.join(timeout=10)
        self._threads.clear()
        if self._pause_guard is not None:
            self._pause_guard.close()  # it resumes what is still stopped, then exits
        if self._wake_fd is not None:
            os.close(self._wake_fd)
            self._wake_fd = None
        if self._bpf is None:
            return
        with self._lock:
            if self._links is not None:
                self._links.close_all()  # quick: the kernel defers their grace periods
            if os.environ.get("OTELBPF_DETACH", "background") == "wait":
                # In parallel: each detach waits out an RCU grace period in the kernel under a
                # global mutex (~0.1 s per uprobe on this VM, more under load): hundreds of
                # probes take a minute, whatever the threads.
                with ThreadPoolExecutor(16, thread_name_prefix="otelbpf-detach") as pool:
                    list(pool.map(self._bpf.detach_uprobe_event, list(self._bpf.uprobe_fds)))
                    list(pool.map(self._bpf.detach_tracepoint, list(self._bpf.tracepoint_fds)))
            else:
                self.detacher_pid = detach_in_background(self._bpf)
                if self.detacher_pid is None:  # could not start it: in place, as slow as it is
                    for name in list(self._bpf.uprobe_fds):
                        self._bpf.detach_uprobe_event(name)
                    for name in list(self._bpf.tracepoint_fds):
                        self._bpf.detach_tracepoint(name)
        self.drain_once("strevents")
        self.drain_tick(hold=False)
        for fam in self.options.families:
            if fam.on_unload is not None:
                with self._lock:
                    try:
                        fam.on_unload(self._bpf)
                    except Exception:  # one family's final read must not lose the others'
                        log.exception("%s: final read failed", fam.name)
        final = {name: self.read_map(name) for name in self._counting_maps()}
        final_stats = self.kernel_stats()
        self._final_pause_counts = self.pause_counts()
        self._final, self._final_stats = final, final_stats
        self._skipped = self.records_skipped()  # kept for the final export
        with self._drain_lock:
            self._final_rings = [(name, r.size, r.take_peak()) for name, r in sorted(self._readers.items())]
            for r in self._readers.values():
                r.close()
            self._readers.clear()
        with self._lock:
            self._bpf.cleanup()
            self._bpf = None

    def _family_rings(self) -> list[RingSpec]:
        return [ring for fam in self.options.families for ring in fam.rings]

    def _counting_maps(self) -> list[str]:
        """Hash maps the families count into (kept readable after stop)."""
        return [name for fam in self.options.families for name in fam.counting_maps]

    def watch_pid(self, pid: int) -> None:
        """Add a process to the in-kernel filter (its children follow)."""
        with self._lock:
            if self._bpf is None:
                return
            watched = self._bpf["watched"]
            watched[watched.Key(pid)] = watched.Leaf(1)
        self._work.put(pid)

    @property
    def stopping(self) -> bool:
        """stop() has begun: probes are going or gone, the final drain is its own."""
        return self._stop.is_set()

    # -- draining ---------------------------------------------------------

    def records_skipped(self) -> dict[str, int]:
        """Records each ring's reader skipped: discarded by their producer, or malformed."""
        if not self._readers:
            return dict(self._skipped)
        return {name: reader.discarded for name, reader in self._readers.items()}

    def drain_once(self, ring: str = "events") -> int:
        reader = self._readers[ring]
        if not reader.pending_bytes():
            return 0  # two reads of mapped memory: an idle tick costs no more
        arr = reader.drain()
        n = len(arr)
        if n:
            self.records_received[ring] += n
            if ring == "strevents":
                arr = self._handle_strings(arr)
            if len(arr):
                self._deliver(ring, arr)
        return n

    def drain_tick(self, hold: bool = True) -> int:
        """One timer tick: ``events`` drained first and delivered last, ``cut`` rings' records
        written from the mark on held for the next tick (see the module doc); ``hold`` False:
        none held (the final drain). The records drained and delivered (held ones too).

        Returns 0 once the sensor is stopped and its rings are closed."""
        with self._drain_lock:
            if "events" not in self._readers:
                return 0
            reader = self._readers["events"]
            events = reader.drain() if reader.pending_bytes() else EMPTY_EVENTS
            # after the events: what they parent on (a request read) or end (an exit ends what
            # its process did) was written before them, so before the mark, and is delivered
            mark = time.monotonic_ns() if hold else None
            n = len(events)
            for ring in self._family_rings():
                n += self._drain_ring(ring, mark) if ring.cut else self.drain_once(ring.name)
            if len(events):
                self.records_received["events"] += len(events)
                self._deliver("events", events)
            if n:
                self._deliver(TICK, EMPTY_EVENTS)
            return n

    def _drain_ring(self, ring: RingSpec, mark: int | None) -> int:
        """Drain a ``cut`` ring: deliver what the last tick held and what was written before
        ``mark`` (a record is written at its call's end: ``ts_ns + duration_ns``), hold the rest
        (at most one tick: a held record is delivered next time whatever its time)."""
        reader = self._readers[ring.name]
        held = self._held.pop(ring.name, None)
        arr = reader.drain() if reader.pending_bytes() else None
        n = 0
        if arr is not None and len(arr):
            n = len(arr)
            self.records_received[ring.name] += n
            if mark is not None:
                later = (arr["ts_ns"] + arr["duration_ns"]) >= mark
                if later.any():
                    self._held[ring.name] = arr[later]
                    arr = arr[~later]
        if held is not None:
            arr = held if arr is None or not len(arr) else np.concatenate((held, arr))
            n += len(held)
        if arr is not None and len(arr):
            self._deliver(ring.name, arr)
        return n

    def _drain_loop(self) -> None:
        """Every ``drain_interval`` while records come, unless the consumer is backlogged;
        after a tick that found every ring empty the wait doubles, up to IDLE_DRAIN_FACTOR
        intervals, and the first record brings it back. Idle, the wake-ups were most of this
        thread's cost (0.4% of a core at 50 ms).

        The wait is in epoll, edge-triggered, on the drained rings: the BPF side wakes it
        only when a record fills another eighth of a ring (common.h ``ring_wake``), so a
        burst is drained then instead of at the timer's next tick, and a ring need not hold
        what a burst writes in the longest wait. stop() ends the wait through an eventfd."""
        name_os_thread("otelbpf-drain")
        base = self.options.drain_interval_s
        longest = base * IDLE_DRAIN_FACTOR
        interval = base
        poller = select.epoll()
        try:
            if self._wake_fd is not None:  # made by start()
                poller.register(self._wake_fd, select.EPOLLIN)
            for name, reader in self._readers.items():
                if name != "strevents":  # the discovery thread waits on that one
                    poller.register(reader.map_fd, select.EPOLLIN | select.EPOLLET)
            poller.poll(0)  # a ring holding records already is reported once: no wake-up, the timer drains it
            while True:
                woken = poller.poll(interval)
                if self._stop.is_set():
                    return
                self.fill_wakeups += bool(woken)
                if self._backlogged():
                    # The processing thread is behind: records wait in the kernel's rings, which
                    # are resident anyway, rather than as copies in the agent's heap (a second
                    # buffer of up to processing_queue_size). A full ring drops and counts in the
                    # kernel; a forced drain (sync, stop) still takes everything.
                    self.drain_pauses += 1
                    interval = base
                    continue
                try:
                    n = self.drain_tick()
                except Exception:  # keep draining whatever one batch did
                    log.exception("drain failed")
                    n = 1
                interval = base if n else min(interval * 2, longest)
        finally:
            poller.close()

    def _handle_strings(self, arr: np.ndarray) -> np.ndarray:
        """Attach to libraries just opened and executables just started; resume
        processes paused for it. Returns the records for the correlators: exec
        reports are the sensor's own (a process's exec is on the events ring)."""
        opens = arr["kind"] == StrKind.LIB_OPEN
        execs = opens & (np.ascontiguousarray(arr).view(_STR_FLAGS)["exec"] == 1)
        for rec, is_exec in zip(arr[opens], execs[opens]):
            pid = int(rec["pid"])
            if pid == self._own_pid:
                continue  # the agent reading a library: no news, and each failed read would report another
            lib: LibraryFile | None = None
            try:
                path = rec["s"].split(b"\0", 1)[0].decode(errors="replace")
                if is_exec:
                    lib = libraries.executable(pid, self.options.families, path)
                else:
                    lib = libraries.in_process(pid, path, self.options.families)
                if lib is not None:
                    if self._wanted(lib, self._is_library_user(pid)):
                        self._attach(lib)
                    if self._users_only_kinds and self._kind(lib).marks_user:
                        self._attach_users_only(pid)  # it just became a library user
                if self.on_process is not None:
                    self.on_process(pid, int(rec["a0"]) if is_exec else None)
            except Exception as exc:
                self._count("discovery", f"pid {pid}: {exc}")
            finally:
                if rec["paused"]:
                    self._resume_open(pid, bytes(rec["s"]), lib)
        for fam in self.options.families:
            if fam.runtime is None:
                continue
            mine = arr[np.isin(arr["kind"], fam.runtime.kinds)]
            if not len(mine):
                continue
            try:
                fam.runtime.handle(mine, self)
            except Exception as exc:
                self._count("runtime", f"{fam.name}: {exc}")
            finally:
                for pid in np.unique(mine["pid"][mine["paused"] != 0]).tolist():
                    if self._host_pause:  # an RDMA context (ibverbs.c): out of `paused` first
                        self.with_bpf(functools.partial(_take_paused, pid=pid))
                    self._resume(pid)
        rest: np.ndarray = arr[~execs]
        return rest

    def _resume_open(self, pid: int, path: bytes, lib: LibraryFile | None) -> None:
        """Resume a process stopped at a library open. In host mode, first take it out of
        ``paused`` (so the guard does not), count whether its library is probed, and tell
        the kernel that (cgroup, path) is known: its next opens stop nothing. Resumed whatever ``paused``
        says: a second thread's stop may follow the entry the first one's record took."""
        try:
            if self._host_pause:
                at = self.with_bpf(lambda bpf: _take_paused(bpf, pid))
                if at is not None:  # else the guard resumed it (max_pause), or it exited
                    since_ns, cgroup = at
                    done = lib is None or lib.key in self._attached or lib.key in self._unprobeable
                    waited = time.monotonic_ns() - since_ns
                    self.pause_stats.durations_ns.append(waited)
                    # Known either way: a failed attach is retried on its own timer (every
                    # open stopping again would wait for nothing)
                    self.with_bpf(lambda bpf: _know(bpf, cgroup, path))
                    if done:
                        self.pause_stats.probed += 1
                    else:
                        self.pause_stats.unprobed += 1
                    log.info(
                        "pid %d resumed after %.3fs at its open of %s%s",
                        pid,
                        waited / 1e9,
                        path.split(b"\0", 1)[0].decode(errors="replace"),
                        "" if done else ": not attached yet, it runs unprobed",
                    )
        finally:
            self._resume(pid)

    def pause_counts(self) -> dict[str, int]:
        """Host mode's pause, by outcome: the agent's (``probed``, ``unprobed``) and the
        kernel's and guard's (PAUSE_KERNEL_OUTCOMES); empty when the pause is off."""
        if not self._host_pause:
            return {}
        kernel = self.with_bpf(lambda bpf: [int(bpf["pause_stats"][bpf["pause_stats"].Key(i)].value) for i in range(4)])
        counts = dict(self._final_pause_counts) if kernel is None else dict(zip(PAUSE_KERNEL_OUTCOMES, kernel))
        counts.update(probed=self.pause_stats.probed, unprobed=self.pause_stats.unprobed)
        return counts

    def _resume(self, pid: int) -> None:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass

    # -- discovery and attaching ------------------------------------------

    def _discovery_loop(self) -> None:
        name_os_thread("otelbpf-discover")
        bpf = self._bpf
        if bpf is None:
            raise SensorError("the discovery loop runs only while the BPF program is loaded (Sensor.start)")
        poller = select.epoll()
        poller.register(bpf["strevents"].map_fd, select.EPOLLIN)
        next_scan = time.monotonic() + self.options.rescan_interval_s
        try:
            while not self._stop.is_set():
                next_retry = min((r.due for r in self._retry.values()), default=next_scan)
                poller.poll(min(0.2, max(0.0, min(next_scan, next_retry) - time.monotonic())))
                try:
                    self.drain_once("strevents")
                    self._pending_work()
                    self._retry_due()
                    self._check_guard()
                    if time.monotonic() >= next_scan:
                        self._rescan()
                        next_scan = time.monotonic() + self.options.rescan_interval_s
                except Exception as exc:  # keep discovering whatever one step did
                    self._count("discovery", f"discovery: {exc}")
                    log.exception("discovery step failed")
        finally:
            poller.close()

    def _check_guard(self) -> None:
        """A pause guard that died (killed) leaves nothing to bound a pause or resume after the
        agent's death: the pause goes off, said once."""
        guard = self._pause_guard
        if guard is not None and not guard.alive():
            self._pause_guard = None
            self.update_map("pause_gate", [(0, 0)])
            log.warning("the pause guard exited (%s): the pause at load is off", guard.process.returncode)

    def _pending_work(self) -> None:
        while True:
            try:
                pid = self._work.get_nowait()
            except queue.Empty:
                return
            if pid is None:
                return
            for lib in libraries.from_process(pid, self.options.families):
                self._attach(lib)

    def _rescan(self) -> None:
        pids = self.watched_pids() if self.options.pids else libraries.all_pids()
        for pid in pids:
            libs = list(libraries.from_process(pid, self.options.families))
            user = any(self._kind(lib).marks_user for lib in libs)
            for lib in libs:
                if self._wanted(lib, user):
                    self._attach(lib)

    def _kind(self, lib: LibraryFile) -> LibraryKind:
        fam = next(f for f in self.options.families if f.name == lib.family)
        return next(k for k in fam.libraries if k.name == lib.kind)

    def _wanted(self, lib: LibraryFile, by_user: bool) -> bool:
        """Whether to probe ``lib``, shown by a process that is (``by_user``) a library user or
        not: always, but for a ``users_only`` kind in host mode, which waits for a library user
        to map the file (LibraryKind.users_only). Said once per file left alone."""
        if by_user or self.options.pids or not self._kind(lib).users_only:
            return True
        if lib.key not in self._left_alone:
            self._left_alone.add(lib.key)
            log.info("%s (%s): not probed while no process that uses a GPU library maps it", lib.shown_path, lib.kind)
        return False

    def _is_library_user(self, pid: int) -> bool:
        """``pid`` in the kernel's ``lib_users`` (discovery.c: it opened a GPU stack's library,
        or its parent had)."""

        def look(bpf: Any) -> bool:
            table = bpf["lib_users"]
            return table.get(table.Key(pid)) is not None

        return bool(self.with_bpf(look))

    def _attach_users_only(self, pid: int) -> None:
        """The ``users_only`` libraries ``pid`` maps, now that it is a library user: a process
        loads libssl (Python's ``ssl``) before it opens the CUDA runtime, and it is stopped at
        that open until its probes, these too, are in place."""
        for lib in libraries.from_process(pid, self.options.families):
            if self._kind(lib).users_only:
                self._attach(lib)

    def watched_pids(self) -> list[int]:
        with self._lock:
            if self._bpf is None:
                return []
            return [k.value for k in self._bpf["watched"]]

    def attached_libraries(self) -> list[LibraryFile]:
        return list(self._attached.values())

    def _attach(self, lib: LibraryFile) -> None:
        """Probe ``lib`` now (a fresh path to it: a process just showed it to us);
        on failure, schedule a retry."""
        if lib.key in self._attached or lib.key in self._unprobeable or self._stop.is_set():
            return
        pending = self._retry.get(lib.key)
        if pending is not None and time.monotonic() - pending.last < RETRY_FIRST_S:
            pending.lib = lib  # just failed: no new attempt per sighting, but retry by the fresher path
            return
        if self._try_attach(lib):
            self._retry.pop(lib.key, None)
        else:
            self._schedule_retry(lib, 1 if pending is None else pending.attempts + 1)
        self.attach_stats.retrying = len(self._retry)

    def _schedule_retry(self, lib: LibraryFile, attempts: int) -> None:
        if attempts >= RETRY_ATTEMPTS:
            self._retry.pop(lib.key, None)
            self._count(
                "gave_up",
                f"{lib.shown_path}: still failing after {attempts} attempts: given up until a process shows it again",
            )
            return
        delay = min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (attempts - 1))
        now = time.monotonic()
        self._retry[lib.key] = _Retry(lib, attempts, now + delay, now)
        log.info("retrying %s in %.1fs (attempt %d failed)", lib.shown_path, delay, attempts)

    def _retry_due(self) -> None:
        """Retry the attaches whose back-off is over; give up on files gone from disk."""
        now = time.monotonic()
        for key, retry in list(self._retry.items()):
            if retry.due > now or self._stop.is_set():
                continue
            lib = _reachable(retry.lib)
            if lib is None:
                del self._retry[key]
                self._count("gone", f"{retry.lib.shown_path}: the file is gone: no more retries")
            elif self._try_attach(lib):
                del self._retry[key]
            else:
                self._schedule_retry(lib, retry.attempts + 1)
        self.attach_stats.retrying = len(self._retry)

    def _try_attach(self, lib: LibraryFile) -> bool:
        """Attach every probe of ``lib`` not attached yet; True when all are in place
        (or the file cannot be probed at all, which retrying would not change)."""
        kind = self._kind(lib)
        lib = _by_host_path(lib)
        try:
            targets = _targets(kind, lib.path)
        except elf.NoSymbols as exc:
            self._unprobeable.add(lib.key)
            self._count("no_symbols", f"{lib.shown_path} ({lib.kind}): {exc}")
            return True
        except (elf.ElfError, OSError) as exc:
            self._count("symbols", f"{lib.shown_path}: {exc}")
            return False
        added = failed = total = 0
        first_error = ""
        # The lock is taken per probe, not per library: each attach may wait ~0.1 s in the
        # kernel (more under load), and a library of 80 probes held the processing thread's
        # map reads and the metrics export behind it for seconds.
        for target in targets:
            total += 1
            probe = (*lib.key, target.vaddr, target.program)
            if self._stop.is_set():  # never hold up stop()
                self.attach_stats.probes += added
                return False
            with self._lock:
                if self._bpf is None:
                    return True
                if probe in self._probes:
                    continue
                try:
                    self._attach_probe(lib.path, target.vaddr, target.program, ret=target.ret)
                except Exception as exc:
                    failed += 1
                    first_error = first_error or f"{target.label}@{target.vaddr:#x}: {exc}"
                    continue
                self._probes.add(probe)
            added += 1
        self.attach_stats.probes += added
        if failed:
            self._count(
                "attach",
                f"{lib.shown_path} ({lib.kind}): {total - failed} of {total} probes in place, "
                f"{failed} failed (first: {first_error})",
                failed,
            )
            return False
        self._attached[lib.key] = lib
        self.attach_stats.libraries += 1
        log.info("attached %d probes to %s (%s)", total, lib.shown_path, lib.kind)
        return True

    def attach_at(self, path: str, shown_path: str, vaddr: int, entry: str | None, ret: str | None) -> int:
        """Probe a function found at run time (families' ``RuntimeTargets``),
        once per file, address and program whichever process led to it.
        Returns how many probes were added; raises when one could not be."""
        count = 0
        st = os.stat(path)
        with self._lock:
            if self._bpf is None:
                return 0
            try:
                for fn, is_ret in ((entry, False), (ret, True)):
                    if fn is None:
                        continue
                    key = (st.st_dev, st.st_ino, vaddr, fn)
                    if key in self._probes:
                        continue
                    try:
                        self._attach_probe(path, vaddr, fn, ret=is_ret)
                    except Exception as exc:
                        self._count("runtime", f"{shown_path}@{vaddr:#x} ({fn}): {exc}")
                        raise
                    self._probes.add(key)
                    count += 1
            finally:
                self.attach_stats.probes += count
        return count

    def _attach_probe(self, path: str, vaddr: int, program: str, *, ret: bool) -> None:
        """One uprobe (``ret``: uretprobe): a uprobe-multi link where the kernel has them
        (``uprobe_links``), else BCC's perf event. The caller holds the lock."""
        bpf = self._bpf
        assert bpf is not None
        if self._links is not None:
            self._links.attach(bpf, path, vaddr, program, ret=ret)
        elif ret:
            bpf.attach_uretprobe(name=path, addr=vaddr, fn_name=program)
        else:
            bpf.attach_uprobe(name=path, addr=vaddr, fn_name=program)

    def _count(self, reason: str, message: str, n: int = 1) -> None:
        self.attach_stats.failures += n
        self.attach_stats.by_reason[reason] += n
        self.attach_stats.last_error = message
        log.warning("attach failed (%s): %s", reason, message)

    # -- kernel-side state ------------------------------------------------

    def kernel_stats(self) -> dict[str, int]:
        """Drops counted in the kernel, summed over CPUs."""
        with self._lock:
            if self._bpf is None:
                return dict(self._final_stats)
            table = self._bpf["stats"]
            return {s.name.lower(): int(sum(table[table.Key(int(s))])) for s in Stat}

    def read_map(self, name: str) -> MapEntries:
        """(key struct, value) pairs of a counting hash map: an int for scalar
        values, the (copied) struct for struct values."""
        with self._lock:
            if self._bpf is None:
                return list(self._final.get(name, []))
            return [(k, getattr(v, "value", v)) for k, v in self._bpf[name].items()]

    def with_bpf(self, fn: Callable[[Any], T]) -> T | None:
        """``fn(bpf)`` under the lock that serialises BCC use; None once unloaded."""
        with self._lock:
            if self._bpf is None:
                return None
            return fn(self._bpf)

    def update_map(self, name: str, items: list[tuple[int, int]]) -> None:
        """Write scalar (key, value) pairs into a hash map (families that let
        user space decide what the kernel traces)."""
        with self._lock:
            if self._bpf is None:
                return
            table = self._bpf[name]
            for k, v in items:
                table[table.Key(k)] = table.Leaf(v)

    def delete_keys(self, name: str, keys: list[object]) -> None:
        """Forget counters already exported. Once unloaded, from the final snapshot: a
        metrics export racing the stop must not leave them to be exported again."""
        with self._lock:
            if self._bpf is None:
                gone = {bytes(memoryview(k)) for k in keys}  # type: ignore[arg-type]  # ctypes keys
                self._final[name] = [(k, v) for k, v in self._final.get(name, []) if bytes(memoryview(k)) not in gone]
                return
            table = self._bpf[name]
            for k in keys:
                try:
                    del table[k]
                except KeyError:
                    pass

    def pause_gate_fd(self) -> int:
        """The map that turns the pause at load on (common.h ``pause_gate``; with
        ``pause_on_load``), for the command's guard to turn it off if the agent dies."""
        fd = self.with_bpf(lambda bpf: int(bpf["pause_gate"].map_fd))
        if fd is None:
            raise SensorError("the pause gate exists only while the program is loaded")
        return fd

    def ring_pending_bytes(self) -> int:
        return sum(r.pending_bytes() for r in self._readers.values())

    def ring_usage(self) -> list[tuple[str, int, int]]:
        """(ring, size, the most bytes waiting in it since the last call) per ring: the
        evidence for sizing ``ring_buffer_size`` (every byte of a ring is resident memory).
        Once stopped, what stop() read last, so that the final export of a run shorter than one
        metrics interval still says it."""
        with self._drain_lock:
            if not self._readers:
                return list(self._final_rings)
            return [(name, r.size, r.take_peak()) for name, r in sorted(self._readers.items())]


def detach_in_background(bpf: Any) -> int | None:
    """Hand every probe and tracepoint (their perf event fds) to a process that releases
    them, so the agent stops in well under a second however many probes it holds.

    Releasing a uprobe's perf event waits out an RCU grace period under the kernel's global
    trace event mutex: ~0.1 s each on this VM under load, one after another, so 700 probes
    (the default receivers on a host with a dozen CUDA/NCCL libraries) held SIGTERM for 88 s.
    The releaser is ``cat`` started with those fds (vfork+exec: no fork handlers run in this
    threaded process) in its own session, reading a pipe from the agent: the agent closes its
    own copies first (cheap: they are not the last references), then the pipe; ``cat`` exits
    at the end of its input and its exit releases the probes, in the kernel. (A releaser that
    exited at once could beat the agent's closes and leave the slow last close to the agent.)
    Until it is gone the probes still fire (their events reach no reader): the traced
    programs pay their cost for that long.
    ``OTELBPF_DETACH=wait`` detaches in place instead. Returns the releaser's pid."""
    fds = [
        *bpf.uprobe_fds.values(),
        *bpf.tracepoint_fds.values(),
        *(fd for per_cpu in bpf.open_perf_events.values() for fd in per_cpu.values()),
    ]
    if not fds:
        return None
    try:
        releaser = subprocess.Popen(
            ["cat"],
            pass_fds=fds,
            start_new_session=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    except OSError as exc:
        log.warning("cannot release probes in the background (%s): detaching in place", exc)
        return None
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
    bpf.uprobe_fds.clear()
    bpf.tracepoint_fds.clear()
    bpf.open_perf_events.clear()
    if releaser.stdin is not None:
        releaser.stdin.close()  # the end of its input: it exits, and its exit releases the probes
    log.info("releasing %d probes in the background (pid %d)", len(fds), releaser.pid)
    return releaser.pid


@contextmanager
def _thread_named(name: str) -> Iterator[None]:
    """The calling thread named ``name`` (its kernel comm) for the block, then as before."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm") as f:
            before = f.read().strip()
    except OSError:
        before = None
    name_os_thread(name)
    try:
        yield
    finally:
        if before is not None:
            name_os_thread(before)


def _take_paused(bpf: Any, pid: int) -> tuple[int, int] | None:
    """(since_ns, cgroup) of ``pid`` in ``paused``, taken out; None when not there."""
    table = bpf["paused"]
    key = table.Key(pid)
    try:
        at = table[key]
        del table[key]
    except KeyError:
        return None
    return int(at.since_ns), int(at.cgroup)


def _know(bpf: Any, cgroup: int, path: bytes) -> None:
    """known_libs[(cgroup, path)] = 1: that path's opens in that cgroup stop nothing."""
    table = bpf["known_libs"]
    key = table.Key()
    key.cgroup = cgroup
    field = type(key).path
    raw = path[: field.size]
    ctypes.memmove(ctypes.addressof(key) + field.offset, raw, len(raw))
    table[key] = table.Leaf(1)


def _targets(kind: LibraryKind, path: str) -> list[ProbeAt]:
    """Every (address, program) of a library of ``kind``: its named symbols' sites (every
    version and alias, entry and return programs), or the sites the kind finds itself."""
    if kind.find_probes is not None:
        return kind.find_probes(path)
    sites = elf.resolve(path, kind.symbols, symtab=kind.symtab)
    return [
        ProbeAt(site.probe_vaddr, fn, spec.symbol, ret)
        for spec in kind.probes
        for site in spec.select(sites.get(spec.symbol, []))
        for fn, ret in ((spec.entry, False), (spec.ret, True))
        if fn is not None
    ]


def _by_host_path(lib: LibraryFile) -> LibraryFile:
    """``lib`` by the path it was shown by, when that path leads to the same inode on the
    host (a process in the agent's own mount namespace, the common case): unlike
    /proc/PID/root/..., it outlives the process. Through the process's root, a short-lived
    process that exited in the middle of an attach failed every probe left (each retry, by
    the next such process's root, added about one). A container's file is not at its path
    on the host: it stays reached through the process's root."""
    if lib.path == lib.shown_path or not os.path.isabs(lib.shown_path):
        return lib
    try:
        if elf.file_key(lib.shown_path) != lib.key:
            return lib
    except OSError:
        return lib
    return LibraryFile(lib.shown_path, lib.shown_path, lib.family, lib.kind, lib.key)


def _reachable(lib: LibraryFile) -> LibraryFile | None:
    """``lib`` by a path that still leads to its inode: its own path, or, once
    the process it was seen through is gone, the path it was shown by, on the
    host. None when neither does (the file is gone, or replaced)."""
    for path in (lib.path, lib.shown_path):
        try:
            if elf.file_key(path) == lib.key:
                return lib if path == lib.path else LibraryFile(path, lib.shown_path, lib.family, lib.kind, lib.key)
        except OSError:
            continue
    return None


def require_root() -> None:
    """Fail early, naming what is missing and the fix, when the agent lacks privileges
    (the capability rules live in otelbpf/base/privileges.py, shared with `otelbpf doctor`)."""
    from otelbpf.base.privileges import PrivilegeError, require_privileges

    try:
        require_privileges(uprobe_links=uprobe_links.supported())
    except PrivilegeError as exc:
        raise SensorError(str(exc)) from exc
