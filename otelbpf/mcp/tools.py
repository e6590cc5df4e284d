"""The answers the MCP tools give over an output folder, as plain dicts.

Each answer names what it rests on under ``evidence``: span ids with their trace ids, the
metric points (name, attributes, time) it read, or a profile file and its sample indices, so
an assistant can show where a number came from. Every list is cut at the caller's ``limit``
(the server caps it) and says how many there were (``total``).

The readers are analyze/'s: ``summary`` for metrics and spans (through folder.py),
``diagnose`` for findings, ``collectives``/``stragglers`` for NCCL ranks.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter, defaultdict
from dataclasses import asdict

from otelbpf.analyze import collectives, diagnose, stragglers
from otelbpf.analyze.summary import AGENT_SCOPE, _num
from otelbpf.mcp.folder import Data, Folder, FolderError, JsonObject, ProcKey, Span
from otelbpf.mcp.profiles import ProfileError, top_functions

#: Span kinds (OTLP): server requests are what ``slow_requests`` lists.
SERVER, CLIENT = 2, 3
CUDA_SCOPE, NCCL_SCOPE, HTTP_SCOPE = "otelbpf.cuda", "otelbpf.nccl", "otelbpf.http"
EVIDENCE = 5
TRACE_ID = re.compile(r"^[0-9a-f]{32}$")
PROFILE_NAME = re.compile(r"^[A-Za-z0-9_.-]+\.pb\.gz$")
#: What a request's CUDA child shows besides its name and duration.
_CHILD_ATTRS = ("cuda.memcpy.bytes", "cuda.memcpy.direction", "cuda.memcpy.host_memory", "cuda.kernel.name")


class ToolInputError(Exception):
    """The caller asked for something the folder does not have; the message says what there is."""


def _cite(spans: list[Span], n: int = EVIDENCE) -> list[JsonObject]:
    return [{"trace_id": s.trace_id, "span_id": s.span_id} for s in spans[:n]]


def _label(proc: ProcKey, res: JsonObject) -> JsonObject:
    return {
        "service": res.get("service.name", proc[0]),
        "pid": int(res.get("process.pid", proc[1]) or 0),
        "host": res.get("host.name", ""),
    }


def _points(data: Data, proc: ProcKey, name: str) -> list[tuple[JsonObject, JsonObject, int]]:
    """(attributes, point, time) of every series of ``name`` in the process, as last exported."""
    return [(dict(a), dp, t) for (n, a), (t, dp, _k) in data.metrics.get(proc, {}).items() if n == name]


def _metric_cite(name: str, attrs: JsonObject, t: int) -> JsonObject:
    return {"metric": name, "attributes": attrs, "time_unix_nano": str(t)}


def _by_proc(data: Data) -> dict[ProcKey, list[Span]]:
    out: dict[ProcKey, list[Span]] = defaultdict(list)
    for s in data.spans:
        out[s.proc].append(s)
    return out


def _is_gpu(data: Data, proc: ProcKey, spans: list[Span]) -> bool:
    return any(s.scope in (CUDA_SCOPE, NCCL_SCOPE) for s in spans) or any(
        n.startswith(("cuda.", "nccl.")) for (n, _a) in data.metrics.get(proc, {})
    )


def _procs(data: Data, pid: int | None) -> list[ProcKey]:
    keys = [k for k in data.procs if k[0] != "otelbpf"]
    if pid is not None:
        keys = [k for k in keys if int(data.procs[k].get("process.pid", k[1]) or 0) == pid]
        if not keys:
            pids = sorted({int(data.procs[k].get("process.pid", 0) or 0) for k in data.procs if k[0] != "otelbpf"})
            raise ToolInputError(f"no process with pid {pid} in the folder; its processes: {pids[:50]}")
    return keys


def _meta(data: Data) -> JsonObject:
    return {"files": data.files, "lines_still_being_written": data.partial}


def list_processes(data: Data, profiles: list[str], limit: int) -> JsonObject:
    spans = _by_proc(data)
    rows = []
    for proc in _procs(data, None):
        mine = spans.get(proc, [])
        res = data.procs[proc]
        label = _label(proc, res)
        launches = sum(_num(dp) for _a, dp, _t in _points(data, proc, "cuda.kernel.launches"))
        rows.append(
            {
                **label,
                "gpu": _is_gpu(data, proc, mine),
                "command_line": str(res.get("process.command_line", ""))[:256],
                "spans": dict(Counter(s.scope for s in mine if s.scope != AGENT_SCOPE)),
                # the agent's live diagnosis of it (otelbpf.finding spans): not the process's own work
                "agent_finding_spans": sum(1 for s in mine if s.scope == AGENT_SCOPE),
                "kernel_launches": int(launches),
                "profiles": [p for p in profiles if p.rsplit("-", 3)[1:2] == [str(label["pid"])]][:10],
                "evidence": {
                    "spans": _cite(sorted((s for s in mine if s.scope != AGENT_SCOPE), key=lambda s: s.start)),
                    "metrics": sorted({n for (n, _a) in data.metrics.get(proc, {})})[:20],
                },
            }
        )
    rows.sort(key=lambda r: (not r["gpu"], -sum(r["spans"].values()), r["pid"]))
    return {"total": len(rows), "processes": rows[:limit], **_meta(data)}


def gpu_summary(data: Data, pid: int | None) -> JsonObject:
    spans = _by_proc(data)
    out = [
        _gpu_process(data, proc, spans.get(proc, []))
        for proc in _procs(data, pid)
        if _is_gpu(data, proc, spans.get(proc, []))
    ]
    return {"total": len(out), "processes": out, **_meta(data)}


def _gpu_process(data: Data, proc: ProcKey, mine: list[Span]) -> JsonObject:
    cites: list[JsonObject] = []

    def series(name: str) -> list[tuple[JsonObject, JsonObject]]:
        got = _points(data, proc, name)
        cites.extend(_metric_cite(name, a, t) for a, _dp, t in got)
        return [(a, dp) for a, dp, _t in got]

    launches = {a.get("cuda.api.function", "?"): int(_num(dp)) for a, dp in series("cuda.kernel.launches")}
    calls = {a.get("cuda.api.function", "?"): int(_num(dp)) for a, dp in series("cuda.api.calls")}
    copied = {a.get("cuda.memcpy.direction", "?"): int(_num(dp)) for a, dp in series("cuda.memcpy.bytes")}
    host = {
        f"{a.get('cuda.memcpy.direction', '?')} {a.get('cuda.memcpy.host_memory', '?')}": int(_num(dp))
        for a, dp in series("cuda.memcpy.host_bytes")
    }
    syncs = {}
    for a, dp in series("cuda.sync.duration"):
        count = int(dp.get("count", 0))
        if count:
            syncs[a.get("cuda.api.function", "?")] = {
                "count": count,
                "mean_ms": round(float(dp.get("sum", 0)) / count * 1e3, 4),
                "max_ms": round(float(dp.get("max", 0)) * 1e3, 4),
            }
    errors = [
        {"function": a.get("cuda.api.function"), "error": a.get("cuda.error.name"), "count": int(_num(dp))}
        for a, dp in series("cuda.api.errors")
    ]
    high = [_num(dp) for _a, dp in series("cuda.memory.high_water")]
    in_use = [_num(dp) for _a, dp in series("cuda.memory.in_use")]
    slowest = sorted((s for s in mine if s.scope == CUDA_SCOPE), key=lambda s: s.start - s.end)
    return {
        **_label(proc, data.procs[proc]),
        "kernel_launches": launches,
        "api_calls": calls,
        "bytes_copied": copied,
        "host_bytes_by_memory": host,
        "sync_waits": syncs,
        "errors": errors[:20],
        "memory_high_water_bytes": int(max(high)) if high else None,
        "memory_in_use_bytes": int(max(in_use)) if in_use else None,
        "slowest_calls": [
            {"name": s.name, "duration_ms": round(s.duration_ms, 4), "trace_id": s.trace_id, "span_id": s.span_id}
            for s in slowest[:EVIDENCE]
        ],
        "evidence": {"metrics": cites[:40], "spans": _cite(slowest)},
    }


def top_kernels(data: Data, pid: int | None, limit: int) -> JsonObject:
    spans = _by_proc(data)
    rows = []
    for proc in _procs(data, pid):
        launch_spans: dict[str, list[Span]] = defaultdict(list)
        for s in spans.get(proc, []):
            if "cuda.kernel.name" in s.attrs:
                launch_spans[str(s.attrs["cuda.kernel.name"])].append(s)
        for a, dp, t in _points(data, proc, "cuda.kernel.launches.top"):
            name = str(a.get("cuda.kernel.name", "?"))
            rows.append(
                {
                    **_label(proc, data.procs[proc]),
                    "kernel": name,
                    "launches": int(_num(dp)),
                    "api_function": a.get("cuda.api.function"),
                    "evidence": {
                        "metrics": [_metric_cite("cuda.kernel.launches.top", a, t)],
                        "spans": _cite(launch_spans.get(name, [])),
                    },
                }
            )
    rows.sort(key=lambda r: (-r["launches"], r["kernel"]))
    return {"total": len(rows), "kernels": rows[:limit], **_meta(data)}


def findings(folder: Folder, data: Data, limit: int) -> JsonObject:
    partial: list[str] = []
    try:
        found = diagnose.diagnose(folder.path, partial)
    except ValueError as exc:
        raise FolderError(str(exc)) from None
    out = []
    for f in found[:limit]:
        d = asdict(f)
        ids = d["evidence"].pop("span_ids", [])
        d["evidence"]["spans"] = [
            {"trace_id": next((s.trace_id for s in data.spans if s.span_id == i), ""), "span_id": i} for i in ids
        ]
        if f.cause == "nccl_straggler":  # no span ids: the collectives it entered latest instead
            rank: JsonObject = {"pid": int(f.process.rsplit("pid ", 1)[-1].rstrip(")"))}
            cite_late_entries(data, [rank])
            d["evidence"]["spans"] = rank["evidence"]["latest_entries"]
        d["cost_explained"] = diagnose.COSTS[f.cause]
        d["share_explained"] = diagnose.share_text(f)
        out.append(d)
    return {"total": len(found), "findings": out, **_meta(data)}


def _collectives(data: Data) -> dict[tuple[str, int], list[Span]]:
    """NCCL collective spans grouped by (communicator, sequence number)."""
    groups: dict[tuple[str, int], list[Span]] = defaultdict(list)
    for s in data.spans:
        if s.name in collectives.COLLECTIVE_SPANS and s.attrs.get("nccl.comm.id") and "nccl.seq" in s.attrs:
            groups[(str(s.attrs["nccl.comm.id"]), int(s.attrs["nccl.seq"]))].append(s)
    return groups


def _lateness(group: list[Span]) -> dict[str, int]:
    """Per span id: how much later than the earliest other rank it entered, ns."""
    out = {}
    for s in group:
        others = [o.start for o in group if o is not s]
        if others:
            out[s.span_id] = s.start - min(others)
    return out


def stragglers_report(folder: Folder, data: Data, threshold_ms: float, min_share: float, limit: int) -> JsonObject:
    try:
        cols = collectives.read([folder.path], workers=1)
    except (collectives.ReadError, OSError) as exc:
        raise FolderError(str(exc)) from None
    if not len(cols):
        return {"ranks": [], "stragglers": [], "note": "no NCCL collective spans with a communicator id", **_meta(data)}
    report = stragglers.analyze(cols, threshold_ns=int(threshold_ms * 1e6), min_share=min_share)
    out = report.to_json()
    out["ranks"] = out["ranks"][:limit]
    out["stragglers"] = out["stragglers"][:limit]
    cite_late_entries(data, out["ranks"] + out["stragglers"])
    return {**out, **_meta(data)}


def cite_late_entries(data: Data, ranks: list[JsonObject]) -> None:
    """Give each rank (a dict with its ``pid``) the collectives where it entered latest."""
    late: dict[int, list[tuple[int, Span]]] = defaultdict(list)
    for group in _collectives(data).values():
        by_id = _lateness(group)
        for s in group:
            if by_id.get(s.span_id, 0) > 0:
                late[int(data.procs[s.proc].get("process.pid", s.proc[1]) or 0)].append((by_id[s.span_id], s))
    for r in ranks:
        mine = [s for _l, s in sorted(late.get(r["pid"], []), key=lambda x: -x[0])]
        r["evidence"] = {"latest_entries": _cite(mine)}


def slow_requests(data: Data, limit: int, min_duration_ms: float, route: str | None) -> JsonObject:
    requests = [s for s in data.spans if s.kind == SERVER and s.duration_ms >= min_duration_ms]
    if route:
        requests = [s for s in requests if route in _route(s)]
    requests.sort(key=lambda s: s.start - s.end)
    out = []
    for s in requests[:limit]:
        kids = _descendants(data, s)
        cuda = [k for k in kids if k.scope == CUDA_SCOPE]
        cuda_ns = sum(k.end - k.start for k in cuda)
        out.append(
            {
                "trace_id": s.trace_id,
                "span_id": s.span_id,
                "name": s.name,
                "route": _route(s),
                "status": s.attrs.get("http.response.status_code", s.attrs.get("rpc.grpc.status_code")),
                "error": s.error,
                "duration_ms": round(s.duration_ms, 4),
                **_label(s.proc, data.procs[s.proc]),
                "cuda_share": round(cuda_ns / max(s.end - s.start, 1), 4),
                "cuda_children": [
                    {
                        "name": k.name,
                        "span_id": k.span_id,
                        "duration_ms": round(k.duration_ms, 4),
                        **{a: k.attrs[a] for a in _CHILD_ATTRS if a in k.attrs},
                    }
                    for k in sorted(cuda, key=lambda k: k.start)[:20]
                ],
                "other_children": len(kids) - len(cuda),
            }
        )
    return {"total": len(requests), "requests": out, **_meta(data)}


def _route(s: Span) -> str:
    a = s.attrs
    if "rpc.service" in a:
        return f"{a['rpc.service']}/{a.get('rpc.method', '')}"
    return f"{a.get('http.request.method', s.name)} {a.get('http.route', a.get('url.path', ''))}".strip()


def _descendants(data: Data, root: Span, cap: int = 1000) -> list[Span]:
    out: list[Span] = []
    todo = [root]
    while todo and len(out) < cap:
        node = todo.pop()
        for kid in data.children.get((node.trace_id, node.span_id), []):
            out.append(kid)
            todo.append(kid)
    return out


def trace(data: Data, trace_id: str, limit: int) -> JsonObject:
    trace_id = trace_id.strip().lower()
    if not TRACE_ID.match(trace_id):
        raise ToolInputError(f"{trace_id[:40]!r} is not a trace id (32 hex digits)")
    spans = data.by_trace.get(trace_id)
    if not spans:
        raise ToolInputError(
            f"no trace {trace_id} in the folder ({len(data.by_trace)} traces); slow_requests lists trace ids"
        )
    ids = {s.span_id for s in spans}
    depth: dict[str, int] = {}

    def level(s: Span) -> int:
        seen = 0
        node = s
        while node.parent_id in ids and seen < 64:
            node = data.by_id[(trace_id, node.parent_id)]
            seen += 1
        return seen

    ordered = sorted(spans, key=lambda s: s.start)
    for s in ordered:
        depth[s.span_id] = level(s)
    return {
        "trace_id": trace_id,
        "total": len(spans),
        "spans": [
            {
                "span_id": s.span_id,
                "parent_span_id": s.parent_id,
                "depth": depth[s.span_id],
                "name": s.name,
                "scope": s.scope,
                "kind": s.kind,
                "error": s.error,
                "start_unix_nano": str(s.start),
                "duration_ms": round(s.duration_ms, 4),
                **_label(s.proc, data.procs[s.proc]),
                "attributes": s.attrs,
            }
            for s in ordered[:limit]
        ],
        **_meta(data),
    }


def flamegraph_top(folder: Folder, profile: str, n: int, sample_type: str | None) -> JsonObject:
    names = folder.profile_files()
    if not PROFILE_NAME.match(profile) or profile not in names:
        raise ToolInputError(
            f"no profile {profile[:120]!r} in {folder.profiles_dir()}; there are {len(names)}: {names[:20]}"
        )
    try:
        out = top_functions(folder.read_profile(profile, 32 << 20), n, sample_type)
    except ProfileError as exc:
        raise ToolInputError(f"{profile}: {exc}") from None
    except OSError as exc:  # UnsafeOutput: a link put there since the listing
        raise FolderError(f"{profile}: {exc.strerror or exc}") from None
    for fn in out["functions"]:
        fn["evidence"] = {"profile": profile, "samples": fn.pop("samples")}
    return {"profile": profile, **out}


def compare_ranks(data: Data, a: int, b: int, comm: str | None, limit: int) -> JsonObject:
    """Rank ``a`` against rank ``b`` on every communicator where both took part."""
    pairs: dict[str, list[tuple[Span, Span]]] = defaultdict(list)
    for (comm_id, _seq), group in _collectives(data).items():
        if comm and comm_id != comm:
            continue
        ra = [s for s in group if s.attrs.get("nccl.rank") == a]
        rb = [s for s in group if s.attrs.get("nccl.rank") == b]
        if ra and rb:
            pairs[comm_id].append((ra[0], rb[0]))
    if not pairs:
        ranks = sorted(
            {
                int(s.attrs["nccl.rank"])
                for g in _collectives(data).values()
                for s in g
                if isinstance(s.attrs.get("nccl.rank"), int)
            }
        )
        raise ToolInputError(
            f"no collective where ranks {a} and {b} both took part"
            + (f" on communicator {comm}" if comm else "")
            + f"; ranks seen: {ranks}"
        )

    def side(spans: list[Span]) -> JsonObject:
        def mean(key: str) -> float | None:
            got = [float(s.attrs[key]) for s in spans if isinstance(s.attrs.get(key), (int, float))]
            return round(statistics.fmean(got) * 1e3, 4) if got else None

        s0 = spans[0]
        return {
            **_label(s0.proc, data.procs[s0.proc]),
            "mean_duration_ms": round(statistics.fmean(s.duration_ms for s in spans), 4),
            "mean_phase_ms": mean("nccl.phase.duration"),
            "mean_gpu_wait_ms": mean("nccl.phase.gpu_wait"),
            "mean_enqueue_ms": mean("nccl.enqueue.duration"),
        }

    out = []
    for comm_id, pp in sorted(pairs.items(), key=lambda kv: -len(kv[1])):
        gaps = [(sa.start - sb.start) / 1e6 for sa, sb in pp]
        widest = sorted(pp, key=lambda p: -abs(p[0].start - p[1].start))
        out.append(
            {
                "comm": comm_id,
                "collectives": len(pp),
                "a": {"rank": a, **side([p[0] for p in pp])},
                "b": {"rank": b, **side([p[1] for p in pp])},
                "a_entered_later": sum(g > 0 for g in gaps),
                "b_entered_later": sum(g < 0 for g in gaps),
                "mean_entry_gap_ms": round(statistics.fmean(gaps), 4),
                "median_entry_gap_ms": round(statistics.median(gaps), 4),
                "evidence": {
                    "widest_gaps": [
                        {
                            "seq": pa.attrs.get("nccl.seq"),
                            "gap_ms": round((pa.start - pb.start) / 1e6, 4),
                            "a": _cite([pa])[0],
                            "b": _cite([pb])[0],
                        }
                        for pa, pb in widest[:EVIDENCE]
                    ]
                },
            }
        )
    return {
        "a": a,
        "b": b,
        "total": len(out),
        "communicators": out[:limit],
        "note": "entry gap = a's entry minus b's, wall clock as exported (one host: no offset)",
        **_meta(data),
    }
