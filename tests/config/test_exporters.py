"""otelbpf.config.exporters: gRPC endpoint forms, TLS settings that contradict the scheme."""

from __future__ import annotations

from pathlib import Path

import pytest

from config.test_limits import validate_and_run
from harness.config_text import load, one_error, with_exporter
from otelbpf.config import (
    OtlpExporterConfig,
)


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


def test_client_certificate_needs_its_key(tmp_path: Path):
    (tmp_path / "c.pem").write_text("PEM\n")
    error = one_error(with_exporter(f"otlp: {{endpoint: 'c:1', tls: {{cert_file: {tmp_path}/c.pem}}}}"))

    assert "exporters.otlp.tls: cert_file and key_file go together" in error


@pytest.mark.parametrize("kind", ["otlp", "otlphttp"])
@pytest.mark.parametrize("key", ["ca_file", "cert_file", "key_file"])
def test_a_missing_tls_file_names_the_option(tmp_path: Path, kind: str, key: str):
    """validate passed a CA file that did not exist; run then failed opening it."""
    for name in ("ca_file", "cert_file", "key_file"):
        (tmp_path / name).write_text("PEM\n")
    files = {name: str(tmp_path / name) for name in ("ca_file", "cert_file", "key_file")}
    files[key] = str(tmp_path / "missing.pem")
    endpoint = "c:1" if kind == "otlp" else "https://c"
    tls = ", ".join(f"{k}: {v}" for k, v in files.items())

    error = one_error(with_exporter(f"{kind}: {{endpoint: '{endpoint}', tls: {{{tls}}}}}"))

    assert f"exporters.{kind}.tls.{key}: cannot read '{tmp_path}/missing.pem': No such file or directory" in error


def test_a_tls_file_that_is_a_directory_is_refused(tmp_path: Path):
    error = one_error(with_exporter(f"otlp: {{endpoint: 'c:1', tls: {{ca_file: {tmp_path}}}}}"))

    assert f"exporters.otlp.tls.ca_file: '{tmp_path}' is not a regular file" in error


def test_a_missing_ca_file_from_the_environment_names_the_variable():
    text = with_exporter("otlp: {endpoint: 'c:1'}").replace("exporters: [file]", "exporters: [otlp]")

    error = one_error(text, OTEL_EXPORTER_OTLP_CERTIFICATE="/nonexistent/ca.pem")

    assert error.startswith("exporters.otlp.tls.ca_file: cannot read '/nonexistent/ca.pem'")
    assert error.endswith("(value from OTEL_EXPORTER_OTLP_CERTIFICATE)")


def test_validate_and_run_refuse_a_missing_ca_file_alike(tmp_path: Path):
    path = tmp_path / "c.yaml"
    path.write_text(with_exporter(f"otlp: {{endpoint: 'c:1', tls: {{ca_file: {tmp_path}/ca.pem}}}}"))

    stderr = validate_and_run(path)

    assert f"{path}:5:" in stderr and f"exporters.otlp.tls.ca_file: cannot read '{tmp_path}/ca.pem'" in stderr


@pytest.mark.parametrize(
    "endpoint, why",
    [
        ("a b:4317", "' ' is not allowed"),
        (" c:4317", "' ' is not allowed"),
        ("c\\x01:4317", "'\\x01' is not allowed"),
        ("c:0", "port '0' is not a number from 1 to 65535"),
        ("c:65536", "port '65536' is not a number from 1 to 65535"),
        ("c:abc", "port 'abc' is not a number from 1 to 65535"),
        ("c:+1", "port '+1' is not a number from 1 to 65535"),
        ("c:", "port '' is not a number from 1 to 65535"),
        ("c:" + "9" * 5000, "is not a number from 1 to 65535"),
        ("http://c:0", "port '0' is not a number from 1 to 65535"),
        ("https://[::1]:99999", "port '99999' is not a number from 1 to 65535"),
    ],
)
@pytest.mark.parametrize("kind", ["otlp", "otlphttp", "pyroscope"])
def test_endpoints_with_spaces_controls_or_bad_ports_are_refused(kind: str, endpoint: str, why: str):
    """urllib took them as they are; every export then failed, or never left."""
    if kind != "otlp" and "://" not in endpoint:
        endpoint = f"http://{endpoint}"

    error = one_error(with_exporter(f'{kind}: {{endpoint: "{endpoint}"}}'))

    assert f"exporters.{kind}.endpoint:" in error and why in error


@pytest.mark.parametrize("endpoint", ["c:1", "c:65535", "[::1]:4317", "http://c", "https://c:443/"])
def test_endpoints_in_range_are_kept(endpoint: str):
    assert OtlpExporterConfig(endpoint=endpoint).endpoint == endpoint


@pytest.mark.parametrize("name", ["x-token-bin", "X-Trace-Bin"])
def test_grpc_binary_metadata_names_are_refused(name: str):
    """grpc raises TypeError at every export for a -bin key with a str value."""
    error = one_error(with_exporter(f"otlp: {{endpoint: 'c:1', headers: {{{name}: abc}}}}"))

    assert f"exporters.otlp.headers: '{name}': gRPC metadata names ending in -bin carry binary values" in error


def test_http_headers_may_end_in_bin():
    text = with_exporter("otlphttp: {endpoint: 'http://c', headers: {x-bin: abc}}")
    assert load(text).exporters["otlphttp"].headers == {"x-bin": "abc"}


SECRET = "s3cr3tVALUE"


@pytest.mark.parametrize(
    "exporter",
    [
        f"otlphttp/tempo: {{endpoint: 'https://u:{SECRET}@c:4318', headers: {{Authorization: 'Bearer {SECRET}'}}}}",
        f"otlphttp/tempo: {{traces_endpoint: 'https://{SECRET}@c/v1/traces', headers: {{authorization: x}}}}",
        f"pyroscope/tempo: {{endpoint: 'https://u:{SECRET}@p:4040', bearer_token: '{SECRET}'}}",
        f"pyroscope/tempo: {{endpoint: 'https://u:{SECRET}@p:4040', basic_auth: {{username: u, password: p}}}}",
    ],
)
def test_userinfo_never_silently_replaces_a_configured_authorization(exporter: str):
    error = one_error(with_exporter(exporter))

    assert "exporters." in error and "/tempo: " in error  # names the exporter
    assert "carries userinfo (user:password@)" in error and "keep one of them" in error
    assert SECRET not in error


@pytest.mark.parametrize("endpoint", [f"https://u:{SECRET}@c:4317", f"u:{SECRET}@c:4317"])
def test_userinfo_in_a_grpc_endpoint_is_refused_not_dropped(endpoint: str):
    error = one_error(with_exporter(f"otlp: {{endpoint: '{endpoint}'}}"))

    assert error.startswith("test.yaml:") and "exporters.otlp.endpoint: the endpoint carries userinfo" in error
    assert "gRPC never sends" in error and SECRET not in error


@pytest.mark.parametrize(
    "exporter",
    [
        "otlphttp: {endpoint: 'https://u:p@c:4318'}",
        "otlphttp: {endpoint: 'https://c:4318', headers: {authorization: x}}",
        "pyroscope: {endpoint: 'https://u:p@p:4040', tenant_id: t}",
    ],
)
def test_userinfo_or_an_authorization_alone_is_fine(exporter: str):
    assert load(with_exporter(exporter))
