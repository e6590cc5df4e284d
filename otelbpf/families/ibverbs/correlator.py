"""ibverbs events and per-QP counters -> spans and per-QP metrics.

Input: the control-path events of bpf/ibverbs.c (a QP's creation, state
changes with the peer's QP number, LID and GID, destruction; memory
registration; device open/close), its error/slow completion events, the
SEV_IBV_CONTEXT strings (device names), and the kernel's per-QP counters
(``ibv_qps`` live, ``ibv_retired`` destroyed, ``ibv_errors``; latency
histograms are inside the per-QP values). A QP is identified by (pid,
context, QP number, incarnation): QP numbers are per device and come back
after a destroy.

Output: one span per control call, an ``rdma.qp`` span per QP lifetime (at
its destroy, or when its process exits with it open), an ``rdma.completion``
span per error or slow completion; per-process metrics with one series per
QP (docs/semantic-conventions.md, "RDMA").
"""

from __future__ import annotations

import ipaddress
import logging
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from opentelemetry.sdk.metrics.export import HistogramDataPoint, Metric
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.util.types import AttributeValue

from otelbpf.base.events import FLAG_IBV_POSTED, FLAG_INCOMPLETE, IbvFunc, Kind, StrKind
from otelbpf.correlate import metrics as m
from otelbpf.correlate.base import CorrelatorBase, CorrelatorSettings
from otelbpf.correlate.spans import make_span, scope
from otelbpf.families.ibverbs import abi
from otelbpf.families.ibverbs.probes import read_device_name
from otelbpf.sensor.family import MapEntries, MapReader

log = logging.getLogger(__name__)

SCOPE = scope("otelbpf.ibverbs")
IBV_KINDS = (Kind.IBV_OPEN, Kind.IBV_COMPLETION)

#: Latency histogram bounds: 2^1 .. 2^35 ns, in seconds. The kernel counts completions in
#: log2(ns) buckets 0..35 (the last also holding anything longer), and bucket b, [2^b, 2^(b+1))
#: ns, is exactly the OTel bucket whose upper bound is 2^(b+1) ns: the counts map one to one.
LATENCY_BOUNDS = tuple(2.0**b / 1e9 for b in range(1, 36))
QUEUES = ("send", "receive")

QpKey = tuple[int, int, int]  # pid, context, qpn
QpGenKey = tuple[int, int, int, int]  # pid, context, qpn, gen: one incarnation's counters
#: The error counters' key as looked up: a QP whose counters the kernel has not shown has no gen.
_ErrorsKey = tuple[int, int, int, int | None]


def peer_address(gid: bytes) -> str | None:
    """The IP address inside a RoCE GID (IPv4-mapped or IPv6); None for an
    InfiniBand GID (a link-local subnet prefix + port GUID: no IP in it)."""
    if len(gid) != 16 or not any(gid):
        return None
    addr = ipaddress.IPv6Address(gid)
    if addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    if addr.is_link_local:
        return None
    return str(addr)


def _gid_text(gid: bytes) -> str:
    return ":".join(gid[i : i + 2].hex() for i in range(0, 16, 2))


@dataclass
class _Qp:
    """One QP incarnation and what the control path said about it."""

    pid: int
    ctx: int
    qpn: int
    gen: int | None  # ibv_qps .gen; None until the kernel's counters are seen
    start_ns: int  # wall: created, or first seen
    created: bool = False
    qp_type: str | None = None
    state: str | None = None
    remote_qpn: int | None = None
    dlid: int | None = None
    port: int | None = None
    gid: bytes | None = None
    mtu: int | None = None
    transitions: Counter[str] = field(default_factory=Counter)  # new state -> count
    end_ns: int | None = None
    end_reason: str | None = None

    def attributes(self, device: str | None) -> dict[str, AttributeValue]:
        attrs: dict[str, AttributeValue] = {"rdma.qp.num": self.qpn}
        if device:
            attrs["rdma.device.name"] = device
        if self.qp_type:
            attrs["rdma.qp.type"] = self.qp_type
        if self.remote_qpn is not None:
            attrs["rdma.qp.remote.num"] = self.remote_qpn
        if self.dlid:
            attrs["rdma.qp.remote.lid"] = self.dlid
        if self.gid is not None:
            attrs["rdma.qp.remote.gid"] = _gid_text(self.gid)
            address = peer_address(self.gid)
            if address:
                attrs["network.peer.address"] = address
        if self.port:
            attrs["rdma.port.num"] = self.port
        return attrs


_METRICS = {
    # name: (kind, unit, description)
    "rdma.wr.posted": ("sum", "{wr}", "Work requests posted, per QP and opcode"),
    "rdma.wr.bytes": ("sum", "By", "Bytes in posted work requests (the sum of their SGE lengths)"),
    "rdma.completions": (
        "sum",
        "{completion}",
        "Work completions polled, per QP, opcode and status (errors: status other than SUCCESS)",
    ),
    "rdma.completion.bytes": ("sum", "By", "byte_len of successful work completions"),
    "rdma.completion.duration": (
        "histogram",
        "s",
        "Post to completion of signaled work requests, per queue (receive: posted to data arrived)",
    ),
    "rdma.qp.state.changes": (
        "sum",
        "{transition}",
        "Successful ibv_modify_qp state transitions, by the state entered",
    ),
    "rdma.memory.registered": ("gauge", "By", "Memory registered (ibv_reg_mr*) and not deregistered"),
    "rdma.memory.regions": ("gauge", "{region}", "Memory regions registered and not deregistered"),
    "otelbpf.ibverbs.anomalies": ("sum", "{event}", "What the agent could not account fully"),
}


#: (metric name, attributes): one series of a process's metrics.
_SeriesKey = tuple[str, frozenset[tuple[str, AttributeValue]]]


class _Series:
    """Points of one process's metrics, summed by (metric, attributes)."""

    def __init__(self) -> None:
        self.values: dict[_SeriesKey, float] = {}
        self.hists: dict[_SeriesKey, tuple[np.ndarray, float]] = {}
        self.starts: dict[_SeriesKey, int] = {}

    def add(self, name: str, attrs: m.Attrs, value: float, start: int) -> None:
        key = (name, frozenset(attrs.items()))
        self.values[key] = self.values.get(key, 0) + value
        self.starts[key] = min(self.starts.get(key, start), start)

    def add_histogram(self, name: str, attrs: m.Attrs, counts: np.ndarray, total: float, start: int) -> None:
        key = (name, frozenset(attrs.items()))
        old_counts, old_total = self.hists.get(key, (0, 0.0))
        self.hists[key] = (counts + old_counts, total + old_total)
        self.starts[key] = min(self.starts.get(key, start), start)

    def set_gauge(self, name: str, attrs: m.Attrs, value: float) -> None:
        self.values[(name, frozenset(attrs.items()))] = value

    def merge(self, other: _Series, only_existing: bool = False) -> None:
        for key, v in other.values.items():
            if not only_existing or key in self.values:
                self.add(key[0], dict(key[1]), v, other.starts[key])
        for key, (counts, total) in other.hists.items():
            if not only_existing or key in self.hists:
                self.add_histogram(key[0], dict(key[1]), counts, total, other.starts[key])

    def metrics(self, now: int) -> list[Metric]:
        # A name's points are either sums or gauges (values) or histograms, never both.
        by_name: dict[str, list[tuple[m.Attrs, float, int]]] = defaultdict(list)
        for (name, attrs), v in sorted(self.values.items(), key=lambda kv: kv[0][0]):
            by_name[name].append((dict(attrs), v, self.starts.get((name, attrs), 0)))
        hists_by_name: dict[str, list[tuple[m.Attrs, tuple[np.ndarray, float], int]]] = defaultdict(list)
        for (name, attrs), (counts, total) in self.hists.items():
            hists_by_name[name].append((dict(attrs), (counts, total), self.starts[(name, attrs)]))
        out = []
        for name, points in by_name.items():
            kind, unit, description = _METRICS[name]
            metric: Metric | None
            if kind == "sum":
                metric = m.cumulative_sum_since(name, unit, description, points, now)
            else:
                metric = m.gauge(name, unit, description, [(a, v) for a, v, _st in points], now)
            if metric is not None:  # never None: a name is here for its points
                out.append(metric)
        for name, hist_points in hists_by_name.items():
            _kind, unit, description = _METRICS[name]
            # The kernel's log2 buckets keep no min or max: None leaves OTLP's optional fields
            # unset (the SDK's dataclass types them float only).
            hdps = [
                HistogramDataPoint(
                    attributes=a,
                    start_time_unix_nano=st,
                    time_unix_nano=now,
                    count=int(c.sum()),
                    sum=t,
                    bucket_counts=[int(x) for x in c],
                    explicit_bounds=list(LATENCY_BOUNDS),
                    min=None,  # type: ignore[arg-type]
                    max=None,  # type: ignore[arg-type]
                )
                for a, (c, t), st in hist_points
            ]
            metric = m.histogram(name, unit, description, hdps)
            if metric is not None:  # never None: a name is here for its points
                out.append(metric)
        return out


def continue_series(series: _Series, ended: _Series, carry: _Series) -> None:
    """One export of a process: add the QPs that ended since the last one (``ended``) to the
    live ones (``series``), then what ended in earlier exports (``carry``) to every series
    that goes on. A QP number used again with the same peer (a library reloaded, a QP made
    again) continues its series: cumulative, monotonic. ``ended`` comes first: a later
    incarnation destroyed with nothing live beside it still continues the earlier one's
    counts (merged after the carry, it restarted them: 12 fell back to 6)."""
    series.merge(ended)
    series.merge(carry, only_existing=True)
    carry.merge(ended)


@dataclass
class _Process:
    pid: int
    resource: Resource
    start_ns: int
    mrs: dict[int, tuple[int, int]] = field(default_factory=dict)  # mr pointer -> (context, bytes)
    registered: Counter[int] = field(default_factory=Counter)  # context -> bytes registered now
    regions: Counter[int] = field(default_factory=Counter)  # context -> MRs registered now
    anomalies: Counter[str] = field(default_factory=Counter)  # reason -> events
    exited: bool = False
    carry: _Series = field(default_factory=lambda: _Series())  # counts of QPs destroyed and exported


class IbverbsCorrelator(CorrelatorBase[_Process]):
    scope = SCOPE

    def __init__(
        self,
        settings: CorrelatorSettings,
        read_map: MapReader,
        forget_keys: Callable[[str, list[object]], None],
        *,
        traces: bool = True,
        max_spans_per_second: int = 20_000,
        on_sampled_out: Callable[[int], None] = lambda n: None,
        sync: Callable[[], object] = lambda: None,
    ) -> None:
        super().__init__(settings, max_spans_per_second=max_spans_per_second)
        self._sync = sync
        #: exports skipped because the events describing the counters were not processed in time
        self.deferred_exports = 0
        self._read_map = read_map
        self._forget_keys = forget_keys
        self._traces = traces
        self._on_sampled_out = on_sampled_out
        self._devices: dict[tuple[int, int], str] = {}  # (pid, context) -> device name
        self._current: dict[QpKey, _Qp] = {}  # the latest incarnation of each QP number
        self._retired: dict[QpGenKey, _Qp] = {}  # destroyed, counters not yet exported
        #: pid -> wall time its last metrics were exported after it exited: its map keys may be
        #: read once more (the sensor's final snapshot) and are ignored then.
        self._finished: dict[int, int] = {}

    # -- input ------------------------------------------------------------

    def _new_process(self, pid: int, resource: Resource, start_ns: int) -> _Process:
        return _Process(pid, resource, start_ns)

    def on_strings(self, arr: np.ndarray) -> None:
        mine = arr[arr["kind"] == StrKind.IBV_CONTEXT]
        with self._lock:
            for rec in mine:
                name = rec["s"].split(b"\0", 1)[0].decode(errors="replace")
                self._devices[(int(rec["pid"]), int(rec["a0"]))] = name

    def on_events(self, arr: np.ndarray) -> None:
        kinds = arr["kind"]
        mine = arr[((kinds >= IBV_KINDS[0]) & (kinds <= IBV_KINDS[1])) | (kinds == Kind.PROC_EXIT)]
        if not len(mine):
            return
        spans: list[ReadableSpan] = []
        with self._lock:
            for rec in mine.tolist():
                spans.extend(self._event(rec))
            if self._traces:
                allowed = self._budget.take(len(spans))
                if allowed < len(spans):
                    self._on_sampled_out(len(spans) - allowed)
                spans = spans[:allowed]
            else:
                spans = []
        if spans:
            self.spans_emitted += len(spans)
            self._emit(spans)

    def _event(self, rec: tuple[int, ...]) -> list[ReadableSpan]:
        ts, dur, pid, tid, kind, func, flags, ret, a0, a1, a2, a3 = rec
        if kind == Kind.PROC_EXIT:
            return self._process_exit(pid, ts)
        p = self._proc(pid)
        if flags & FLAG_INCOMPLETE:
            p.anomalies["incomplete"] += 1
        if kind == Kind.IBV_COMPLETION:
            return self._completion_span(rec)
        if kind == Kind.IBV_QP_GID:
            self._qp(pid, a0, a1, ts).gid = int(a2).to_bytes(8, "little") + int(a3).to_bytes(8, "little")
            return []
        attrs: dict[str, object] = {"thread.id": tid}
        ctx = a0
        spans: list[ReadableSpan] = []
        if kind == Kind.IBV_OPEN:
            ctx = a1
            if ret == 0:
                attrs["rdma.context"] = f"{ctx:#x}"
        elif kind == Kind.IBV_CREATE_QP and ret == 0:
            qp = self._created(pid, ctx, a2, ts)
            attrs.update(qp.attributes(None))
            attrs["rdma.qp.max_send_wr"] = a3 & 0xFFFFFFFF
            attrs["rdma.qp.max_recv_wr"] = a3 >> 32
        elif kind == Kind.IBV_MODIFY_QP:
            attrs.update(self._modified(pid, ctx, a1, a2, ts, ret == 0))
        elif kind == Kind.IBV_DESTROY_QP:
            qp = self._qp(pid, ctx, a1, ts)
            attrs.update(qp.attributes(None))
            if ret == 0:
                qp.end_ns, qp.end_reason = self._clock.to_wall(ts + dur), "destroyed"
                spans.append(self._lifetime_span(qp))
        elif kind == Kind.IBV_REG_MR:
            attrs["rdma.mr.length"] = a2
            attrs["rdma.mr.address"] = f"{a1:#x}"
            if ret == 0:
                p.mrs[a3] = (ctx, a2)
                p.registered[ctx] += a2
                p.regions[ctx] += 1
        elif kind == Kind.IBV_DEREG_MR:
            attrs["rdma.mr.length"] = a2
            attrs["rdma.mr.address"] = f"{a1:#x}"
            if ret == 0:
                known = p.mrs.pop(a3, None)
                if known is None:
                    p.anomalies["untracked_dereg"] += 1  # registered before the agent started
                else:
                    p.registered[known[0]] -= known[1]
                    p.regions[known[0]] -= 1
        elif kind == Kind.IBV_CREATE_CQ:
            attrs["rdma.cq.entries"] = a1
        spans.insert(0, self._call_span(rec, ctx, attrs))
        return spans

    def _qp(self, pid: int, ctx: int, qpn: int, ts: int) -> _Qp:
        """The current incarnation of a QP number (one seen only now: made before the agent)."""
        key = (pid, ctx, qpn)
        qp = self._current.get(key)
        if qp is None:
            qp = self._current[key] = _Qp(pid, ctx, qpn, None, self._clock.to_wall(ts))
        return qp

    def _created(self, pid: int, ctx: int, packed: int, ts: int) -> _Qp:
        qpn = packed & 0xFFFFFF
        key = (pid, ctx, qpn)
        qp = self._current.get(key)
        if qp is None or qp.gen != ts:  # else: its counters were read before this event
            if qp is not None and qp.end_ns is None and qp.gen is not None:
                qp.end_ns, qp.end_reason = self._clock.to_wall(ts), "replaced"  # destroyed unseen
                self._retired[(pid, ctx, qpn, qp.gen)] = qp
            qp = self._current[key] = _Qp(pid, ctx, qpn, ts, self._clock.to_wall(ts))
        qp.created = True
        qp.start_ns = self._clock.to_wall(ts)
        qp.qp_type = abi.QP_TYPES.get((packed >> 32) & 0xFF, f"type{(packed >> 32) & 0xFF}")
        return qp

    def _modified(self, pid: int, ctx: int, a1: int, a2: int, ts: int, ok: bool) -> dict[str, object]:
        qpn = a1 & 0xFFFFFF
        qp = self._qp(pid, ctx, qpn, ts)
        mask = a2 & 0xFFFFFFFF
        attrs: dict[str, object] = {"rdma.qp.attr_mask": mask}
        has_state, has_av, has_dest, has_port = (bool(a1 >> b & 1) for b in (28, 30, 31, 60))
        state = abi.QP_STATES[(a1 >> 24) & 0x7] if has_state else None
        if state:
            attrs["rdma.qp.state"] = state
        if ok:
            if has_dest:
                qp.remote_qpn = (a1 >> 32) & 0xFFFFFF
            if has_av:
                qp.dlid = (a2 >> 32) & 0xFFFF or None
                qp.mtu = abi.MTU_BYTES.get((a1 >> 56) & 0xF)
                if not (a1 >> 29) & 1:
                    qp.gid = None
            if has_port:
                qp.port = (a2 >> 56) & 0xFF
            elif has_av and (a2 >> 48) & 0xFF:
                qp.port = (a2 >> 48) & 0xFF
            if state:
                qp.state = state
                qp.transitions[state] += 1
        attrs.update(qp.attributes(None))
        if qp.mtu:
            attrs["rdma.qp.path_mtu"] = qp.mtu
        return attrs

    def _process_exit(self, pid: int, ts: int) -> list[ReadableSpan]:
        spans = []
        for key, qp in list(self._current.items()):
            if key[0] == pid and qp.end_ns is None:
                qp.end_ns, qp.end_reason = self._clock.to_wall(ts), "process_exited"
                spans.append(self._lifetime_span(qp))
        if pid in self._procs:
            self._procs[pid].exited = True
        return spans

    # -- spans ------------------------------------------------------------

    def device_name(self, pid: int, ctx: int) -> str | None:
        """The device of a context: from its open, else read from the live process."""
        name = self._devices.get((pid, ctx))
        if name is None and ctx:
            try:
                name = self._devices[(pid, ctx)] = read_device_name(pid, ctx)
            except (OSError, ValueError):
                return None
        return name

    def _call_span(self, rec: tuple[int, ...], ctx: int, attrs: dict[str, object]) -> ReadableSpan:
        ts, dur, pid, _tid, kind, func, flags, ret, *_ = rec
        name = IbvFunc(func).name
        device = self.device_name(pid, ctx)
        if device:
            attrs["rdma.device.name"] = device
        error = None
        if flags & FLAG_INCOMPLETE:
            attrs["otelbpf.incomplete"] = True
            error = f"the thread exited before {name} returned"
        elif kind in (Kind.IBV_MODIFY_QP, Kind.IBV_DESTROY_QP, Kind.IBV_DEREG_MR, Kind.IBV_CLOSE):
            attrs["rdma.return_code"] = ret
            if ret != 0:
                error = f"{name} returned {ret}"
        elif ret != 0:
            error = f"{name} returned NULL"
        start = self._clock.to_wall(ts)
        return make_span(
            name,
            resource=self._proc(pid).resource,
            scope=SCOPE,
            start_ns=start,
            end_ns=start + dur,
            attributes=attrs,
            error=error,
        )

    def _lifetime_span(self, qp: _Qp) -> ReadableSpan:
        attrs = qp.attributes(self.device_name(qp.pid, qp.ctx))
        attrs["rdma.qp.end_reason"] = qp.end_reason
        if qp.state:
            attrs["rdma.qp.state"] = qp.state
        attrs["rdma.qp.transitions"] = sum(qp.transitions.values())
        if not qp.created:
            attrs["otelbpf.ibverbs.created_before_agent"] = True
        error = "the process exited with the QP open" if qp.end_reason == "process_exited" else None
        return make_span(
            "rdma.qp",
            resource=self._proc(qp.pid).resource,
            scope=SCOPE,
            start_ns=qp.start_ns,
            end_ns=max(qp.end_ns or qp.start_ns, qp.start_ns),
            attributes=attrs,
            error=error,
        )

    def _completion_span(self, rec: tuple[int, ...]) -> list[ReadableSpan]:
        ts, dur, pid, tid, _kind, slot, flags, status, ctx, a1, wr_id, a3 = rec
        qpn = a1 & 0xFFFFFFFF
        qp = self._current.get((pid, ctx, qpn))
        attrs: dict[str, AttributeValue] = qp.attributes(self.device_name(pid, ctx)) if qp else {"rdma.qp.num": qpn}
        attrs.update(
            {
                "thread.id": tid,
                "rdma.wc.opcode": abi.WC_NAMES.get(slot, "OTHER"),
                "rdma.wc.status": abi.wc_status_name(status),
                "rdma.wr.id": f"{wr_id:#x}",
                "rdma.wc.byte_len": a3 & 0xFFFFFFFF,
            }
        )
        if status:
            attrs["rdma.wc.vendor_err"] = a1 >> 32
        posted = bool(flags & FLAG_IBV_POSTED)
        if posted:
            attrs["rdma.wr.bytes"] = a3 >> 32
        else:
            attrs["otelbpf.ibverbs.post_unseen"] = True
        start = self._clock.to_wall(ts)
        error = f"work completion {abi.wc_status_name(status)}" if status else None
        return [
            make_span(
                "rdma.completion",
                resource=self._proc(pid).resource,
                scope=SCOPE,
                start_ns=start,
                end_ns=start + dur,
                attributes=attrs,
                error=error,
            )
        ]

    # -- metrics ----------------------------------------------------------

    def collect(self) -> list[tuple[Resource, list[Metric]]]:
        """Cumulative per-QP metrics per process; forgets destroyed QPs and exited processes."""
        now = self._clock.now_wall()
        # Only processes whose exit was processed before the maps are read are forgotten after
        # this export: one whose exit event arrives during the sync below may have posted after
        # the read, and its final counters go out with the next export.
        with self._lock:
            exited = {pid for pid, p in self._procs.items() if p.exited}
        live = self._read_map("ibv_qps")
        retired = self._read_map("ibv_retired")
        errors: dict[_ErrorsKey, Counter[tuple[int, int]]] = defaultdict(Counter)  # -> (slot, status) -> count
        error_keys: dict[_ErrorsKey, list[object]] = defaultdict(list)
        for k, v in self._read_map("ibv_errors"):
            errors[(k.pid, k.ctx, k.qpn, k.gen)][(k.slot, k.status)] += v
            error_keys[(k.pid, k.ctx, k.qpn, k.gen)].append(k)
        # The counters just read may run ahead of the events naming their QP's peer and
        # state (ibv_modify_qp): process every event emitted before the read, or a QP's
        # posts would go out once without its peer attributes, a series of its own. When
        # processing lags too far behind (the sync timed out, counted by the agent), this
        # export is skipped: the counters are cumulative, the next export carries them all.
        if self._sync() is False:
            self.deferred_exports += 1
            return []
        out = []
        with self._lock:
            self._finished = {pid: t for pid, t in self._finished.items() if t > now - 60 * 10**9}
            live = [(k, v) for k, v in live if k.pid not in self._finished]
            retired = [(k, v) for k, v in retired if k.pid not in self._finished]
            counted: dict[int, list[tuple[_Qp, object]]] = defaultdict(list)
            for k, stats in live:
                counted[k.pid].append((self._incarnation(k.pid, k.ctx, k.qpn, stats.gen, now), stats))
            done: list[tuple[QpGenKey, object]] = []
            final: dict[int, list[tuple[_Qp, object]]] = defaultdict(list)
            for k, stats in retired:
                qp = self._retired.pop((k.pid, k.ctx, k.qpn, k.gen), None)
                if qp is None:
                    qp = self._current.get((k.pid, k.ctx, k.qpn))
                    if qp is None or qp.gen not in (None, k.gen):
                        qp = _Qp(k.pid, k.ctx, k.qpn, k.gen, now, end_reason="destroyed")
                final[k.pid].append((qp, stats))
                done.append(((k.pid, k.ctx, k.qpn, k.gen), k))
            # A process that ever registered memory is exported until it is forgotten: its
            # gauges fall to zero when its regions are deregistered, and that zero must go out.
            noted = {pid for pid, p in self._procs.items() if p.regions or p.anomalies}
            for pid in set(counted) | set(final) | noted:
                p = self._proc(pid)
                series = _Series()
                for qp, stats in counted.get(pid, []):
                    self._add_qp(series, qp, stats, errors)
                ended = _Series()
                for qp, stats in final.get(pid, []):
                    self._add_qp(ended, qp, stats, errors)
                counted_qps = {id(qp) for qp, _ in counted.get(pid, []) + final.get(pid, [])}
                for qp in self._current.values():
                    if qp.pid == pid and id(qp) not in counted_qps and qp.transitions:
                        self._add_qp(series, qp, None, errors)  # never counted in the kernel
                continue_series(series, ended, p.carry)
                metrics = self._process_metrics(p, series, now)
                if metrics:
                    out.append((p.resource, metrics))
            self._forget(done, live, error_keys, exited, now)
        return out

    def _incarnation(self, pid: int, ctx: int, qpn: int, gen: int, now: int) -> _Qp:
        """The record of the live counters' QP: the current one, or a new incarnation whose
        create event is still on its way (the older one then waits for its retired counters)."""
        qp = self._current.get((pid, ctx, qpn))
        if qp is not None:
            if qp.gen is None:
                qp.gen = gen  # a QP made before the agent: its counters name its incarnation
            elif qp.gen != gen:
                self._retired[(pid, ctx, qpn, qp.gen)] = qp
                qp = None
        if qp is None:
            qp = self._current[(pid, ctx, qpn)] = _Qp(pid, ctx, qpn, gen, now)
        return qp

    def _add_qp(self, series: _Series, qp: _Qp, s: Any, errors: dict[_ErrorsKey, Counter[tuple[int, int]]]) -> None:
        """``s``: the QP's counters (a BCC ibv_qps or ibv_retired value), None when never counted."""
        base = qp.attributes(self.device_name(qp.pid, qp.ctx))
        start = qp.start_ns
        for state, n in qp.transitions.items():
            series.add("rdma.qp.state.changes", {**base, "rdma.qp.state": state}, n, start)
        if s is None:
            return
        for slot in range(abi.SLOTS):
            if s.posted[slot]:
                attrs = {**base, "rdma.wr.opcode": abi.WR_NAMES.get(slot, "OTHER")}
                series.add("rdma.wr.posted", attrs, s.posted[slot], start)
                series.add("rdma.wr.bytes", attrs, s.posted_bytes[slot], start)
            if s.done[slot]:
                wc = {**base, "rdma.wc.opcode": abi.WC_NAMES.get(slot, "OTHER")}
                series.add("rdma.completions", {**wc, "rdma.wc.status": "SUCCESS"}, s.done[slot], start)
                series.add("rdma.completion.bytes", wc, s.done_bytes[slot], start)
        for (slot, status), n in errors.get((qp.pid, qp.ctx, qp.qpn, qp.gen), Counter()).items():
            attrs = {
                **base,
                "rdma.wc.opcode": abi.WC_NAMES.get(slot, "OTHER"),
                "rdma.wc.status": abi.wc_status_name(status),
            }
            series.add("rdma.completions", attrs, n, start)
        for name, q in zip(QUEUES, s.q):
            if q.lat_count:
                counts = np.frombuffer(bytes(q.lat_buckets), dtype="<u8").astype(np.int64)
                series.add_histogram(
                    "rdma.completion.duration", {**base, "rdma.queue": name}, counts, q.lat_sum_ns / 1e9, start
                )
        if s.unmatched:
            series.add("otelbpf.ibverbs.anomalies", {"reason": "completion_post_unseen"}, s.unmatched, start)

    def _forget(
        self,
        done: list[tuple[QpGenKey, object]],
        live: MapEntries,
        error_keys: dict[_ErrorsKey, list[object]],
        exited: set[int],
        now: int,
    ) -> None:
        """After export: destroyed QPs' final counters and everything of processes that had
        exited before the counters were read."""
        gone_keys = {key for key, _k in done}
        self._forget_keys("ibv_retired", [k for _key, k in done])
        self._forget_keys("ibv_qps", [k for k, _s in live if k.pid in exited])
        self._forget_keys(
            "ibv_errors", [k for key, ks in error_keys.items() if key in gone_keys or key[0] in exited for k in ks]
        )
        for key, qp in list(self._current.items()):
            if qp.end_reason == "process_exited":
                continue  # its live counters are read once more, then it goes with its process
            if qp.end_ns is not None and (qp.gen is None or (*key, qp.gen) in gone_keys):
                del self._current[key]
        for pid in exited:
            self._current = {k: q for k, q in self._current.items() if k[0] != pid}
            self._retired = {k: q for k, q in self._retired.items() if k[0] != pid}
            self._devices = {k: d for k, d in self._devices.items() if k[0] != pid}
            del self._procs[pid]
            self._finished[pid] = now
            self._info.forget(pid)

    def _process_metrics(self, p: _Process, series: _Series, now: int) -> list[Metric]:
        for ctx, n in p.regions.items():
            name = self.device_name(p.pid, ctx) or f"{ctx:#x}"
            series.set_gauge("rdma.memory.registered", {"rdma.device.name": name}, p.registered[ctx])
            series.set_gauge("rdma.memory.regions", {"rdma.device.name": name}, n)
        for reason, n in p.anomalies.items():
            series.add("otelbpf.ibverbs.anomalies", {"reason": reason}, n, p.start_ns)
        return series.metrics(now)

    # -- for tests and the summary ---------------------------------------

    def qps(self) -> list[dict[str, object]]:
        with self._lock:
            return [
                {"pid": q.pid, "qpn": q.qpn, "state": q.state, "remote_qpn": q.remote_qpn, "ended": q.end_reason}
                for q in list(self._current.values()) + list(self._retired.values())
            ]
