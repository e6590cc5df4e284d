"""The MCP tools over a running agent: its live state (live/endpoint.py) read as the same
``Data`` an output folder gives, so the tools answer from either. The live state holds the
last metric collection and the agent's last spans, so answers are about "now", not the whole
run; profiles are not in it (they are files, or Pyroscope's)."""

from __future__ import annotations

from otelbpf.live import endpoint, model
from otelbpf.mcp.folder import Data, JsonObject, Span


class LiveSource:
    """One agent's socket (or the newest in the run directory, looked up at each call)."""

    def __init__(self, socket_path: str | None = None) -> None:
        self.socket_path = socket_path
        self.path = socket_path or endpoint.run_dir()

    def snapshot(self) -> JsonObject:
        """Raises EndpointError (no agent, a stale socket, a timeout)."""
        return endpoint.fetch(self.socket_path) if self.socket_path else endpoint.fetch_newest()

    def profile_files(self) -> list[str]:
        return []

    def load(self) -> Data:
        return to_data(self.snapshot())


def to_data(snap: JsonObject) -> Data:
    """A snapshot as the tools' ``Data``: processes keyed (service, pid) as summary.py keys
    them, metric points in the OTLP-JSON shape the analyze readers take."""
    data = Data(files=[f"live: agent pid {snap.get('agent_pid')}"])
    at = int(snap.get("metrics_time_unix_nano", 0))
    for proc in snap.get("processes", []):
        res = proc.get("resource", {})
        key = (res.get("service.name", "?"), res.get("process.pid", 0))
        data.procs.setdefault(key, res)
        points = data.metrics.setdefault(key, {})
        for m in proc.get("metrics", []):
            for p in m.get("points", []):
                dp = {"asDouble": p["value"]} if "value" in p else {k: p[k] for k in ("count", "sum", "max") if k in p}
                points[(m["name"], tuple(sorted(p.get("attributes", {}).items())))] = (at, dp, m.get("kind"))
    for s in snap.get("spans", []):
        key = (s.get("service", "?"), s.get("pid", 0))
        data.procs.setdefault(key, {"service.name": key[0], "process.pid": key[1]})
        span = Span(
            s["trace_id"],
            s["span_id"],
            s.get("parent_id", ""),
            s["name"],
            int(s.get("kind", 0)),
            s.get("scope", ""),
            int(s["start"]),
            int(s["end"]),
            bool(s.get("error")),
            s.get("attributes", {}),
            key,
        )
        data.spans.append(span)
        data.by_id[(span.trace_id, span.span_id)] = span
        data.by_trace[span.trace_id].append(span)
        if span.parent_id:
            data.children[(span.trace_id, span.parent_id)].append(span)
    return data


def findings(snap: JsonObject, limit: int) -> JsonObject:
    """The live view's findings (the diagnosis engine over the recent spans, NCCL stragglers)."""
    tables = model.build(None, snap)
    data = to_data(snap)
    out = []
    for f in tables.findings[:limit]:
        ids = f["evidence"].pop("span_ids", [])
        f["evidence"]["spans"] = [
            {"trace_id": next((s.trace_id for s in data.spans if s.span_id == i), ""), "span_id": i} for i in ids
        ]
        out.append(f)
    return {"total": len(tables.findings), "findings": out, "files": data.files, "lines_still_being_written": []}


def ranks(snap: JsonObject, limit: int) -> JsonObject:
    """NCCL ranks as the agent's live straggler detector counts them."""
    tables = model.build(None, snap)
    return {"ranks": [vars(r) for r in tables.ranks[:limit]], "total": len(tables.ranks)}
