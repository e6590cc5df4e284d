"""The profiles pipeline, the profiling receiver, the pyroscope exporter and PYROSCOPE_*."""

from __future__ import annotations

import pytest

from otelbpf.config import ConfigError, FileExporterConfig, PyroscopeExporterConfig
from otelbpf.families.registry import load_config, load_config_text

PROFILES = """\
receivers:
  profiling: {cuda_memory: false}
exporters:
  pyroscope: {}
service:
  pipelines:
    profiles: {receivers: [profiling], exporters: [pyroscope]}
"""


def errors(text: str, **env: str) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        load_config_text(text, source="t.yaml", env=env)
    return exc.value.errors


def test_pyroscope_server_address_without_a_file_replaces_the_file_exporter():
    env = {
        "PYROSCOPE_SERVER_ADDRESS": "http://pyro:4040",
        "PYROSCOPE_BASIC_AUTH_USER": "u",
        "PYROSCOPE_BASIC_AUTH_PASSWORD": "p",
        "PYROSCOPE_TENANT_ID": "t",
    }
    config = load_config(None, env=env)
    [(name, exporter)] = config.pipeline_exporters("profiles")
    assert name == "pyroscope" and isinstance(exporter, PyroscopeExporterConfig)
    assert exporter.endpoint == "http://pyro:4040" and exporter.tenant_id == "t"
    assert (exporter.basic_auth.username, exporter.basic_auth.password) == ("u", "p")
    assert config.pipeline_exporters("traces") == [("file", FileExporterConfig())]


def test_with_a_file_the_variables_fill_only_what_it_leaves_unset():
    text = PROFILES.replace("pyroscope: {}", "pyroscope: {endpoint: 'http://mine:4040', bearer_token: tok}")
    config = load_config_text(
        text,
        env={
            "PYROSCOPE_SERVER_ADDRESS": "http://env:4040",
            "PYROSCOPE_BASIC_AUTH_USER": "u",
            "PYROSCOPE_TENANT_ID": "t",
        },
    )
    exporter = config.exporters["pyroscope"]
    assert exporter.endpoint == "http://mine:4040" and exporter.bearer_token == "tok"
    assert exporter.basic_auth is None and exporter.tenant_id == "t"


def test_a_pyroscope_exporter_needs_an_endpoint():
    assert any("no endpoint: set endpoint here or PYROSCOPE_SERVER_ADDRESS" in e for e in errors(PROFILES))


def test_profiles_and_other_signals_do_not_mix():
    text = """\
receivers:
  profiling: {cuda_memory: false}
  cuda: {}
exporters:
  pyroscope: {endpoint: "http://p:4040"}
  otlp: {endpoint: "c:4317"}
service:
  pipelines:
    profiles: {receivers: [cuda], exporters: [otlp]}
    traces: {receivers: [profiling], exporters: [pyroscope]}
"""
    found = errors(text)
    assert any("receiver 'cuda' produces no profiles" in e for e in found)
    assert not any("exporter 'otlp'" in e for e in found)  # OTLP carries profiles too (otlp_profiles)
    assert any("receiver 'profiling' produces profiles only" in e for e in found)
    assert any("exporter 'pyroscope' (pyroscope) exports profiles only" in e for e in found)


def test_cuda_memory_needs_the_cuda_receiver():
    found = errors(
        PROFILES.replace("{cuda_memory: false}", "{}").replace("pyroscope: {}", "pyroscope: {endpoint: 'http://p:1'}")
    )
    assert any("receivers.profiling.cuda_memory: CUDA memory profiles need the cuda receiver" in e for e in found)


def test_receiver_and_exporter_options_are_checked():
    text = PROFILES.replace("{cuda_memory: false}", "{cuda_memory: false, max_python_frames: 50, sample_rate: 0}")
    text = text.replace("pyroscope: {}", "pyroscope: {endpoint: 'ftp://x'}")
    found = "\n".join(errors(text))
    assert "max_python_frames must be 16, 32, 64 or 128, got 50" in found
    assert "sample_rate" in found
    assert "is not an http(s):// URL" in found
    both = PROFILES.replace(
        "pyroscope: {}", "pyroscope: {endpoint: 'http://p:1', basic_auth: {username: a, password: b}, bearer_token: c}"
    )
    assert any("basic_auth and bearer_token both set" in e for e in errors(both))
