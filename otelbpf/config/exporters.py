"""The exporters' options: ``otlp`` (gRPC), ``otlphttp`` (HTTP/protobuf), ``file`` (OTLP-JSON
lines and pprof files), ``pyroscope`` (profiles) and ``prometheus`` (metrics, scraped), and what
each needs to have a destination."""

from __future__ import annotations

import re
import urllib.parse
from typing import Annotated, Literal, TypeAlias

from pydantic import BaseModel, BeforeValidator, Field, field_validator, model_validator

from otelbpf.config.fields import (
    FilePath,
    GrpcHeaders,
    Headers,
    HeaderValue,
    ReadableFile,
    Section,
    endpoint_port,
    endpoint_text,
    has_userinfo,
    http_url,
)
from otelbpf.config.signals import Signal
from otelbpf.config.units import PositiveDuration, Size


class HttpTLSConfig(Section):
    """TLS for the HTTP exporter; the endpoint's scheme (http/https) decides whether TLS is used."""

    ca_file: ReadableFile | None = None
    cert_file: ReadableFile | None = None
    key_file: ReadableFile | None = None

    @model_validator(mode="after")
    def _client_pair(self) -> HttpTLSConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together (client certificate and its key): set both or neither")
        return self


class TLSConfig(HttpTLSConfig):
    """TLS for the gRPC exporter. ``insecure`` unset: decided by the endpoint's scheme
    (``http://`` plaintext, ``https://`` or no scheme TLS), as the Collector and SDKs do."""

    insecure: bool | None = None


Compression: TypeAlias = Literal["gzip", "none"]


class OtlpExporterConfig(Section):
    """OTLP over gRPC. ``endpoint`` is ``host:port`` or ``http(s)://host[:port]``."""

    endpoint: str | None = None
    headers: GrpcHeaders = {}
    tls: TLSConfig = TLSConfig()
    timeout: PositiveDuration = 10_000_000_000
    compression: Compression = "gzip"

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is not None:
            _grpc_target(value)
            if has_userinfo(value if "://" in value else f"//{value}"):  # the channel takes host:port
                raise ValueError(
                    "the endpoint carries userinfo (user:password@), which gRPC never sends: give the "
                    "credentials as a header (authorization: Basic <base64 of user:password>)"
                )
        return value

    @model_validator(mode="after")
    def _scheme_agrees_with_tls(self) -> OtlpExporterConfig:
        scheme = endpoint_scheme(self.endpoint)
        if self.tls.insecure is True and scheme == "https":
            raise ValueError(f"tls.insecure is true but the endpoint {self.endpoint!r} is https: drop one of them")
        if self.tls.insecure is False and scheme == "http":
            raise ValueError(
                f"tls.insecure is false but the endpoint {self.endpoint!r} is plaintext http: use https:// or host:port"
            )
        return self

    @property
    def target(self) -> str:
        """``host:port`` for the gRPC channel (port 443/80 filled in for a URL without one)."""
        if self.endpoint is None:
            raise ValueError("the exporter has no endpoint")
        return _grpc_target(self.endpoint)

    @property
    def insecure(self) -> bool:
        """Whether the channel is plaintext: ``tls.insecure`` if set, else the scheme decides."""
        if self.tls.insecure is not None:
            return self.tls.insecure
        return endpoint_scheme(self.endpoint) == "http"


#: Where each signal goes under an OTLP/HTTP base URL (profiles: the Collector's path while the
#: signal is in development).
HTTP_PATHS = {"traces": "/v1/traces", "metrics": "/v1/metrics", "profiles": "/v1development/profiles"}


class OtlpHttpExporterConfig(Section):
    """OTLP over HTTP/protobuf. ``endpoint`` is a base URL to which ``/v1/traces``,
    ``/v1/metrics`` and ``/v1development/profiles`` are appended; ``traces_endpoint``,
    ``metrics_endpoint`` and ``profiles_endpoint`` are used as given."""

    endpoint: str | None = None
    traces_endpoint: str | None = None
    metrics_endpoint: str | None = None
    profiles_endpoint: str | None = None
    headers: Headers = {}
    tls: HttpTLSConfig = HttpTLSConfig()
    timeout: PositiveDuration = 10_000_000_000
    compression: Compression = "gzip"

    @field_validator("endpoint", "traces_endpoint", "metrics_endpoint", "profiles_endpoint")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return http_url(value, "http://localhost:4318")

    @model_validator(mode="after")
    def _one_authorization(self) -> OtlpHttpExporterConfig:
        urls = [f for f in ("endpoint", *(f"{s}_endpoint" for s in HTTP_PATHS)) if has_userinfo(getattr(self, f))]
        if urls and any(name.lower() == "authorization" for name in self.headers):
            raise ValueError(_userinfo_replaces(urls, "the authorization header"))
        return self

    def signal_endpoint(self, signal: Signal | Literal["profiles"]) -> str | None:
        """The URL set for ``signal`` alone (``traces_endpoint``, ...), if any."""
        endpoint: str | None = getattr(self, f"{signal}_endpoint")
        return endpoint

    def url(self, signal: Signal | Literal["profiles"]) -> str:
        """Where ``signal`` is POSTed."""
        explicit = self.signal_endpoint(signal)
        if explicit is not None:
            return explicit
        if self.endpoint is None:
            raise ValueError(f"the exporter has no endpoint for {signal}")
        return self.endpoint.rstrip("/") + HTTP_PATHS[signal]


def _mode(value: object) -> int:
    """A permission mode, written as in chmod: ``"0600"`` (or the YAML int 0o600 / 384)."""
    if isinstance(value, str) and re.fullmatch(r"0?[0-7]{3}", value.strip()):
        value = int(value.strip(), 8)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0o777:
        raise ValueError(f'invalid mode {value!r}: write it as in chmod, in quotes (e.g. "0600")')
    return value


Mode = Annotated[int, BeforeValidator(_mode)]


class FileExporterConfig(Section):
    """OTLP-JSON lines (the Collector file exporter's format), one file per signal, and pprof
    files under ``profiles/``. The agent runs as root and what it writes names paths, hosts and
    peers: the directory is created ``dir_mode`` and files ``file_mode`` (owner only by
    default), and nothing is written through a symbolic link (``base/safe_files.py``)."""

    directory: FilePath = Field("./otelbpf-out", min_length=1)
    rotate_size: Size = 64 << 20
    #: Rotated files kept per signal, the oldest removed first (0: all): with the default
    #: rotation, 2 GiB of spans at most; removals counted in ``otelbpf.export.files_removed``.
    max_rotated_files: int = Field(32, ge=0, le=1 << 20)
    #: pprof files kept in ``profiles/`` (one per process, kind and interval), about: the ones
    #: that ended first are removed past a tenth more (0: all); counted as for rotated files.
    max_profile_files: int = Field(20000, ge=0, le=1 << 24)
    file_mode: Mode = 0o600
    dir_mode: Mode = 0o700
    #: ``otelbpf run`` ends by writing ``report.html`` (``otelbpf report``) into ``directory``.
    report: bool = True
    #: ... unless the OTLP-JSON files there hold more than this: the page is built in the agent's
    #: memory, about half the files' size (800 MiB for 1.4 GiB of spans), and takes ~10 s per
    #: 300 MiB; past it the agent says so and ``otelbpf report`` writes the page on demand.
    report_max_input: Size = 256 << 20
    #: ``otelbpf run`` starts by moving an earlier run's files into ``previous/<its start>/``
    #: (``export/runs.py``): the folder's top level is one run. True: add to them instead.
    append: bool = False

    @model_validator(mode="after")
    def _owner_can_use(self) -> FileExporterConfig:
        if self.file_mode & 0o600 != 0o600 or self.dir_mode & 0o700 != 0o700:
            raise ValueError(
                f"file_mode {self.file_mode:04o} / dir_mode {self.dir_mode:04o}: the owner (the agent) needs "
                "read and write on files and rwx on the directory"
            )
        return self


class BasicAuthConfig(Section):
    username: HeaderValue = Field(min_length=1)
    password: HeaderValue


class RetryConfig(Section):
    """Exponential back-off between attempts; a profile is dropped (and counted) after
    ``max_elapsed_time``."""

    initial_interval: PositiveDuration = 1_000_000_000
    max_interval: PositiveDuration = 30_000_000_000
    max_elapsed_time: PositiveDuration = 300_000_000_000


class PyroscopeExporterConfig(Section):
    """Profiles to Grafana Pyroscope: ``push`` (push.v1.PusherService/Push, Connect protocol)
    or the legacy ``ingest`` endpoint (/ingest?format=pprof)."""

    endpoint: str | None = None
    protocol: Literal["push", "ingest"] = "push"
    basic_auth: BasicAuthConfig | None = None
    bearer_token: HeaderValue | None = None
    tenant_id: HeaderValue | None = None
    headers: Headers = {}
    timeout: PositiveDuration = 10_000_000_000
    max_queue_size: int = Field(256, ge=1, le=1 << 16)
    retry: RetryConfig = RetryConfig()

    @field_validator("endpoint")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return http_url(value, "http://localhost:4040")

    @model_validator(mode="after")
    def _one_auth(self) -> PyroscopeExporterConfig:
        if self.basic_auth is not None and self.bearer_token is not None:
            raise ValueError("basic_auth and bearer_token both set: a request carries one Authorization; keep one")
        given = [
            what
            for what, present in (
                ("basic_auth", self.basic_auth is not None),
                ("bearer_token", self.bearer_token is not None),
                ("the authorization header", any(name.lower() == "authorization" for name in self.headers)),
            )
            if present
        ]
        if given and has_userinfo(self.endpoint):
            raise ValueError(_userinfo_replaces(["endpoint"], given[0]))
        return self


class PrometheusExporterConfig(Section):
    """Metrics for Prometheus to scrape, as the Collector's ``prometheus`` exporter serves them:
    ``/metrics`` on ``endpoint`` (``host:port``) in the text exposition format, names and units
    converted as OpenTelemetry specifies (``nccl.collective.wait`` in ``s`` ->
    ``nccl_collective_wait_seconds``). The agent's metrics are per process, so the resource's
    attributes become labels (``resource_to_telemetry_conversion``, on by default here: without
    them two processes' series would collide). A series not refreshed for ``metric_expiration``
    (its process gone) is no longer served. ``localhost`` by default: what the page shows names
    hosts, processes and commands; set ``0.0.0.0:9464`` for a Prometheus on another host."""

    endpoint: str = "localhost:9464"
    resource_to_telemetry_conversion: bool = True
    metric_expiration: PositiveDuration = 300_000_000_000

    @field_validator("endpoint")
    @classmethod
    def _host_port(cls, value: str) -> str:
        hint = "write host:port (e.g. 0.0.0.0:9464)"
        endpoint_text(value)
        parts = urllib.parse.urlsplit(f"//{value}")
        try:
            port = endpoint_port(value, parts)
        except ValueError as exc:
            raise ValueError(f"{exc}: {hint}") from None
        if port is None or not parts.hostname or parts.path or parts.query or "@" in parts.netloc:
            raise ValueError(f"prometheus endpoint {value!r} is not host:port: {hint}")
        return value

    @property
    def host_port(self) -> tuple[str, int]:
        """Where to listen: (host, port); an IPv6 literal without its brackets."""
        parts = urllib.parse.urlsplit(f"//{self.endpoint}")
        assert parts.hostname is not None and parts.port is not None  # checked by _host_port
        return parts.hostname, parts.port


def _userinfo_replaces(urls: list[str], authorization: str) -> str:
    """Why userinfo and another Authorization are refused together (the exporter is the error's
    option path; the URL is not shown: its userinfo is a credential)."""
    return (
        f"{' and '.join(urls)} carries userinfo (user:password@), which the HTTP client would send as basic "
        f"auth in place of {authorization}: the request carries one Authorization; keep one of them"
    )


ExporterConfig: TypeAlias = (
    OtlpExporterConfig
    | OtlpHttpExporterConfig
    | FileExporterConfig
    | PyroscopeExporterConfig
    | PrometheusExporterConfig
)
EXPORTER_TYPES: dict[str, type[BaseModel]] = {
    "otlp": OtlpExporterConfig,
    "otlphttp": OtlpHttpExporterConfig,
    "file": FileExporterConfig,
    "pyroscope": PyroscopeExporterConfig,
    "prometheus": PrometheusExporterConfig,
}


def endpoint_scheme(endpoint: str | None) -> str | None:
    """``http``/``https`` of ``http(s)://host...``; None for a bare ``host:port``."""
    if endpoint is None or "://" not in endpoint:
        return None
    return endpoint.split("://", 1)[0].lower()


def _grpc_target(endpoint: str) -> str:
    hint = "write host:port or http(s)://host[:port] (e.g. localhost:4317)"
    endpoint_text(endpoint)
    scheme = endpoint_scheme(endpoint)
    if scheme is not None and scheme not in ("http", "https"):
        raise ValueError(f"gRPC endpoint {endpoint!r} has scheme {scheme!r}: {hint}")
    parts = urllib.parse.urlsplit(endpoint if scheme else f"//{endpoint}")
    try:
        port = endpoint_port(endpoint, parts)
    except ValueError as exc:
        raise ValueError(f"{exc}: {hint}") from None
    if not parts.hostname or parts.path not in ("", "/") or parts.query:
        raise ValueError(f"gRPC endpoint {endpoint!r} is not {hint.removeprefix('write ')}")
    if port is None:
        if scheme is None:
            raise ValueError(f"gRPC endpoint {endpoint!r} has no port: {hint}")
        port = 443 if scheme == "https" else 80
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{port}"


def missing_endpoint(exporter: ExporterConfig | None, signal: Signal | Literal["profiles"]) -> str | None:
    """Why ``exporter`` has nowhere to send ``signal`` (its endpoint may come from a variable
    the loader fills in), or None."""
    if isinstance(exporter, PyroscopeExporterConfig) and exporter.endpoint is None:
        return "no endpoint: set endpoint here or PYROSCOPE_SERVER_ADDRESS"
    if isinstance(exporter, OtlpExporterConfig) and exporter.endpoint is None:
        return "no endpoint: set endpoint here or OTEL_EXPORTER_OTLP_ENDPOINT"
    if (
        isinstance(exporter, OtlpHttpExporterConfig)
        and exporter.endpoint is None
        and exporter.signal_endpoint(signal) is None
    ):
        env = (
            f", or OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT"
            if signal != "profiles"
            else ""
        )  # the variables fill in traces and metrics only
        return f"no endpoint: set endpoint or {signal}_endpoint here{env}"
    return None
