"""deploy/kubernetes: every manifest valid against the Kubernetes schemas (kubernetes-validate,
offline), and what the agent needs actually granted: host pid namespace, the capabilities
docs/capabilities.md and otelbpf/base/privileges.py name, the host mounts, bounded resources, and
configs the agent's own loader accepts."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from harness.agent import REPO
from otelbpf.base.privileges import REQUIRED_NAMES
from otelbpf.families.registry import load_config_text

K8S = REPO / "deploy" / "kubernetes"
MANIFESTS = sorted(K8S.glob("*.yaml"))
#: The oldest Kubernetes the manifests claim (daemonset.yaml) and the newest schemas shipped.
VERSIONS = ["1.25.0", kubernetes_validate.latest_version()]
#: What the agent reads from the host (docs/capabilities.md, "Kernel filesystems").
HOST_PATHS = {
    "/sys/kernel/tracing",
    "/sys/kernel/debug",
    "/sys/fs/bpf",
    "/sys/kernel/btf",
    "/lib/modules",
    "/usr/src",
    "/var/cache/otelbpf",  # the program cache, kept on the node
}
ENV = {
    "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317",
    "PYROSCOPE_SERVER_ADDRESS": "http://pyroscope:4040",
    "K8S_NODE_NAME": "node-1",
    "K8S_POD_NAME": "pod",
    "K8S_NAMESPACE": "ns",
}


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def kind(name: str) -> list[dict]:
    return [d for p in MANIFESTS for d in documents(p) if d["kind"] == name]


def agent_containers() -> list[tuple[dict, dict]]:
    """(pod spec, container) of every otelbpf container: the DaemonSet's and the sidecar's."""
    found = []
    for workload in kind("DaemonSet") + kind("Deployment"):
        spec = workload["spec"]["template"]["spec"]
        found += [(spec, c) for c in spec["containers"] if c["name"] == "otelbpf"]
    return found


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_is_valid_kubernetes(path, version):
    docs = documents(path)
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_validation_catches_a_misspelt_field():
    ds = kind("DaemonSet")[0]
    ds["spec"]["template"]["spec"]["hostPid"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, VERSIONS[-1], strict=True)


def test_there_is_a_daemonset_a_sidecar_and_a_collector():
    assert [d["metadata"]["name"] for d in kind("DaemonSet")] == ["otelbpf"]
    assert len(agent_containers()) == 2
    assert {d["metadata"]["name"] for d in kind("Deployment")} == {"otel-collector", "inference"}


@pytest.mark.parametrize("spec, container", agent_containers(), ids=["daemonset", "sidecar"])
def test_agent_gets_exactly_the_documented_privileges(spec, container):
    assert spec["hostPID"] is True
    sc = container["securityContext"]
    assert sc["privileged"] is False and sc["runAsUser"] == 0
    assert "allowPrivilegeEscalation" not in sc, "Kubernetes refuses allowPrivilegeEscalation: false with SYS_ADMIN"
    assert sc["capabilities"]["drop"] == ["ALL"]
    required = {name.removeprefix("CAP_") for name in REQUIRED_NAMES.replace(" and ", ", ").split(", ")}
    assert required == {"BPF", "PERFMON", "SYS_ADMIN", "SYS_PTRACE", "DAC_READ_SEARCH"}
    added = set(sc["capabilities"]["add"])
    # CHECKPOINT_RESTORE: what lets the agent drop SYS_ADMIN on 6.6+ nodes (docs/capabilities.md)
    assert required <= added and added - required <= {"SYSLOG", "CHECKPOINT_RESTORE"}
    assert "CHECKPOINT_RESTORE" in added
    limits, requests = container["resources"]["limits"], container["resources"]["requests"]
    assert set(limits) >= {"cpu", "memory"} and set(requests) >= {"cpu", "memory"}


def _host_mounts(spec: dict, container: dict) -> dict[str, tuple[str, bool]]:
    paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    return {
        paths[m["name"]]: (m["mountPath"], m.get("readOnly", False))
        for m in container["volumeMounts"]
        if m["name"] in paths
    }


def test_daemonset_mounts_the_host_filesystems_at_their_own_paths():
    spec, container = agent_containers()[0]
    mounts = _host_mounts(spec, container)
    assert set(mounts) == HOST_PATHS
    assert all(path == mounted for path, (mounted, _) in mounts.items())
    writable = sorted(p for p, (_, ro) in mounts.items() if not ro)
    assert writable == ["/sys/kernel/tracing", "/var/cache/otelbpf"], "read-only but tracefs and the program cache"
    cache = next(v for v in spec["volumes"] if v["name"] == "program-cache")
    assert cache["hostPath"] == {"path": "/var/cache/otelbpf", "type": "DirectoryOrCreate"}
    assert container["args"] == ["run", "-c", "/etc/otelbpf/otelbpf.yaml"]
    env = {e["name"]: e for e in container["env"]}
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"] == "http://otel-collector.otelbpf.svc:4317"
    assert env["K8S_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_sidecar_mounts_what_compiling_and_attaching_need():
    spec, container = agent_containers()[1]
    assert set(_host_mounts(spec, container)) == {"/sys/kernel/tracing", "/lib/modules", "/usr/src"}
    assert "shareProcessNamespace" not in spec, "cannot be combined with hostPID"


@pytest.mark.parametrize("name", ["otelbpf-config", "otelbpf-sidecar-config"])
def test_agent_configmaps_load_with_the_agents_own_loader(name):
    (cm,) = [d for d in kind("ConfigMap") if d["metadata"]["name"] == name]
    config = load_config_text(cm["data"]["otelbpf.yaml"], source=name, env=ENV)
    assert set(config.pipeline("traces").receivers) == {"cuda", "http", "nccl"}
    assert config.pipeline("traces").exporters == ["otlp"]
    assert config.resource_attributes("traces")["k8s.node.name"] == "node-1"


def test_collector_configmap_is_the_example_config():
    (cm,) = [d for d in kind("ConfigMap") if d["metadata"]["name"] == "otel-collector-config"]
    example = REPO / "examples" / "collector" / "otelbpf-k8s.yaml"
    assert yaml.safe_load(cm["data"]["config.yaml"]) == yaml.safe_load(example.read_text())


def test_collector_service_serves_the_port_the_agents_send_to():
    (svc,) = [d for d in kind("Service") if d["metadata"]["name"] == "otel-collector"]
    assert {p["port"] for p in svc["spec"]["ports"]} >= {4317, 4318}
    assert svc["metadata"]["namespace"] == "otelbpf"
    (role,) = kind("ClusterRole")
    pods = next(r for r in role["rules"] if "pods" in r["resources"])
    assert set(pods["verbs"]) == {"get", "watch", "list"}
