"""Read the file exporter's OTLP-JSON lines back and say what happened, per
process: top kernels, bytes copied by direction, device-memory high-water
mark, errors, synchronize waits, and the agent's own drops."""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TextIO, TypedDict

from otelbpf.base.losses import explain
from otelbpf.base.safe_files import ReadDir, UnsafeOutput

#: An object of an OTLP-JSON line (a request, a resource, a data point...): whatever its JSON holds.
Json = dict[str, Any]
#: A process: (service.name, process.pid) from its resource attributes.
ProcKey = tuple[str, int]
#: One metric series of a process: (metric name, its attributes sorted into pairs).
SeriesKey = tuple[str, tuple[tuple[str, Any], ...]]
#: load_metrics' answer: per process, each series' latest (time ns, OTLP-JSON point, kind).
Latest = dict[ProcKey, dict[SeriesKey, tuple[int, Json, str]]]


#: The scope of the spans the agent makes about a process rather than of it: its live diagnosis
#: (live/findings.py, ``otelbpf.finding`` spans, as long as the window a finding rests on). They
#: sit on the process's resource so a backend shows them beside its calls, but they are none of
#: the process's work: the summary, the report and the MCP tools keep them apart (never among
#: its slowest spans or its span counts).
AGENT_SCOPE = "otelbpf.diagnose"


class SpanStats(TypedDict):
    """load's span counts for one process."""

    count: Counter[str]  # spans by name
    errors: Counter[str]  # error spans by name
    slowest: list[tuple[int, str, Json]]  # (duration ns, name, attributes) of every span
    findings: Counter[str]  # the agent's own finding spans on the process, by cause (AGENT_SCOPE)


def _value(v: Json) -> object:
    for k in ("stringValue", "boolValue", "doubleValue"):
        if k in v:
            return v[k]
    if "intValue" in v:
        return int(v["intValue"])
    if "arrayValue" in v:
        return [_value(x) for x in v["arrayValue"].get("values", [])]
    return None


def _attrs(items: list[Json] | None) -> Json:
    return {a["key"]: _value(a.get("value", {})) for a in items or []}


def _read(directory: str, signal: str, add: Callable[[Json], None], partial: list[str] | None = None) -> None:
    """Feed every request line to ``add``, rotated files first. A line that is not an
    OTLP-JSON request (not JSON, or JSON of another shape) is a ValueError naming its
    file and line, never a traceback. With ``partial`` (a folder read while the agent
    writes it), a last line with no newline yet is one still being written: its
    ``file:line`` goes there instead of into an error. Only regular files directly in the
    folder are read, never through a link (``ReadDir``: the folder is read as root); a link or
    anything else under a telemetry file's name is a ValueError naming it."""
    try:
        folder = ReadDir(directory)
    except FileNotFoundError:
        return  # nothing written there yet: as an empty folder
    with folder as d:
        names = d.names(lambda n: n.startswith(f"{signal}-") and n.endswith(".jsonl"))
        for name in [*names, *d.names(lambda n: n == f"{signal}.jsonl")]:
            _read_file(d, name, add, partial)


def _read_file(d: ReadDir, name: str, add: Callable[[Json], None], partial: list[str] | None) -> None:
    """One telemetry file of ``_read``'s."""
    path = os.path.join(d.path, name)
    try:
        f = d.open_text(name)
    except UnsafeOutput as exc:
        raise ValueError(str(exc)) from None
    with f:
        for n, line in enumerate(f, 1):
            if partial is not None and not line.endswith("\n"):
                partial.append(f"{path}:{n}")
                continue
            line = line.strip()
            if not line:
                continue
            try:
                req = json.loads(line)
                if not isinstance(req, dict):
                    raise TypeError(f"a JSON {type(req).__name__}, not an object")
                add(req)
            except KeyError as exc:
                raise ValueError(f"{path}:{n}: not OTLP-JSON: no field {exc}") from exc
            except (TypeError, AttributeError, ValueError) as exc:
                raise ValueError(f"{path}:{n}: not OTLP-JSON: {exc}") from exc


def process_label(res: Json) -> str:
    """How a process is named to people: in summaries, findings and the report's headings (the
    report finds a finding's process by this name)."""
    return f"{res.get('service.name', '?')} (pid {res.get('process.pid', '?')})"


def _proc_key(res: Json) -> ProcKey:
    return (res.get("service.name", "?"), res.get("process.pid", 0))


def scoped(req: Json, signal: str, procs: dict[ProcKey, Json]) -> Iterator[tuple[ProcKey, Json]]:
    """(process key, scope block) of each ``scope<signal>`` in one OTLP-JSON request
    (``signal``: "Spans" or "Metrics"); ``procs`` gains each process's resource attributes."""
    for r in req.get(f"resource{signal}", []):
        res = _attrs(r.get("resource", {}).get("attributes"))
        key = _proc_key(res)
        procs.setdefault(key, res)
        for block in r.get(f"scope{signal}", []):
            yield key, block


class SpanVisitor(Protocol):
    """What read_spans hands each span to (diagnose.SpanLoader, report._Spans, report_ai.AiSpans,
    report_timeline.Timeline)."""

    def span(self, key: ProcKey, scope: str | None, sp: Json, attrs: Json, duration_ns: int) -> None: ...


def read_spans(
    directory: str,
    visitors: list[SpanVisitor],
    partial: list[str] | None = None,
    procs: dict[ProcKey, Json] | None = None,
) -> None:
    """Every span of the folder, once, to each visitor's ``span(process key, scope, span,
    attributes, ns)``: one pass over the files, however many readers (the report's page took
    two, the findings' and the charts', and decoding the JSON is most of its time).
    ``procs``, when given, gains each process's resource attributes."""

    def add(req: Json) -> None:
        for key, ss in scoped(req, "Spans", {} if procs is None else procs):
            scope = ss.get("scope", {}).get("name")
            for sp in ss.get("spans", []):
                d = int(sp["endTimeUnixNano"]) - int(sp["startTimeUnixNano"])
                a = _attrs(sp.get("attributes"))
                for v in visitors:
                    v.span(key, scope, sp, a, d)

    _read(directory, "traces", add, partial)


def load_metrics(directory: str, procs: dict[ProcKey, Json], partial: list[str] | None = None) -> Latest:
    """The latest point of every series, per process: proc -> {(metric, attrs tuple): (time,
    point, kind)}; ``procs`` gains each process's resource attributes. ``partial``: see _read."""
    latest: Latest = defaultdict(dict)

    def add_metrics(req: Json) -> None:
        for key, sm in scoped(req, "Metrics", procs):
            for metric in sm.get("metrics", []):
                for kind in ("sum", "gauge", "histogram"):
                    if kind in metric:
                        for dp in metric[kind].get("dataPoints", []):
                            a = tuple(sorted(_attrs(dp.get("attributes")).items()))
                            t = int(dp.get("timeUnixNano", 0))
                            slot = (metric["name"], a)
                            if slot not in latest[key] or latest[key][slot][0] <= t:
                                latest[key][slot] = (t, dp, kind)

    _read(directory, "metrics", add_metrics, partial)
    return latest


def load(directory: str) -> tuple[Latest, dict[ProcKey, SpanStats], dict[ProcKey, Json]]:
    """(latest metric points, span stats, process descriptions) per process."""
    spans: dict[ProcKey, SpanStats] = defaultdict(_span_stats)
    procs: dict[ProcKey, Json] = {}
    latest = load_metrics(directory, procs)

    def add_spans(req: Json) -> None:
        for key, ss in scoped(req, "Spans", procs):
            if ss.get("scope", {}).get("name") == AGENT_SCOPE:
                for sp in ss.get("spans", []):
                    spans[key]["findings"][str(_attrs(sp.get("attributes")).get("otelbpf.finding.cause", "?"))] += 1
                continue
            for sp in ss.get("spans", []):
                st = spans[key]
                st["count"][sp["name"]] += 1
                if sp.get("status", {}).get("code") == 2:
                    st["errors"][sp["name"]] += 1
                dur = int(sp["endTimeUnixNano"]) - int(sp["startTimeUnixNano"])
                st["slowest"].append((dur, sp["name"], _attrs(sp.get("attributes"))))

    _read(directory, "traces", add_spans)
    return latest, spans, procs


def _span_stats() -> SpanStats:
    return {"count": Counter(), "errors": Counter(), "slowest": [], "findings": Counter()}


def _num(dp: Json) -> float:
    if "asInt" in dp:
        return int(dp["asInt"])
    return float(dp.get("asDouble", 0))


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


human_bytes = _bytes


def human_seconds(s: float) -> str:
    """Seconds as people read them: 850 µs, 23.4 ms, 1.24 s, 2 min 05 s, 1 h 02 min."""
    a = abs(s)
    if a == 0:
        return "0 s"
    if a < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if a < 1:
        return f"{s * 1e3:.1f} ms"
    if a < 60:
        return f"{s:.2f} s"
    if a < 3600:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"


#: The agent's counters of records it could not keep, by reason (``base/losses.py`` explains them).
_LOSSES = ("otelbpf.events.lost", "otelbpf.events.dropped")


def _losses_first(latest: Latest, procs: dict[ProcKey, Json], out: TextIO) -> None:
    """A first line when the agent lost records: the blocks below may be missing names or
    calls because of it (``pid-N``, unnamed kernels), and the agent's block comes last."""
    lost: Counter[str] = Counter()
    for key in procs:
        if key[0] == "otelbpf":
            for (name, attrs), (_t, dp, _kind) in latest.get(key, {}).items():
                if name in _LOSSES:
                    lost[str(dict(attrs).get("reason", ""))] += int(_num(dp))
    if sum(lost.values()):
        reasons = ", ".join(f"{r} {n:,}" for r, n in lost.most_common() if n)
        print(
            f"otelbpf lost {sum(lost.values()):,} records ({reasons}): what follows may lack names "
            "or calls; the causes and fixes are under the otelbpf block at the end\n",
            file=out,
        )


def summarize(directory: str, out: TextIO) -> int:
    if not os.path.isdir(directory):
        print(f"otelbpf summary: {directory} does not exist (run the agent with the file exporter first)", file=out)
        return 2
    try:
        latest, spans, procs = load(directory)
    except ValueError as exc:
        print(f"otelbpf summary: {exc}", file=out)
        return 2
    if not procs:
        print(f"otelbpf summary: no telemetry in {directory}", file=out)
        return 1
    _losses_first(latest, procs, out)
    for key in sorted(procs, key=lambda k: (k[0] == "otelbpf", str(k))):
        res = procs[key]
        points = latest.get(key, {})

        def series(name: str, points: dict[SeriesKey, tuple[int, Json, str]] = points) -> list[tuple[Json, Json, str]]:
            return [(dict(a), dp, kind) for (n, a), (_t, dp, kind) in points.items() if n == name]

        title = process_label(res)
        print(title, file=out)
        if res.get("process.command_line"):
            print(f"  command: {res['process.command_line']}", file=out)
        if key[0] == "otelbpf":
            for name in (
                "otelbpf.events.received",
                "otelbpf.events.lost",
                "otelbpf.events.dropped",
                "otelbpf.export.dropped",
                "otelbpf.export.failures",
                "otelbpf.attach.failures",
            ):
                for a, dp, _k in series(name):
                    label = ",".join(f"{k}={v}" for k, v in a.items())
                    print(f"  {name}{{{label}}}: {_num(dp):.0f}", file=out)
                    if name in _LOSSES and _num(dp) > 0:  # what it means for the blocks above, and the fix
                        print(f"    {explain(str(a.get('reason', '')))}", file=out)
            print(file=out)
            continue
        launches = series("cuda.kernel.launches")
        if launches:
            total = sum(_num(dp) for _a, dp, _k in launches)
            by = ", ".join(f"{a['cuda.api.function']} {_num(dp):.0f}" for a, dp, _k in launches)
            print(f"  kernel launches: {total:.0f} ({by})", file=out)
        named = series("otelbpf.cuda.kernel_launches.named")
        if named:
            total = sum(_num(dp) for _a, dp, _k in named) or 1
            by_source = {a.get("otelbpf.name_source"): _num(dp) for a, dp, _k in named}
            unnamed = sum(v for k, v in by_source.items() if k in ("launch_site", "unresolved"))
            detail = ", ".join(f"{k} {v / total:.1%}" for k, v in sorted(by_source.items(), key=lambda kv: -kv[1]))
            print(f"  kernel names: {1 - unnamed / total:.1%} of launches named ({detail})", file=out)
        top = sorted(series("cuda.kernel.launches.top"), key=lambda x: -_num(x[1]))
        if top:
            print("  top kernels:", file=out)
            for a, dp, _k in top[:10]:
                print(f"    {_num(dp):>10.0f}  {a.get('cuda.kernel.name')}  [{a.get('cuda.api.function')}]", file=out)
        copies = series("cuda.memcpy.bytes")
        if copies:
            by_direction = sorted(copies, key=lambda x: x[0]["cuda.memcpy.direction"])
            print(
                "  bytes copied: "
                + ", ".join(f"{a['cuda.memcpy.direction']} {_bytes(_num(dp))}" for a, dp, _k in by_direction),
                file=out,
            )
        hw = series("cuda.memory.high_water")
        use = series("cuda.memory.in_use")
        if hw:
            line = f"  device memory: high-water {_bytes(_num(hw[0][1]))}"
            if use:
                line += f", in use at last export {_bytes(_num(use[0][1]))}"
            print(line, file=out)
        for a, dp, _k in series("cuda.sync.duration"):
            count = int(dp.get("count", 0))
            if count:
                print(
                    f"  {a['cuda.api.function']}: {count} waits, mean {float(dp.get('sum', 0)) / count * 1e3:.3f} ms,"
                    f" max {float(dp.get('max', 0)) * 1e3:.3f} ms",
                    file=out,
                )
        errors = series("cuda.api.errors")
        if errors:
            print("  errors:", file=out)
            for a, dp, _k in sorted(errors, key=lambda x: -_num(x[1])):
                print(
                    f"    {_num(dp):>10.0f}  {a['cuda.api.function']} -> {a['cuda.error.name']} "
                    f"({a['cuda.error.code']})",
                    file=out,
                )
        st = spans.get(key)
        if st and st["count"]:
            print(
                "  spans: "
                + ", ".join(
                    f"{n} {c}" + (f" ({st['errors'][n]} errors)" if st["errors"][n] else "")
                    for n, c in st["count"].most_common()
                ),
                file=out,
            )
            slow = sorted(st["slowest"], key=lambda x: -x[0])[:3]
            for dur, name, _attrs in slow:
                print(f"    slowest: {name} {dur / 1e6:.3f} ms", file=out)
        if st and st["findings"]:
            print(
                "  the agent's live findings on it (otelbpf.finding spans, not its own): "
                + ", ".join(f"{c} {n}" for c, n in st["findings"].most_common()),
                file=out,
            )
        print(file=out)
    return 0
