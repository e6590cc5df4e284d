"""otelbpf.config.env: the standard OTEL_* variables, without a config file (they choose the
exporters) and with one (what the file says wins)."""

from __future__ import annotations

import pytest

from harness.config_text import MINIMAL, load, one_error
from otelbpf.config import ConfigError, OtlpExporterConfig, OtlpHttpExporterConfig
from otelbpf.families.registry import load_config

# --- standard OTEL_* variables without a config file -------------------------------------------------


def test_endpoint_variable_without_file_exports_over_grpc():
    config = load_config(None, env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"})

    assert set(config.exporters) == {"otlp", "file"}  # profiles still go to files: OTLP carries none
    for signal in ("traces", "metrics"):
        [(name, otlp)] = config.pipeline_exporters(signal)
        assert name == "otlp" and isinstance(otlp, OtlpExporterConfig)
    assert [name for name, _ in config.pipeline_exporters("profiles")] == ["file"]
    assert otlp.target == "collector:4317"
    assert otlp.insecure is True  # http:// means plaintext, as in the SDKs


def test_http_protobuf_protocol_gives_an_otlphttp_exporter():
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://otlp.example.com", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
    config = load_config(None, env=env)

    [(name, exporter)] = config.pipeline_exporters("traces")
    assert name == "otlphttp" and isinstance(exporter, OtlpHttpExporterConfig)
    assert exporter.url("traces") == "https://otlp.example.com/v1/traces"
    assert exporter.url("metrics") == "https://otlp.example.com/v1/metrics"


def test_http_json_protocol_is_refused_clearly():
    with pytest.raises(ConfigError) as caught:
        load_config(None, env={"OTEL_EXPORTER_OTLP_ENDPOINT": "c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})

    assert caught.value.errors == [
        "OTEL_EXPORTER_OTLP_PROTOCOL=http/json: OTLP/JSON over HTTP is not supported; use grpc or http/protobuf"
    ]


def test_signal_specific_variables_split_the_exporters():
    config = load_config(
        None,
        env={
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://tempo:4317",
            "OTEL_EXPORTER_OTLP_METRICS_HEADERS": "x-scope-orgid=team-a",
        },
    )

    [(traces_name, traces)] = config.pipeline_exporters("traces")
    [(metrics_name, metrics)] = config.pipeline_exporters("metrics")
    assert (traces_name, traces.endpoint, traces.headers) == ("otlp/traces", "http://tempo:4317", {})
    assert (metrics_name, metrics.endpoint) == ("otlp/metrics", "http://collector:4317")
    assert metrics.headers == {"x-scope-orgid": "team-a"}


def test_http_signal_endpoints_share_one_exporter():
    config = load_config(
        None,
        env={
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://mimir:9009/otlp/v1/metrics",
        },
    )

    [(name, exporter)] = config.pipeline_exporters("metrics")
    assert name == "otlphttp" and config.pipeline_exporters("traces") == [(name, exporter)]
    assert exporter.url("metrics") == "http://mimir:9009/otlp/v1/metrics"  # signal URLs are used as given
    assert exporter.url("traces") == "http://collector:4318/v1/traces"


def test_a_signal_without_an_endpoint_keeps_the_file_exporter():
    config = load_config(None, env={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "tempo:4317"})

    assert [n for n, _ in config.pipeline_exporters("traces")] == ["otlp"]
    assert [n for n, _ in config.pipeline_exporters("metrics")] == ["file"]


def test_exporter_variables_are_parsed(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("PEM\n")
    config = load_config(
        None,
        env={
            "OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317",
            "OTEL_EXPORTER_OTLP_HEADERS": "api-key=a%2Cb%3Dc, x-team = ml ops",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_EXPORTER_OTLP_COMPRESSION": "none",
            "OTEL_EXPORTER_OTLP_CERTIFICATE": str(ca),
        },
    )

    otlp = config.exporters["otlp"]
    assert otlp.headers == {"api-key": "a,b=c", "x-team": "ml ops"}
    assert otlp.timeout == 2_500_000_000  # OTEL_EXPORTER_OTLP_TIMEOUT is in milliseconds
    assert otlp.insecure is True and otlp.tls.ca_file == str(ca)
    assert otlp.compression == "none"


def test_bad_variables_are_named_in_the_error():
    with pytest.raises(ConfigError) as caught:
        load_config(
            None,
            env={
                "OTEL_EXPORTER_OTLP_ENDPOINT": "collector",
                "OTEL_EXPORTER_OTLP_TIMEOUT": "10s",
                "OTEL_EXPORTER_OTLP_COMPRESSION": "zstd",
            },
        )

    assert caught.value.errors == [
        "OTEL_EXPORTER_OTLP_TIMEOUT: '10s' is not a whole number of milliseconds "
        "(e.g. OTEL_EXPORTER_OTLP_TIMEOUT=10000)",
        "exporters.otlp.endpoint: gRPC endpoint 'collector' has no port: write host:port or http(s)://host[:port] "
        "(e.g. localhost:4317) (value from OTEL_EXPORTER_OTLP_ENDPOINT)",
        "exporters.otlp.compression: Input should be 'gzip' or 'none', got 'zstd' "
        "(value from OTEL_EXPORTER_OTLP_COMPRESSION)",
    ]


def test_empty_variables_count_as_unset():
    assert load_config(None, env={"OTEL_EXPORTER_OTLP_ENDPOINT": ""}) == load_config(None, env={})


def test_service_name_and_resource_attributes():
    config = load_config(
        None,
        env={
            "OTEL_RESOURCE_ATTRIBUTES": "service.name=from-attrs,deployment.environment=prod%20eu",
            "OTEL_SERVICE_NAME": "trainer",
        },
    )

    assert config.resource_attributes("traces") == {"service.name": "trainer", "deployment.environment": "prod eu"}
    assert config.resource_attributes("metrics") == config.resource_attributes("traces")


def test_metric_export_interval_variable():
    config = load_config(None, env={"OTEL_METRIC_EXPORT_INTERVAL": "30000"})

    assert config.service.telemetry.metrics_interval == 30 * 10**9  # the variable beats the built-in default
    assert load(MINIMAL, OTEL_METRIC_EXPORT_INTERVAL="30000").service.telemetry.metrics_interval == 30 * 10**9
    written = MINIMAL + "  telemetry: {metrics_interval: 5s}\n"
    assert load(written, OTEL_METRIC_EXPORT_INTERVAL="30000").service.telemetry.metrics_interval == 5 * 10**9


# --- precedence with a config file: what the file says wins ---------------------------------------------

WITH_OTLP = """\
receivers: {cuda: }
exporters:
  otlp:
    endpoint: file-collector:4317
    headers: {x-team: from-file}
  otlp/metrics-only: {}
service:
  pipelines:
    traces: {receivers: [cuda], exporters: [otlp]}
    metrics: {receivers: [cuda], exporters: [otlp, otlp/metrics-only]}
"""


def test_file_values_win_over_variables_and_variables_fill_the_rest():
    config = load(
        WITH_OTLP,
        OTEL_EXPORTER_OTLP_ENDPOINT="env-collector:4317",
        OTEL_EXPORTER_OTLP_HEADERS="x-team=from-env,x-extra=1",
        OTEL_EXPORTER_OTLP_TIMEOUT="500",
    )

    otlp = config.exporters["otlp"]
    assert otlp.endpoint == "file-collector:4317"
    assert otlp.headers == {"x-team": "from-file", "x-extra": "1"}  # a written mapping gains only missing keys
    assert otlp.timeout == 500_000_000
    assert config.exporters["otlp/metrics-only"].endpoint == "env-collector:4317"


def test_signal_specific_variables_apply_to_single_signal_exporters_only():
    config = load(
        WITH_OTLP.replace("endpoint: file-collector:4317\n", ""),
        OTEL_EXPORTER_OTLP_ENDPOINT="generic:4317",
        OTEL_EXPORTER_OTLP_METRICS_ENDPOINT="metrics:4317",
    )

    assert config.exporters["otlp"].endpoint == "generic:4317"  # serves traces and metrics
    assert config.exporters["otlp/metrics-only"].endpoint == "metrics:4317"


def test_insecure_variable_applies_only_without_a_scheme():
    text = WITH_OTLP.replace("file-collector:4317", "https://secure:4317")
    config = load(text, OTEL_EXPORTER_OTLP_ENDPOINT="plain:4317", OTEL_EXPORTER_OTLP_INSECURE="true")

    assert config.exporters["otlp"].insecure is False  # https:// decides
    assert config.exporters["otlp/metrics-only"].insecure is True


def test_with_a_file_the_protocol_variable_is_ignored():
    config = load(WITH_OTLP, OTEL_EXPORTER_OTLP_ENDPOINT="c:4317", OTEL_EXPORTER_OTLP_PROTOCOL="http/json")

    assert isinstance(config.exporters["otlp"], OtlpExporterConfig)


def test_with_a_file_the_endpoint_variable_adds_no_exporter():
    config = load(MINIMAL, OTEL_EXPORTER_OTLP_ENDPOINT="c:4317")

    assert set(config.exporters) == {"file"}


def test_resource_attributes_written_in_the_file_win():
    text = MINIMAL + "processors:\n  resource: {attributes: {service.name: pinned}}\n"
    config = load(
        text.replace("exporters: [file]", "processors: [resource], exporters: [file]"),
        OTEL_SERVICE_NAME="from-env",
        OTEL_RESOURCE_ATTRIBUTES="team=ml",
    )

    assert config.resource_attributes("traces") == {"service.name": "pinned", "team": "ml"}


def test_resource_variables_take_effect_without_a_resource_processor():
    config = load(MINIMAL, OTEL_SERVICE_NAME="trainer")

    assert [name for name, _ in config.pipeline_processors("traces")] == ["resource"]
    assert config.resource_attributes("traces") == {"service.name": "trainer"}


def test_malformed_resource_attributes_variable():
    error = one_error(MINIMAL, OTEL_RESOURCE_ATTRIBUTES="team")

    assert error == (
        "OTEL_RESOURCE_ATTRIBUTES: item 1 (of the comma-separated list) is not key=value; "
        "write OTEL_RESOURCE_ATTRIBUTES=key1=value1,key2=value2"
    )
