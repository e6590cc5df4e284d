"""deploy/compose: the compose file valid against the compose specification's JSON schema
(vendored in tests/deploy/schemas, from compose-spec/compose-spec), every file it mounts or
builds from present, and the services wired to each other the way their configs say."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from harness.agent import REPO
from otelbpf.families.registry import load_config_text

COMPOSE_DIR = REPO / "deploy" / "compose"
COMPOSE = COMPOSE_DIR / "compose.yaml"
SCHEMA = Path(__file__).parent / "schemas" / "compose-spec.json"


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def validator() -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(json.loads(SCHEMA.read_text()))


def test_compose_file_is_valid_against_the_compose_spec():
    errors = sorted(validator().iter_errors(compose()), key=str)
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def test_the_schema_catches_a_misspelt_key():
    doc = compose()
    doc["services"]["otelbpf"]["cap-add"] = ["BPF"]
    assert list(validator().iter_errors(doc))


def test_the_stack_has_every_service():
    assert set(compose()["services"]) == {
        "otelbpf",
        "demo",
        "otel-collector",
        "tempo",
        "prometheus",
        "pyroscope",
        "grafana",
    }


def _bind_sources(service: dict) -> list[str]:
    return [v.split(":")[0] for v in service.get("volumes", []) if v.startswith((".", "/"))]


@pytest.mark.parametrize("name", sorted(yaml.safe_load(COMPOSE.read_text())["services"]))
def test_every_relative_mount_and_build_exists(name):
    service = compose()["services"][name]
    for source in _bind_sources(service):
        if source.startswith("."):
            assert (COMPOSE_DIR / source).exists(), f"{name}: {source}"
    if "build" in service:
        context = (COMPOSE_DIR / service["build"]["context"]).resolve()
        assert context == REPO
        dockerfile = (context / service["build"]["dockerfile"]).read_text()
        assert f" AS {service['build']['target']}" in dockerfile


def test_the_agent_has_the_host_view_and_the_documented_capabilities():
    agent = compose()["services"]["otelbpf"]
    assert agent["pid"] == "host"
    assert agent["cap_drop"] == ["ALL"]
    assert {"BPF", "PERFMON", "SYS_ADMIN", "SYS_PTRACE", "DAC_READ_SEARCH"} <= set(agent["cap_add"])
    assert "privileged" not in agent
    hosts = {s for s in _bind_sources(agent) if s.startswith("/")}
    assert hosts == {
        "/sys/kernel/tracing",
        "/sys/kernel/debug",
        "/sys/kernel/btf",
        "/sys/fs/bpf",
        "/lib/modules",
        "/usr/src",
    }


def test_the_agent_config_loads_and_points_where_compose_says():
    agent = compose()["services"]["otelbpf"]
    config = load_config_text((COMPOSE_DIR / "otelbpf.yaml").read_text(), source="compose", env=agent["environment"])
    assert config.exporters["otlp"].endpoint == "http://otel-collector:4317"
    assert config.exporters["pyroscope"].endpoint == "http://pyroscope:4040"
    assert set(config.pipeline("traces").receivers) == {"cuda", "http", "nccl"}
    assert config.pipeline("profiles").exporters == ["pyroscope"]


def test_collector_tempo_prometheus_and_grafana_are_wired():
    services = compose()["services"]
    collector = services["otel-collector"]
    (config_mount,) = [v for v in collector["volumes"] if v.endswith("/etc/otelcol-contrib/config.yaml:ro")]
    gateway = yaml.safe_load((COMPOSE_DIR / config_mount.split(":")[0]).read_text())
    tempo_target = collector["environment"]["TEMPO_OTLP_ENDPOINT"]
    assert "${env:TEMPO_OTLP_ENDPOINT" in gateway["exporters"]["otlp/tempo"]["endpoint"]
    tempo = yaml.safe_load((COMPOSE_DIR / "tempo.yaml").read_text())
    assert (
        tempo_target.split(":")[1]
        == tempo["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].split(":")[1]
    )
    datasources = yaml.safe_load((COMPOSE_DIR / "grafana/provisioning/datasources/datasources.yaml").read_text())
    urls = {d["uid"]: d["url"] for d in datasources["datasources"]}
    assert urls == {
        "prometheus": "http://prometheus:9090",
        "tempo": f"http://tempo:{tempo['server']['http_listen_port']}",
        "pyroscope": "http://pyroscope:4040",
    }
    provider = yaml.safe_load((COMPOSE_DIR / "grafana/provisioning/dashboards/dashboards.yaml").read_text())
    path = provider["providers"][0]["options"]["path"]
    assert any(v == f"./grafana/dashboards:{path}:ro" for v in services["grafana"]["volumes"])
