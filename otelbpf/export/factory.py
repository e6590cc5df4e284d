"""Build OpenTelemetry SDK exporters from exporter configs.

gRPC (``otlp``) and HTTP/protobuf (``otlphttp``) use the official
opentelemetry-exporter-otlp packages (their retry with back-off included);
``file`` is the local OTLP-JSON default; ``prometheus`` serves metrics for scraping
(export/prometheus.py, loaded only when configured). gRPC span requests are built by
``otlp_proto.encode_spans_proto`` (a third of the SDK encoder's CPU, the same message).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.metrics.export import MetricExporter
from opentelemetry.sdk.trace.export import SpanExporter

from otelbpf.config import (
    ExporterConfig,
    FileExporterConfig,
    OtlpExporterConfig,
    OtlpHttpExporterConfig,
    PrometheusExporterConfig,
    Signal,
    to_seconds,
)
from otelbpf.export.jsonfile import FileMetricExporter, FileSpanExporter
from otelbpf.export.sender import redact_http_client_logs

if TYPE_CHECKING:
    import grpc  # at run time imported where used: only an agent with a gRPC exporter loads it


log = logging.getLogger(__name__)

#: gRPC core's tracers that write each call's metadata (headers) to stderr: with them on, an
#: exporter's credentials reach the agent's log.
_METADATA_TRACERS = frozenset({"all", "http", "http1"})


def traced_metadata(grpc_trace: str | None) -> list[str]:
    """Tracers of a ``GRPC_TRACE`` value that print call metadata (``-name`` turns one off)."""
    names = [t.strip() for t in (grpc_trace or "").split(",") if t.strip()]
    return [t for t in names if t in _METADATA_TRACERS]


def warn_traced_headers(cfg: OtlpExporterConfig) -> bool:
    """Say so when ``GRPC_TRACE`` will print this exporter's headers: they are credentials
    more often than not (an Authorization, an API key). The operator asked for the trace, so
    it stays on; the warning names what it exposes. Returns whether it warned."""
    tracers = traced_metadata(os.environ.get("GRPC_TRACE"))
    if not cfg.headers or not tracers:
        return False
    log.warning(
        "GRPC_TRACE=%s prints each call's metadata to stderr: the %s exporter's headers (%s) will "
        "appear in this log in clear. Unset GRPC_TRACE, or leave out %s, outside a debugging session.",
        os.environ.get("GRPC_TRACE"),
        cfg.target,
        ", ".join(sorted(cfg.headers)),
        ",".join(tracers),
    )
    return True


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


def _grpc_kwargs(cfg: OtlpExporterConfig) -> dict[str, Any]:
    import grpc

    warn_traced_headers(cfg)
    kwargs: dict[str, Any] = {
        "endpoint": cfg.target,
        "insecure": cfg.insecure,
        "headers": dict(cfg.headers),
        "timeout": to_seconds(cfg.timeout),
        "compression": grpc.Compression.Gzip if cfg.compression == "gzip" else grpc.Compression.NoCompression,
    }
    if not cfg.insecure and (cfg.tls.ca_file or cfg.tls.cert_file):
        kwargs["credentials"] = grpc_credentials(cfg)
    return kwargs


def grpc_credentials(cfg: OtlpExporterConfig) -> grpc.ChannelCredentials:
    """TLS credentials of a gRPC exporter: its CA and client pair, the system's roots otherwise."""
    import grpc

    return grpc.ssl_channel_credentials(
        root_certificates=_read(cfg.tls.ca_file),
        private_key=_read(cfg.tls.key_file),
        certificate_chain=_read(cfg.tls.cert_file),
    )


def _http_kwargs(cfg: OtlpHttpExporterConfig, signal: Signal) -> dict[str, Any]:
    from opentelemetry.exporter.otlp.proto.http import Compression

    redact_http_client_logs()
    kwargs: dict[str, Any] = {
        "endpoint": cfg.url(signal),
        "headers": dict(cfg.headers),
        "timeout": to_seconds(cfg.timeout),
        "compression": Compression.Gzip if cfg.compression == "gzip" else Compression.NoCompression,
    }
    if cfg.tls.ca_file:
        kwargs["certificate_file"] = cfg.tls.ca_file
    if cfg.tls.cert_file:
        kwargs["client_certificate_file"] = cfg.tls.cert_file
        kwargs["client_key_file"] = cfg.tls.key_file
    return kwargs


def _file_kwargs(cfg: FileExporterConfig) -> dict[str, int]:
    """What the file exporter's span and metric halves share, after the directory."""
    return {
        "rotate_bytes": cfg.rotate_size,
        "max_rotated": cfg.max_rotated_files,
        "file_mode": cfg.file_mode,
        "dir_mode": cfg.dir_mode,
    }


def span_exporter(cfg: ExporterConfig) -> SpanExporter:
    if isinstance(cfg, OtlpExporterConfig):
        from otelbpf.export.otlp_proto import FastOTLPSpanExporter

        return FastOTLPSpanExporter(**_grpc_kwargs(cfg))
    if isinstance(cfg, OtlpHttpExporterConfig):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter

        return HttpSpanExporter(**_http_kwargs(cfg, "traces"))
    if isinstance(cfg, FileExporterConfig):
        return FileSpanExporter(cfg.directory, **_file_kwargs(cfg))
    raise TypeError(f"no span exporter for {type(cfg).__name__}")


def metric_exporter(cfg: ExporterConfig) -> MetricExporter:
    if isinstance(cfg, OtlpExporterConfig):
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        return OTLPMetricExporter(**_grpc_kwargs(cfg))
    if isinstance(cfg, OtlpHttpExporterConfig):
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter

        return HttpMetricExporter(**_http_kwargs(cfg, "metrics"))
    if isinstance(cfg, FileExporterConfig):
        return FileMetricExporter(cfg.directory, **_file_kwargs(cfg))
    if isinstance(cfg, PrometheusExporterConfig):
        from otelbpf.export.prometheus import PrometheusExporter

        return PrometheusExporter.from_config(cfg)
    raise TypeError(f"no metric exporter for {type(cfg).__name__}")
