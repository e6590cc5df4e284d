"""otelbpf.config.exporters: gRPC endpoint forms, TLS settings that contradict the scheme."""

from __future__ import annotations

import pytest

from harness.config_text import one_error, with_exporter
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


def test_client_certificate_needs_its_key():
    error = one_error(with_exporter("otlp: {endpoint: 'c:1', tls: {cert_file: /c.pem}}"))

    assert "exporters.otlp.tls: cert_file and key_file go together" in error
