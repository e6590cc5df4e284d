"""examples/collector: the OpenTelemetry Collector configs, checked for structure.

No Collector binary installs here (no otelcol-contrib package in PyPI, Debian or npm; the Go
toolchain here is too old to build one), so this checks what `otelcol validate` would check
first, up to that boundary: every component is one the otelcol-contrib distribution ships, for
a signal it handles; every pipeline names defined components; `${env:VAR:-default}`
references are well formed; the ports match what the agent, compose and Prometheus use.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from harness.agent import REPO

EXAMPLES = REPO / "examples" / "collector"
CONFIGS = sorted(EXAMPLES.glob("*.yaml"))
ALL = {"traces", "metrics", "logs"}
#: Component type -> the signals it handles, for the components these configs use; each is in
#: otelcol-contrib's manifest (opentelemetry-collector-releases, distributions/otelcol-contrib).
COMPONENTS = {
    "receivers": {"otlp": ALL, "otlpjsonfile": ALL},
    "processors": {"batch": ALL, "memory_limiter": ALL, "resource": ALL, "k8sattributes": ALL},
    "exporters": {
        "otlp": ALL,
        "otlphttp": ALL,
        "file": ALL,
        "debug": ALL,
        "prometheus": {"metrics"},
        "prometheusremotewrite": {"metrics"},
    },
}
ENV_REF = re.compile(r"\$\{([^}]*)\}")


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_the_three_configs_exist():
    assert [p.name for p in CONFIGS] == ["otelbpf-gateway.yaml", "otelbpf-k8s.yaml", "otlpjsonfile-replay.yaml"]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_components_and_pipelines(path):
    config = load(path)
    assert set(config) <= {"receivers", "processors", "exporters", "connectors", "extensions", "service"}
    for section, known in COMPONENTS.items():
        for name in config.get(section, {}):
            assert name.split("/")[0] in known, f"{section}.{name}: not a component of otelcol-contrib used here"
    pipelines = config["service"]["pipelines"]
    assert pipelines
    used = set()
    for pipeline, body in pipelines.items():
        signal = pipeline.split("/")[0]
        assert signal in ALL, pipeline
        assert set(body) <= {"receivers", "processors", "exporters"} and body["receivers"] and body["exporters"]
        for section in ("receivers", "processors", "exporters"):
            for name in body.get(section, []):
                assert name in config[section], f"{pipeline}: {section} {name} is not defined"
                assert signal in COMPONENTS[section][name.split("/")[0]], f"{pipeline}: {name} has no {signal}"
                used.add((section, name))
        assert len(set(body.get("processors", []))) == len(body.get("processors", []))
        if "memory_limiter" in body.get("processors", []):
            assert body["processors"][0] == "memory_limiter", "the memory limiter goes first"
    for section in ("receivers", "processors"):
        assert {(section, n) for n in config.get(section, {})} <= used, f"unused {section} in {path.name}"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_environment_references_are_well_formed(path):
    refs = ENV_REF.findall(path.read_text())
    assert refs
    for ref in refs:
        assert re.fullmatch(r"env:[A-Z_][A-Z0-9_]*(:-[^}]*)?", ref), ref


def test_gateway_fans_out_traces_metrics_and_files():
    config = load(EXAMPLES / "otelbpf-gateway.yaml")
    pipes = config["service"]["pipelines"]
    assert pipes["traces"]["exporters"] == ["otlp/tempo", "file"]
    assert pipes["metrics"]["exporters"] == ["prometheus", "file"]
    assert {"otlp/jaeger", "prometheusremotewrite"} <= set(config["exporters"]), "the alternatives are there"
    assert config["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].endswith(":4317")
    assert config["receivers"]["otlp"]["protocols"]["http"]["endpoint"].endswith(":4318")
    # The metrics reach Prometheus with the resource attributes the dashboards group by.
    assert config["exporters"]["prometheus"]["resource_to_telemetry_conversion"]["enabled"] is True
    prometheus = load(REPO / "deploy" / "compose" / "prometheus.yaml")
    (target,) = prometheus["scrape_configs"][0]["static_configs"][0]["targets"]
    assert target.split(":")[1] == config["exporters"]["prometheus"]["endpoint"].split(":")[1]


def test_replay_reads_what_the_agents_file_exporter_writes(tmp_path):
    """The include globs match the files otelbpf's file exporters write, rotated ones too."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from otelbpf.export.jsonfile import FileMetricExporter, FileSpanExporter

    out = tmp_path / "otelbpf-out"
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(FileSpanExporter(str(out), rotate_bytes=1)))
    for name in ("first", "second"):
        tracer_provider.get_tracer("t").start_span(name).end()
    tracer_provider.shutdown()
    reader = PeriodicExportingMetricReader(FileMetricExporter(str(out)), export_interval_millis=3_600_000)
    meter_provider = MeterProvider(metric_readers=[reader])
    meter_provider.get_meter("m").create_counter("c").add(1)
    meter_provider.shutdown()
    written = sorted(p.name for p in out.iterdir())
    assert len([w for w in written if w.startswith("traces")]) >= 2, written

    config = load(EXAMPLES / "otlpjsonfile-replay.yaml")
    for name, body in config["receivers"].items():
        signal = name.split("/")[1]
        (glob,) = body["include"]
        assert body["start_at"] == "beginning"
        pattern = ENV_REF.sub(str(out), glob)
        matched = sorted(p.name for p in Path("/").glob(pattern.lstrip("/")))
        assert matched == [w for w in written if w.startswith(signal)], (pattern, written)


def test_k8s_config_associates_pods_by_what_the_agent_exports():
    config = load(EXAMPLES / "otelbpf-k8s.yaml")
    k8s = config["processors"]["k8sattributes"]
    sources = [s for rule in k8s["pod_association"] for s in rule["sources"]]
    assert [(s["from"], s["name"]) for s in sources] == [
        ("resource_attribute", "k8s.pod.uid"),
        ("resource_attribute", "container.id"),
    ]
    assert {"k8s.namespace.name", "k8s.pod.name", "k8s.node.name"} <= set(k8s["extract"]["metadata"])
    for pipeline in config["service"]["pipelines"].values():
        assert "k8sattributes" in pipeline["processors"]
