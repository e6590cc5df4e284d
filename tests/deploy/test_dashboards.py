"""The Grafana dashboards (deploy/compose/grafana): built by their script, loadable by the SDK's
models, every PromQL query valid, and, against a real agent run, every metric and label a query
names is one the agent really exports (in the Prometheus names of the Collector's exporter)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import promql_parser
import pytest
import yaml
from grafana_foundation_sdk.models.dashboard import Dashboard
from prometheus_names import OtlpMetric, label_name, metric_name, series_names

from harness.agent import BUILD, REPO, AgentProcess

GRAFANA = REPO / "deploy" / "compose" / "grafana"
SCRIPT = GRAFANA / "dashboards.py"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
TRAFFIC = REPO / "deploy" / "demo" / "traffic.py"
#: Grafana's variables, as a query would see them once Grafana substituted them.
GRAFANA_VARS = {"$__rate_interval": "1m", "$__range": "30m", "$service": ".*"}
#: Labels every series has in Prometheus besides the metric's and the resource's attributes.
SERIES_LABELS = {"job", "instance", "otel_scope_name", "otel_scope_version"}


def panels(dashboard: dict) -> Iterator[dict]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def promql_queries() -> list[tuple[str, str]]:
    """(dashboard/panel title, PromQL with Grafana's variables substituted)."""
    found = []
    for path in DASHBOARDS:
        dash = json.loads(path.read_text())
        for panel in panels(dash):
            for target in panel.get("targets", []):
                if "expr" in target:
                    found.append((f"{path.name}: {panel['title']}", _substitute(target["expr"])))
        for var in dash["templating"].get("list", []):
            found.append((f"{path.name}: variable {var['name']}", _label_values(var["query"])))
    return found


def traceql_queries() -> list[tuple[str, str]]:
    return [
        (f"{path.name}: {panel['title']}", target["query"])
        for path in DASHBOARDS
        for panel in panels(json.loads(path.read_text()))
        for target in panel.get("targets", [])
        if target.get("queryType") == "traceql"
    ]


def _substitute(expr: str) -> str:
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, f"unknown Grafana variable in {expr}"
    return expr


def _label_values(query: str) -> str:
    """label_values(metric, label) -> a PromQL query using both, so it is checked the same way."""
    m = re.fullmatch(r"label_values\((\w+), (\w+)\)", query)
    assert m, query
    return f"count by ({m[2]}) ({m[1]})"


def selectors(expr) -> Iterator[tuple[str, set[str]]]:
    """(metric name, labels matched) of every vector selector; grouping labels as ('', labels)."""
    if isinstance(expr, promql_parser.VectorSelector):
        yield expr.name, {m.name for m in expr.matchers.matchers}
    elif isinstance(expr, promql_parser.MatrixSelector):
        yield from selectors(expr.vector_selector)
    elif isinstance(expr, promql_parser.AggregateExpr):
        if expr.modifier is not None:
            yield "", set(expr.modifier.labels)
        yield from selectors(expr.expr)
    elif isinstance(expr, promql_parser.Call):
        for arg in expr.args:
            yield from selectors(arg)
    elif isinstance(expr, promql_parser.BinaryExpr):
        yield from selectors(expr.lhs)
        yield from selectors(expr.rhs)
    elif isinstance(expr, (promql_parser.ParenExpr, promql_parser.UnaryExpr, promql_parser.SubqueryExpr)):
        yield from selectors(expr.expr)


# ---- offline


def test_committed_dashboards_are_what_the_script_builds():
    out = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert [p.name for p in DASHBOARDS] == sorted(
        ["otelbpf-agent.json", "otelbpf-gpu.json", "otelbpf-http.json", "otelbpf-nccl.json"]
    )


def test_dashboards_load_into_the_sdk_models_and_use_provisioned_datasources():
    provisioned = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "datasources.yaml").read_text())
    uids = {d["uid"]: d["type"] for d in provisioned["datasources"]}
    for path in DASHBOARDS:
        raw = json.loads(path.read_text())
        model = Dashboard.from_json(raw)
        assert model.uid == raw["uid"] and model.title.startswith("otelbpf / ")
        for panel in panels(raw):
            if panel["type"] == "row":
                continue
            for ref in [panel["datasource"], *(t["datasource"] for t in panel["targets"])]:
                assert uids.get(ref["uid"]) == ref["type"], f"{path.name} {panel['title']}: {ref}"


@pytest.mark.parametrize("where, expr", promql_queries())
def test_every_promql_query_parses(where, expr):
    promql_parser.parse(expr)


def test_a_broken_query_is_caught():
    with pytest.raises(ValueError):
        promql_parser.parse("sum by (le (rate(x[1m]))")


@pytest.mark.parametrize(
    "otlp, prom",
    [
        (OtlpMetric("cuda.kernel.launches", "{launch}", "sum", True), "cuda_kernel_launches_total"),
        (OtlpMetric("cuda.memcpy.bytes", "By", "sum", True), "cuda_memcpy_bytes_total"),
        (OtlpMetric("cuda.memory.in_use", "By", "gauge", False), "cuda_memory_in_use_bytes"),
        (OtlpMetric("cuda.sync.duration", "s", "histogram", False), "cuda_sync_duration_seconds"),
        (
            OtlpMetric("nccl.algorithm.bandwidth", "By/s", "histogram", False),
            "nccl_algorithm_bandwidth_bytes_per_second",
        ),
        (OtlpMetric("otelbpf.export.sent", "1", "sum", True), "otelbpf_export_sent_total"),
        (OtlpMetric("gpu.utilization", "1", "gauge", False), "gpu_utilization_ratio"),
        (OtlpMetric("otelbpf.spans.queued", "{span}", "gauge", False), "otelbpf_spans_queued"),
        (OtlpMetric("process.memory.usage", "By", "sum", False), "process_memory_usage_bytes"),
    ],
)
def test_prometheus_names(otlp, prom):
    assert metric_name(otlp) == prom
    assert label_name("cuda.memcpy.host_memory") == "cuda_memcpy_host_memory"


# ---- against a real run


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> dict:
    """The demo traffic under the real agent (cuda, http, nccl), exported to files. A second
    traces exporter points at a closed port and the http receiver keeps few spans, so the
    self metrics that only appear on trouble (export failures and drops, spans sampled out)
    are exported too."""
    subprocess.run([str(REPO / "examples" / "build.sh")], check=True, capture_output=True, text=True)
    tmp = tmp_path_factory.mktemp("dashboards")
    receivers = ["cuda", "http", "nccl"]
    doc = {
        "receivers": {
            "cuda": {"search_paths": []},
            "http": {"processes": "all", "max_spans_per_second": 5},
            "nccl": {"search_paths": []},
        },
        "processors": {"batch": {"timeout": "100ms"}},
        "exporters": {
            "file": {"directory": str(tmp / "out")},
            "otlphttp/down": {"endpoint": "http://127.0.0.1:9", "timeout": "500ms"},
        },
        "service": {
            "pipelines": {
                "traces": {"receivers": receivers, "processors": ["batch"], "exporters": ["file", "otlphttp/down"]},
                "metrics": {"receivers": receivers, "processors": ["batch"], "exporters": ["file"]},
            },
            "telemetry": {"metrics_interval": "300ms", "drain_interval": "20ms"},
        },
    }
    cfg = tmp / "otelbpf.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    with AgentProcess(
        ["-c", str(cfg), "--", sys.executable, str(TRAFFIC), "--build", str(BUILD), "--rounds", "2"]
    ) as agent:
        assert agent.wait(300) == 0, agent.output
    rounds = [json.loads(line) for line in agent.output.splitlines() if line.startswith('{"round"')]
    assert len(rounds) == 2, agent.output
    return {
        "metrics": _exported_series(tmp / "out" / "metrics.jsonl"),
        "spans": _span_facts(tmp / "out" / "traces.jsonl"),
        "rounds": rounds,
    }


def _exported_series(path: Path) -> dict[str, set[str]]:
    """Prometheus series name -> the labels it carries, from the OTLP-JSON metrics."""
    series: dict[str, set[str]] = {}
    for line in path.read_text().splitlines():
        for rm in json.loads(line)["resourceMetrics"]:
            resource = {label_name(a["key"]) for a in rm["resource"].get("attributes", [])}
            for sm in rm["scopeMetrics"]:
                for m in sm["metrics"]:
                    kind = next(k for k in ("sum", "gauge", "histogram") if k in m)
                    metric = OtlpMetric(m["name"], m.get("unit", ""), kind, bool(m[kind].get("isMonotonic")))
                    attrs = {label_name(a["key"]) for p in m[kind]["dataPoints"] for a in p.get("attributes", [])}
                    for name in series_names(metric):
                        labels = attrs | resource | SERIES_LABELS | ({"le"} if name.endswith("_bucket") else set())
                        series.setdefault(name, set()).update(labels)
    return series


def _span_facts(path: Path) -> dict[str, set[str]]:
    facts: dict[str, set[str]] = {"span": set(), "resource": set(), "event": set(), "kind": set()}
    for line in path.read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            facts["resource"].update(a["key"] for a in rs["resource"].get("attributes", []))
            for ss in rs["scopeSpans"]:
                for s in ss["spans"]:
                    facts["span"].update(a["key"] for a in s.get("attributes", []))
                    facts["event"].update(e["name"] for e in s.get("events", []))
                    facts["kind"].add(s.get("kind"))
    return facts


@pytest.mark.bpf
def test_every_query_names_metrics_and_labels_a_real_run_exports(real_run):
    exported = real_run["metrics"]
    problems = []
    for where, expr in promql_queries():
        found = list(selectors(promql_parser.parse(expr)))
        metrics = [(name, labels) for name, labels in found if name]
        assert metrics, f"{where}: no metric in {expr}"
        available: set[str] = set()
        for name, labels in metrics:
            if name not in exported:
                problems.append(f"{where}: {name} is not exported")
                continue
            available |= exported[name]
            problems += [f"{where}: {name} has no label {label}" for label in labels - exported[name]]
        for name, labels in found:
            if not name:
                problems += [f"{where}: no metric carries the label {label}" for label in labels - available]
    assert not problems, "\n".join(problems) + "\n\nexported: " + ", ".join(sorted(exported))


@pytest.mark.bpf
def test_every_traceql_attribute_is_on_real_spans(real_run):
    facts = real_run["spans"]
    queries = traceql_queries()
    assert queries
    for where, query in queries:
        for scope, key in re.findall(r"\b(span|resource)\.([\w.]+)", query):
            assert key in facts[scope], f"{where}: no span has {scope}.{key}"
        for event in re.findall(r'event:name = "([^"]+)"', query):
            assert event in facts["event"], f"{where}: no span has the event {event}"
        if "kind = server" in query:
            assert 2 in facts["kind"], "no SERVER span (OTLP SpanKind 2)"
