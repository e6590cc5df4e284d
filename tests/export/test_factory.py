"""Exporters built from their configs: what the factory says about their credentials."""

from __future__ import annotations

import logging

import pytest

from otelbpf.config.exporters import OtlpExporterConfig
from otelbpf.export.factory import span_exporter, traced_metadata, warn_traced_headers


def test_only_the_tracers_that_print_metadata_count():
    assert traced_metadata(None) == []
    assert traced_metadata("") == []
    assert traced_metadata("api,round_robin") == []
    assert traced_metadata("api, http ,-http2_stream_state") == ["http"]
    assert traced_metadata("channel,call_error,http1") == ["http1"]
    assert traced_metadata("all") == ["all"]


def test_a_traced_exporter_with_headers_is_named_with_its_header_names_not_values(monkeypatch, caplog):
    cfg = OtlpExporterConfig(endpoint="collector:4317", headers={"authorization": "Bearer s3cret"})
    monkeypatch.setenv("GRPC_TRACE", "http,api")
    with caplog.at_level(logging.WARNING, logger="otelbpf.export.factory"):
        span_exporter(cfg).shutdown()
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1, warned
    assert "authorization" in warned[0] and "collector:4317" in warned[0] and "GRPC_TRACE=http,api" in warned[0]
    assert "s3cret" not in warned[0]


@pytest.mark.parametrize(
    ("trace", "headers"),
    [(None, {"authorization": "x"}), ("api", {"authorization": "x"}), ("all", {})],
)
def test_no_warning_without_both_a_metadata_tracer_and_headers(monkeypatch, trace, headers):
    if trace is None:
        monkeypatch.delenv("GRPC_TRACE", raising=False)
    else:
        monkeypatch.setenv("GRPC_TRACE", trace)
    assert not warn_traced_headers(OtlpExporterConfig(endpoint="collector:4317", headers=headers))


def test_the_http_exporters_request_line_is_logged_without_its_query_token(caplog):
    """urllib3 logs each request line at DEBUG, query string included (``log_level: debug``)."""
    import http.server
    import threading

    from otelbpf.config import OtlpHttpExporterConfig

    class Collector(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/v1/traces?api_key=s3cr3tVALUE"
        exporter = span_exporter(OtlpHttpExporterConfig(traces_endpoint=url, compression="none"))
        with caplog.at_level(logging.DEBUG):
            exporter.export([])
        exporter.shutdown()
    finally:
        server.shutdown()
    [line] = [r.getMessage() for r in caplog.records if r.name == "urllib3.connectionpool" and "POST" in r.getMessage()]
    assert '"POST /v1/traces?api_key=REDACTED HTTP/1.1" 200' in line
    assert "s3cr3tVALUE" not in caplog.text
