"""The offline straggler report: which rank holds the others back, and why.

Reads the exported NCCL spans of every rank (collectives.py) and, all in numpy:

1. **ranks**: one per (host.name, process.pid), named by its rank in the largest
   communicator it belongs to;
2. **clocks**: hosts' clock offsets are measured from the collectives (clock_offsets.py) and
   removed, unless told not to;
3. **per collective** (communicator id, sequence number) seen from at least two ranks, in
   order per communicator: the adaptive test of adaptive.py says which ranks are late
   (beyond the others' spread, a share of the collective's duration and the ``threshold``
   floor) and which are persistently so; a late rank's lateness splits into compute, host
   and communication shares (lateness.py);
4. **per rank**: how many of its collectives it was late on, by how much in total, and its
   class from the summed shares. A rank is a persistent straggler when the window test held
   for it, it was late on at least ``min_share`` of its collectives and on at least
   ``MIN_STRAGGLES``. Ranks are listed by the total delay they caused;
5. **ranks that stopped**: a rank whose last collective of a communicator comes before the
   others' last (it left, or died between collectives), or whose process exited during its
   last one.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

import numpy as np

from otelbpf.analyze import clock_offsets, profile_diff
from otelbpf.analyze.collectives import EXITED, FAILED, Collectives, ReadError, read
from otelbpf.base.safe_files import UnsafeOutput
from otelbpf.correlate.adaptive import CommDetector, Params
from otelbpf.correlate.lateness import CLASSES, UNKNOWN, classify_many, components

#: A persistent straggler straggled on at least this many collectives.
MIN_STRAGGLES = 3


@dataclass
class RankReport:
    rank: int
    host: str
    pid: int
    service: str
    collectives: int  # compared collectives it took part in
    straggled: int  # of those, the ones it entered last, late by >= the threshold
    share: float
    lateness_total_ms: float  # summed over the collectives it straggled on
    lateness_mean_ms: float
    compute_ms: float  # the shares of that lateness (summed), see lateness.py
    host_ms: float
    communication_ms: float
    cls: str
    persistent: bool
    #: functions where it burnt more CPU than the healthy ranks (profile_diff.FrameDelta as dicts)
    explaining_frames: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Stopped:
    rank: int
    host: str
    pid: int
    comm: str
    last_seq: int  # its last collective on the communicator
    comm_last_seq: int  # the last any rank reached
    how: str  # what its last span says


@dataclass
class Report:
    files: int
    spans: int
    collectives_compared: int
    threshold_ms: float
    min_share: float
    clock_correction: bool
    hosts: list[clock_offsets.HostOffset]
    ranks: list[RankReport]
    stopped: list[Stopped] = field(default_factory=list)
    #: per straggler, what the differential CPU profile says (profile_diff.ProfileDiff.to_json)
    profile_diffs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def stragglers(self) -> list[RankReport]:
        return [r for r in self.ranks if r.persistent]

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["stragglers"] = [asdict(r) for r in self.stragglers]
        out["hosts"] = [
            {
                "host": h.host,
                "offset_ms": h.offset_ns / 1e6,
                "low_ms": None if h.low_ns is None else h.low_ns / 1e6,
                "high_ms": None if h.high_ns is None else h.high_ns / 1e6,
                "collectives": h.collectives,
                "via": h.via,
                "consistent": h.consistent,
            }
            for h in self.hosts
        ]
        return out


def _groups(comm: np.ndarray, seq: np.ndarray, *more: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(order, group index per row in that order): rows sorted by comm, seq, then ``more``
    (last key first, as np.lexsort takes them)."""
    order = np.lexsort((*more, seq, comm))
    c, s = comm[order], seq[order]
    change = np.empty(len(order), dtype=bool)
    change[:1] = True
    change[1:] = (c[1:] != c[:-1]) | (s[1:] != s[:-1])
    return order, np.cumsum(change) - 1


def analyze(data: Collectives, *, threshold_ns: int, min_share: float, correct_clocks: bool = True) -> Report:
    part_key = data.host.astype(np.int64) << 32 | data.pid
    parts, part = np.unique(part_key, return_inverse=True)
    # One row per (rank, collective): a span exported twice (replayed files) counts once.
    order, group = _groups(data.comm, data.seq, part)
    first = np.ones(len(order), dtype=bool)
    first[1:] = (group[1:] != group[:-1]) | (part[order][1:] != part[order][:-1])
    rows = order[first]
    group = group[first]
    host, enter, completion = data.host[rows], data.start[rows], data.end[rows]
    labels = _rank_labels(data, part, parts)
    ref_part = min(range(len(parts)), key=lambda i: (labels[i] < 0, labels[i], i)) if len(parts) else 0
    reference = int(parts[ref_part] >> 32) if len(parts) else 0
    if correct_clocks:
        offsets = clock_offsets.estimate(data.hosts, host, group, enter, completion, data.observed[rows], reference)
    else:
        offsets = [clock_offsets.HostOffset(h, 0, via="not corrected") for h in data.hosts]
    shift = np.array([o.offset_ns for o in offsets], dtype=np.int64) if offsets else np.zeros(1, np.int64)
    enter = enter - shift[host]
    phase = data.phase[rows] * 1e9
    gpu = data.gpu_wait[rows] * 1e9

    # Per communicator, its collectives in order, through the adaptive test (adaptive.py).
    end = completion - shift[host]
    who_all = part[rows]
    starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    sizes = np.diff(np.r_[starts, len(group)])
    comm_of, observed_all = data.comm[rows], data.observed[rows]
    n_parts = len(parts)
    collectives = np.zeros(n_parts, dtype=np.int64)
    straggled = np.zeros(n_parts, dtype=np.int64)
    total = np.zeros(n_parts)
    shares = [np.zeros(n_parts) for _ in range(3)]
    persistent = np.zeros(n_parts, dtype=bool)  # the window test held at least once
    params = Params(floor_ns=threshold_ns)
    detectors: dict[int, CommDetector[int]] = {}  # comm -> detector of rank rows
    compared = 0
    for s0, n in zip(starts.tolist(), sizes.tolist()):
        if n < 2:
            continue
        compared += 1
        idx = slice(s0, s0 + n)
        w, e = who_all[idx], enter[idx].astype(np.float64)
        collectives[w] += 1
        det = detectors.setdefault(int(comm_of[s0]), CommDetector(params))
        for v in det.add(dict(zip(w.tolist(), e.tolist()))):
            if not v.late:
                continue
            persistent[v.member] |= v.persistent
            me = int(np.flatnonzero(w == v.member)[0])
            others = np.arange(n) != me
            parts3 = components(
                e[me],
                phase[idx][me],
                gpu[idx][me],
                e[others].mean(),
                phase[idx][others].mean(),
                gpu[idx][others].mean(),
            )
            straggled[v.member] += 1
            total[v.member] += v.deviation_ns
            for k in range(3):
                shares[k][v.member] += np.nan_to_num(parts3[k])
        observed = observed_all[idx]
        if observed.any():
            det.note_duration(float(end[idx][observed].min() - e.max()))
    cls = classify_many(*shares)
    ranks = []
    for i in range(n_parts):
        h, pid = int(parts[i] >> 32), int(parts[i] & 0xFFFFFFFF)
        share = straggled[i] / collectives[i] if collectives[i] else 0.0
        ranks.append(
            RankReport(
                rank=int(labels[i]),
                host=data.hosts[h],
                pid=pid,
                service=data.services.get((h, pid), f"pid {pid}"),
                collectives=int(collectives[i]),
                straggled=int(straggled[i]),
                share=round(float(share), 4),
                lateness_total_ms=round(float(total[i]) / 1e6, 3),
                lateness_mean_ms=round(float(total[i]) / straggled[i] / 1e6, 3) if straggled[i] else 0.0,
                compute_ms=round(float(shares[0][i]) / 1e6, 3),
                host_ms=round(float(shares[1][i]) / 1e6, 3),
                communication_ms=round(float(shares[2][i]) / 1e6, 3),
                cls=CLASSES[cls[i]] if cls[i] >= 0 and straggled[i] else UNKNOWN,
                persistent=bool(persistent[i] and straggled[i] >= MIN_STRAGGLES and share >= min_share),
            )
        )
    ranks.sort(key=lambda r: (-r.lateness_total_ms, r.rank))
    return Report(
        files=data.files,
        spans=len(data),
        collectives_compared=compared,
        threshold_ms=threshold_ns / 1e6,
        min_share=min_share,
        clock_correction=correct_clocks and len(data.hosts) > 1,
        hosts=offsets,
        ranks=ranks,
        stopped=_stopped(data, rows, part, parts, labels),
    )


def _rank_labels(data: Collectives, part: np.ndarray, parts: np.ndarray) -> np.ndarray:
    """Each participant's rank in the largest communicator it is in (-1: never known)."""
    labels = np.full(len(parts), -1, dtype=np.int64)
    order = np.lexsort((data.rank, data.nranks, part))  # per participant, the largest nranks last
    last = np.flatnonzero(np.r_[part[order][1:] != part[order][:-1], True])
    labels[part[order][last]] = data.rank[order][last]
    return labels


def _stopped(
    data: Collectives, rows: np.ndarray, part: np.ndarray, parts: np.ndarray, labels: np.ndarray
) -> list[Stopped]:
    comm, seq, who, status = data.comm[rows], data.seq[rows], part[rows], data.status[rows]
    order = np.lexsort((seq, who, comm))
    c, s, w, st = comm[order], seq[order], who[order], status[order]
    last = np.flatnonzero(np.r_[(c[1:] != c[:-1]) | (w[1:] != w[:-1]), True])
    out = []
    for comm_id in np.unique(c[last]):
        mine = last[c[last] == comm_id]
        top = int(s[mine].max())
        for i in mine:
            if s[i] >= top and st[i] != EXITED:
                continue
            p = int(w[i])
            h, pid = int(parts[p] >> 32), int(parts[p] & 0xFFFFFFFF)
            how = {EXITED: "its process exited during it", FAILED: "it failed"}.get(int(st[i]), "completed")
            out.append(Stopped(int(labels[p]), data.hosts[h], pid, f"{int(comm_id):016x}", int(s[i]), top, how))
    return sorted(out, key=lambda x: (x.comm, x.last_seq, x.rank))


def _ms(value: float) -> str:
    return f"{value:+.1f} ms"


def render(report: Report, out: TextIO) -> None:
    ranks = len(report.ranks)
    print(
        f"otelbpf stragglers: {ranks} ranks on {len(report.hosts)} host{'s' if len(report.hosts) != 1 else ''}, "
        f"{report.collectives_compared} collectives compared ({report.spans} spans in {report.files} files)",
        file=out,
    )
    if report.clock_correction:
        print("clock offsets (measured from the collectives; subtracted before comparing):", file=out)
        for h in report.hosts:
            if h.via == "reference":
                print(f"  {h.host}: reference", file=out)
            elif h.via == "unreachable":
                print(f"  {h.host}: shares no collective with the others; not corrected", file=out)
            else:
                low, high = h.low_ns, h.high_ns
                assert low is not None and high is not None  # a host measured through collectives has both
                bounds = (
                    f"within [{low / 1e6:.3f}, {high / 1e6:.3f}] ms"
                    if h.consistent
                    else ("the bounds contradict each other: clocks drifted during the run?")
                )
                via = "" if h.via == "direct" else f", through {h.via}"
                print(f"  {h.host}: {h.offset_ns / 1e6:+.3f} ms ({bounds}; {h.collectives} collectives{via})", file=out)
    elif len(report.hosts) > 1:
        print("clock offsets: not corrected (--no-clock-correction)", file=out)
    persistent = report.stragglers
    if persistent:
        print(
            f"persistent stragglers (last, by >= {report.threshold_ms:g} ms, in >= {report.min_share:.0%} "
            "of their collectives):",
            file=out,
        )
        for n, r in enumerate(persistent, 1):
            print(
                f"  {n}. rank {r.rank} ({r.host}, pid {r.pid}, {r.service}): {r.cls}, last in {r.straggled} of "
                f"{r.collectives} collectives ({r.share:.0%}), late by {r.lateness_mean_ms:.1f} ms on average "
                f"({r.lateness_total_ms:.1f} ms in all)",
                file=out,
            )
            print(
                f"     why: GPU wait {_ms(r.compute_ms)}, host {_ms(r.host_ms)}, "
                f"previous collective finishing {_ms(r.communication_ms)} (summed over those collectives)",
                file=out,
            )
            if r.explaining_frames:
                frames = ", ".join(f"{f['function']} +{f['self_ms_per_s']:.1f} ms/s" for f in r.explaining_frames[:3])
                print(f"     on the CPU more than the healthy ranks (CPU ms per second): {frames}", file=out)
        for d in report.profile_diffs:
            if "slow_pprof" in d:
                print(
                    f"  differential flame graph of rank {d['rank']}: go tool pprof -http=: "
                    f"-diff_base {d['base_pprof']} {d['slow_pprof']}",
                    file=out,
                )
    else:
        print(
            f"no persistent straggler (none was last, by >= {report.threshold_ms:g} ms, in >= "
            f"{report.min_share:.0%} of its collectives)",
            file=out,
        )
    print("all ranks, most delay caused first:", file=out)
    print(
        f"  {'rank':>5} {'host':<16} {'pid':>8} {'collectives':>11} {'last':>6} {'late total':>12} "
        f"{'late mean':>10}  class",
        file=out,
    )
    for r in report.ranks:
        print(
            f"  {r.rank:>5} {r.host[:16]:<16} {r.pid:>8} {r.collectives:>11} {r.straggled:>6} "
            f"{r.lateness_total_ms:>9.1f} ms {r.lateness_mean_ms:>7.1f} ms  {r.cls if r.straggled else '-'}",
            file=out,
        )
    for s in report.stopped:
        print(
            f"stopped: rank {s.rank} ({s.host}, pid {s.pid}) reached seq {s.last_seq} of communicator {s.comm}, "
            f"the others {s.comm_last_seq}; at its last one {s.how}",
            file=out,
        )


def explain_with_profiles(
    report: Report, paths: list[str], window_ns: tuple[int, int], diff_dir: str | None = None
) -> list[str]:
    """Name, for each straggler, the functions it burns more CPU in than the healthy ranks
    over the job's window, when the folders hold the profiling receiver's CPU profiles;
    with ``diff_dir``, write the pprof pair for ``go tool pprof -diff_base``. Returns warnings."""
    stragglers = report.stragglers
    if not stragglers:
        return []
    ranks, skipped = profile_diff.read_cpu(paths, {(r.host, r.pid) for r in report.ranks}, window_ns)
    warnings = [f"skipped a profile: {s}" for s in skipped]
    slow_keys = {(r.host, r.pid) for r in stragglers}
    healthy = [cpu for key, cpu in ranks.items() if key not in slow_keys]
    for r in stragglers:
        slow = ranks.get((r.host, r.pid))
        if slow is None or not healthy:
            continue
        d = profile_diff.diff(slow, healthy)
        r.explaining_frames = [vars(f) for f in d.frames]
        entry = d.to_json() | {"rank": r.rank, "host": r.host}
        if diff_dir is not None:
            try:
                entry["slow_pprof"], entry["base_pprof"] = profile_diff.write_pprof(
                    slow, healthy, os.path.join(diff_dir, f"rank{r.rank}-{r.pid}")
                )
            except UnsafeOutput as exc:  # a folder refused: said, the report goes on
                warnings.append(f"no pprof pair for rank {r.rank}: {exc}")
        report.profile_diffs.append(entry)
    return warnings


def run(
    paths: list[str],
    *,
    threshold_ns: int,
    min_share: float,
    as_json: bool,
    correct_clocks: bool,
    out: TextIO,
    err: TextIO,
    diff_dir: str | None = None,
) -> int:
    """``otelbpf stragglers``: 0 with a report, 1 when there are no NCCL collectives, 2 on bad input."""
    try:
        data = read(paths)
    except (ReadError, OSError) as exc:
        print(f"otelbpf stragglers: {exc}", file=err)
        return 2
    if not len(data):
        print(
            f"otelbpf stragglers: no NCCL collective spans with a communicator id in {', '.join(paths)} "
            "(was the agent's nccl receiver in the traces pipeline, and did it see the communicators created?)",
            file=err,
        )
        return 1
    report = analyze(data, threshold_ns=threshold_ns, min_share=min_share, correct_clocks=correct_clocks)
    window = (int(data.start.min()), int(data.end.max()))
    for warning in explain_with_profiles(report, paths, window, diff_dir):
        print(f"otelbpf stragglers: {warning}", file=err)
    if as_json:
        json.dump(report.to_json(), out, indent=1)
        out.write("\n")
    else:
        render(report, out)
    return 0
