"""``otelbpf report DIR -o report.html``: what the agent wrote into DIR, as one HTML page.

Findings first (``diagnose``, ranked by the time they cost, with their evidence and fix),
then one section per process (the ``MAX_DETAILED`` with findings or the most traced time;
the others a row each in one table): what it did (CUDA launches, bytes copied, off-CPU time by
reason), the CUDA API time per call, a timeline of its spans (lanes: off-CPU, CUDA API,
syncs, copies, NCCL; ``report_timeline``), the AI flame graph (CUDA calls and kernels on
top of the code that made them, weights switchable: ``report_ai``), and a flame graph of
each profile the profiling receiver wrote (``profiles/*.pb.gz``: CPU merged over every
interval, CUDA memory in use at the last one) and of the sched receiver's ``off_cpu`` spans
(thread, reason, kernel stack).

It opens with a one-line verdict (the job, how long it was traced, the cause that costs most
and its fix). Values are written as people read them (seconds and bytes humanized, tables for
what the findings hold, never a Python dict), and a section with nothing in it is left out.
Span ids link to the trace in Tempo, Jaeger or Grafana when ``OTELBPF_TRACE_URL`` holds a
URL template (``TRACE_URL``): ``{trace_id}`` and ``{span_id}`` are filled in, e.g.
``http://jaeger:16686/trace/{trace_id}?uiFind={span_id}`` or
``http://grafana:3000/explore?left={"datasource":"tempo","queries":[{"query":"{trace_id}","queryType":"traceql"}]}``
(more in docs/gpu-idle.md).

The page is self-contained and works offline: the charts are drawn by d3 and
d3-flame-graph, vendored in ``report_assets/`` (versions and licenses in its README) and
inlined with the data (one JSON block); CSS is inline; nothing is fetched. The findings and
tables are plain HTML, readable without the scripts. A folder that is partly unreadable
gives a partial report with the reason, never a traceback.
"""

from __future__ import annotations

import glob
import html
import json
import os
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, TextIO

from otelbpf.analyze import collectives, profile_diff, report_ai, stragglers
from otelbpf.analyze.diagnose import (
    COSTS,
    SCHED_SCOPE,
    Finding,
    SpanLoader,
    findings_of,
    headline,
    read_nccl,
    straggler_findings,
    verdict,
)
from otelbpf.analyze.idle import load_timelines
from otelbpf.analyze.report_ai import PROFILE_NAME, AiSpans, Weight
from otelbpf.analyze.report_timeline import Timeline
from otelbpf.analyze.report_tree import Node, read_profile
from otelbpf.analyze.summary import (
    AGENT_SCOPE,
    Json,
    ProcKey,
    SeriesKey,
    _num,
    human_bytes,
    human_seconds,
    load_metrics,
    process_label,
    read_spans,
)
from otelbpf.base.safe_files import OutputDir
from otelbpf.config import Config, FileExporterConfig
from otelbpf.config.units import format_size

#: The vendored scripts, inlined in this order (d3-flame-graph takes its modules from ``d3``).
ASSETS = ("d3.min.js", "d3-flamegraph.min.js")
#: The page ``otelbpf run`` writes into each file exporter's directory when it ends.
RUN_REPORT = "report.html"
#: Processes drawn in full (facts, CUDA API time, timeline, flame graphs); the rest get a row
#: each in one table. A host under process churn has hundreds: five minutes of bench/churn.py
#: left 1,226 flame graphs, a 22.5 MiB page that no browser draws usably, and the agent at
#: ~540 MiB writing it after its stop.
MAX_DETAILED = 40
#: The environment variable holding the trace URL template the page links span ids to: a
#: trace viewer's address with ``{trace_id}`` (and optionally ``{span_id}``) in it. An
#: environment variable, not config, since ``otelbpf report`` runs without the agent's config
#: (often elsewhere, on a copy of the folder) and the link is a viewer's, not the agent's.
TRACE_URL = "OTELBPF_TRACE_URL"
__all__ = ["after_run", "read_profile", "render", "run"]


@dataclass
class FlameGraph:
    service: str
    pid: int
    kind: str
    unit: str  # pprof-style "type/unit" of the values ("cpu/nanoseconds", ...)
    root: Node
    files: int = 0
    note: str = ""  # what the graph is made of, for its heading


@dataclass
class ApiTime:
    calls: int = 0
    total_ns: int = 0
    max_ns: int = 0


def flame_graphs(directory: str, problems: list[str]) -> list[FlameGraph]:
    """One graph per (process, kind): CPU merged over every interval; CUDA memory in use as
    the last interval saw it (a balance, not a sum over intervals)."""
    graphs: dict[tuple[str, int, str], FlameGraph] = {}
    for path in sorted(
        glob.glob(os.path.join(directory, "profiles", "*.pb.gz")),
        key=lambda p: int(m["ms"]) if (m := PROFILE_NAME.match(os.path.basename(p))) else 0,
    ):
        m = PROFILE_NAME.match(os.path.basename(path))
        if not m or m["kind"] == "cuda_calls":  # drawn in the AI flame graph (report_ai), with its weights
            continue
        try:
            unit, samples = read_profile(path)
        except Exception as exc:  # noqa: BLE001 - a truncated or foreign file: say so, go on
            problems.append(f"{path}: not a readable pprof profile ({type(exc).__name__}: {exc})")
            continue
        key = (m["service"], int(m["pid"]), m["kind"])
        if unit.startswith("inuse_"):  # newer interval replaces the older
            graphs.pop(key, None)
        g = graphs.setdefault(key, FlameGraph(key[0], key[1], key[2], unit, Node("all")))
        g.files += 1
        g.note = (
            "in use at the last interval"
            if unit.startswith("inuse_")
            else f"{g.files} interval{'s' if g.files != 1 else ''}"
        )
        for frames, value in samples:
            g.root.add(frames, value)
    return [g for g in graphs.values() if g.root.value > 0]


#: One process's latest metric points (an entry of summary.load_metrics' answer).
Points = dict[SeriesKey, tuple[int, Json, str]]


class _Spans:
    """Span visitor: traced time per CUDA API function, and the off-CPU flame graph (the sched
    receiver's ``off_cpu`` spans: thread, reason, then the kernel stack outermost first,
    weighted by time off the CPU)."""

    def __init__(self) -> None:
        self.calls: dict[ProcKey, dict[str, ApiTime]] = defaultdict(lambda: defaultdict(ApiTime))
        self.off: dict[ProcKey, FlameGraph] = {}

    def span(self, key: ProcKey, scope: str | None, sp: Json, a: Json, d: int) -> None:
        if scope == "otelbpf.cuda":
            t = self.calls[key][sp["name"]]
            t.calls += 1
            t.total_ns += d
            t.max_ns = max(t.max_ns, d)
        elif scope == SCHED_SCOPE:
            g = self.off.setdefault(
                key,
                FlameGraph(
                    str(key[0]),
                    int(key[1] or 0),
                    "off_cpu",
                    "off_cpu/nanoseconds",
                    Node("all"),
                    1,
                    "off_cpu spans: thread, reason, kernel stack",
                ),
            )
            stack = [str(f) for f in reversed(a.get("otelbpf.sched.kernel_stack") or [])]
            g.root.add([f"thread {a.get('thread.name', '?')}", str(a.get("otelbpf.sched.reason", "?")), *stack], d)


# -- HTML -------------------------------------------------------------------------

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;max-width:1400px}
h1{font-size:1.5em}h2{font-size:1.25em;margin-top:1.6em;border-bottom:1px solid #ccc}h3{font-size:1.05em}
table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4}td.n{text-align:right;font-variant-numeric:tabular-nums}
.finding{border-left:4px solid #c0392b;padding:.3em .8em;margin:.8em 0;background:#fdf3f2}
.verdict{font-size:1.1em;padding:.4em .8em;background:#fff8e1;border-left:4px solid #f39c12}
.finding h3{margin:.2em 0}.fix{background:#eef7ee;padding:.3em .6em}.muted{color:#777}
pre{background:#f7f7f7;padding:.5em;overflow:auto;max-height:20em;font-size:12px}
.problem{color:#a00}.legend{font-size:12px;color:#444;margin:.2em 0}
.chart{width:100%;border:1px solid #ddd;min-height:20px}.details{font:12px monospace;min-height:1.4em;color:#333}
.timeline rect{fill-opacity:.85}.timeline text{font:11px system-ui,sans-serif}
"""

#: Draws every chart from the one JSON block; a chart that fails is replaced by its error
#: (thrown on, so a broken page shows in the console and the Chromium test).
_JS = r"""
(function(){
var data=JSON.parse(document.getElementById('otelbpf-data').textContent);
function amount(v,unit){var p=unit.split('/'),k=p[0],b=p[1];
  if(b==='nanoseconds')return (v/1e9).toFixed(3)+'s '+k;
  if(b==='bytes')return (v/1048576).toFixed(1)+' MiB '+k;
  return Math.round(v)+' '+k;}
data.flames.forEach(function(f){
  var el=document.getElementById(f.id),legend=document.getElementById(f.id+'-legend');
  var details=document.getElementById(f.id+'-details'),sel=document.getElementById(f.id+'-weight');
  var w=f.weights[0];
  var chart=flamegraph.default().width(el.clientWidth||1000).cellHeight(18).minFrameSize(2)
    .transitionDuration(250).sort(true).setDetailsElement(details)
    .setLabelHandler(function(d){var root=d;while(root.parent)root=root.parent;
      return d.data.name+': '+amount(d.value,w.unit)+' ('+(100*d.value/root.value).toFixed(1)+'%)';});
  function show(i){w=f.weights[i];
    legend.textContent='weight: '+w.label+' ('+amount(w.tree.value,w.unit)+'). Rests on: '+w.rests_on+
      (w.coverage?'. '+w.coverage:'');}
  show(0);
  if(f.differential)chart.setColorMapper(flamegraph.colorMapper.differentialColorMapper);
  d3.select(el).datum(f.weights[0].tree).call(chart);
  el.dataset.drawn=String(el.querySelectorAll('rect').length);
  if(sel)sel.addEventListener('change',function(){show(+sel.value);chart.update(f.weights[+sel.value].tree);});
});
data.timelines.forEach(function(t){
  var el=document.getElementById(t.id),width=el.clientWidth||1000,lh=22,left=70,top=4;
  var h=top+t.lanes.length*lh+24;
  var x=d3.scaleLinear().domain([0,Math.max(t.end,1e-3)]).range([left,width-10]);
  var color={'off-CPU':'#7f8c8d','CUDA API':'#2e86c1','sync':'#c0392b','copies':'#d68910','NCCL':'#8e44ad'};
  var svg=d3.select(el).append('svg').attr('width',width).attr('height',h).attr('class','timeline');
  var g=svg.append('g');
  t.lanes.forEach(function(l,i){var y=top+i*lh;
    svg.append('text').attr('x',2).attr('y',y+14).text(l.name);
    g.selectAll(null).data(l.spans).enter().append('rect')
      .attr('data-x',function(s){return s[0];}).attr('data-w',function(s){return s[1];})
      .attr('y',y+2).attr('height',lh-6).attr('fill',color[l.name]||'#555')
      .append('title').text(function(s){return s[2]+': '+s[1].toFixed(3)+' ms at +'+s[0].toFixed(3)+' ms';});
  });
  var axis=svg.append('g').attr('transform','translate(0,'+(top+t.lanes.length*lh)+')');
  function draw(sx){
    g.selectAll('rect').attr('x',function(){return sx(+this.dataset.x);})
      .attr('width',function(){return Math.max(1,sx(+this.dataset.x+ +this.dataset.w)-sx(+this.dataset.x));});
    axis.call(d3.axisBottom(sx).ticks(8).tickFormat(function(v){return v+' ms';}));}
  draw(x);
  svg.call(d3.zoom().scaleExtent([1,1e6]).translateExtent([[left,0],[width-10,h]]).extent([[left,0],[width-10,h]])
    .on('zoom',function(e){draw(e.transform.rescaleX(x));}));
});
document.body.dataset.charts='drawn';
})();
"""


def _vendored() -> str:
    """The vendored scripts as inline ``<script>`` elements (read from the package)."""
    folder = resources.files("otelbpf.analyze") / "report_assets"
    parts = []
    for name in ASSETS:
        text = (folder / name).read_text(encoding="utf-8")
        if "</script" in text.lower():  # an inline script ends there: never true of the pinned versions
            raise ValueError(f"report_assets/{name} cannot be inlined: it contains '</script'")
        parts.append(f"<script>{text}</script>")
    return "".join(parts)


def _amount(value: float, unit: str) -> str:
    """A value as people read it (pprof units: count, nanoseconds, bytes)."""
    kind, _, base = unit.partition("/")
    if base == "nanoseconds":
        return f"{value / 1e9:.3f}s {kind}"
    if base == "bytes":
        return f"{value / 2**20:.1f} MiB {kind}"
    return f"{value:.0f} {kind}"


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


class _Charts:
    """Collects what the script draws (one JSON block) and hands out element ids."""

    def __init__(self) -> None:
        self.flames: list[Json] = []
        self.timelines: list[Json] = []

    def flame(self, heading: str, weights: list[Json], differential: bool = False) -> str:
        fid = f"flame-{len(self.flames)}"
        self.flames.append({"id": fid, "weights": weights, "differential": differential})
        switch = ""
        if len(weights) > 1:
            switch = (
                f"<label>weight: <select id='{fid}-weight'>"
                + "".join(f"<option value='{i}'>{_e(w['label'])}</option>" for i, w in enumerate(weights))
                + "</select></label>"
            )
        return (
            f"<h3>{_e(heading)}</h3>{switch}<p class='legend' id='{fid}-legend'></p>"
            f"<div class='chart flame' id='{fid}'></div><div class='details' id='{fid}-details'></div>"
        )

    def timeline(self, data: Json) -> str:
        tid = f"timeline-{len(self.timelines)}"
        self.timelines.append({"id": tid, **data})
        notes = [
            f"{lane['name']}: the {lane['shown']} longest of {lane['total']} spans"
            for lane in data["lanes"]
            if lane["shown"] < lane["total"]
        ]
        bound = ("<p class='legend'>Bounded: " + _e("; ".join(notes)) + ".</p>") if notes else ""
        return (
            f"<h3>Timeline (ms after the first span; drag to pan, wheel to zoom)</h3>{bound}"
            f"<div class='chart' id='{tid}'></div>"
        )

    def script(self) -> str:
        blob = json.dumps({"flames": self.flames, "timelines": self.timelines}, separators=(",", ":"))
        return (
            f"<script type='application/json' id='otelbpf-data'>{blob.replace('<', chr(92) + 'u003c')}</script>"
            f"{_vendored()}<script>{_JS}</script>"
        )


def _weight_json(w: Weight) -> Json:
    coverage = ""
    if w.counted:
        profiles = w.key in report_ai.REPLACES
        part = (
            ("The profiles" if profiles else "The spans") if w.comparable == w.root.value else "Its synchronize calls"
        )
        held = w.comparable / w.counted
        # a share above 100% is not one: said as "all", with what made it more
        coverage = f"{part} hold {min(held, 1.0):.0%} of what the metrics counted ({_amount(w.counted, w.unit)})"
        if w.comparable < 0.995 * w.counted:
            coverage += (
                ": the rest came after the profiler's last read"
                if profiles
                else ": the rest were sampled out or too short to be spans"
            )
        elif w.comparable > 1.005 * w.counted:
            coverage += (
                f" ({held:.0%}: the metrics' last export came before the profiler's last read)"
                if profiles
                else f" ({held:.0%}: sampled launches scaled by their sample_every are an estimate)"
            )
    return {
        "key": w.key,
        "label": w.label,
        "unit": w.unit,
        "rests_on": w.rests_on,
        "tree": w.root.to_json(),
        "coverage": coverage,
    }


#: Evidence shown elsewhere on the page: the headline (window, threads), the process's idle account
#: (``_idle_html``), the span links and kernel stacks below the table.
_NOT_IN_TABLE = frozenset({"span_ids", "stacks", "idle", "window_s", "cuda_threads"})
#: Evidence tables whose values are seconds (the others are counts, or say what they hold).
_SECONDS_TABLES = frozenset({"beside_code", "by_reason", "could_not_see", "other_threads_code"})


def _value(key: str, v: object) -> str:
    """An evidence value as people read it: seconds and bytes humanized, tables as ``name value``
    lists (never a Python dict)."""
    if isinstance(v, dict):
        if key == "repeated_sizes":  # size -> how many
            return ", ".join(f"{n:,} × {human_bytes(int(size))}" for size, n in v.items())
        if key == "other_threads":  # thread -> reason -> seconds
            return "; ".join(f"{name}: {_value('by_reason', reasons)}" for name, reasons in v.items())
        child = "seconds" if key in _SECONDS_TABLES else ""
        return ", ".join(f"{k} {_value(child, x)}" for k, x in v.items())
    if isinstance(v, list):
        return ", ".join(str(x) for x in v)
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (int, float)):
        if key == "seconds" or key.endswith("_s"):
            return human_seconds(float(v))
        if key == "bytes" or key.endswith("_bytes"):
            return human_bytes(float(v))
        return f"{v:,}" if isinstance(v, int) else f"{v:,.2f}"
    return str(v)


def _label(key: str) -> str:
    """An evidence key as a row heading: ``mean_gap_s`` -> ``mean gap``."""
    return key.removesuffix("_s").replace("_", " ")


def trace_url() -> str | None:
    """The trace URL template of ``TRACE_URL``, or None when unset or not a web address with
    ``{trace_id}`` in it (a ``javascript:`` template would run in the page)."""
    url = os.environ.get(TRACE_URL, "").strip()
    if url.startswith(("http://", "https://")) and "{trace_id}" in url:
        return url
    return None


class _TraceIds:
    """Span visitor: each span's trace id, for the links (kept only when a URL is configured)."""

    def __init__(self) -> None:
        self.of: dict[str, str] = {}

    def span(self, key: ProcKey, scope: str | None, sp: Json, a: Json, d: int) -> None:
        if sp.get("traceId") and sp.get("spanId"):
            self.of[sp["spanId"]] = sp["traceId"]


def _span_ids_html(ids: list[str], traces: Mapping[str, str], url: str | None) -> str:
    """The cited span ids, each a link to its trace when a URL template is configured."""
    out = []
    for i in ids:
        trace = traces.get(i)
        if url and trace:
            href = url.replace("{trace_id}", trace).replace("{span_id}", i)
            out.append(f"<a href='{_e(href)}' title='trace {_e(trace)}'><code>{_e(i)}</code></a>")
        else:
            out.append(f"<code>{_e(i)}</code>")
    return f"<p>spans: {', '.join(out)}</p>" if out else ""


def _finding_html(i: int, f: Finding, traces: Mapping[str, str], url: str | None) -> str:
    rows = "".join(
        f"<tr><th>{_e(_label(k))}</th><td>{_e(_value(k, v))}</td></tr>"
        for k, v in sorted(f.evidence.items())
        if k not in _NOT_IN_TABLE
    )
    stacks = "".join(
        f"<p class='muted'>{_e(human_seconds(s['seconds']))} in:</p><pre>{_e(chr(10).join(s['kernel_stack']))}</pre>"
        for s in f.evidence.get("stacks", [])
    )
    return (
        f'<div class="finding" id="finding-{i}"><h3>{i}. {_e(headline(f))}</h3><p>{_e(f.summary)}</p>'
        f"<p class='muted'>cost: {_e(COSTS.get(f.cause, ''))}</p>{f'<table>{rows}</table>' if rows else ''}{stacks}"
        f"{_span_ids_html(list(f.evidence.get('span_ids', [])), traces, url)}"
        f"<p class='fix'><b>fix:</b> {_e(f.fix)}</p></div>"
    )


def _idle_html(findings: list[Finding]) -> str:
    """Each process's idle account once (every finding of a process carries the same)."""
    accounts: dict[str, dict[str, Any]] = {}
    for f in findings:
        if "idle" in f.evidence:
            accounts.setdefault(f.process, f.evidence["idle"])
    if not accounts:
        return ""
    rows = "".join(
        f"<tr><td>{_e(p)}</td><td class='n'>{_e(human_seconds(a['idle_budget_s']))}</td>"
        f"<td class='n'>{a['gaps']:,}</td><td class='n'>{_e(human_seconds(a['charged_s']))}</td>"
        f"<td class='n'>{_e(human_seconds(a['unexplained_s']))}</td>"
        f"<td>{_e(_value('could_not_see', a.get('could_not_see') or {}))}</td></tr>"
        for p, a in accounts.items()
    )
    return (
        "<h3>Where the idle time went</h3><p class='muted'>The time the GPU had nothing queued from the "
        "launching threads' view (after a synchronize or a blocking copy, until the next call; and inside copies "
        "and allocations that keep it idle), each second charged to one cause (docs/gpu-idle.md).</p>"
        "<table><tr><th>process</th><th>idle</th><th>gaps</th><th>charged to causes</th><th>unexplained</th>"
        f"<th>what the agent could not see</th></tr>{rows}</table>"
    )


class _Extent:
    """Span visitor: the first start and last end of the processes' own spans (not the agent's),
    for the verdict's duration."""

    def __init__(self) -> None:
        self.start: int | None = None
        self.end: int | None = None

    def span(self, key: ProcKey, scope: str | None, sp: Json, a: Json, d: int) -> None:
        if key[0] == "otelbpf" or scope == AGENT_SCOPE:
            return
        start, end = int(sp["startTimeUnixNano"]), int(sp["endTimeUnixNano"])
        self.start = start if self.start is None else min(self.start, start)
        self.end = end if self.end is None else max(self.end, end)


def _verdict_html(procs: dict[ProcKey, Json], extent: _Extent, findings: list[Finding]) -> str:
    """The page's first line: the job (its processes), how long it was traced, what costs most
    and its fix (diagnose.verdict)."""
    names = list(dict.fromkeys(str(r.get("service.name", "?")) for k, r in procs.items() if k[0] != "otelbpf"))
    job = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    traced = (
        f", traced {human_seconds((extent.end - extent.start) / 1e9)}"
        if extent.start is not None and extent.end is not None
        else ""
    )
    count = f"{len(findings)} finding{'s' if len(findings) != 1 else ''}"
    return (
        f"<p class='verdict' id='verdict'><b>{_e(job or 'no process')}</b>{_e(traced)}: {_e(count)}; "
        f"{_e(verdict(findings))}</p>"
    )


def _series(points: Points, name: str) -> list[tuple[Json, Json]]:
    return [(dict(a), dp) for (n, a), (_t, dp, _k) in points.items() if n == name]


def _counted(points: Points) -> dict[str, float]:
    """What the metrics counted of the span-based AI weights (so the page can say how much the spans hold)."""
    sync_s = sum(float(dp.get("sum", 0)) for _a, dp in _series(points, "cuda.sync.duration"))
    return {
        "launches": sum(_num(dp) for _a, dp in _series(points, "cuda.kernel.launches")),
        "copied": sum(_num(dp) for _a, dp in _series(points, "cuda.memcpy.bytes")),
        "sync": sync_s * 1e9,
    }


def _process_html(
    res: Json,
    points: Points,
    calls: dict[str, ApiTime],
    graphs: list[FlameGraph],
    ai: list[Weight],
    timeline: Json | None,
    charts: _Charts,
) -> str:
    parts: list[str] = []
    facts: list[tuple[str, str]] = []
    launches = sum(_num(dp) for _a, dp in _series(points, "cuda.kernel.launches"))
    if launches:
        facts.append(("kernel launches", f"{launches:.0f}"))
    for a, dp in sorted(_series(points, "cuda.memcpy.bytes"), key=lambda x: str(x[0])):
        facts.append((f"bytes copied {a.get('cuda.memcpy.direction')}", human_bytes(_num(dp))))
    errors = sum(_num(dp) for _a, dp in _series(points, "cuda.api.errors"))
    if errors:
        facts.append(("failed CUDA calls", f"{errors:.0f}"))
    off: dict[str, float] = defaultdict(float)
    for a, dp in _series(points, "otelbpf.thread.off_cpu.time"):
        off[str(a.get("otelbpf.sched.reason"))] += _num(dp)
    for reason, s in sorted(off.items(), key=lambda kv: -kv[1]):
        facts.append((f"off-CPU: {reason}", human_seconds(s)))
    if facts:
        parts.append(
            "<table>" + "".join(f"<tr><th>{_e(k)}</th><td class='n'>{_e(v)}</td></tr>" for k, v in facts) + "</table>"
        )
    metric_calls = {a.get("cuda.api.function"): _num(dp) for a, dp in _series(points, "cuda.api.calls")}
    if calls or metric_calls:
        parts.append(
            "<h3>CUDA API time per call</h3><table><tr><th>function</th><th>calls</th><th>traced</th>"
            "<th>total ms</th><th>mean us</th><th>max us</th></tr>"
        )
        names = sorted(
            set(calls) | {str(k) for k in metric_calls if k}, key=lambda n: -(calls[n].total_ns if n in calls else 0)
        )
        for n in names:
            t = calls.get(n, ApiTime())
            mean = t.total_ns / t.calls / 1e3 if t.calls else 0.0
            parts.append(
                f"<tr><td>{_e(n)}</td><td class='n'>{metric_calls.get(n, t.calls):.0f}</td>"
                f"<td class='n'>{t.calls}</td><td class='n'>{t.total_ns / 1e6:.3f}</td>"
                f"<td class='n'>{mean:.1f}</td><td class='n'>{t.max_ns / 1e3:.1f}</td></tr>"
            )
        parts.append("</table>")
    if timeline:
        parts.append(charts.timeline(timeline))
    if ai:
        counted = _counted(points)
        for w in ai:
            w.counted = counted.get(report_ai.REPLACES.get(w.key, w.key)) or None
        parts.append(
            charts.flame(
                "AI flame graph: CUDA calls and kernels on top of the code that made them "
                "(click a frame to zoom; the switch picks the weight)",
                [_weight_json(w) for w in ai],
            )
        )
    for g in graphs:
        parts.append(
            charts.flame(
                f"{g.kind} profile: {_amount(g.root.value, g.unit)} ({g.note}; click a frame to "
                "zoom, the bottom row to reset)",
                [
                    {
                        "key": g.kind,
                        "label": g.unit.partition("/")[0],
                        "unit": g.unit,
                        "rests_on": g.note,
                        "coverage": "",
                        "tree": g.root.to_json(),
                    }
                ],
            )
        )
    if not parts:  # nothing seen of it but its name (the agent's own resource, a process that made no call)
        return ""
    head = [f"<h2>{_e(process_label(res))}</h2>"]
    if res.get("process.command_line"):
        head.append(f"<p class='muted'>{_e(res['process.command_line'])}</p>")
    return "\n".join(head + parts)


def _stragglers_html(
    directory: str,
    nccl: tuple[collectives.Collectives, stragglers.Report] | None,
    charts: _Charts,
    problems: list[str],
) -> list[str]:
    """NCCL stragglers (``otelbpf stragglers``, read once with the findings: ``diagnose.read_nccl``)
    and, where the folder has CPU profiles of the ranks, each straggler's differential flame graph
    against the healthy ranks."""
    if nccl is None:
        return []  # no collectives, or the span readers above already said what they could not read
    data, report = nccl
    if not report.stragglers:
        return [
            f"<h2>NCCL</h2><p>{report.collectives_compared} collectives of {len(report.ranks)} ranks compared: "
            "no persistent straggler.</p>"
        ]
    window = (int(data.start.min()), int(data.end.max()))
    ranks, skipped = profile_diff.read_cpu([directory], {(r.host, r.pid) for r in report.ranks}, window)
    problems += [f"skipped a profile: {s}" for s in skipped]
    slow_keys = {(r.host, r.pid) for r in report.stragglers}
    healthy = [cpu for key, cpu in ranks.items() if key not in slow_keys]
    parts = ["<h2>NCCL stragglers</h2>"]
    for r in report.stragglers:
        parts.append(
            f"<p><b>rank {r.rank}</b> ({_e(r.host)}, pid {r.pid}, {_e(r.service)}): {_e(r.cls)}, last in "
            f"{r.straggled} of {r.collectives} collectives, late by {r.lateness_mean_ms:.1f} ms on average "
            f"(GPU wait {r.compute_ms:.1f} ms, host {r.host_ms:.1f} ms, previous collective "
            f"{r.communication_ms:.1f} ms, summed).</p>"
        )
        slow = ranks.get((r.host, r.pid))
        if slow is None or not healthy:
            parts.append(
                "<p class='muted'>No CPU profiles of this rank and the others in the folder: run the "
                "profiling receiver beside nccl for the differential flame graph.</p>"
            )
            continue
        frames = profile_diff.diff(slow, healthy).frames[:5]
        if frames:
            parts.append(
                "<p>On the CPU more than the healthy ranks (CPU ms per second): "
                + _e(", ".join(f"{f.function} +{f.self_ms_per_s:.1f}" for f in frames))
                + "</p>"
            )
        tree = profile_diff.diff_tree(slow, healthy)
        parts.append(
            charts.flame(
                f"Differential CPU flame graph of rank {r.rank} against {len(healthy)} healthy ranks (width: its CPU "
                "time; red: more than the healthy ranks' mean per second, blue: less)",
                [
                    {
                        "key": "cpu",
                        "label": "cpu",
                        "unit": "cpu/nanoseconds",
                        "coverage": "",
                        "rests_on": f"CPU profiles over the job's window ({slow.seconds:.0f} s of this rank's "
                        "profiles)",
                        "tree": tree,
                    }
                ],
                differential=True,
            )
        )
    return parts


def _time_ns(graphs: list[FlameGraph], calls: dict[str, ApiTime]) -> int:
    """A process's traced time: CPU and off-CPU in its flame graphs, and its CUDA API calls."""
    return sum(g.root.value for g in graphs if g.unit.endswith("/nanoseconds")) + sum(
        t.total_ns for t in calls.values()
    )


def _ranked(
    procs: dict[ProcKey, Json],
    findings: list[Finding],
    by_proc: dict[ProcKey, list[FlameGraph]],
    calls: dict[ProcKey, dict[str, ApiTime]],
) -> tuple[list[ProcKey], list[ProcKey]]:
    """(the processes drawn in full, the rest): those with a finding first, then by the time
    they were seen spending (``_time_ns``), at most ``MAX_DETAILED``."""
    with_findings = {f.process for f in findings}

    def rank(key: ProcKey) -> tuple[bool, int]:
        return process_label(procs[key]) not in with_findings, -_time_ns(by_proc.get(key, []), calls.get(key, {}))

    order = sorted(procs, key=rank)
    return order[:MAX_DETAILED], order[MAX_DETAILED:]


def _others_html(
    keys: list[ProcKey],
    procs: dict[ProcKey, Json],
    by_proc: dict[ProcKey, list[FlameGraph]],
    calls: dict[ProcKey, dict[str, ApiTime]],
) -> str:
    """One row per process not drawn in full, busiest first."""
    rows = []
    for key in keys:
        res, graphs, api = procs[key], by_proc.get(key, []), calls.get(key, {})
        cpu = sum(g.root.value for g in graphs if g.kind == "cpu") / 1e9
        off = sum(g.root.value for g in graphs if g.kind == "off_cpu") / 1e9
        command = str(res.get("process.command_line", ""))
        rows.append(
            f"<tr><td>{_e(res.get('service.name', '?'))}</td><td class='n'>{_e(res.get('process.pid', '?'))}</td>"
            f"<td class='n'>{cpu:.3f}</td><td class='n'>{off:.3f}</td>"
            f"<td class='n'>{sum(t.calls for t in api.values())}</td>"
            f"<td class='muted'>{_e(command[:160] + ('…' if len(command) > 160 else ''))}</td></tr>"
        )
    return (
        f"<h2>{len(keys)} more process{'es' if len(keys) != 1 else ''}</h2>"
        f"<p>Drawn in full above: the {MAX_DETAILED} with findings or the most traced time."
        " The rest, busiest first (their telemetry is in the folder):</p>"
        "<table><tr><th>service</th><th>pid</th><th>CPU s</th><th>off-CPU s</th><th>CUDA calls traced</th>"
        f"<th>command line</th></tr>{''.join(rows)}</table>"
    )


def render(directory: str) -> tuple[str, list[Finding], list[str]]:
    """(the page, its findings, what could not be read)."""
    problems: list[str] = []
    partial: list[str] = []  # last lines still being written (or cut off): skipped, and said
    unreadable: list[str] = []  # why the findings cannot be trusted: no diagnosis then
    procs: dict[ProcKey, Json] = {}
    try:
        latest = load_metrics(directory, procs, partial)
    except ValueError as exc:
        latest = {}
        problems.append(f"no metrics: {exc}")
        unreadable.append(str(exc))
    loader, spans, ai_spans, timeline, extent = SpanLoader(), _Spans(), AiSpans(), Timeline(), _Extent()
    url, traces = trace_url(), _TraceIds()
    try:
        read_spans(directory, [loader, spans, ai_spans, timeline, extent, *([traces] if url else [])], partial, procs)
    except ValueError as exc:
        problems.append(f"no spans (or only some): {exc}")
        unreadable.append(str(exc))
    findings = [] if unreadable else findings_of(loader, latest, procs, load_timelines(directory))
    if unreadable:
        problems.insert(0, f"no diagnosis: {unreadable[0]}")
    nccl = read_nccl(directory)
    if nccl is not None:
        findings = sorted([*findings, *straggler_findings(*nccl)], key=lambda f: (f.cause == "unexplained", -f.cost_s))
    problems += [f"{where}: an incomplete last line, skipped" for where in partial]
    graphs = flame_graphs(directory, problems)
    ai = report_ai.merge(ai_spans.weights(), report_ai.from_profiles(directory))
    by_proc: dict[ProcKey, list[FlameGraph]] = defaultdict(list)

    def key_of(service: str, pid: int) -> ProcKey:
        key = next((k for k, r in procs.items() if int(r.get("process.pid", -1) or -1) == pid), (service, pid))
        procs.setdefault(key, {"service.name": service, "process.pid": pid})
        return key

    for g in graphs:
        by_proc[key_of(g.service, g.pid)].append(g)
    for key in spans.calls:
        key_of(key[0], int(key[1] or 0))
    for key, g in spans.off.items():
        by_proc[key_of(key[0], int(key[1] or 0))].append(g)
    for pid in ai:
        key_of("?", pid)
    charts = _Charts()
    body = [f"<h1>otelbpf report: {_e(os.path.abspath(directory))}</h1>", _verdict_html(procs, extent, findings)]
    body += [f"<p class='problem'>{_e(p)}</p>" for p in problems]
    if findings:
        body.append("<h2>Findings</h2>")
        body += [_finding_html(i, f, traces.of, url) for i, f in enumerate(findings, 1)]
        body.append(_idle_html(findings))
    body += _stragglers_html(directory, nccl, charts, problems)
    detailed, others = _ranked(procs, findings, by_proc, spans.calls)
    for key in sorted(detailed, key=lambda k: (k[0] == "otelbpf", str(k))):
        pid = int(procs[key].get("process.pid", 0) or 0)
        body.append(
            _process_html(
                procs[key],
                latest.get(key, {}),
                spans.calls.get(key, {}),
                by_proc.get(key, []),
                ai.get(pid, []),
                timeline.to_json(pid),
                charts,
            )
        )
    if others:
        body.append(_others_html(others, procs, by_proc, spans.calls))
    page = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>otelbpf report</title>"
        f"<style>{_CSS}</style></head><body>{''.join(body)}{charts.script()}</body></html>"
    )
    return page, findings, problems


def run(directory: str, output: str, out: TextIO, err: TextIO) -> int:
    """``otelbpf report DIR -o FILE``: 0 written, 2 when DIR is missing or holds nothing, or
    FILE cannot be written safely. The page holds command lines and paths and is written as
    root: owner-only (0600), under a random name then renamed, never through a link, and not
    into a folder another user owns or can write (``OutputDir``)."""
    if not os.path.isdir(directory):
        err.write(f"otelbpf report: {directory} does not exist (run the agent with the file exporter first)\n")
        return 2
    page, findings, problems = render(directory)
    for p in problems:
        err.write(f"otelbpf report: {p}\n")
    try:
        _write_page(os.path.dirname(output) or ".", os.path.basename(output), page)
    except OSError as exc:  # UnsafeOutput included: one line, never a traceback
        err.write(f"otelbpf report: {output} not written: {exc}\n")
        return 2
    out.write(f"wrote {output}: {len(findings)} finding{'s' if len(findings) != 1 else ''}\n")
    return 0


def _write_page(directory: str, name: str, page: str, *, dir_mode: int = 0o700, file_mode: int = 0o600) -> None:
    """``page`` written whole as ``directory/name`` through ``OutputDir``. Raises OSError
    (UnsafeOutput for a folder or name refused)."""
    out = OutputDir(directory, dir_mode=dir_mode, file_mode=file_mode)
    try:
        out.write_whole(name, page.encode("utf-8"))
    finally:
        out.close()


def _telemetry_bytes(directory: str) -> int:
    """Bytes of the OTLP-JSON files directly in ``directory`` (links not followed)."""
    total = 0
    with os.scandir(directory) as entries:
        for e in entries:
            if e.name.endswith(".jsonl") and e.is_file(follow_symlinks=False):
                total += e.stat(follow_symlinks=False).st_size
    return total


def after_run(config: Config, err: TextIO) -> list[str]:
    """The end of ``otelbpf run``: ``report.html`` in the directory of every file exporter a
    pipeline uses whose ``report`` is on, written as the exporter writes its files (owner-only,
    never through a link). Returns the paths written. A report that cannot be written is said
    on ``err`` and never changes how the run ends."""
    pipelines = [config.pipeline(signal) for signal in config.pipeline_signals()]
    used = {name for p in pipelines if p is not None for name in p.exporters}
    written = []
    for name in sorted(used):
        cfg = config.exporters.get(name)
        if not isinstance(cfg, FileExporterConfig) or not cfg.report or not os.path.isdir(cfg.directory):
            continue
        path = os.path.join(cfg.directory, RUN_REPORT)
        try:
            size = _telemetry_bytes(cfg.directory)
        except OSError:
            size = 0  # unreadable: the page's own reading says why, below
        if size > cfg.report_max_input:
            err.write(
                f"otelbpf: stopped; no {path}: the run wrote {size / 2**20:.1f} MiB of telemetry there, over the file "
                f"exporter's report_max_input ({format_size(cfg.report_max_input)}); "
                f"`otelbpf report {cfg.directory} -o {path}` writes it\n"
            )
            continue
        # The agent has stopped and flushed; the page takes ~10 s per 50 MB of spans (a long
        # run's): say so, so a wait after Ctrl-C is not mistaken for a stop that hangs.
        err.write(f"otelbpf: stopped; writing {path} (Ctrl-C skips it)\n")
        err.flush()
        try:
            page, findings, problems = render(cfg.directory)
            _write_page(cfg.directory, RUN_REPORT, page, dir_mode=cfg.dir_mode, file_mode=cfg.file_mode)
        except Exception as exc:  # noqa: BLE001 - the run's telemetry is already written; the page is extra
            err.write(f"otelbpf: no {path}: {type(exc).__name__}: {exc}\n")
            continue
        written.append(path)
        err.write(
            f"otelbpf: wrote {path}: {len(findings)} finding{'s' if len(findings) != 1 else ''}"
            f"{f' ({len(problems)} problems reading the folder)' if problems else ''}\n"
        )
    return written
