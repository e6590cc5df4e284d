"""otelbpf.config.messages: every problem at once, each at its option path and file position,
with the value, the allowed values or keys, and a "did you mean"."""

from __future__ import annotations

import pytest

from harness.config_text import MINIMAL, errors_of, load, one_error, with_cuda, with_exporter
from otelbpf.config import (
    ConfigError,
)


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


SECRET = "s3cr3tVALUE"


@pytest.mark.parametrize(
    ("text", "env", "where"),
    [
        # a value substituted from ${env:...} is never shown, whatever the error
        (
            with_exporter("otlp: {endpoint: 'c:4317', headers: ['${env:TOKEN}']}"),
            {"TOKEN": f"Bearer {SECRET}"},
            "headers",
        ),
        (with_exporter("otlp: {endpoint: 'c:4317', timeout: '${env:T}'}"), {"T": SECRET}, "exporters.otlp.timeout"),
        (with_exporter("otlphttp: {endpoint: '${env:E}'}"), {"E": f"ftp://collector/?k={SECRET}"}, "endpoint"),
        (  # a model's error quotes its fields
            with_exporter("otlp: {endpoint: '${env:E}', tls: {insecure: true}}"),
            {"E": f"https://{SECRET}.example.com:4317"},
            "exporters.otlp:",
        ),
        # userinfo and query values, written in the file or taken from a variable
        (with_exporter(f"otlphttp: {{endpoint: 'https://u:{SECRET}@c:99999'}}"), {}, "u:REDACTED@c"),
        (with_exporter(f"otlphttp: {{traces_endpoint: 'ftp://c/v1/traces?api_key={SECRET}'}}"), {}, "traces_endpoint"),
        (
            MINIMAL.replace("[file]", "[otlp]").replace("  file:\n", "  otlp:\n"),
            {"OTEL_EXPORTER_OTLP_ENDPOINT": f"https://u:{SECRET}@collector:99999"},
            "(value from OTEL_EXPORTER_OTLP_ENDPOINT)",
        ),
        # an option with a secret's name, whatever type was written
        (with_exporter(f"pyroscope: {{endpoint: 'http://p:4040', bearer_token: {{t: {SECRET}}}}}"), {}, "bearer_token"),
    ],
)
def test_errors_show_no_secret(text, env, where):
    errors = "\n".join(errors_of(text, **env))

    assert where in errors
    assert SECRET not in errors


def test_a_malformed_headers_variable_names_the_item_not_its_value():
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_HEADERS": f"x-tenant=a,Bearer {SECRET}"}
    error = one_error(MINIMAL.replace("[file]", "[otlp]").replace("  file:\n", "  otlp:\n"), **env)

    assert error.startswith("OTEL_EXPORTER_OTLP_HEADERS: item 2 (of the comma-separated list) is not key=value")
    assert SECRET not in error
