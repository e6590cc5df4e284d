"""``otelbpf report DIR -o report.html``: what the agent wrote into DIR, as one HTML page.

Findings first (``diagnose``, ranked by the time they cost, with their evidence and fix),
then one section per process: what it did (CUDA launches, bytes copied, off-CPU time by
reason), the CUDA API time per call, a flame graph of each profile the profiling receiver
wrote (``profiles/*.pb.gz``, merged per process and kind), and an off-CPU flame graph of
the sched receiver's ``off_cpu`` spans (thread, reason, kernel stack).

The page is self-contained: CSS and the little script that zooms the flame graphs are
inline, nothing is fetched. The flame graphs are rendered here as nested blocks (each
frame's width its share of the samples), so the page shows them without a script too.
A folder that is partly unreadable gives a partial report with the reason, never a
traceback.
"""

from __future__ import annotations

import glob
import gzip
import html
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TextIO

from otelbpf.analyze.diagnose import COSTS, SCHED_SCOPE, Finding, diagnose
from otelbpf.analyze.summary import _attrs, _num, _proc_key, _read, load_metrics
from otelbpf.export.proto import profile_pb2

#: Frames narrower than this share of a flame graph's total are left out (unreadable anyway).
MIN_FRAME_SHARE = 0.002
MAX_DEPTH = 128
_PROFILE_NAME = re.compile(r"^(?P<service>.+)-(?P<pid>\d+)-(?P<kind>[a-z_]+)-(?P<ms>\d+)\.pb\.gz$")


@dataclass
class Node:
    name: str
    value: int = 0
    children: dict[str, Node] = field(default_factory=dict)

    def add(self, frames: list[str], value: int) -> None:
        """``frames`` root first."""
        self.value += value
        node = self
        for f in frames[:MAX_DEPTH]:
            node = node.children.setdefault(f, Node(f))
            node.value += value


@dataclass
class FlameGraph:
    service: str
    pid: int
    kind: str
    unit: str                # what the values count ("samples", "bytes", ...)
    root: Node
    files: int = 0


@dataclass
class ApiTime:
    calls: int = 0
    total_ns: int = 0
    max_ns: int = 0


def read_profile(path: str) -> tuple[str, list[tuple[list[str], int]]]:
    """(sample type, [(frames root first, value)]) of one pprof file: the CPU profile's
    ``cpu`` values if it has them, else its first sample type."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    prof = profile_pb2.Profile()
    prof.ParseFromString(data)
    strings = list(prof.string_table)
    types = [f"{strings[t.type]}/{strings[t.unit]}" for t in prof.sample_type]
    index = next((i for i, t in enumerate(types) if t.startswith("cpu/")), 0)
    functions = {fn.id: strings[fn.name] for fn in prof.function}
    locations: dict[int, list[str]] = {}
    for loc in prof.location:
        # lines are innermost first within one location (inlined calls)
        names = [functions.get(line.function_id, "?") for line in loc.line] or [f"0x{loc.address:x}"]
        locations[loc.id] = names
    samples = []
    for s in prof.sample:
        if index >= len(s.value):
            continue
        frames: list[str] = []
        for lid in s.location_id:  # leaf first
            frames.extend(locations.get(lid, ["?"]))
        samples.append((frames[::-1], int(s.value[index])))
    return (types[index] if types else "samples/count"), samples


def flame_graphs(directory: str, problems: list[str]) -> list[FlameGraph]:
    """One graph per (process, kind), every interval's file merged."""
    graphs: dict[tuple[str, int, str], FlameGraph] = {}
    for path in sorted(glob.glob(os.path.join(directory, "profiles", "*.pb.gz"))):
        m = _PROFILE_NAME.match(os.path.basename(path))
        if not m:
            continue
        try:
            unit, samples = read_profile(path)
        except Exception as exc:  # a truncated or foreign file: say so, go on
            problems.append(f"{path}: not a readable pprof profile ({type(exc).__name__}: {exc})")
            continue
        key = (m["service"], int(m["pid"]), m["kind"])
        g = graphs.setdefault(key, FlameGraph(key[0], key[1], key[2], unit, Node("all")))
        g.files += 1
        for frames, value in samples:
            g.root.add(frames, value)
    return [g for g in graphs.values() if g.root.value > 0]


def from_spans(directory: str, partial: list[str] | None = None) -> tuple[dict[tuple, dict[str, ApiTime]],
                                                                          dict[tuple, FlameGraph]]:
    """Per process: traced time per CUDA API function (the CUDA spans), and an off-CPU flame
    graph (the sched receiver's ``off_cpu`` spans: thread, reason, then the kernel stack
    outermost first, weighted by time off the CPU)."""
    calls: dict[tuple, dict[str, ApiTime]] = defaultdict(lambda: defaultdict(ApiTime))
    off: dict[tuple, FlameGraph] = {}

    def add(req: dict) -> None:
        for rs in req.get("resourceSpans", []):
            key = _proc_key(_attrs(rs.get("resource", {}).get("attributes")))
            for ss in rs.get("scopeSpans", []):
                scope = ss.get("scope", {}).get("name")
                for sp in ss.get("spans", []):
                    d = int(sp["endTimeUnixNano"]) - int(sp["startTimeUnixNano"])
                    if scope == "otelbpf.cuda":
                        t = calls[key][sp["name"]]
                        t.calls += 1
                        t.total_ns += d
                        t.max_ns = max(t.max_ns, d)
                    elif scope == SCHED_SCOPE:
                        a = _attrs(sp.get("attributes"))
                        g = off.setdefault(key, FlameGraph(str(key[0]), int(key[1] or 0), "off_cpu",
                                                           "off_cpu/nanoseconds", Node("all")))
                        stack = [str(f) for f in reversed(a.get("otelbpf.sched.kernel_stack") or [])]
                        g.root.add([f"thread {a.get('thread.name', '?')}", str(a.get("otelbpf.sched.reason", "?")),
                                    *stack], d)
                        g.files = 1

    _read(directory, "traces", add, partial)
    return calls, off


# -- HTML -------------------------------------------------------------------------

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;max-width:1400px}
h1{font-size:1.5em}h2{font-size:1.25em;margin-top:1.6em;border-bottom:1px solid #ccc}h3{font-size:1.05em}
table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4}td.n{text-align:right;font-variant-numeric:tabular-nums}
.finding{border-left:4px solid #c0392b;padding:.3em .8em;margin:.8em 0;background:#fdf3f2}
.finding h3{margin:.2em 0}.fix{background:#eef7ee;padding:.3em .6em}.muted{color:#777}
pre{background:#f7f7f7;padding:.5em;overflow:auto;max-height:20em;font-size:12px}
.problem{color:#a00}
.flame{position:relative;width:100%;border:1px solid #ddd;font:11px monospace;overflow:hidden}
.flame div{position:absolute;height:16px;box-sizing:border-box;border:1px solid #fff;overflow:hidden;
white-space:nowrap;cursor:pointer;padding-left:2px}
"""

_JS = """
document.querySelectorAll('.flame').forEach(function(g){
  g.addEventListener('click',function(e){
    var t=e.target; if(!t.dataset||t.dataset.x===undefined)return;
    var x0=+t.dataset.x,w0=+t.dataset.w,d0=+t.dataset.d;
    g.querySelectorAll('div').forEach(function(b){
      var x=+b.dataset.x,w=+b.dataset.w,d=+b.dataset.d;
      var inside=x>=x0-1e-9&&x+w<=x0+w0+1e-9;
      if(d<d0){inside=x<=x0+1e-9&&x+w>=x0+w0-1e-9;}
      b.style.display=inside?'':'none';
      if(inside){var nx=d<d0?0:(x-x0)/w0,nw=d<d0?1:w/w0;b.style.left=(nx*100)+'%';b.style.width=(nw*100)+'%';}
    });
  });
});
"""


def _amount(value: float, unit: str) -> str:
    """A flame graph's value as people read it (pprof units: count, nanoseconds, bytes)."""
    kind, _, base = unit.partition("/")
    if base == "nanoseconds":
        return f"{value / 1e9:.3f}s {kind}"
    if base == "bytes":
        return f"{value / 2**20:.1f} MiB {kind}"
    return f"{value:.0f} {kind}"


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


def _color(name: str) -> str:
    """Warm colours, stable per function name; Python frames greener."""
    h = sum(ord(c) * (i + 1) for i, c in enumerate(name[:40])) % 55
    if name.endswith(".py") or ".py:" in name or name.startswith("<"):
        return f"hsl({90 + h},45%,60%)"
    return f"hsl({h},75%,62%)"


def _flame_html(g: FlameGraph) -> str:
    total = g.root.value
    blocks: list[str] = []
    depth_max = 0

    def walk(node: Node, x: float, depth: int) -> None:
        nonlocal depth_max
        w = node.value / total
        if w < MIN_FRAME_SHARE:
            return
        depth_max = max(depth_max, depth)
        title = f"{node.name}: {_amount(node.value, g.unit)} ({w:.1%})"
        blocks.append(
            f'<div data-x="{x:.6f}" data-w="{w:.6f}" data-d="{depth}" title="{_e(title)}" '
            f'style="left:{x * 100:.4f}%;width:{w * 100:.4f}%;top:{depth * 17}px;background:{_color(node.name)}">'
            f"{_e(node.name)}</div>")
        cx = x
        for child in sorted(node.children.values(), key=lambda n: -n.value):
            walk(child, cx, depth + 1)
            cx += child.value / total

    walk(g.root, 0.0, 0)
    return (f'<div class="flame" style="height:{(depth_max + 1) * 17 + 2}px">' + "".join(blocks) + "</div>")


def _finding_html(i: int, f: Finding) -> str:
    evidence = {k: v for k, v in f.evidence.items() if k not in ("span_ids", "stacks")}
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in sorted(evidence.items()))
    stacks = "".join(
        f"<p class='muted'>{s['seconds']:.3f}s in:</p><pre>{_e(chr(10).join(s['kernel_stack']))}</pre>"
        for s in f.evidence.get("stacks", []))
    spans = f"<p>spans: <code>{_e(', '.join(f.evidence['span_ids']))}</code></p>" if f.evidence.get("span_ids") else ""
    return (f'<div class="finding" id="finding-{i}"><h3>{i}. {_e(f.cause)}: {_e(f.process)}: ~{f.cost_s:.3f}s '
            f"({f.share:.1%} of its traced window)</h3><p>{_e(f.summary)}</p>"
            f"<p class='muted'>cost: {_e(COSTS.get(f.cause, ''))}</p><table>{rows}</table>{stacks}{spans}"
            f"<p class='fix'><b>fix:</b> {_e(f.fix)}</p></div>")


def _series(points: dict, name: str) -> list[tuple[dict, dict]]:
    return [(dict(a), dp) for (n, a), (_t, dp, _k) in points.items() if n == name]


def _process_html(res: dict, points: dict, calls: dict[str, ApiTime], graphs: list[FlameGraph]) -> str:
    title = f"{res.get('service.name', '?')} (pid {res.get('process.pid', '?')})"
    parts = [f"<h2>{_e(title)}</h2>"]
    if res.get("process.command_line"):
        parts.append(f"<p class='muted'>{_e(res['process.command_line'])}</p>")
    facts: list[tuple[str, str]] = []
    launches = sum(_num(dp) for _a, dp in _series(points, "cuda.kernel.launches"))
    if launches:
        facts.append(("kernel launches", f"{launches:.0f}"))
    for a, dp in sorted(_series(points, "cuda.memcpy.bytes"), key=lambda x: str(x[0])):
        facts.append((f"bytes copied {a.get('cuda.memcpy.direction')}", f"{_num(dp):.0f}"))
    errors = sum(_num(dp) for _a, dp in _series(points, "cuda.api.errors"))
    if errors:
        facts.append(("failed CUDA calls", f"{errors:.0f}"))
    off: dict[str, float] = defaultdict(float)
    for a, dp in _series(points, "otelbpf.thread.off_cpu.time"):
        off[str(a.get("otelbpf.sched.reason"))] += _num(dp)
    for reason, s in sorted(off.items(), key=lambda kv: -kv[1]):
        facts.append((f"off-CPU: {reason}", f"{s:.3f}s"))
    if facts:
        parts.append("<table>" + "".join(f"<tr><th>{_e(k)}</th><td class='n'>{_e(v)}</td></tr>" for k, v in facts)
                     + "</table>")
    metric_calls = {a.get("cuda.api.function"): _num(dp) for a, dp in _series(points, "cuda.api.calls")}
    if calls or metric_calls:
        parts.append("<h3>CUDA API time per call</h3><table><tr><th>function</th><th>calls</th><th>traced</th>"
                     "<th>total ms</th><th>mean us</th><th>max us</th></tr>")
        names = sorted(set(calls) | {str(k) for k in metric_calls if k},
                       key=lambda n: -(calls[n].total_ns if n in calls else 0))
        for n in names:
            t = calls.get(n, ApiTime())
            mean = t.total_ns / t.calls / 1e3 if t.calls else 0.0
            parts.append(f"<tr><td>{_e(n)}</td><td class='n'>{metric_calls.get(n, t.calls):.0f}</td>"
                         f"<td class='n'>{t.calls}</td><td class='n'>{t.total_ns / 1e6:.3f}</td>"
                         f"<td class='n'>{mean:.1f}</td><td class='n'>{t.max_ns / 1e3:.1f}</td></tr>")
        parts.append("</table>")
    for g in graphs:
        source = ("off_cpu spans: thread, reason, kernel stack" if g.kind == "off_cpu"
                  else f"{g.files} interval{'s' if g.files != 1 else ''}")
        parts.append(f"<h3>{_e(g.kind)} profile: {_e(_amount(g.root.value, g.unit))} ({_e(source)}; "
                     "click a frame to zoom, the top row to reset)</h3>")
        parts.append(_flame_html(g))
    return "\n".join(parts)


def render(directory: str) -> tuple[str, list[Finding], list[str]]:
    """(the page, its findings, what could not be read)."""
    problems: list[str] = []
    partial: list[str] = []  # last lines still being written (or cut off): skipped, and said
    try:
        findings = diagnose(directory, [])
    except ValueError as exc:
        findings = []
        problems.append(f"no diagnosis: {exc}")
    procs: dict = {}
    try:
        latest = load_metrics(directory, procs, partial)
    except ValueError as exc:
        latest = {}
        problems.append(f"no metrics: {exc}")
    try:
        calls, off_cpu = from_spans(directory, partial)
    except ValueError as exc:
        calls, off_cpu = {}, {}
        problems.append(f"no spans: {exc}")
    problems += [f"{where}: an incomplete last line, skipped" for where in partial]
    graphs = flame_graphs(directory, problems)
    by_proc: dict[tuple, list[FlameGraph]] = defaultdict(list)
    for g in graphs:
        key = next((k for k, r in procs.items() if int(r.get("process.pid", -1) or -1) == g.pid), (g.service, g.pid))
        procs.setdefault(key, {"service.name": g.service, "process.pid": g.pid})
        by_proc[key].append(g)
    for key in calls:
        procs.setdefault(key, {"service.name": key[0], "process.pid": key[1]})
    for key, g in off_cpu.items():
        procs.setdefault(key, {"service.name": key[0], "process.pid": key[1]})
        by_proc[key].append(g)
    body = [f"<h1>otelbpf report: {_e(os.path.abspath(directory))}</h1>"]
    body += [f"<p class='problem'>{_e(p)}</p>" for p in problems]
    body.append("<h2>Findings</h2>")
    if findings:
        body += [_finding_html(i, f) for i, f in enumerate(findings, 1)]
    else:
        body.append("<p>No cause of GPU idle time above 1% of a process's traced window.</p>")
    for key in sorted(procs, key=lambda k: (k[0] == "otelbpf", str(k))):
        body.append(_process_html(procs[key], latest.get(key, {}), calls.get(key, {}), by_proc.get(key, [])))
    page = ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>otelbpf report</title>"
            f"<style>{_CSS}</style></head><body>{''.join(body)}<script>{_JS}</script></body></html>")
    return page, findings, problems


def run(directory: str, output: str, out: TextIO, err: TextIO) -> int:
    """``otelbpf report DIR -o FILE``: 0 written, 2 when DIR is missing or holds nothing."""
    if not os.path.isdir(directory):
        err.write(f"otelbpf report: {directory} does not exist (run the agent with the file exporter first)\n")
        return 2
    page, findings, problems = render(directory)
    for p in problems:
        err.write(f"otelbpf report: {p}\n")
    with open(output, "w", encoding="utf-8") as f:
        f.write(page)
    out.write(f"wrote {output}: {len(findings)} finding{'s' if len(findings) != 1 else ''}\n")
    return 0
