"""The configs users copy, in the repository's top-level ``config/``: each passes ``otelbpf
validate`` as it is; the documented default is the very file the package ships (and runs with no
``-c``: ``config/otelbpf.yaml`` is a link to it, so a new option is documented once); the
Kubernetes manifests carry the DaemonSet's and the sidecar's word for word."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.agent import REPO
from otelbpf.config import DEFAULT_CONFIG_PATH

CONFIG = REPO / "config"
FILES = sorted(CONFIG.glob("*.yaml"))
#: What the configs read from their environment (${env:...}), as a DaemonSet or a host sets it.
ENV = {
    "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317",
    "PYROSCOPE_SERVER_ADDRESS": "http://pyroscope:4040",
    "K8S_NODE_NAME": "node-1",
    "K8S_POD_NAME": "pod",
    "K8S_NAMESPACE": "ns",
}
#: config/<name>.yaml -> the manifest whose ConfigMap carries it.
EMBEDDED = {
    "daemonset.yaml": REPO / "deploy" / "kubernetes" / "configmap.yaml",
    "sidecar.yaml": REPO / "deploy" / "kubernetes" / "sidecar-example.yaml",
}


def test_the_folder_holds_the_default_a_daemonset_a_sidecar_and_a_fleet_config() -> None:
    assert [p.name for p in FILES] == ["daemonset.yaml", "fleet.yaml", "otelbpf.yaml", "sidecar.yaml"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_otelbpf_validate_accepts_it(path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OTELBPF_", "PYROSCOPE_"))}
    done = subprocess.run(
        [sys.executable, "-m", "otelbpf.cli", "validate", "-c", str(path)],
        env={**env, **ENV},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "receivers=" in done.stdout


def test_the_documented_default_is_the_packaged_one() -> None:
    assert (CONFIG / "otelbpf.yaml").resolve() == (REPO / "otelbpf" / "config" / "otelbpf.yaml").resolve()
    assert (CONFIG / "otelbpf.yaml").read_text() == Path(DEFAULT_CONFIG_PATH).read_text()


@pytest.mark.parametrize("name", sorted(EMBEDDED))
def test_the_manifest_carries_the_config_word_for_word(name: str) -> None:
    (config_map,) = [d for d in yaml.safe_load_all(EMBEDDED[name].read_text()) if d and d["kind"] == "ConfigMap"]
    assert config_map["data"]["otelbpf.yaml"] == (CONFIG / name).read_text()
