"""The diagnosis, live and exported: what `otelbpf top` shows as findings, sent out as OTLP.

At each metrics collection the agent's live state (state.py: the last metrics collected and
the last spans built) goes through the same tables `otelbpf top` draws (model.py, which runs
analyze/diagnose.py over each process's recent CUDA spans and latest metrics, plus the NCCL
correlator's live straggler counts). Each finding becomes:

- an ``otelbpf.finding`` span on its process's resource, linked to the spans its evidence
  cites (a trace backend shows the finding beside the very copies or syncs that cost the
  time), sent when the finding first appears and again, if it is still there, once
  ``repeat_interval`` has passed (a backend's query over the last hour always finds it);
- ``otelbpf.finding.cost`` (s, gauge) and ``otelbpf.finding.share`` (gauge) per process and
  cause, for dashboards and alerts: the time the cause cost in the recent window, and that
  time over the window.

Read-only over the live state, so it costs one table build per collection (the spans the
live ring holds: 2,000 at most) and nothing at all on the data path.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.metrics.export import Metric
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, TraceFlags

from otelbpf.analyze.summary import AGENT_SCOPE
from otelbpf.correlate import metrics as m
from otelbpf.correlate.spans import make_span, scope
from otelbpf.live import model

SCOPE = scope(AGENT_SCOPE)
#: Links per finding span: the evidence a backend can open, not every span it rests on.
MAX_LINKS = 32
#: Scalar evidence values copied onto the span as ``otelbpf.finding.evidence.<key>``.
MAX_EVIDENCE_ATTRIBUTES = 16
_PID = re.compile(r"\(pid (\d+)\)$")
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)

MetricsTriple = tuple[Resource, InstrumentationScope, list[Metric]]


def _pid(process: str) -> int | None:
    match = _PID.search(process)
    return int(match.group(1)) if match else None


def _evidence_attributes(evidence: Mapping[str, Any]) -> dict[str, object]:
    """The evidence's scalars (counts, bytes, seconds, names): lists and tables stay in the
    links and in `otelbpf diagnose`."""
    out: dict[str, object] = {}
    for key, value in evidence.items():
        if len(out) >= MAX_EVIDENCE_ATTRIBUTES:
            break
        if isinstance(value, (bool, int, float, str)) and key != "span_ids":
            out[f"otelbpf.finding.evidence.{key}"] = value
    return out


class FindingsReporter:
    """Turns the live state's findings into spans and gauges (see the module doc)."""

    def __init__(
        self,
        snapshot: Callable[[], dict[str, Any]],
        resource: Callable[[int], Resource],
        emit: Callable[[list[ReadableSpan]], object],
        repeat_interval_s: float,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        """``snapshot``: LiveState.snapshot; ``resource``: a process's resource by pid (the
        one its spans carry); ``emit``: where spans go (the traces pipeline)."""
        self._snapshot = snapshot
        self._resource = resource
        self._emit = emit
        self._repeat_ns = int(repeat_interval_s * 1e9)
        self._clock = clock
        self._previous: dict[str, Any] | None = None
        #: (pid, cause) -> when its span was last sent; only keys of current findings are kept
        self._sent: dict[tuple[int, str], int] = {}
        self.spans_sent = 0

    def collect(self) -> list[MetricsTriple]:
        """A metrics source (MetricsLoop): the gauges, and the spans of new findings emitted."""
        snap = self._snapshot()
        if snap is self._previous:  # the live state's cache: nothing new since the last call
            return []
        findings = model.build(self._previous, snap).findings
        self._previous = snap
        now = self._clock()
        traces = {s["span_id"]: s["trace_id"] for s in snap.get("spans", []) if s.get("trace_id")}
        starts = {s["span_id"]: int(s["start"]) for s in snap.get("spans", [])}
        by_pid: dict[int, list[dict[str, Any]]] = {}
        spans: list[ReadableSpan] = []
        current: set[tuple[int, str]] = set()
        for f in findings:
            pid = _pid(str(f.get("process", "")))
            if pid is None:
                continue
            by_pid.setdefault(pid, []).append(f)
            key = (pid, str(f["cause"]))
            current.add(key)
            last = self._sent.get(key)
            if last is None or now - last >= self._repeat_ns:
                spans.append(self._span(pid, f, traces, starts, now))
                self._sent[key] = now
        self._sent = {k: t for k, t in self._sent.items() if k in current}
        if spans:
            self.spans_sent += len(spans)
            self._emit(spans)
        out: list[MetricsTriple] = []
        for pid, found in sorted(by_pid.items()):
            metrics = [
                x
                for x in (
                    m.gauge(
                        "otelbpf.finding.cost",
                        "s",
                        "Time a diagnosed cause of GPU idle or slowness cost in the recent window",
                        [({"otelbpf.finding.cause": f["cause"]}, float(f.get("cost_s", 0.0))) for f in found],
                        now,
                    ),
                    m.gauge(
                        "otelbpf.finding.share",
                        "1",
                        "A diagnosed cause's cost over the process's recent traced window",
                        [({"otelbpf.finding.cause": f["cause"]}, float(f.get("share", 0.0))) for f in found],
                        now,
                    ),
                )
                if x is not None
            ]
            out.append((self._resource(pid), SCOPE, metrics))
        return out

    def _span(
        self, pid: int, finding: Mapping[str, Any], traces: Mapping[str, str], starts: Mapping[str, int], now: int
    ) -> ReadableSpan:
        evidence: Mapping[str, Any] = finding.get("evidence") or {}
        cited: Sequence[str] = [str(s) for s in evidence.get("span_ids", []) or []]
        links = [
            Link(SpanContext(int(traces[s], 16), int(s, 16), False, _SAMPLED)) for s in cited[:MAX_LINKS] if s in traces
        ]
        start = min((starts[s] for s in cited if s in starts), default=now)
        attributes: dict[str, object] = {
            "otelbpf.finding.cause": str(finding["cause"]),
            "otelbpf.finding.summary": str(finding.get("summary", "")),
            "otelbpf.finding.cost": float(finding.get("cost_s", 0.0)),
            "otelbpf.finding.share": float(finding.get("share", 0.0)),
            **_evidence_attributes(evidence),
        }
        if finding.get("fix"):
            attributes["otelbpf.finding.fix"] = str(finding["fix"])
        if len(cited) > len(links):
            attributes["otelbpf.finding.evidence.spans"] = len(cited)
        return make_span(
            "otelbpf.finding",
            resource=self._resource(pid),
            scope=SCOPE,
            start_ns=min(start, now),
            end_ns=now,
            attributes=attributes,
            links=links,
        )
