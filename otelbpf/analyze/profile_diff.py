"""The differential flame graph: where a slow rank spends CPU that the healthy ranks do not.

A straggler report says *which* rank is late and whether the lateness is compute, host or
communication; on a host-slow rank the next question is *what the host was doing*. The
profiling receiver writes one CPU profile per process and interval (``profiles/*.pb.gz``,
pprof). This module reads the slow rank's and the healthy ranks' profiles over the same
window, normalises each to CPU time per second of wall time (ranks may have been profiled
for different lengths of time), and subtracts the healthy ranks' mean from the slow rank:

- ``frames``: functions ranked by how much more CPU the slow rank burns in them (self time,
  with the inclusive time beside it), the names a straggler finding can cite;
- ``write_pprof``: the slow rank's profile and a *base* profile (the healthy mean, scaled to
  the slow rank's duration), so that ``go tool pprof -diff_base base.pb.gz slow.pb.gz``
  draws the differential flame graph in any pprof viewer (and Pyroscope's diff view).

Functions are compared by name (a rank's addresses differ with ASLR; names do not).
"""

from __future__ import annotations

import gzip
import logging
import math
import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError

from otelbpf.base.safe_files import OutputDir
from otelbpf.correlate.profile_record import CPU_SAMPLE_TYPES
from otelbpf.correlate.stacks import Frame
from otelbpf.export.pprof import ProfileBuilder
from otelbpf.export.proto import profile_pb2

log = logging.getLogger(__name__)

#: A stack as compared across ranks: function names, root first.
Stack = tuple[str, ...]
#: A process across hosts: (host name, pid).
Process = tuple[str, int]


class ProfileReadError(Exception):
    """A profile file that is not gzipped pprof (the message names the file)."""


@dataclass
class RankCpu:
    """One process's CPU samples over the window: nanoseconds per stack, and the wall time
    its profiles covered (the normaliser)."""

    pid: int
    host: str = ""
    seconds: float = 0.0
    stacks: Counter[Stack] = field(default_factory=Counter)
    files: list[str] = field(default_factory=list)
    #: CPU samples the stacks' nanoseconds came from (the profiles' ``samples`` count; 0 when
    #: they carry none): what tells a function's excess from the sampling's own noise.
    samples: int = 0

    def rate(self) -> dict[Stack, float]:
        """CPU nanoseconds per second of wall time, per stack."""
        if self.seconds <= 0:
            return {}
        return {s: ns / self.seconds for s, ns in self.stacks.items()}


@dataclass(frozen=True)
class FrameDelta:
    function: str
    self_ms_per_s: float  # slow rank minus the healthy mean, CPU ms per wall second, in the frame itself
    total_ms_per_s: float  # the same, in the frame and what it calls
    slow_ms_per_s: float  # the slow rank's own inclusive rate, for scale


@dataclass
class ProfileDiff:
    slow_pid: int
    base_pids: list[int]
    slow_seconds: float
    base_seconds: float
    frames: list[FrameDelta]
    slow_files: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            "slow_pid": self.slow_pid,
            "base_pids": self.base_pids,
            "slow_seconds": round(self.slow_seconds, 3),
            "base_seconds": round(self.base_seconds, 3),
            "frames": [vars(f) for f in self.frames],
            "slow_files": self.slow_files,
        }


def profile_files(paths: Iterable[str]) -> list[str]:
    """CPU pprof files under each output folder (``profiles/*-cpu-*.pb.gz``) or given as files."""
    out: list[str] = []
    for path in paths:
        p = Path(path)
        if p.is_file():
            out.append(str(p))
            continue
        folder = p / "profiles" if (p / "profiles").is_dir() else p
        if folder.is_dir():
            out += sorted(str(f) for f in folder.glob("*-cpu-*.pb.gz") if f.is_file() and not f.is_symlink())
    return out


def _load(path: str) -> profile_pb2.Profile:
    try:
        with open(path, "rb") as f:
            data = f.read(64 << 20)
        prof = profile_pb2.Profile()
        prof.ParseFromString(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
        return prof
    except (OSError, EOFError, gzip.BadGzipFile, ValueError, DecodeError) as exc:
        raise ProfileReadError(f"{path}: not a readable pprof profile ({exc})") from exc


def _process_of(prof: profile_pb2.Profile) -> Process | None:
    """(host_name, process_pid) from the labels the profiler puts on every sample."""
    strings = prof.string_table
    for sample in prof.sample[:1]:
        labels = {strings[lb.key]: strings[lb.str] if lb.str else str(lb.num) for lb in sample.label}
        pid = labels.get("process_pid", "")
        return (labels.get("host_name", ""), int(pid)) if pid.isdigit() else None
    return None


def read_cpu(
    paths: Sequence[str], processes: Iterable[Process] | None = None, window_ns: tuple[int, int] | None = None
) -> tuple[dict[Process, RankCpu], list[str]]:
    """CPU stacks per (host, pid) from the CPU profiles under ``paths``, only the profiles that
    overlap ``window_ns`` (wall clock) and only ``processes`` when given. Unreadable files are
    skipped and named in the second value (a folder being written holds partial files)."""
    wanted = set(processes) if processes is not None else None
    ranks: dict[Process, RankCpu] = {}
    skipped: list[str] = []
    for path in profile_files(paths):
        try:
            prof = _load(path)
        except ProfileReadError as exc:
            skipped.append(str(exc))
            continue
        who = _process_of(prof)
        if who is None or (wanted is not None and who not in wanted):
            continue
        start, end = prof.time_nanos, prof.time_nanos + prof.duration_nanos
        if window_ns is not None and (end <= window_ns[0] or start >= window_ns[1]):
            continue
        cpu_index = next((i for i, st in enumerate(prof.sample_type) if prof.string_table[st.type] == "cpu"), None)
        if cpu_index is None:
            continue
        count_index = next(
            (i for i, st in enumerate(prof.sample_type) if prof.string_table[st.type] == "samples"), None
        )
        rank = ranks.setdefault(who, RankCpu(who[1], who[0]))
        rank.seconds += prof.duration_nanos / 1e9
        rank.files.append(os.path.basename(path))
        names = {fn.id: prof.string_table[fn.name] for fn in prof.function}
        locations = {loc.id: [names.get(line.function_id, "?") for line in loc.line] for loc in prof.location}
        for sample in prof.sample:
            leaf_first = [name for lid in sample.location_id for name in locations.get(lid, ["?"])]
            rank.stacks[tuple(reversed(leaf_first))] += sample.value[cpu_index]
            if count_index is not None:
                rank.samples += sample.value[count_index]
    return ranks, skipped


def _by_function(rates: dict[Stack, float]) -> tuple[defaultdict[str, float], defaultdict[str, float]]:
    """(self, inclusive) rate per function; a function counted once per stack for inclusive."""
    own: defaultdict[str, float] = defaultdict(float)
    total: defaultdict[str, float] = defaultdict(float)
    for stack, rate in rates.items():
        if not stack:
            continue
        own[stack[-1]] += rate
        for name in set(stack):
            total[name] += rate
    return own, total


def _mean(rates: Sequence[dict[Stack, float]]) -> dict[Stack, float]:
    out: Counter[Stack] = Counter()
    for r in rates:
        out.update(r)
    return {s: v / len(rates) for s, v in out.items()} if rates else {}


#: A function's excess on the slow rank is named only past this many standard deviations of
#: the sampling's own noise (below).
NOISE_SIGMAS = 2.0


def _beyond_noise(slow_samples: float, base_samples: float) -> bool:
    """Is ``slow_samples - base_samples`` more than sampling noise? Both are CPU samples over
    the slow rank's duration (the base: the healthy ranks' mean rate times it), each a Poisson
    count, so their difference has a variance of about their sum. At 99 Hz over a few seconds a
    function every rank runs alike differs by a sample or two, 5-10 ms/s: without this the
    slowest rank's own share of shared work read as an explanation."""
    return slow_samples - base_samples >= NOISE_SIGMAS * math.sqrt(max(slow_samples + base_samples, 1.0))


def diff(slow: RankCpu, healthy: Sequence[RankCpu], *, top: int = 10, min_ms_per_s: float = 1.0) -> ProfileDiff:
    """The functions where ``slow`` burns more CPU per second than the mean of ``healthy``, by
    at least ``min_ms_per_s`` and by more than sampling noise (when the profiles count samples)."""
    slow_rate = slow.rate()
    base_rate = _mean([h.rate() for h in healthy if h.seconds > 0])
    s_own, s_total = _by_function(slow_rate)
    b_own, b_total = _by_function(base_rate)
    # rate (ns/s) * seconds / ns per sample = samples; the slow rank's own mean sample weight
    ns_total = sum(slow.stacks.values())
    to_samples = slow.seconds * slow.samples / ns_total if slow.samples and ns_total else 0.0
    frames = [
        FrameDelta(
            name,
            round((s_own[name] - b_own[name]) / 1e6, 3),
            round((s_total[name] - b_total[name]) / 1e6, 3),
            round(s_total[name] / 1e6, 3),
        )
        for name in s_own
        if (s_own[name] - b_own[name]) / 1e6 >= min_ms_per_s
        and (not to_samples or _beyond_noise(s_own[name] * to_samples, b_own[name] * to_samples))
    ]
    frames.sort(key=lambda f: (-f.self_ms_per_s, f.function))
    return ProfileDiff(
        slow.pid,
        sorted(h.pid for h in healthy),
        slow.seconds,
        sum(h.seconds for h in healthy) / max(len(healthy), 1),
        frames[:top],
        slow.files,
    )


def _build(stacks: dict[Stack, float], seconds: float) -> bytes:
    b = ProfileBuilder(
        CPU_SAMPLE_TYPES,
        time_ns=0,
        duration_ns=max(int(seconds * 1e9), 1),
        period_type=("cpu", "nanoseconds"),
        period=0,
        default_sample_type="cpu",
    )
    for stack, ns in stacks.items():
        value = int(round(ns))
        if value > 0:
            b.add([Frame(name) for name in reversed(stack)], (1, value), {})
    return b.encode()


def write_pprof(slow: RankCpu, healthy: Sequence[RankCpu], out_dir: str) -> tuple[str, str]:
    """``slow-<pid>.pb.gz`` and ``base-healthy.pb.gz`` (the healthy ranks' mean rates over the
    slow rank's duration) in ``out_dir``: ``go tool pprof -diff_base base slow`` reads them.
    Written as everything root writes (``OutputDir``: owner-only, never through a link, not
    into a folder another user owns or can write). Raises UnsafeOutput."""
    base = {s: rate * slow.seconds for s, rate in _mean([h.rate() for h in healthy if h.seconds > 0]).items()}
    names = (f"slow-{slow.pid}.pb.gz", "base-healthy.pb.gz")
    out = OutputDir(out_dir)
    try:
        for name, data in zip(names, (_build(dict(slow.stacks), slow.seconds), _build(base, slow.seconds))):
            out.write_whole(name, data)
    finally:
        out.close()
    return os.path.join(out_dir, names[0]), os.path.join(out_dir, names[1])


def diff_tree(
    slow: RankCpu, healthy: Sequence[RankCpu], *, min_share: float = 0.002, max_depth: int = 128
) -> dict[str, object]:
    """The slow rank's CPU call tree as d3-flame-graph draws it (``{name, value, children}``,
    value: its CPU nanoseconds) with ``delta`` on every node: its value minus the healthy
    ranks' mean over the same duration (red where the slow rank burns more, blue where less,
    with d3-flame-graph's differential colours). Frames below ``min_share`` of the total are
    left out; functions the slow rank never ran have no width to draw and are not shown."""
    base_rate = _mean([h.rate() for h in healthy if h.seconds > 0])
    values: Counter[Stack] = Counter()
    deltas: dict[Stack, float] = defaultdict(float)
    for stack, ns in slow.stacks.items():
        for depth in range(min(len(stack), max_depth) + 1):
            values[stack[:depth]] += ns
            deltas[stack[:depth]] += ns
    for stack, rate in base_rate.items():
        for depth in range(min(len(stack), max_depth) + 1):
            deltas[stack[:depth]] -= rate * slow.seconds
    floor = values[()] * min_share
    children: dict[Stack, list[Stack]] = {}
    for path in values:
        if path and values[path] >= floor:
            children.setdefault(path[:-1], []).append(path)

    def walk(path: Stack) -> dict[str, object]:
        kids = sorted(children.get(path, []), key=lambda p: -values[p])
        return {
            "name": path[-1] if path else "all",
            "value": int(values[path]),
            "delta": int(round(deltas[path])),
            "children": [walk(k) for k in kids],
        }

    return walk(())
