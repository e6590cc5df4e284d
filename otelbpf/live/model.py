"""Snapshots (state.py) -> the tables `otelbpf top` shows. Pure: no terminal, no socket.

Rates come from two metric collections (cumulative counts, divided by the time between
them), so they change at the agent's metrics interval. Latency percentiles and HTTP routes
come from the spans in the newest snapshot (the agent's last ``max_spans`` spans, the ones its
span budget and ``min_span_duration`` let through): they say "in the recent spans", not "of
every call". A head-sampled request span counts for as many requests as it was kept for (its
adjusted count), so a route's numbers estimate all its requests under sampling. Live findings
are the diagnosis engine's (analyze/diagnose.py) over those spans and the latest metrics, plus
the NCCL correlator's live straggler counts.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from otelbpf.analyze import diagnose
from otelbpf.analyze.idle import Timeline, timeline_of
from otelbpf.live.state import JsonObject

AGENT_SERVICE = "otelbpf"
CUDA_SCOPE, NCCL_SCOPE, HTTP_SCOPE = "otelbpf.cuda", "otelbpf.nccl", "otelbpf.http"
SERVER = 2
#: One metric series: (metric name, its attributes sorted into pairs).
SeriesKey = tuple[str, tuple[tuple[str, Any], ...]]
#: A process's series, each with its point (the snapshot's, with its metric's ``kind`` added).
Points = dict[SeriesKey, JsonObject]


@dataclass
class ApiRow:
    pid: int
    api: str
    calls: int  # cumulative, from cuda.api.calls
    calls_per_s: float | None
    spans: int  # recent spans of this API (the percentiles' sample)
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None


@dataclass
class ProcessRow:
    pid: int
    service: str
    gpu: bool
    calls_per_s: float | None
    launches_per_s: float | None
    bytes_per_s: dict[str, float]  # "H2D", "D2H", ... -> bytes/s
    host_bytes_per_s: dict[str, float]  # "H2D pageable", ... -> bytes/s
    memory_in_use: float | None
    memory_high_water: float | None
    sync_wait_share: float | None  # seconds in sync waits per second (summed over threads)


@dataclass
class KernelRow:
    pid: int
    kernel: str
    launches: int
    launches_per_s: float | None


@dataclass
class RankRow:
    pid: int
    service: str
    rank: int | None
    collectives: int
    collectives_per_s: float | None
    wait_mean_ms: float | None
    straggled: int  # collectives the live detector found it late on
    straggler_class: str
    current_straggler: bool = False


@dataclass
class RouteRow:
    pid: int
    route: str
    requests: int  # in the recent spans, each counted for as many as its sampling kept it for
    per_s: float | None
    errors: int
    p50_ms: float
    p95_ms: float


@dataclass
class AgentRow:
    events_per_s: float | None
    events_received: int
    lost: int
    dropped: int
    cpu_share: float | None  # of one core
    rss_bytes: float | None
    #: Of the requests head sampling decided since the last collection, the share kept as spans
    #: (otelbpf.http.sampled); None when it decided none.
    http_kept_share: float | None = None


@dataclass
class Tables:
    time_unix_nano: int
    metrics_age_s: float | None
    processes: list[ProcessRow] = field(default_factory=list)
    apis: list[ApiRow] = field(default_factory=list)
    kernels: list[KernelRow] = field(default_factory=list)
    ranks: list[RankRow] = field(default_factory=list)
    routes: list[RouteRow] = field(default_factory=list)
    findings: list[JsonObject] = field(default_factory=list)
    agent: AgentRow | None = None

    def to_json(self) -> JsonObject:
        return asdict(self)


def _pid(resource: JsonObject) -> int:
    return int(resource.get("process.pid", 0) or 0)


def _series(snap: JsonObject | None) -> dict[int, Points]:
    """pid -> {(metric, attrs tuple): point}; the agent's own under pid -1."""
    out: dict[int, Points] = defaultdict(dict)
    for proc in (snap or {}).get("processes", []):
        res = proc.get("resource", {})
        pid = -1 if res.get("service.name") == AGENT_SERVICE else _pid(res)
        for m in proc.get("metrics", []):
            for p in m.get("points", []):
                out[pid][(m["name"], tuple(sorted(p.get("attributes", {}).items())))] = {**p, "kind": m.get("kind")}
    return out


def _val(p: JsonObject | None) -> float:
    if p is None:
        return 0.0
    return float(p.get("value", p.get("sum", 0)) or 0)


def _sum(points: Points, name: str, *keys: str) -> dict[str, float]:
    """``name``'s points summed by the values of ``keys`` (joined by a space; "" with none)."""
    out: dict[str, float] = defaultdict(float)
    for (n, attrs), p in points.items():
        if n == name:
            a = dict(attrs)
            out[" ".join(str(a.get(k, "")) for k in keys)] += _val(p)
    return dict(out)


def _pct(values: list[float], q: float) -> float:
    """The nearest-rank percentile: the smallest value with at least ``q`` of them at or below it."""
    values = sorted(values)
    return values[max(0, math.ceil(q * len(values)) - 1)]


def _weighted_pct(values: list[tuple[float, int]], q: float) -> float:
    """``_pct`` of (value, weight) pairs, each value standing for ``weight`` of them: the smallest
    value with at least ``q`` of the total weight at or below it (with weights of 1, ``_pct``)."""
    values = sorted(values)
    need = max(1, math.ceil(q * sum(w for _, w in values)))
    seen = 0
    for value, weight in values:
        seen += weight
        if seen >= need:
            return value
    return values[-1][0]


#: What a head-sampled request span stands for (families/http/sampling.py: 2^shift); 1 without it.
ADJUSTED_COUNT = "otelbpf.http.sampling.adjusted_count"


def _adjusted(span: JsonObject) -> int:
    try:
        return max(1, int(span.get("attributes", {}).get(ADJUSTED_COUNT, 1)))
    except (TypeError, ValueError):
        return 1


class Rates:
    """Per-second deltas between an older and a newer metric collection; with no older one
    yet, each counter's mean rate since its point's start (the agent's first collection comes
    a second after it starts: rates from then on, not after two metrics intervals)."""

    def __init__(self, old: JsonObject | None, new: JsonObject) -> None:
        t0 = (old or {}).get("metrics_time_unix_nano", 0)
        t1 = new.get("metrics_time_unix_nano", 0)
        self.t1 = t1
        self.dt = (t1 - t0) / 1e9 if old and t1 > t0 else None
        self.old, self.new = _series(old), _series(new)

    def _since_start(self, pid: int, name: str, *keys: str) -> dict[str, float] | None:
        out: dict[str, float] = defaultdict(float)
        for (n, attrs), p in self.new.get(pid, {}).items():
            start = p.get("start") or 0
            if n != name or not start or self.t1 <= start:
                continue
            a = dict(attrs)
            out[" ".join(str(a.get(k, "")) for k in keys)] += _val(p) / ((self.t1 - start) / 1e9)
        return dict(out) or None

    def per_s(self, pid: int, name: str, *keys: str) -> dict[str, float] | None:
        if self.dt is None:
            return self._since_start(pid, name, *keys)
        now, before = _sum(self.new.get(pid, {}), name, *keys), _sum(self.old.get(pid, {}), name, *keys)
        # a counter that went down started again (an exec resets a process's series): count from zero
        return {k: (v - before.get(k, 0.0) if v >= before.get(k, 0.0) else v) / self.dt for k, v in now.items()}

    def total_per_s(self, pid: int, name: str) -> float | None:
        got = self.per_s(pid, name)
        return None if got is None else sum(got.values())


def build(old: JsonObject | None, new: JsonObject) -> Tables:
    """The tables for ``new``, with rates against ``old`` (an earlier snapshot whose metrics
    are from an earlier collection; None: no rates yet)."""
    rates = Rates(old, new)
    series = rates.new
    t = new.get("time_unix_nano", 0)
    mt = new.get("metrics_time_unix_nano", 0)
    tables = Tables(time_unix_nano=t, metrics_age_s=round((t - mt) / 1e9, 1) if mt else None)
    spans = new.get("spans", [])
    by_pid: dict[int, list[JsonObject]] = defaultdict(list)
    services: dict[int, str] = {}
    for s in spans:
        by_pid[s.get("pid", 0)].append(s)
        services.setdefault(s.get("pid", 0), s.get("service", ""))
    collected = {
        _pid(p.get("resource", {})): str(p.get("resource", {}).get("service.name", ""))
        for p in new.get("processes", [])
        if p.get("resource", {}).get("service.name") != AGENT_SERVICE
    }
    if collected:  # the processes of the last collection: those whose spans linger in the ring exited
        services = collected
    timelines = timeline_of(d for d in new.get("timelines", ()) if isinstance(d, dict))

    for pid in sorted(services):
        points = series.get(pid, {})
        mine = by_pid.get(pid, [])
        gpu = any(n.startswith(("cuda.", "nccl.")) for n, _a in points) or any(
            s.get("scope") in (CUDA_SCOPE, NCCL_SCOPE) for s in mine
        )
        sync = rates.per_s(pid, "cuda.sync.duration")
        in_use = _sum(points, "cuda.memory.in_use").get("")
        high = _sum(points, "cuda.memory.high_water").get("")
        tables.processes.append(
            ProcessRow(
                pid,
                services[pid],
                gpu,
                rates.total_per_s(pid, "cuda.api.calls"),
                rates.total_per_s(pid, "cuda.kernel.launches"),
                rates.per_s(pid, "cuda.memcpy.bytes", "cuda.memcpy.direction") or {},
                rates.per_s(pid, "cuda.memcpy.host_bytes", "cuda.memcpy.direction", "cuda.memcpy.host_memory") or {},
                in_use,
                high,
                sum(sync.values()) if sync is not None else None,
            )
        )
        _apis(tables, rates, pid, points, mine)
        _kernels(tables, rates, pid, points)
        _rank(tables, rates, pid, services[pid], points, mine)
        _routes(tables, pid, mine)
        tables.findings += _findings(pid, services[pid], points, mine, timelines.get(pid))
    tables.processes.sort(key=lambda r: (not r.gpu, -(r.calls_per_s or 0), r.pid))
    tables.kernels.sort(key=lambda r: (-r.launches, r.kernel))
    tables.findings.sort(key=lambda f: (f.get("cause") == "unexplained", -f.get("cost_s", 0)))
    if tables.ranks:
        worst = max(tables.ranks, key=lambda r: (r.straggled, r.pid))
        worst.current_straggler = worst.straggled > 0
        tables.ranks.sort(key=lambda r: (r.rank if r.rank is not None else 1 << 30, r.pid))
    tables.agent = _agent(rates, series.get(-1, {}))
    return tables


def _apis(tables: Tables, rates: Rates, pid: int, points: Points, spans: list[JsonObject]) -> None:
    calls = _sum(points, "cuda.api.calls", "cuda.api.function")
    per_s = rates.per_s(pid, "cuda.api.calls", "cuda.api.function") or {}
    durations: dict[str, list[float]] = defaultdict(list)
    for s in spans:
        if s.get("scope") == CUDA_SCOPE:
            durations[s["name"]].append((s["end"] - s["start"]) / 1e6)
    for api in sorted(set(calls) | set(durations)):
        d = durations.get(api, [])
        tables.apis.append(
            ApiRow(
                pid,
                api,
                int(calls.get(api, 0)),
                per_s.get(api),
                len(d),
                _pct(d, 0.5) if d else None,
                _pct(d, 0.95) if d else None,
                _pct(d, 0.99) if d else None,
            )
        )


def _kernels(tables: Tables, rates: Rates, pid: int, points: Points) -> None:
    per_s = rates.per_s(pid, "cuda.kernel.launches.top", "cuda.kernel.name") or {}
    for name, n in _sum(points, "cuda.kernel.launches.top", "cuda.kernel.name").items():
        tables.kernels.append(KernelRow(pid, name, int(n), per_s.get(name)))


def _rank(tables: Tables, rates: Rates, pid: int, service: str, points: Points, spans: list[JsonObject]) -> None:
    collectives = sum(_sum(points, "nccl.collectives").values())
    if not collectives and not any(s.get("scope") == NCCL_SCOPE for s in spans):
        return
    ranks = [s["attributes"]["nccl.rank"] for s in spans if isinstance(s.get("attributes", {}).get("nccl.rank"), int)]
    wait = [p for (n, _a), p in points.items() if n == "nccl.wait.duration"]
    count = sum(int(p.get("count", 0)) for p in wait)
    straggled = _sum(points, "nccl.straggler", "nccl.straggler.class")
    tables.ranks.append(
        RankRow(
            pid,
            service,
            ranks[-1] if ranks else None,
            int(collectives),
            rates.total_per_s(pid, "nccl.collectives"),
            round(sum(_val(p) for p in wait) / count * 1e3, 3) if count else None,
            int(sum(straggled.values())),
            max(straggled, key=lambda k: straggled[k]) if straggled else "",
        )
    )


def _routes(tables: Tables, pid: int, spans: list[JsonObject]) -> None:
    groups: dict[str, list[JsonObject]] = defaultdict(list)
    for s in spans:
        if s.get("scope") == HTTP_SCOPE and s.get("kind") == SERVER:
            a = s.get("attributes", {})
            route = (
                f"{a['rpc.service']}/{a.get('rpc.method', '')}"
                if "rpc.service" in a
                else f"{a.get('http.request.method', s['name'])} {a.get('http.route', a.get('url.path', ''))}"
            )
            groups[route.strip()].append(s)
    for route, reqs in groups.items():
        # A request kept with probability 2^-k stands for 2^k of them (its adjusted count): under
        # head sampling the table estimates every request, not only the ones traced.
        d = [((s["end"] - s["start"]) / 1e6, _adjusted(s)) for s in reqs]
        n = sum(w for _, w in d)
        window = (max(s["end"] for s in reqs) - min(s["start"] for s in reqs)) / 1e9
        errors = sum(
            _adjusted(s)
            for s in reqs
            if s.get("error") or int(s["attributes"].get("http.response.status_code", 0) or 0) >= 500
        )
        tables.routes.append(
            RouteRow(
                pid,
                route,
                n,
                round(n / window, 2) if window > 0 else None,
                errors,
                _weighted_pct(d, 0.5),
                _weighted_pct(d, 0.95),
            )
        )


def _findings(
    pid: int, service: str, points: Points, spans: list[JsonObject], timeline: Timeline | None = None
) -> list[JsonObject]:
    """The diagnosis engine over this process's recent CUDA spans, its off-CPU spans (the
    ``sched`` receiver's, when on: input starvation, blocking I/O, host contention), its CPU
    samples in time (the profiler's, when on: the code that ran in the gaps) and its latest
    metrics."""

    def of(scope_name: str) -> list[diagnose._Span]:
        return [
            diagnose._Span(
                s["name"],
                s["start"],
                s["end"],
                int(s["attributes"].get("thread.id", 0) or 0),
                s["attributes"],
                s["span_id"],
            )
            for s in spans
            if s.get("scope") == scope_name
        ]

    latest = {
        (n, a): (0, {"asDouble": p["value"]} if "value" in p else p, p.get("kind")) for (n, a), p in points.items()
    }
    label = f"{service} (pid {pid})"
    out = [
        asdict(f) for f in diagnose._process_findings(label, of(CUDA_SCOPE), latest, of(diagnose.SCHED_SCOPE), timeline)
    ]
    straggled = _sum(points, "nccl.straggler", "nccl.straggler.class")
    if straggled:
        cls = max(straggled, key=lambda k: straggled[k])
        out.append(
            {
                "cause": "nccl_straggler",
                "process": f"{service} (pid {pid})",
                "cost_s": 0.0,
                "share": 0.0,
                "summary": f"late on {int(sum(straggled.values()))} collectives ({cls})",
                "evidence": {},
                "fix": diagnose.FIXES["nccl_straggler"],
            }
        )
    return out


def _agent(rates: Rates, points: Points) -> AgentRow | None:
    if not points:
        return None
    received = _sum(points, "otelbpf.events.received")
    cpu = rates.total_per_s(-1, "process.cpu.time")
    rss = _sum(points, "process.memory.usage").get("")
    return AgentRow(
        rates.total_per_s(-1, "otelbpf.events.received"),
        int(sum(received.values())),
        int(sum(_sum(points, "otelbpf.events.lost").values())),
        int(
            sum(_sum(points, "otelbpf.events.dropped").values()) + sum(_sum(points, "otelbpf.export.dropped").values())
        ),
        cpu,
        rss,
        _kept_share(rates.per_s(-1, "otelbpf.http.sampled", "decision")),
    )


def _kept_share(decided: dict[str, float] | None) -> float | None:
    """kept / all decisions; ``red_map_full`` is not a decision of its own (a shed request the
    kernel could not count, already counted as shed)."""
    if not decided:
        return None
    total = sum(v for k, v in decided.items() if k != "red_map_full")
    return decided.get("kept", 0.0) / total if total > 0 else None
