"""otelbpf.config: the YAML config, its errors, ${env:...} substitution and the OTEL_* variables."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from otelbpf.config import (
    DEFAULT_CONFIG_PATH,
    Config,
    ConfigError,
    FileExporterConfig,
    OtlpExporterConfig,
    OtlpHttpExporterConfig,
    format_duration,
    format_size,
    load_config,
    load_config_text,
    parse_duration,
    parse_size,
    to_seconds,
)

DOCUMENTED_DEFAULT = Path(DEFAULT_CONFIG_PATH)

# A small valid file the error tests start from; each test breaks one thing.
MINIMAL = """\
receivers:
  cuda:
exporters:
  file:
service:
  pipelines:
    traces: {receivers: [cuda], exporters: [file]}
"""


def load(text: str, **env: str) -> Config:
    return load_config_text(textwrap.dedent(text), source="test.yaml", env=env)


def errors_of(text: str, **env: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load(text, **env)
    return caught.value.errors


def with_cuda(options: str) -> str:
    """MINIMAL with the cuda receiver's options given as a flow mapping body."""
    return MINIMAL.replace("  cuda:\n", f"  cuda: {{{options}}}\n")


def with_exporter(line: str) -> str:
    """MINIMAL with one more exporter entry (``name: {...}``) after the file exporter."""
    return MINIMAL.replace("  file:\n", f"  file:\n  {line}\n")


def one_error(text: str, **env: str) -> str:
    errors = errors_of(text, **env)
    assert len(errors) == 1, errors
    return errors[0]


# --- the default ---------------------------------------------------------------------------


def test_default_config_is_valid_and_writes_files():
    config = load_config(None, env={})

    # every receiver that costs nothing while unused; requests of the processes that use a GPU
    assert config.enabled_receivers() == {"cuda", "profiling", "http", "nccl", "ibverbs"}
    assert config.receivers["http"].processes == "gpu"
    assert config.pipeline_signals() == ["traces", "metrics", "profiles"]
    assert config.pipeline_exporters("profiles") == [("file", FileExporterConfig())]
    for signal in ("traces", "metrics"):
        assert config.pipeline_exporters(signal) == [("file", FileExporterConfig())]
        assert [name for name, _ in config.pipeline_processors(signal)] == ["batch", "resource"]
        assert config.resource_attributes(signal) == {}
    assert config.targets.pids == []


def test_documented_exporter_examples_are_valid():
    """The commented-out otlp/otlphttp examples in the documented file, uncommented, load."""
    text = DOCUMENTED_DEFAULT.read_text()
    section = text[text.index("\nexporters:") : text.index("\ntargets:")]
    examples = [line[4:] for line in section.splitlines() if re.match(r"  # (\S+:|  )", line)]
    config = load(
        "exporters:\n  " + "\n  ".join(examples) + "\n"
        "receivers: {cuda: }\n"
        "service: {pipelines: {traces: {receivers: [cuda], exporters: [otlp, otlphttp, otlp/tempo]}}}\n"
    )

    assert [name for name, _ in config.pipeline_exporters("traces")] == ["otlp", "otlphttp", "otlp/tempo"]


def test_default_values_read_as_documented():
    cuda = load_config(None, env={}).receivers["cuda"]

    assert cuda.libraries == ["cudart", "cuda"]
    assert cuda.ring_buffer_size == 16 * 1024 * 1024
    assert cuda.min_span_duration == 0
    assert "/usr/local/cuda*/lib64/libcudart.so*" in cuda.search_paths


# --- error messages ------------------------------------------------------------------------


def test_wrong_type_names_the_dotted_path_and_the_value():
    error = one_error(MINIMAL.replace("  cuda:\n", "  cuda:\n    launch_sample_every: ten\n"))

    assert error == "test.yaml:3:5: receivers.cuda.launch_sample_every: Input should be a valid integer, got 'ten'"


def test_typo_in_a_key_names_its_path_and_suggests_the_option():
    error = one_error(MINIMAL.replace("  cuda:\n", "  cuda:\n    lanuch_errors: true\n"))

    assert error.startswith(
        "test.yaml:3:5: receivers.cuda.lanuch_errors: unknown option (did you mean 'launch_errors'?)"
    )
    assert "allowed: libraries, search_paths, launch_sample_every, launch_errors," in error


def test_typo_in_a_top_level_section():
    errors = errors_of(MINIMAL.replace("\nexporters:", "\nexporter:"))

    assert errors[0] == (
        "test.yaml:3:1: exporter: unknown option (did you mean 'exporters'?); "
        "allowed: receivers, processors, exporters, targets, service"
    )
    assert "exporter 'file' is not defined under exporters; defined exporters: none" in errors[1]


def test_bad_enum_value_lists_the_allowed_values():
    text = MINIMAL + "  telemetry: {log_level: verbose}\n"

    assert one_error(text).endswith(
        "service.telemetry.log_level: Input should be 'debug', 'info', 'warning' or 'error', got 'verbose'"
    )


def test_bad_library_name_lists_the_allowed_libraries():
    error = one_error(with_cuda("libraries: [cudart, nvml]"))

    assert "receivers.cuda.libraries[1]: Input should be 'cudart' or 'cuda', got 'nvml'" in error


def test_every_error_is_listed_at_once():
    text = """\
        receivers:
          cuda: {launch_sample_every: -1, top_kernels: many}
        exporters:
          file: {rotate_size: huge}
        service:
          pipelines:
            traces: {receivers: [cuda], exporters: [file, otlp]}
          telemetry: {drain_interval: 0}
        """
    with pytest.raises(ConfigError) as caught:
        load(text)

    paths = [e.split(": ")[1] for e in caught.value.errors]
    assert paths == [
        "receivers.cuda.launch_sample_every",
        "receivers.cuda.top_kernels",
        "exporters.file.rotate_size",
        "service.telemetry.drain_interval",
        "service.pipelines.traces.exporters[1]",
    ]
    assert str(caught.value).startswith("invalid otelbpf configuration (test.yaml, 5 errors):\n  test.yaml:2:")


def test_unknown_exporter_type_lists_the_allowed_types():
    error = one_error(with_exporter("zipkin: {endpoint: x}"))

    assert error == (
        "test.yaml:5:3: exporters.zipkin: unknown exporter type 'zipkin'; "
        "allowed types: file, otlp, otlphttp, pyroscope"
    )


def test_named_components_are_validated_by_their_type():
    config = load(
        """\
        receivers: {cuda: }
        exporters:
          file/local: {directory: /var/log/otelbpf}
          otlp/tempo: {endpoint: "tempo:4317"}
        service:
          pipelines:
            traces: {receivers: [cuda], exporters: [file/local, otlp/tempo]}
        """
    )
    assert config.pipeline_exporters("traces") == [
        ("file/local", FileExporterConfig(directory="/var/log/otelbpf")),
        ("otlp/tempo", OtlpExporterConfig(endpoint="tempo:4317")),
    ]

    error = one_error(with_exporter("file/local: {endpoint: x}"))
    assert "exporters.file/local.endpoint: unknown option; allowed: directory, rotate_size" in error


def test_receivers_take_no_instance_name():
    error = one_error(MINIMAL.replace("cuda", "cuda/a"))

    assert "receivers.cuda/a: invalid receiver name 'cuda/a': a probe family is loaded once" in error


def test_pipeline_naming_an_undefined_component():
    text = with_exporter("otlp/tempo: {endpoint: 't:1'}")
    error = one_error(text.replace("exporters: [file]", "exporters: [file, otlp/tmpo]"))

    assert error == (
        "test.yaml:8:51: service.pipelines.traces.exporters[1]: exporter 'otlp/tmpo' is not defined under "
        "exporters (did you mean 'otlp/tempo'?); defined exporters: file, otlp/tempo"
    )


def test_pipelines_must_exist_and_not_be_empty():
    assert one_error(MINIMAL.replace("    traces: {receivers: [cuda], exporters: [file]}\n", "    {}\n")).endswith(
        "service.pipelines: no pipelines: define traces, metrics and/or profiles here"
    )
    assert one_error(MINIMAL.replace("receivers: [cuda]", "receivers: []")).endswith(
        "service.pipelines.traces.receivers: a pipeline needs at least one of its receivers"
    )
    assert errors_of(MINIMAL.replace("traces:", "logs:")) == [
        "test.yaml:7:5: service.pipelines.logs: unknown option; allowed: traces, metrics, profiles",
        "test.yaml:6:3: service.pipelines: no pipelines: define traces, metrics and/or profiles here",
    ]


def test_otlp_exporter_in_use_needs_an_endpoint():
    error = one_error(MINIMAL.replace("  file:\n", "  otlp:\n").replace("[file]", "[otlp]"))

    assert error == (
        "test.yaml:4:3: exporters.otlp.endpoint: no endpoint: set endpoint here or OTEL_EXPORTER_OTLP_ENDPOINT "
        "(the traces pipeline uses this exporter)"
    )


def test_batch_queue_must_hold_a_batch():
    text = MINIMAL + "processors:\n  batch: {send_batch_size: 100, max_queue_size: 10}\n"

    assert "max_queue_size (10) must be at least send_batch_size (100)" in one_error(text)


def test_ring_buffer_size_must_be_a_power_of_two():
    assert load(with_cuda("ring_buffer_size: 64KiB")).receivers["cuda"].ring_buffer_size == 65536
    error = one_error(with_cuda("ring_buffer_size: 3MiB"))
    assert "must be a power of two from the page size (4KiB) to 1GiB" in error and "got 3MiB" in error


def test_search_paths_must_be_absolute():
    error = one_error(with_cuda("search_paths: [/ok/libcudart.so*, lib/libcudart.so]"))

    assert "receivers.cuda.search_paths[1]: 'lib/libcudart.so' is relative" in error


# --- YAML problems ----------------------------------------------------------------------------


def test_yaml_syntax_error_shows_file_line_and_column(tmp_path: Path):
    path = tmp_path / "broken.yaml"
    path.write_text("receivers:\n  cuda: {libraries: [cudart\nservice: {}\n")

    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})

    assert re.fullmatch(rf"{re.escape(str(path))}:3:8: invalid YAML: .+", caught.value.errors[0])


def test_duplicate_keys_are_refused():
    error = one_error(MINIMAL + "receivers: {}\n")

    assert error == "test.yaml:8:1: invalid YAML: duplicate key 'receivers' (first written on line 1)"


def test_empty_missing_and_non_mapping_files(tmp_path: Path):
    assert "the file is empty" in one_error("")
    assert "the top level must be a mapping" in one_error("- cuda\n")
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "absent.yaml", env={})


# --- durations and sizes --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("250ms", 250_000_000),
        ("1s", 1_000_000_000),
        ("10us", 10_000),
        ("10µs", 10_000),
        ("2m", 120_000_000_000),
        ("1m30s", 90_000_000_000),
        ("1.5s", 1_500_000_000),
        ("1h", 3_600_000_000_000),
        ("7ns", 7),
        ("0us", 0),
        (2, 2_000_000_000),
        (0.05, 50_000_000),
        ("3", 3_000_000_000),
    ],
)
def test_durations(text: str | float, ns: int):
    assert parse_duration(text) == ns


@pytest.mark.parametrize("text", ["10 seconds", "1d", "ms", "", "-1s", -1, True, "1s2"])
def test_bad_durations(text: object):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_duration_helpers():
    assert format_duration(50_000_000) == "50ms"
    assert format_duration(90_000_000_000) == "90s"
    assert format_duration(0) == "0ns"
    assert all(parse_duration(format_duration(ns)) == ns for ns in (1, 1_500, 10**9, 3_600 * 10**9))
    assert to_seconds(parse_duration("250ms")) == 0.25


def test_durations_in_the_file_become_nanoseconds():
    config = load(with_cuda("min_span_duration: 10us") + "  telemetry: {drain_interval: 0.1, metrics_interval: 1m}\n")

    assert config.receivers["cuda"].min_span_duration == 10_000
    assert config.service.telemetry.drain_interval == 100_000_000
    assert config.service.telemetry.metrics_interval == 60_000_000_000


def test_sizes():
    assert parse_size("64KiB") == 65536
    assert parse_size("4mib") == 4 << 20
    assert parse_size("1GiB") == 1 << 30
    assert parse_size(4096) == 4096
    assert parse_size("512B") == 512
    assert format_size(4 << 20) == "4MiB"
    for bad in ("4MB", "1.5MiB", "lots", -1):
        with pytest.raises(ValueError, match="size"):
            parse_size(bad)


# --- ${env:VAR} substitution ---------------------------------------------------------------------


def test_env_substitution_forms():
    text = MINIMAL.replace(
        "  file:\n",
        "  file:\n"
        "  otlp:\n"
        "    endpoint: ${env:COLLECTOR}:${PORT}\n"
        "    headers:\n"
        "      authorization: Bearer ${env:TOKEN:-none}\n"
        "      x-empty: ${env:EMPTY:-fallback}\n"
        "      x-price: $$5 ${DOLLARS:-}\n",
    ).replace("[file]", "[otlp]")
    config = load(text, COLLECTOR="collector.svc", PORT="4317", EMPTY="")

    otlp = config.exporters["otlp"]
    assert otlp.endpoint == "collector.svc:4317"
    assert otlp.headers == {"authorization": "Bearer none", "x-empty": "fallback", "x-price": "$5 "}


def test_env_substitution_feeds_typed_options():
    config = load(with_cuda("launch_sample_every: '${env:EVERY}', ring_buffer_size: '${SIZE:-1MiB}'"), EVERY="100")

    assert config.receivers["cuda"].launch_sample_every == 100
    assert config.receivers["cuda"].ring_buffer_size == 1 << 20


def test_unset_variable_without_default_names_it_and_where_it_was_used():
    error = one_error(MINIMAL.replace("  file:\n", "  file: {directory: '${env:OUT_DIR}/spans'}\n"))

    assert error == (
        "test.yaml:4:10: exporters.file.directory: environment variable OUT_DIR is not set (used as ${env:OUT_DIR}); "
        "set it, or give a default: ${env:OUT_DIR:-value}"
    )


def test_invalid_value_from_a_variable_says_so():
    error = one_error(with_cuda("launch_sample_every: '${EVERY}'"), EVERY="often")

    assert error.endswith(
        "receivers.cuda.launch_sample_every: Input should be a valid integer, got 'often' (value from ${EVERY})"
    )


def test_unsupported_provider_and_bad_names():
    assert "unsupported provider 'file'" in one_error(with_exporter("file/b: {directory: '${file:/x}'}"))
    assert "'1X' is not a variable name" in one_error(with_exporter("file/b: {directory: '${1X}'}"))


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


def test_exporter_variables_are_parsed():
    config = load_config(
        None,
        env={
            "OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317",
            "OTEL_EXPORTER_OTLP_HEADERS": "api-key=a%2Cb%3Dc, x-team = ml ops",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_EXPORTER_OTLP_COMPRESSION": "none",
            "OTEL_EXPORTER_OTLP_CERTIFICATE": "/etc/ca.pem",
        },
    )

    otlp = config.exporters["otlp"]
    assert otlp.headers == {"api-key": "a,b=c", "x-team": "ml ops"}
    assert otlp.timeout == 2_500_000_000  # OTEL_EXPORTER_OTLP_TIMEOUT is in milliseconds
    assert otlp.insecure is True and otlp.tls.ca_file == "/etc/ca.pem"
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
        "OTEL_RESOURCE_ATTRIBUTES: 'team' is not key=value; write OTEL_RESOURCE_ATTRIBUTES=key1=value1,key2=value2"
    )


# --- exporters ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "target", "insecure"),
    [
        ("localhost:4317", "localhost:4317", False),  # no scheme: TLS unless tls.insecure says otherwise
        ("http://collector:4317", "collector:4317", True),
        ("https://otlp.example.com", "otlp.example.com:443", False),
        ("[::1]:4317", "[::1]:4317", False),
    ],
)
def test_grpc_endpoint_forms(endpoint: str, target: str, insecure: bool):
    exporter = OtlpExporterConfig(endpoint=endpoint)

    assert (exporter.target, exporter.insecure) == (target, insecure)


def test_tls_settings_that_contradict_the_scheme_are_errors():
    error = one_error(with_exporter("otlp: {endpoint: 'https://c', tls: {insecure: true}}"))

    assert "tls.insecure is true but the endpoint 'https://c' is https" in error


def test_client_certificate_needs_its_key():
    error = one_error(with_exporter("otlp: {endpoint: 'c:1', tls: {cert_file: /c.pem}}"))

    assert "exporters.otlp.tls: cert_file and key_file go together" in error


def test_config_is_immutable():
    config = load_config(None, env={})

    with pytest.raises(ValueError, match="frozen"):
        config.receivers["cuda"].launch_sample_every = 5  # type: ignore[misc]
