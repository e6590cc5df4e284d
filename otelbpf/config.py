"""The agent's configuration: a YAML file in the OpenTelemetry Collector's shape.

``receivers`` are probe families, ``processors`` shape what leaves, ``exporters`` say where it
goes, and ``service.pipelines`` wires them per signal (``traces``, ``metrics``); only
receivers named in a pipeline are loaded. ``config/otelbpf.yaml`` documents every option
with its default. Components are named ``type`` or ``type/name`` (``otlp/tempo``); receivers
take no ``/name`` because one probe family is loaded once.

Values: durations are ``"250ms"``, ``"1.5s"``, ``"1m30s"`` (units ns, us, ms, s, m, h) or a
plain number of seconds, at most 24h, and are stored as int nanoseconds (``parse_duration``,
``to_seconds``); sizes are ``"64KiB"``, ``"4MiB"``, ``"1GiB"`` or a plain number of bytes,
stored as int bytes (``parse_size``). String values may use ``${env:VAR}``,
``${env:VAR:-default}``, ``${VAR}`` and ``${VAR:-default}`` (the default applies when VAR is
unset or empty; ``$$`` writes a literal ``$``); an unset variable without a default is an
error naming it and the option that used it.

Where settings come from, highest precedence first (explicit configuration wins, as in the
OpenTelemetry SDKs where constructor arguments beat environment variables):

1. The config file (after ``${env:...}`` substitution). A mapping written in the file
   (``headers``, ``processors.resource.attributes``) keeps its keys; environment variables only
   add keys it lacks.
2. Signal-specific standard variables (``OTEL_EXPORTER_OTLP_TRACES_*``,
   ``OTEL_EXPORTER_OTLP_METRICS_*``), for an ``otlp``/``otlphttp`` exporter that only the
   pipeline of that signal uses; an ``otlphttp`` exporter also takes
   ``OTEL_EXPORTER_OTLP_{TRACES,METRICS}_ENDPOINT`` as its ``traces_endpoint`` /
   ``metrics_endpoint`` (full URLs, used as they are, as the spec says).
3. The generic ``OTEL_EXPORTER_OTLP_*`` variables: ``ENDPOINT``, ``HEADERS`` (``k=v,k2=v2``,
   percent-decoded), ``TIMEOUT`` (milliseconds), ``COMPRESSION`` (gzip | none), ``INSECURE``
   (true | false; gRPC, and as the spec says only for an endpoint without ``http(s)://``, whose
   scheme decides), ``CERTIFICATE``, ``CLIENT_CERTIFICATE``, ``CLIENT_KEY``.
4. Built-in defaults.

Without a config file the built-in default (``DEFAULT_CONFIG_YAML``, the same as
``config/otelbpf.yaml``) is used; being defaults, its values rank below the variables. If
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or a signal-specific endpoint) is set, that signal's pipeline
exports over OTLP instead of to local files: gRPC (``otlp``) unless
``OTEL_EXPORTER_OTLP[_<SIGNAL>]_PROTOCOL`` is ``http/protobuf`` (``otlphttp``); ``http/json``
is refused. One exporter serves both signals where the variables say the same for each, else
there is one per signal (``otlp/traces``, ``otlp/metrics``). A signal without any endpoint
variable keeps the file exporter. With a config file the ``PROTOCOL`` variables are ignored:
the file names the exporter type, and the endpoint variables add no exporter.

Resource: ``OTEL_RESOURCE_ATTRIBUTES`` (``k=v,...``, percent-decoded) and
``OTEL_SERVICE_NAME`` (which wins for ``service.name``) add to the ``resource`` processor's
``attributes``; keys written in the file win over both. When either is set and the file
defines no ``resource`` processor, one is created, and ``resource`` is appended to every
pipeline that lacks it, so the variables always take effect as they do in an SDK.
``OTEL_METRIC_EXPORT_INTERVAL`` (milliseconds) fills ``service.telemetry.metrics_interval``.
As the spec says, an empty variable counts as unset.

A file is checked before it is parsed: at most ``MAX_CONFIG_BYTES`` (1 MiB), nested at most
``MAX_CONFIG_DEPTH`` (32) levels, and at most ``MAX_CONFIG_NODES`` (100,000) values once YAML
aliases are expanded, so no file (an alias bomb, /dev/zero) can exhaust the host. Values are
bounded by what the kernel and the runtime accept (ring buffers up to 1 GiB, durations up to
24h, headers that gRPC and HTTP can send), so ``otelbpf validate`` fails where ``run`` would.

Every problem found is reported at once in one ``ConfigError`` whose lines name the option
path (``receivers.cuda.launch_sample_every: ...``), the file position where known, the
allowed values or keys, and the environment variable a bad value came from.
"""

from __future__ import annotations

import difflib
import math
import mmap
import os
import re
import urllib.parse
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TypeAlias, Union, get_args, get_origin

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError
from pydantic_core.core_schema import ErrorType

Signal: TypeAlias = Literal["traces", "metrics"]
SIGNALS: tuple[Signal, ...] = ("traces", "metrics")
#: Every pipeline a config may define: the OTLP signals, and profiles (pprof: files, Pyroscope).
PIPELINE_SIGNALS: tuple[str, ...] = (*SIGNALS, "profiles")

OptionPath: TypeAlias = tuple[str | int, ...]  # keys and list indexes from the top of the config


class ConfigError(Exception):
    """The configuration is invalid; ``errors`` holds one line per problem, all of them."""

    def __init__(self, source: str, errors: Sequence[str]) -> None:
        self.source = source
        self.errors = list(errors)
        count = f"{len(self.errors)} error{'s' if len(self.errors) != 1 else ''}"
        lines = "\n".join(f"  {e}" for e in self.errors)
        super().__init__(f"invalid otelbpf configuration ({source}, {count}):\n{lines}")


# ---------------------------------------------------------------------------------------
# Durations and sizes
# ---------------------------------------------------------------------------------------

_DURATION_UNITS_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_NUMBER = re.compile(r"\d+(?:\.\d*)?|\.\d+")


#: The longest duration any option takes. Timers are ``threading.Event.wait`` calls, which
#: raise OverflowError past ``threading.TIMEOUT_MAX``; an hour-long interval is already an
#: agent that exports nothing for an hour.
MAX_DURATION_NS = 24 * _DURATION_UNITS_NS["h"]


def parse_duration(value: object) -> int:
    """A duration in int nanoseconds from ``"250ms"``, ``"1m30s"`` or a number of seconds,
    at most ``MAX_DURATION_NS`` (24h)."""
    hint = "write a number of seconds or a number with a unit: ns, us, ms, s, m, h (e.g. 250ms, 1.5s, 1m30s)"
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"invalid duration {value!r}: {hint}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"invalid duration {value!r}: must not be negative")
        seconds = float(value)
    else:
        text = value.strip()
        parts = list(_DURATION_PART.finditer(text))
        if _NUMBER.fullmatch(text):
            seconds = float(text)
        elif not text or "".join(p.group(0) for p in parts) != text:
            raise ValueError(f"invalid duration {value!r}: {hint}")
        else:
            seconds = sum(float(p.group(1)) * _DURATION_UNITS_NS[p.group(2)] for p in parts) / 1e9
    if not math.isfinite(seconds) or seconds * 1e9 > MAX_DURATION_NS:
        raise ValueError(f"duration {value!r} is too long: at most {format_duration(MAX_DURATION_NS)}")
    return round(seconds * 1_000_000_000)


def format_duration(ns: int) -> str:
    """The shortest exact spelling of ``ns`` in the largest whole unit (``1500000`` -> ``1500us``)."""
    for unit in ("h", "m", "s", "ms", "us"):
        if ns and ns % _DURATION_UNITS_NS[unit] == 0:
            return f"{ns // _DURATION_UNITS_NS[unit]}{unit}"
    return f"{ns}ns"


def to_seconds(ns: int) -> float:
    """A stored duration as float seconds, the unit the OpenTelemetry SDK takes."""
    return ns / 1_000_000_000


_SIZE_UNITS = {"b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
_SIZE = re.compile(r"(\d+)\s*([A-Za-z]*)")


def parse_size(value: object) -> int:
    """A size in int bytes from ``"64KiB"``, ``"4MiB"``, ``"1GiB"`` or a number of bytes."""
    hint = "write a number of bytes or a whole number with a unit: B, KiB, MiB, GiB (e.g. 4MiB)"
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"invalid size {value!r}: {hint}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"invalid size {value!r}: must not be negative")
        return value
    match = _SIZE.fullmatch(value.strip())
    unit = match.group(2).lower() if match else ""
    if match is None or (unit and unit not in _SIZE_UNITS):
        raise ValueError(f"invalid size {value!r}: {hint}")
    return int(match.group(1)) * _SIZE_UNITS.get(unit, 1)


def format_size(size: int) -> str:
    """The largest whole binary unit for ``size`` bytes (``4194304`` -> ``4MiB``)."""
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if size and size % unit == 0:
            return f"{size // unit}{name}"
    return f"{size}B"


Duration = Annotated[int, BeforeValidator(parse_duration)]
PositiveDuration = Annotated[int, BeforeValidator(parse_duration), Field(gt=0)]
Size = Annotated[int, BeforeValidator(parse_size)]


#: The largest BPF ring buffer accepted. The kernel takes a power of two up to 2 GiB
#: (``max_entries`` is a u32), all of it kernel memory that is never swapped, plus the
#: same again mapped twice into the agent; a quarter of that is already generous.
MAX_RING_BYTES = 1 << 30


def _power_of_two_ring(value: int) -> int:
    if value < mmap.PAGESIZE or value & (value - 1) or value > MAX_RING_BYTES:
        raise ValueError(
            f"the BPF ring buffer size must be a power of two from the page size "
            f"({format_size(mmap.PAGESIZE)}) to {format_size(MAX_RING_BYTES)}, got {format_size(value)}"
        )
    return value


#: A BPF ring buffer's size: what the kernel accepts.
RingSize = Annotated[int, BeforeValidator(parse_size), AfterValidator(_power_of_two_ring)]


def _scalar_attribute(value: object) -> object:
    if isinstance(value, (str, bool, int, float)):
        return value
    raise ValueError(f"an attribute value must be a string, number or boolean, got {value!r}")


AttributeValue = Annotated[str | bool | int | float, BeforeValidator(_scalar_attribute)]

_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HEADER_VALUE = re.compile(r"[\x20-\x7e]*")


def _header_value(value: str) -> str:
    """What both transports send: gRPC refuses any control or non-ASCII byte in metadata
    (every export then fails with "Invalid metadata"), and CR/LF would split an HTTP header."""
    if not _HEADER_VALUE.fullmatch(value):
        bad = next(c for c in value if not _HEADER_VALUE.fullmatch(c))
        raise ValueError(f"{bad!r} is not allowed in a header value: printable ASCII only (no CR, LF, NUL, tab)")
    return value


def _header_name(name: str) -> str:
    if not _HEADER_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a header name (letters, digits and !#$%&'*+.^_`|~-)")
    return name


def _unique_names(value: dict[str, str]) -> dict[str, str]:
    seen: set[str] = set()
    for name in value:
        if name.lower() in seen:
            raise ValueError(f"header {name!r} is written twice (names are case-insensitive)")
        seen.add(name.lower())
    return value


def _lowercase_names(value: dict[str, str]) -> dict[str, str]:
    """gRPC metadata keys are lowercase: an upper-case one fails every export."""
    return {name.lower(): text for name, text in _unique_names(value).items()}


HeaderValue = Annotated[str, AfterValidator(_header_value)]
_HeaderName = Annotated[str, AfterValidator(_header_name)]
Headers = Annotated[dict[_HeaderName, HeaderValue], AfterValidator(_unique_names)]
GrpcHeaders = Annotated[dict[_HeaderName, HeaderValue], AfterValidator(_lowercase_names)]

def _no_nul(value: str) -> str:
    if "\0" in value:
        raise ValueError("a path must not contain a NUL character")
    return value


FilePath = Annotated[str, AfterValidator(_no_nul)]


# ---------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------


class _Section(BaseModel):
    """Unknown keys are errors (typos must not pass silently); loaded configs are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def _unique(items: list[Any], what: str) -> list[Any]:
    repeated = sorted({str(i) for i in items if items.count(i) > 1})
    if repeated:
        raise ValueError(f"{what} listed more than once: {', '.join(repeated)}")
    return items


# --- receivers ---------------------------------------------------------------------------

_DEFAULT_CUDA_SEARCH_PATHS = (
    "/usr/local/cuda*/lib64/libcudart.so*",
    "/usr/lib/x86_64-linux-gnu/libcudart.so*",
    "/opt/conda/lib/libcudart.so*",
    "/opt/conda/envs/*/lib/libcudart.so*",
    "/opt/conda/lib/python3*/site-packages/nvidia/cuda_runtime/lib/libcudart.so*",
    "/usr/local/lib/python3*/dist-packages/nvidia/cuda_runtime/lib/libcudart.so*",
    "/usr/local/lib/python3*/site-packages/nvidia/cuda_runtime/lib/libcudart.so*",
    # CUDA 13 wheels (PyTorch cu130 loads its runtime from nvidia/cu13/lib)
    "/opt/conda/lib/python3*/site-packages/nvidia/cu1[3-9]/lib/libcudart.so*",
    "/usr/local/lib/python3*/dist-packages/nvidia/cu1[3-9]/lib/libcudart.so*",
    "/usr/local/lib/python3*/site-packages/nvidia/cu1[3-9]/lib/libcudart.so*",
    "/usr/lib/x86_64-linux-gnu/libcuda.so*",
    "/usr/lib/aarch64-linux-gnu/libcuda.so*",
    "/usr/lib64/libcuda.so*",
    "/usr/local/nvidia/lib64/libcuda.so*",
)


def _absolute_glob(pattern: str) -> str:
    if not pattern.startswith("/"):
        raise ValueError(f"{pattern!r} is relative: search paths are absolute globs (the working directory varies)")
    return pattern


_DEFAULT_IBVERBS_SEARCH_PATHS = (
    "/usr/lib/x86_64-linux-gnu/libibverbs.so*",
    "/usr/lib/aarch64-linux-gnu/libibverbs.so*",
    "/usr/lib64/libibverbs.so*",
    "/usr/lib/libibverbs.so*",
    "/opt/conda/lib/libibverbs.so*",
    "/opt/conda/envs/*/lib/libibverbs.so*",
)


class IbverbsReceiverConfig(_Section):
    """Uprobes on libibverbs (queue pairs, memory regions) and on the RDMA provider's post and
    poll functions found in each opened device context (the data path)."""

    search_paths: list[Annotated[str, AfterValidator(_absolute_glob)]] = list(_DEFAULT_IBVERBS_SEARCH_PATHS)
    data_path: bool = True
    slow_completion: PositiveDuration = 1_000_000
    max_queue_pairs: int = Field(16384, ge=64, le=1 << 20)
    ring_buffer_size: RingSize = 1 << 20
    max_spans_per_second: int = Field(20_000, ge=0, le=10_000_000)


class CudaReceiverConfig(_Section):
    """Uprobes on the CUDA runtime (``cudart``) and driver (``cuda``) libraries."""

    libraries: list[Literal["cudart", "cuda"]] = ["cudart", "cuda"]
    search_paths: list[Annotated[str, AfterValidator(_absolute_glob)]] = list(_DEFAULT_CUDA_SEARCH_PATHS)
    launch_sample_every: int = Field(0, ge=0, le=1 << 30)
    launch_errors: bool = False
    min_span_duration: Duration = 0
    ring_buffer_size: RingSize = 16 << 20
    top_kernels: int = Field(20, ge=0, le=1000)
    max_spans_per_second: int = Field(20_000, ge=0, le=10_000_000)
    symbol_names: int = Field(65536, ge=1024, le=1 << 22)
    symbol_tables: int = Field(128, ge=8, le=4096)

    @field_validator("libraries")
    @classmethod
    def _libraries(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("name at least one of cudart, cuda (to disable the receiver, drop it from the pipelines)")
        return _unique(value, "library")


class HttpReceiverConfig(_Section):
    """Syscall tracepoints on sockets: HTTP/1.x, HTTP/2 and gRPC spans and RED metrics."""

    #: host mode: ``gpu`` traces the processes that load a library another receiver probes
    #: (CUDA, NCCL, ibverbs) and their children; ``all`` every process. --pid and run --
    #: trace their targets either way.
    processes: Literal["gpu", "all"] = "gpu"
    ports: list[Annotated[int, Field(ge=1, le=65535)]] = []
    payload_size: Size = 4 << 10
    ring_buffer_size: RingSize = 16 << 20
    capture_headers: list[str] = []
    redact_headers: list[str] = []
    max_spans_per_second: int = Field(20_000, ge=0, le=10_000_000)

    @field_validator("ports")
    @classmethod
    def _ports(cls, value: list[int]) -> list[int]:
        return _unique(value, "port")

    @field_validator("payload_size")
    @classmethod
    def _payload(cls, value: int) -> int:
        if value & (value - 1) or not 64 <= value <= 8192:
            raise ValueError(f"payload_size must be a power of two from 64B to 8KiB, got {format_size(value)}")
        return value

    @field_validator("capture_headers", "redact_headers")
    @classmethod
    def _header_names(cls, value: list[str]) -> list[str]:
        bad = [h for h in value if not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", h)]
        if bad:
            raise ValueError(f"not HTTP header names: {', '.join(map(repr, bad))}")
        return [h.lower() for h in value]


class ProfilingReceiverConfig(_Section):
    """CPU samples (perf cpu-clock) and CUDA memory by stack, Python frames merged with native."""

    sample_rate: int = Field(99, ge=1, le=1000)
    interval: PositiveDuration = 10_000_000_000
    python: bool = True
    max_python_frames: int = 64
    cuda_memory: bool = True
    stack_map_entries: int = Field(16384, ge=1024, le=1 << 20)
    sample_map_entries: int = Field(16384, ge=1024, le=1 << 20)
    code_map_entries: int = Field(16384, ge=1024, le=1 << 20)
    live_allocations: int = Field(262144, ge=1024, le=1 << 24)
    symbol_tables: int = Field(128, ge=8, le=4096)

    @field_validator("max_python_frames")
    @classmethod
    def _frames(cls, value: int) -> int:
        if value not in (16, 32, 64, 128):
            raise ValueError(f"max_python_frames must be 16, 32, 64 or 128, got {value}")
        return value


_DEFAULT_NCCL_SEARCH_PATHS = (
    "/usr/lib/x86_64-linux-gnu/libnccl.so*",
    "/usr/lib/aarch64-linux-gnu/libnccl.so*",
    "/usr/lib64/libnccl.so*",
    "/usr/local/cuda*/lib64/libnccl.so*",
    "/opt/conda/lib/libnccl.so*",
    "/opt/conda/envs/*/lib/libnccl.so*",
    "/opt/conda/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so*",
    "/usr/local/lib/python3*/dist-packages/nvidia/nccl/lib/libnccl.so*",
    "/usr/local/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so*",
)


class NcclReceiverConfig(_Section):
    """Uprobes on NCCL (``libnccl.so``): communicators, collectives, send/recv, groups; spans,
    metrics and live straggler findings."""

    search_paths: list[Annotated[str, AfterValidator(_absolute_glob)]] = list(_DEFAULT_NCCL_SEARCH_PATHS)
    ring_buffer_size: RingSize = 1 << 20
    #: the adaptive straggler test's floor (correlate/adaptive.py): lateness must also beat the
    #: other ranks' spread and a tenth of the collective's duration, persistently
    straggler_threshold: PositiveDuration = 1_000_000
    completion_timeout: PositiveDuration = 30_000_000_000
    max_spans_per_second: int = Field(20_000, ge=0, le=10_000_000)


ReceiverConfig: TypeAlias = (
    CudaReceiverConfig | HttpReceiverConfig | ProfilingReceiverConfig | NcclReceiverConfig | IbverbsReceiverConfig
)
RECEIVER_TYPES: dict[str, type[BaseModel]] = {
    "cuda": CudaReceiverConfig,
    "http": HttpReceiverConfig,
    "profiling": ProfilingReceiverConfig,
    "nccl": NcclReceiverConfig,
    "ibverbs": IbverbsReceiverConfig,
}
#: Receivers that feed the profiles pipeline (and only it).
PROFILE_RECEIVERS: tuple[type[BaseModel], ...] = (ProfilingReceiverConfig,)


# --- processors --------------------------------------------------------------------------


class BatchProcessorConfig(_Section):
    """Groups telemetry before export, like the Collector's batch processor."""

    timeout: PositiveDuration = 1_000_000_000
    send_batch_size: int = Field(512, ge=1, le=1 << 16)
    max_queue_size: int = Field(8192, ge=1, le=1 << 22)

    @model_validator(mode="after")
    def _queue_holds_a_batch(self) -> BatchProcessorConfig:
        if self.max_queue_size < self.send_batch_size:
            raise ValueError(
                f"max_queue_size ({self.max_queue_size}) must be at least send_batch_size ({self.send_batch_size})"
            )
        return self


class ResourceProcessorConfig(_Section):
    """Attributes added to every resource; ``service.name`` overrides the per-process default."""

    attributes: dict[str, AttributeValue] = {}

    @field_validator("attributes")
    @classmethod
    def _keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        if "" in value:
            raise ValueError("attribute keys must not be empty")
        return value


ProcessorConfig: TypeAlias = BatchProcessorConfig | ResourceProcessorConfig
PROCESSOR_TYPES: dict[str, type[BaseModel]] = {"batch": BatchProcessorConfig, "resource": ResourceProcessorConfig}


# --- exporters ---------------------------------------------------------------------------


class HttpTLSConfig(_Section):
    """TLS for the HTTP exporter; the endpoint's scheme (http/https) decides whether TLS is used."""

    ca_file: FilePath | None = None
    cert_file: FilePath | None = None
    key_file: FilePath | None = None

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


class OtlpExporterConfig(_Section):
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
        return value

    @model_validator(mode="after")
    def _scheme_agrees_with_tls(self) -> OtlpExporterConfig:
        scheme = _scheme(self.endpoint)
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
        return _scheme(self.endpoint) == "http"


class OtlpHttpExporterConfig(_Section):
    """OTLP over HTTP/protobuf. ``endpoint`` is a base URL to which ``/v1/traces`` and
    ``/v1/metrics`` are appended; ``traces_endpoint``/``metrics_endpoint`` are used as given."""

    endpoint: str | None = None
    traces_endpoint: str | None = None
    metrics_endpoint: str | None = None
    headers: Headers = {}
    tls: HttpTLSConfig = HttpTLSConfig()
    timeout: PositiveDuration = 10_000_000_000
    compression: Compression = "gzip"

    @field_validator("endpoint", "traces_endpoint", "metrics_endpoint")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None:
            parts = urllib.parse.urlsplit(value)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"{value!r} is not an http(s):// URL with a host (like http://localhost:4318)")
        return value

    def url(self, signal: Signal) -> str:
        """Where ``signal`` is POSTed."""
        explicit = self.traces_endpoint if signal == "traces" else self.metrics_endpoint
        if explicit is not None:
            return explicit
        if self.endpoint is None:
            raise ValueError(f"the exporter has no endpoint for {signal}")
        return self.endpoint.rstrip("/") + f"/v1/{signal}"


def _mode(value: object) -> int:
    """A permission mode, written as in chmod: ``"0600"`` (or the YAML int 0o600 / 384)."""
    if isinstance(value, str) and re.fullmatch(r"0?[0-7]{3}", value.strip()):
        value = int(value.strip(), 8)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0o777:
        raise ValueError(f"invalid mode {value!r}: write it as in chmod, in quotes (e.g. \"0600\")")
    return value


Mode = Annotated[int, BeforeValidator(_mode)]


class FileExporterConfig(_Section):
    """OTLP-JSON lines (the Collector file exporter's format), one file per signal, and pprof
    files under ``profiles/``. The agent runs as root and what it writes names paths, hosts and
    peers: the directory is created ``dir_mode`` and files ``file_mode`` (owner only by
    default), and nothing is written through a symbolic link (``export/safe_files.py``)."""

    directory: FilePath = Field("./otelbpf-out", min_length=1)
    rotate_size: Size = 64 << 20
    file_mode: Mode = 0o600
    dir_mode: Mode = 0o700

    @model_validator(mode="after")
    def _owner_can_use(self) -> FileExporterConfig:
        if self.file_mode & 0o600 != 0o600 or self.dir_mode & 0o700 != 0o700:
            raise ValueError(
                f"file_mode {self.file_mode:04o} / dir_mode {self.dir_mode:04o}: the owner (the agent) needs "
                "read and write on files and rwx on the directory"
            )
        return self


class BasicAuthConfig(_Section):
    username: HeaderValue = Field(min_length=1)
    password: HeaderValue


class RetryConfig(_Section):
    """Exponential back-off between attempts; a profile is dropped (and counted) after
    ``max_elapsed_time``."""

    initial_interval: PositiveDuration = 1_000_000_000
    max_interval: PositiveDuration = 30_000_000_000
    max_elapsed_time: PositiveDuration = 300_000_000_000


class PyroscopeExporterConfig(_Section):
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
        if value is not None:
            parts = urllib.parse.urlsplit(value)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"{value!r} is not an http(s):// URL with a host (like http://localhost:4040)")
        return value

    @model_validator(mode="after")
    def _one_auth(self) -> PyroscopeExporterConfig:
        if self.basic_auth is not None and self.bearer_token is not None:
            raise ValueError("basic_auth and bearer_token both set: a request carries one Authorization; keep one")
        return self


ExporterConfig: TypeAlias = OtlpExporterConfig | OtlpHttpExporterConfig | FileExporterConfig | PyroscopeExporterConfig
EXPORTER_TYPES: dict[str, type[BaseModel]] = {
    "otlp": OtlpExporterConfig,
    "otlphttp": OtlpHttpExporterConfig,
    "file": FileExporterConfig,
    "pyroscope": PyroscopeExporterConfig,
}


def _scheme(endpoint: str | None) -> str | None:
    if endpoint is None or "://" not in endpoint:
        return None
    return endpoint.split("://", 1)[0].lower()


def _grpc_target(endpoint: str) -> str:
    hint = "write host:port or http(s)://host[:port] (e.g. localhost:4317)"
    scheme = _scheme(endpoint)
    if scheme is not None and scheme not in ("http", "https"):
        raise ValueError(f"gRPC endpoint {endpoint!r} has scheme {scheme!r}: {hint}")
    parts = urllib.parse.urlsplit(endpoint if scheme else f"//{endpoint}")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"gRPC endpoint {endpoint!r} has an invalid port: {hint}") from None
    if not parts.hostname or parts.path not in ("", "/") or parts.query:
        raise ValueError(f"gRPC endpoint {endpoint!r} is not {hint.removeprefix('write ')}")
    if port is None:
        if scheme is None:
            raise ValueError(f"gRPC endpoint {endpoint!r} has no port: {hint}")
        port = 443 if scheme == "https" else 80
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{port}"


# --- targets and service -------------------------------------------------------------------


class TargetsConfig(_Section):
    """Which processes are watched: all, or only ``pids`` and their descendants."""

    pids: list[Annotated[int, Field(gt=0, le=1 << 22)]] = []  # PID_MAX_LIMIT

    @field_validator("pids")
    @classmethod
    def _pids(cls, value: list[int]) -> list[int]:
        return _unique(value, "pid")


class PipelineConfig(_Section):
    """Which receivers feed one signal, through which processors (in order), to which exporters."""

    receivers: list[str]
    processors: list[str] = []
    exporters: list[str]

    @field_validator("receivers", "exporters")
    @classmethod
    def _not_empty(cls, value: list[str], info: ValidationInfo) -> list[str]:
        if not value:
            raise ValueError(f"a pipeline needs at least one of its {info.field_name}")
        return _unique(value, info.field_name.removesuffix("s"))

    @field_validator("processors")
    @classmethod
    def _processors(cls, value: list[str]) -> list[str]:
        return _unique(value, "processor")


class PipelinesConfig(_Section):
    traces: PipelineConfig | None = None
    metrics: PipelineConfig | None = None
    profiles: PipelineConfig | None = None


class TelemetryConfig(_Section):
    """The agent's own rhythm: metric export period, ring-buffer drain period, log level."""

    metrics_interval: PositiveDuration = 10_000_000_000
    drain_interval: PositiveDuration = 50_000_000
    log_level: Literal["debug", "info", "warning", "error"] = "info"


class ServiceConfig(_Section):
    pipelines: PipelinesConfig
    telemetry: TelemetryConfig = TelemetryConfig()


_COMPONENT_KINDS: dict[str, dict[str, type[BaseModel]]] = {
    "receivers": RECEIVER_TYPES,
    "processors": PROCESSOR_TYPES,
    "exporters": EXPORTER_TYPES,
}


def component_type(name: str) -> str:
    """The type part of a component name: ``otlp/tempo`` -> ``otlp``."""
    return name.split("/", 1)[0]


def _error(kind: str, message: str, loc: OptionPath, value: object) -> dict[str, Any]:
    """A validation error of our own ``kind`` (braces escaped: pydantic formats messages)."""
    template = message.replace("{", "{{").replace("}", "}}")
    return {"type": PydanticCustomError(kind, template), "loc": loc, "input": value}


_STANDARD_ERROR_TYPES = frozenset(get_args(ErrorType))  # pydantic's own; others are ours


def _carried(error: Mapping[str, Any], prefix: OptionPath) -> dict[str, Any]:
    """A nested validation error re-raised one level up, its location prefixed."""
    loc = (*prefix, *error["loc"])
    if error["type"] not in _STANDARD_ERROR_TYPES:
        return _error(error["type"], error["msg"], loc, error["input"])
    carried = {"type": error["type"], "loc": loc, "input": error["input"]}
    if "ctx" in error:
        carried["ctx"] = error["ctx"]
    return carried


class Config(_Section):
    """A validated configuration. Build it with ``load_config`` or ``load_config_text``."""

    receivers: dict[str, ReceiverConfig] = {}
    processors: dict[str, ProcessorConfig] = {}
    exporters: dict[str, ExporterConfig] = {}
    targets: TargetsConfig = TargetsConfig()
    service: ServiceConfig

    @field_validator("receivers", "processors", "exporters", mode="before")
    @classmethod
    def _components(cls, value: object, info: ValidationInfo) -> object:
        """Validate each ``type[/name]`` entry against its type's model."""
        kind = info.field_name
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            return value
        types = _COMPONENT_KINDS[kind]
        singular = kind.removesuffix("s")
        built: dict[str, BaseModel] = {}
        errors: list[dict[str, Any]] = []
        for name, body in value.items():
            if not isinstance(name, str):
                message = f"{singular} names are strings like 'type' or 'type/name'"
                errors.append(_error("component_name", message, (str(name),), name))
                continue
            type_, slash, suffix = name.partition("/")
            if type_ not in types:
                allowed = ", ".join(sorted(types))
                message = f"unknown {singular} type {type_!r}{_suggest(type_, types)}; allowed types: {allowed}"
                errors.append(_error("unknown_component", message, (name,), body))
                continue
            if slash and (kind == "receivers" or not suffix or suffix.strip() != suffix or "/" in suffix):
                why = (
                    "a probe family is loaded once, so receivers take no /name"
                    if kind == "receivers"
                    else "write type or type/name with a non-empty name"
                )
                errors.append(_error("component_name", f"invalid {singular} name {name!r}: {why}", (name,), body))
                continue
            try:
                built[name] = types[type_].model_validate({} if body is None else body)
            except ValidationError as exc:
                errors.extend(_carried(e, (name,)) for e in exc.errors())
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        return built

    @model_validator(mode="wrap")
    @classmethod
    def _cross_check(cls, data: Any, handler: Callable[[Any], Config]) -> Config:
        """Pipelines exist and name only defined components (checked on the raw input, so these
        errors are listed with any others), and every OTLP exporter in use has a URL."""
        errors = _reference_errors(data) if isinstance(data, Mapping) else []
        try:
            config = handler(data)
        except ValidationError as exc:
            if not errors:
                raise
            carried = [_carried(e, ()) for e in exc.errors()]
            raise ValidationError.from_exception_data(cls.__name__, [*carried, *errors]) from None
        for signal in config.pipeline_signals():
            for name in config.pipeline(signal).exporters:  # type: ignore[union-attr]
                missing = _missing_endpoint(config.exporters.get(name), signal)
                if missing:
                    message = f"{missing} (the {signal} pipeline uses this exporter)"
                    errors.append(_error("missing_endpoint", message, ("exporters", name, "endpoint"), None))
        errors.extend(_profile_pipeline_errors(config))
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        return config

    # --- accessors the agent uses ---

    def pipeline(self, signal: Signal) -> PipelineConfig | None:
        """The pipeline for ``signal``, or None if the signal is not exported."""
        return getattr(self.service.pipelines, signal)

    def pipeline_signals(self) -> list[Signal]:
        """The signals that have a pipeline, in ``PIPELINE_SIGNALS`` order."""
        return [s for s in PIPELINE_SIGNALS if self.pipeline(s) is not None]  # type: ignore[misc]

    def enabled_receivers(self) -> set[str]:
        """Receivers named by at least one pipeline: the probe families to load."""
        return {name for s in self.pipeline_signals() for name, _ in self.pipeline_receivers(s)}

    def pipeline_receivers(self, signal: Signal) -> list[tuple[str, ReceiverConfig]]:
        pipeline = self.pipeline(signal)
        return [(n, self.receivers[n]) for n in pipeline.receivers] if pipeline else []

    def pipeline_processors(self, signal: Signal) -> list[tuple[str, ProcessorConfig]]:
        """The pipeline's processors in the order they run."""
        pipeline = self.pipeline(signal)
        return [(n, self.processors[n]) for n in pipeline.processors] if pipeline else []

    def pipeline_exporters(self, signal: Signal) -> list[tuple[str, ExporterConfig]]:
        pipeline = self.pipeline(signal)
        return [(n, self.exporters[n]) for n in pipeline.exporters] if pipeline else []

    def resource_attributes(self, signal: Signal) -> dict[str, str | bool | int | float]:
        """Attributes the pipeline's ``resource`` processors add (a later processor wins a key)."""
        merged: dict[str, str | bool | int | float] = {}
        for _, processor in self.pipeline_processors(signal):
            if isinstance(processor, ResourceProcessorConfig):
                merged.update(processor.attributes)
        return merged


def _reference_errors(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Pipelines that are missing or name components the config does not define."""
    service = data.get("service")
    pipelines = service.get("pipelines") if isinstance(service, Mapping) else None
    if not isinstance(pipelines, Mapping):
        return []  # reported as a missing or mistyped option
    errors = []
    if not any(isinstance(pipelines.get(s), Mapping) for s in PIPELINE_SIGNALS):
        message = "no pipelines: define traces, metrics and/or profiles here"
        errors.append(_error("no_pipelines", message, ("service", "pipelines"), None))
    for signal in PIPELINE_SIGNALS:
        pipeline = pipelines.get(signal)
        for kind in ("receivers", "processors", "exporters") if isinstance(pipeline, Mapping) else ():
            names = pipeline.get(kind)
            section = data.get(kind)
            defined = sorted(str(n) for n in section) if isinstance(section, Mapping) else []
            for index, name in enumerate(names if isinstance(names, list) else ()):
                if isinstance(name, str) and name not in defined:
                    singular = kind.removesuffix("s")
                    message = (
                        f"{singular} {name!r} is not defined under {kind}{_suggest(name, defined)}; "
                        f"defined {kind}: {', '.join(defined) or 'none'}"
                    )
                    where = ("service", "pipelines", signal, kind, index)
                    errors.append(_error("undefined_component", message, where, name))
    return errors


def _profile_pipeline_errors(config: Config) -> list[dict[str, Any]]:
    """Profiles go only from profile receivers to file or pyroscope exporters; the other
    pipelines take neither; CUDA memory profiles need the cuda receiver's probes."""
    errors = []
    for signal in config.pipeline_signals():
        pipeline = config.pipeline(signal)
        profiles = signal == "profiles"
        for index, name in enumerate(pipeline.receivers):  # type: ignore[union-attr]
            if isinstance(config.receivers.get(name), PROFILE_RECEIVERS) != profiles:
                why = (f"receiver {name!r} produces no profiles" if profiles
                       else f"receiver {name!r} produces profiles only: name it in service.pipelines.profiles")
                errors.append(_error("wrong_signal", why, ("service", "pipelines", signal, "receivers", index), name))
        for index, name in enumerate(pipeline.exporters):  # type: ignore[union-attr]
            exporter = config.exporters.get(name)
            if profiles and not isinstance(exporter, (FileExporterConfig, PyroscopeExporterConfig)):
                why = f"exporter {name!r} cannot export profiles: use a file or pyroscope exporter"
            elif not profiles and isinstance(exporter, PyroscopeExporterConfig):
                why = f"exporter {name!r} (pyroscope) exports profiles only: name it in service.pipelines.profiles"
            else:
                continue
            errors.append(_error("wrong_signal", why, ("service", "pipelines", signal, "exporters", index), name))
    uses_cuda = any(isinstance(cfg, CudaReceiverConfig) for s in config.pipeline_signals()
                    for _, cfg in config.pipeline_receivers(s))
    for name, cfg in config.pipeline_receivers("profiles"):  # type: ignore[arg-type]
        if isinstance(cfg, ProfilingReceiverConfig) and cfg.cuda_memory and not uses_cuda:
            why = ("CUDA memory profiles need the cuda receiver's probes: add the cuda receiver to a pipeline, "
                   "or set cuda_memory: false")
            errors.append(_error("needs_cuda", why, ("receivers", name, "cuda_memory"), True))
    return errors


def _missing_endpoint(exporter: ExporterConfig | None, signal: Signal) -> str | None:
    if isinstance(exporter, PyroscopeExporterConfig) and exporter.endpoint is None:
        return "no endpoint: set endpoint here or PYROSCOPE_SERVER_ADDRESS"
    if isinstance(exporter, OtlpExporterConfig) and exporter.endpoint is None:
        return "no endpoint: set endpoint here or OTEL_EXPORTER_OTLP_ENDPOINT"
    if isinstance(exporter, OtlpHttpExporterConfig) and exporter.endpoint is None:
        if (exporter.traces_endpoint if signal == "traces" else exporter.metrics_endpoint) is None:
            return (
                f"no endpoint: set endpoint or {signal}_endpoint here, or OTEL_EXPORTER_OTLP_ENDPOINT / "
                f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT"
            )
    return None


def _suggest(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


# ---------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------

DEFAULT_CONFIG_YAML = """\
receivers:
  cuda:
    libraries: [cudart, cuda]
    search_paths:
      - /usr/local/cuda*/lib64/libcudart.so*
      - /usr/lib/x86_64-linux-gnu/libcudart.so*
      - /opt/conda/lib/libcudart.so*
      - /opt/conda/envs/*/lib/libcudart.so*
      - /opt/conda/lib/python3*/site-packages/nvidia/cuda_runtime/lib/libcudart.so*
      - /usr/local/lib/python3*/dist-packages/nvidia/cuda_runtime/lib/libcudart.so*
      - /usr/local/lib/python3*/site-packages/nvidia/cuda_runtime/lib/libcudart.so*
      # CUDA 13 wheels (PyTorch cu130 loads its runtime from nvidia/cu13/lib)
      - /opt/conda/lib/python3*/site-packages/nvidia/cu1[3-9]/lib/libcudart.so*
      - /usr/local/lib/python3*/dist-packages/nvidia/cu1[3-9]/lib/libcudart.so*
      - /usr/local/lib/python3*/site-packages/nvidia/cu1[3-9]/lib/libcudart.so*
      - /usr/lib/x86_64-linux-gnu/libcuda.so*
      - /usr/lib/aarch64-linux-gnu/libcuda.so*
      - /usr/lib64/libcuda.so*
      - /usr/local/nvidia/lib64/libcuda.so*
    launch_sample_every: 0
    launch_errors: false
    min_span_duration: 0us
    ring_buffer_size: 16MiB
    top_kernels: 20
    max_spans_per_second: 20000
    symbol_names: 65536
    symbol_tables: 128
  http:
    processes: gpu
    ports: []
    payload_size: 4KiB
    ring_buffer_size: 16MiB
    capture_headers: []
    redact_headers: []
    max_spans_per_second: 20000
  profiling:
    sample_rate: 99
    interval: 10s
    python: true
    max_python_frames: 64
    cuda_memory: true
    stack_map_entries: 16384
    sample_map_entries: 16384
    code_map_entries: 16384
    live_allocations: 262144
    symbol_tables: 128
  nccl:
    search_paths:
      - /usr/lib/x86_64-linux-gnu/libnccl.so*
      - /usr/lib/aarch64-linux-gnu/libnccl.so*
      - /usr/lib64/libnccl.so*
      - /usr/local/cuda*/lib64/libnccl.so*
      - /opt/conda/lib/libnccl.so*
      - /opt/conda/envs/*/lib/libnccl.so*
      - /opt/conda/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so*
      - /usr/local/lib/python3*/dist-packages/nvidia/nccl/lib/libnccl.so*
      - /usr/local/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so*
    ring_buffer_size: 1MiB
    straggler_threshold: 1ms
    completion_timeout: 30s
    max_spans_per_second: 20000
  ibverbs:
    search_paths:
      - /usr/lib/x86_64-linux-gnu/libibverbs.so*
      - /usr/lib/aarch64-linux-gnu/libibverbs.so*
      - /usr/lib64/libibverbs.so*
      - /usr/lib/libibverbs.so*
      - /opt/conda/lib/libibverbs.so*
      - /opt/conda/envs/*/lib/libibverbs.so*
    data_path: true
    slow_completion: 1ms
    max_queue_pairs: 16384
    ring_buffer_size: 1MiB
    max_spans_per_second: 20000
processors:
  batch:
    timeout: 1s
    send_batch_size: 512
    max_queue_size: 8192
  resource:
    attributes: {}
exporters:
  file:
    directory: ./otelbpf-out
    rotate_size: 64MiB
    file_mode: "0600"
    dir_mode: "0700"
targets:
  pids: []
service:
  pipelines:
    traces:
      receivers: [cuda, http, nccl, ibverbs]
      processors: [batch, resource]
      exporters: [file]
    metrics:
      receivers: [cuda, http, nccl, ibverbs]
      processors: [batch, resource]
      exporters: [file]
    profiles:
      receivers: [profiling]
      processors: [resource]
      exporters: [file]
  telemetry:
    metrics_interval: 10s
    drain_interval: 50ms
    log_level: info
"""
"""The built-in configuration, used when no file is given; ``config/otelbpf.yaml`` is the
same configuration with every option documented (a test keeps them equal)."""

DEFAULT_SOURCE = "<built-in default>"


def load_config(
    path: str | os.PathLike[str] | None, env: Mapping[str, str] = os.environ, receivers: str | None = None
) -> Config:
    """The configuration from the YAML file at ``path``, or the built-in default when ``path``
    is None; ``env`` supplies ``${env:...}`` substitutions and the ``OTEL_*`` variables.
    ``receivers`` (``--receivers``), else ``OTELBPF_RECEIVERS`` in ``env``: a comma-separated
    choice of receivers that replaces the pipelines' (see ``_choose_receivers``).
    Raises ConfigError listing every problem."""
    chosen = receivers if receivers is not None else env.get("OTELBPF_RECEIVERS") or None
    if path is None:
        return _build(DEFAULT_CONFIG_YAML, DEFAULT_SOURCE, env, from_file=False, receivers=chosen)
    source = os.fspath(path)
    try:
        with open(source, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)  # never more: it may be /dev/zero or 60 MB
        text = raw.decode("utf-8")
    except FileNotFoundError:
        example = "see config/otelbpf.yaml for a documented example"
        raise ConfigError(source, [f"{source}: no such file; {example}"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(source, [f"{source}: cannot read: {exc}"]) from None
    return _build(text, source, env, from_file=True, receivers=chosen)


def load_config_text(text: str, *, source: str = "<string>", env: Mapping[str, str] = os.environ) -> Config:
    """Like ``load_config`` for a file whose contents are ``text``; ``source`` names it in errors."""
    return _build(text, source, env, from_file=True)


@dataclass
class _Findings:
    """What assembling the raw config found: problems at option paths (None: not in the file)
    and, per option path, the variable or ``${env:...}`` reference its value came from."""

    issues: list[tuple[OptionPath | None, str]] = field(default_factory=list)
    origins: dict[OptionPath, str] = field(default_factory=dict)


def _build(text: str, source: str, env: Mapping[str, str], *, from_file: bool, receivers: str | None = None) -> Config:
    data, root = _parse_yaml(text, source)
    found = _Findings()
    data = _substitute(data, (), env, found)
    if receivers is not None:
        _choose_receivers(data, receivers, found)
    variables = {k: v for k, v in env.items() if k.startswith("OTEL_") and v != ""}
    if not from_file:
        _route_signals_to_otlp(data, variables, found)
    pyroscope = {k: v for k, v in env.items() if k.startswith("PYROSCOPE_") and v != ""}
    if not from_file:
        _route_profiles_to_pyroscope(data, pyroscope)
    _fill_pyroscope(data, pyroscope, found)
    _fill_exporters(data, variables, found)
    _fill_resource(data, variables, found)
    _fill_telemetry(data, variables, found, override=not from_file)
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        reported = [p for p, _ in found.issues if p is not None]
        for error in exc.errors():
            path = tuple(error["loc"])
            if any(path[: len(p)] == p for p in reported):
                continue  # a value already reported (an unset ${env:VAR}) fails again: say it once
            origin = found.origins.get(path)
            found.issues.append((path, _describe(error) + (f" (value from {origin})" if origin else "")))
    else:
        if not found.issues:
            return config
    file_root = root if from_file else None  # positions in the built-in default would only confuse
    lines = [_format_issue(path, message, source, file_root, found.origins) for path, message in found.issues]
    raise ConfigError(source, list(dict.fromkeys(lines)))


#: Receivers a ``--receivers`` list may name; profiling feeds the profiles pipeline.
CHOOSABLE_RECEIVERS = ("cuda", "http", "nccl", "ibverbs", "profiling")


def _choose_receivers(data: dict[str, Any], chosen: str, found: _Findings) -> None:
    """``--receivers cuda,http`` / ``OTELBPF_RECEIVERS``: the traces and metrics pipelines
    take the chosen receivers but ``profiling``; the profiles pipeline exists only when
    ``profiling`` is chosen (exporting to the file exporter when the config has no profiles
    pipeline). A chosen receiver the config does not define runs with its defaults."""
    names = [n.strip() for n in chosen.split(",") if n.strip()]
    unknown = [n for n in names if n not in CHOOSABLE_RECEIVERS]
    if unknown or not names:
        found.issues.append((None, f"--receivers / OTELBPF_RECEIVERS: {', '.join(map(repr, unknown)) or 'empty'}: "
                                   f"name some of {', '.join(CHOOSABLE_RECEIVERS)}"))
        return
    names = list(dict.fromkeys(names))
    receivers = data.setdefault("receivers", {}) or {}
    data["receivers"] = receivers
    for n in names:
        receivers.setdefault(n, {})
    pipelines = data.setdefault("service", {}).setdefault("pipelines", {})
    signal_receivers = [n for n in names if n != "profiling"]
    for signal in ("traces", "metrics"):
        if signal_receivers and signal in pipelines:
            pipelines[signal]["receivers"] = signal_receivers
        elif not signal_receivers:
            pipelines.pop(signal, None)
    if "profiling" in names:
        if "profiles" not in pipelines:
            data.setdefault("exporters", {}).setdefault("file", {})
            pipelines["profiles"] = {"receivers": ["profiling"], "exporters": ["file"]}
    else:
        pipelines.pop("profiles", None)


def printable(config: Config) -> str:
    """The effective configuration as YAML (sizes in bytes, durations in nanoseconds), with
    header values, passwords and tokens replaced: what ``otelbpf run --print-config`` shows."""

    def scrub(value: Any, key: str = "") -> Any:
        if isinstance(value, dict):
            if key == "headers":
                return {k: "<redacted>" for k in value}
            return {k: scrub(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [scrub(v) for v in value]
        if value is not None and any(w in key for w in ("password", "token")):
            return "<redacted>"
        return value

    return yaml.safe_dump(scrub(config.model_dump(mode="json", exclude_none=True)), sort_keys=False)


# --- YAML ---------------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, Hashable):
                continue
            if key in seen:
                first = seen[key].line + 1
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first written on line {first})", key_node.start_mark
                )
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep)


#: Limits checked before a document is built, so that no config can exhaust the host: a
#: real config is a few KiB, ~8 levels deep and a few hundred nodes. ``MAX_CONFIG_NODES``
#: counts nodes as aliases expand them (an alias bomb's 10 levels of 10 aliases are 10^10).
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_DEPTH = 32
MAX_CONFIG_NODES = 100_000


def _check_shape(text: str, source: str) -> None:
    """Size, nesting depth and alias-expanded node count, on the event stream (which PyYAML
    produces with a loop and bounded memory; building the document recurses and expands
    aliases). Raises ConfigError at the first limit passed."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(source, [f"{source}: larger than {format_size(MAX_CONFIG_BYTES)}: not a config file"])
    anchors: dict[str, int] = {}
    open_nodes: list[list[Any]] = [[None, 0]]  # [anchor, nodes so far] per open collection
    loader = yaml.SafeLoader(text)
    try:
        while loader.check_event():
            event = loader.get_event()
            if isinstance(event, yaml.CollectionStartEvent):
                open_nodes.append([event.anchor, 1])
                if len(open_nodes) - 1 > MAX_CONFIG_DEPTH:
                    _shape_error(source, event, f"nested more than {MAX_CONFIG_DEPTH} levels deep")
                continue
            if isinstance(event, yaml.CollectionEndEvent):
                anchor, count = open_nodes.pop()
            elif isinstance(event, yaml.ScalarEvent):
                anchor, count = event.anchor, 1
            elif isinstance(event, yaml.AliasEvent):
                anchor, count = None, anchors.get(event.anchor, 1)
            else:
                continue
            if anchor is not None:
                anchors[anchor] = count
            open_nodes[-1][1] += count
            if open_nodes[-1][1] > MAX_CONFIG_NODES:
                _shape_error(source, event, f"more than {MAX_CONFIG_NODES} values once YAML aliases (*name) "
                             "are expanded: an alias bomb, or a config that is not one")
    finally:
        loader.dispose()


def _shape_error(source: str, event: yaml.Event, what: str) -> None:
    mark = event.start_mark
    raise ConfigError(source, [f"{source}:{mark.line + 1}:{mark.column + 1}: {what}"])


def _parse_yaml(text: str, source: str) -> tuple[dict[str, Any], yaml.Node]:
    loader = None
    try:
        _check_shape(text, source)
        loader = _Loader(text)
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        raise ConfigError(source, [f"{where}: invalid YAML: {exc.problem or exc.context}"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError(source, [f"{source}: invalid YAML: {exc}"]) from None
    finally:
        if loader is not None:
            loader.dispose()
    if root is None:
        raise ConfigError(source, [f"{source}: the file is empty; see config/otelbpf.yaml for a documented example"])
    if not isinstance(data, dict):
        where = f"{source}:{root.start_mark.line + 1}:{root.start_mark.column + 1}"
        sections = "receivers, processors, exporters, targets and service"
        raise ConfigError(source, [f"{where}: the top level must be a mapping with {sections}"])
    return data, root


def _node_at(root: yaml.Node, path: OptionPath) -> yaml.Node:
    """The deepest YAML node along ``path`` (a mapping entry's key node, a sequence's item)."""
    node, found = root, root
    for part in path:
        if isinstance(node, yaml.MappingNode):
            keys = (entry for entry in node.value if isinstance(entry[0], yaml.ScalarNode))
            entry = next((e for e in keys if e[0].value == str(part)), None)
            if entry is None:
                break
            found, node = entry
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            found = node = node.value[part]
        else:
            break
    return found


# --- ${env:VAR} substitution -----------------------------------------------------------------

_REFERENCE = re.compile(r"\$\$|\$\{([^}]*)\}")
_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _substitute(value: Any, path: OptionPath, env: Mapping[str, str], found: _Findings) -> Any:
    """``value`` with every ``${env:VAR}``-style reference in its strings replaced."""
    if isinstance(value, dict):
        return {k: _substitute(v, (*path, k), env, found) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, (*path, i), env, found) for i, v in enumerate(value)]
    if not isinstance(value, str) or "$" not in value:
        return value

    def replace(match: re.Match[str]) -> str:
        reference = match.group(0)
        if reference == "$$":
            return "$"
        body = match.group(1)
        provider, colon, rest = body.partition(":")
        if colon and not rest.startswith("-"):
            if provider != "env":
                message = f"{reference}: unsupported provider {provider!r}; only ${{env:VAR}} is supported"
                found.issues.append((path, message))
                return ""
            body = rest
        name, _, default = body.partition(":-")
        if not _VAR_NAME.fullmatch(name):
            found.issues.append((path, f"{reference}: {name!r} is not a variable name (write ${{env:NAME}} or "
                                       f"${{env:NAME:-default}}; $$ for a literal $)"))
            return ""
        found.origins[path] = reference
        current = env.get(name)
        if ":-" in body and not current:
            return default
        if current is None:
            found.issues.append((path, f"environment variable {name} is not set (used as {reference}); "
                                       f"set it, or give a default: ${{env:{name}:-value}}"))
            return ""
        return current

    return _REFERENCE.sub(replace, value)


# --- standard OTEL_* variables --------------------------------------------------------------


def _parse_pairs(variable: str, text: str) -> dict[str, str]:
    """``k=v,k2=v2`` with percent-encoded keys and values (the W3C baggage-like OTel format)."""
    pairs: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, eq, value = item.partition("=")
        key = urllib.parse.unquote(key.strip())
        if not eq or not key:
            raise ValueError(f"{variable}: {item.strip()!r} is not key=value; write {variable}=key1=value1,key2=value2")
        pairs[key] = urllib.parse.unquote(value.strip())
    return pairs


def _parse_millis(variable: str, text: str) -> str:
    if not text.strip().isdigit():
        raise ValueError(f"{variable}: {text!r} is not a whole number of milliseconds (e.g. {variable}=10000)")
    return f"{int(text)}ms"


def _parse_bool(variable: str, text: str) -> bool:
    if text.strip().lower() not in ("true", "false"):
        raise ValueError(f"{variable}: {text!r} is not true or false")
    return text.strip().lower() == "true"


def _as_is(variable: str, text: str) -> str:
    return text


Key: TypeAlias = tuple[str, ...]
Settings: TypeAlias = dict[Key, tuple[str, Any]]  # option key path -> (variable, value)

# (variable suffix, option key path in the exporter, parser, exporter types it applies to)
_EXPORTER_VARIABLES: tuple[tuple[str, Key, Callable[[str, str], Any], tuple[str, ...]], ...] = (
    ("HEADERS", ("headers",), _parse_pairs, ("otlp", "otlphttp")),
    ("TIMEOUT", ("timeout",), _parse_millis, ("otlp", "otlphttp")),
    ("COMPRESSION", ("compression",), _as_is, ("otlp", "otlphttp")),
    ("INSECURE", ("tls", "insecure"), _parse_bool, ("otlp",)),
    ("CERTIFICATE", ("tls", "ca_file"), _as_is, ("otlp", "otlphttp")),
    ("CLIENT_CERTIFICATE", ("tls", "cert_file"), _as_is, ("otlp", "otlphttp")),
    ("CLIENT_KEY", ("tls", "key_file"), _as_is, ("otlp", "otlphttp")),
)


def _variable(variables: Mapping[str, str], suffix: str, signals: set[str]) -> str | None:
    """The signal-specific variable for an exporter serving one signal, else the generic one."""
    if len(signals) == 1:
        specific = f"OTEL_EXPORTER_OTLP_{next(iter(signals)).upper()}_{suffix}"
        if specific in variables:
            return specific
    generic = f"OTEL_EXPORTER_OTLP_{suffix}"
    return generic if generic in variables else None


def _exporter_settings(type_: str, signals: set[str], variables: Mapping[str, str]) -> tuple[Settings, list[str]]:
    """What the OTEL_EXPORTER_OTLP_* variables say for one exporter, and the malformed ones."""
    settings: Settings = {}
    problems: list[str] = []
    if type_ == "otlp":
        name = _variable(variables, "ENDPOINT", signals)
        if name:
            settings[("endpoint",)] = (name, variables[name])
    else:
        if "OTEL_EXPORTER_OTLP_ENDPOINT" in variables:
            settings[("endpoint",)] = ("OTEL_EXPORTER_OTLP_ENDPOINT", variables["OTEL_EXPORTER_OTLP_ENDPOINT"])
        for signal in sorted(signals):
            name = f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT"
            if name in variables:
                settings[(f"{signal}_endpoint",)] = (name, variables[name])
    for suffix, key, parse, types in _EXPORTER_VARIABLES:
        name = _variable(variables, suffix, signals)
        if name and type_ in types:
            try:
                settings[key] = (name, parse(name, variables[name]))
            except ValueError as exc:
                problems.append(str(exc))
    return settings, problems


def _route_signals_to_otlp(data: dict[str, Any], variables: Mapping[str, str], found: _Findings) -> None:
    """Without a file: each signal with an endpoint variable exports to an OTLP exporter, one
    exporter for both signals where the variables say the same for each, else one per signal."""
    routes: dict[Signal, str] = {}
    for signal in SIGNALS:
        upper = signal.upper()
        if f"OTEL_EXPORTER_OTLP_{upper}_ENDPOINT" not in variables and "OTEL_EXPORTER_OTLP_ENDPOINT" not in variables:
            continue
        names = (f"OTEL_EXPORTER_OTLP_{upper}_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
        name = next((n for n in names if n in variables), None)
        protocol = variables[name] if name else "grpc"
        if protocol not in ("grpc", "http/protobuf"):
            why = "OTLP/JSON over HTTP is not supported" if protocol == "http/json" else "unknown protocol"
            found.issues.append((None, f"{name}={protocol}: {why}; use grpc or http/protobuf"))
            continue
        routes[signal] = "otlp" if protocol == "grpc" else "otlphttp"
    if not routes:
        return
    shared = len(routes) == 2 and routes["traces"] == routes["metrics"] and all(
        _shared_settings(routes[s], {s}, variables) == _shared_settings(routes[s], set(SIGNALS), variables)
        for s in SIGNALS
    )
    pipelines = data["service"]["pipelines"]
    for signal, type_ in routes.items():
        name = type_ if shared or list(routes.values()).count(type_) == 1 else f"{type_}/{signal}"
        data["exporters"][name] = {}
        pipelines[signal]["exporters"] = [name]
    used = {n for p in pipelines.values() for n in p["exporters"]}
    data["exporters"] = {n: e for n, e in data["exporters"].items() if n in used}


def _route_profiles_to_pyroscope(data: dict[str, Any], variables: Mapping[str, str]) -> None:
    """Without a file: PYROSCOPE_SERVER_ADDRESS (what Pyroscope's own SDKs read) sends the
    profiles pipeline to a pyroscope exporter instead of files."""
    profiles = _pipelines(data).get("profiles")
    if "PYROSCOPE_SERVER_ADDRESS" not in variables or not isinstance(profiles, dict):
        return
    data["exporters"]["pyroscope"] = {}
    profiles["exporters"] = ["pyroscope"]


_PYROSCOPE_VARIABLES: tuple[tuple[str, Key], ...] = (
    ("PYROSCOPE_SERVER_ADDRESS", ("endpoint",)),
    ("PYROSCOPE_TENANT_ID", ("tenant_id",)),
)


def _fill_pyroscope(data: dict[str, Any], variables: Mapping[str, str], found: _Findings) -> None:
    """PYROSCOPE_SERVER_ADDRESS, PYROSCOPE_BASIC_AUTH_USER / _PASSWORD and PYROSCOPE_TENANT_ID
    fill what pyroscope exporters leave unset."""
    exporters = data.get("exporters")
    if not isinstance(exporters, dict):
        return
    for name, body in list(exporters.items()):
        if not isinstance(name, str) or component_type(name) != "pyroscope":
            continue
        if body is None:
            body = exporters[name] = {}
        if not isinstance(body, dict):
            continue
        for variable, key in _PYROSCOPE_VARIABLES:
            if variable in variables:
                _fill(body, key, variables[variable], ("exporters", name, *key), variable, found)
        user = variables.get("PYROSCOPE_BASIC_AUTH_USER")
        if user and body.get("basic_auth") is None and body.get("bearer_token") is None:
            password = variables.get("PYROSCOPE_BASIC_AUTH_PASSWORD", "")
            _fill(body, ("basic_auth",), {"username": user, "password": password},
                  ("exporters", name, "basic_auth"), "PYROSCOPE_BASIC_AUTH_USER", found)


def _shared_settings(type_: str, signals: set[str], variables: Mapping[str, str]) -> dict[Key, Any]:
    """An exporter's settings less its per-signal URLs (one otlphttp exporter holds both)."""
    settings = _exporter_settings(type_, signals, variables)[0]
    return {k: v for k, (_, v) in settings.items() if k not in (("traces_endpoint",), ("metrics_endpoint",))}


def _pipelines(data: Mapping[str, Any]) -> dict[Any, Any]:
    """The raw ``service.pipelines`` mapping, or {} where the file has none or a malformed one."""
    service = data.get("service")
    pipelines = service.get("pipelines") if isinstance(service, dict) else None
    return pipelines if isinstance(pipelines, dict) else {}


def _fill_exporters(data: dict[str, Any], variables: Mapping[str, str], found: _Findings) -> None:
    """Give otlp/otlphttp exporters what OTEL_EXPORTER_OTLP_* say, where the file is silent."""
    exporters = data.get("exporters")
    if not isinstance(exporters, dict):
        return
    served: dict[str, set[str]] = {}
    for signal, pipeline in _pipelines(data).items():
        names = pipeline.get("exporters") if isinstance(pipeline, dict) else None
        for name in names if isinstance(names, list) else ():
            if isinstance(name, str):
                served.setdefault(name, set()).add(str(signal))
    for name, body in list(exporters.items()):
        type_ = component_type(name) if isinstance(name, str) else None
        if type_ not in ("otlp", "otlphttp"):
            continue
        if body is None:
            body = exporters[name] = {}
        if not isinstance(body, dict):
            continue
        settings, problems = _exporter_settings(type_, served.get(name, set()), variables)
        found.issues.extend((None, p) for p in problems)
        for key, (variable, value) in settings.items():
            if key == ("tls", "insecure") and isinstance(body.get("endpoint"), str) and _scheme(body["endpoint"]):
                continue  # the spec: INSECURE applies only to an endpoint without http(s)://
            _fill(body, key, value, ("exporters", name, *key), variable, found)


def _fill(body: dict[str, Any], key: Key, value: Any, path: OptionPath, variable: str, found: _Findings) -> None:
    """Set ``body[key...] = value`` unless the file set it; a mapping gains only missing keys."""
    *parents, last = key
    for part in parents:
        if body.get(part) is None:
            body[part] = {}
        body = body[part]
        if not isinstance(body, dict):
            return
    current = body.get(last)
    if isinstance(value, dict):
        if current is None:
            current = body[last] = {}
        for k, v in value.items() if isinstance(current, dict) else ():
            if k not in current:
                current[k] = v
                found.origins[(*path, k)] = variable
    elif current is None:
        body[last] = value
        found.origins[path] = variable


def _fill_resource(data: dict[str, Any], variables: Mapping[str, str], found: _Findings) -> None:
    """OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME into the ``resource`` processor, which
    every pipeline then runs."""
    attributes: dict[str, tuple[str, str]] = {}
    if "OTEL_RESOURCE_ATTRIBUTES" in variables:
        try:
            pairs = _parse_pairs("OTEL_RESOURCE_ATTRIBUTES", variables["OTEL_RESOURCE_ATTRIBUTES"])
        except ValueError as exc:
            found.issues.append((None, str(exc)))
            return
        attributes = {k: ("OTEL_RESOURCE_ATTRIBUTES", v) for k, v in pairs.items()}
    if "OTEL_SERVICE_NAME" in variables:
        attributes["service.name"] = ("OTEL_SERVICE_NAME", variables["OTEL_SERVICE_NAME"])
    if not attributes:
        return
    if data.get("processors") is None:
        data["processors"] = {}
    if not isinstance(data["processors"], dict):
        return
    path = ("processors", "resource", "attributes")
    for key, (variable, value) in attributes.items():
        _fill(data["processors"], path[1:], {key: value}, path, variable, found)
    for pipeline in _pipelines(data).values():
        if isinstance(pipeline, dict):
            names = pipeline.setdefault("processors", [])
            if isinstance(names, list) and "resource" not in names:
                names.append("resource")


def _fill_telemetry(data: dict[str, Any], variables: Mapping[str, str], found: _Findings, *, override: bool) -> None:
    """OTEL_METRIC_EXPORT_INTERVAL (ms) into service.telemetry.metrics_interval: where the file
    leaves it unset, or always over the built-in default (``override``)."""
    variable = "OTEL_METRIC_EXPORT_INTERVAL"
    service = data.get("service")
    if variable not in variables or not isinstance(service, dict):
        return
    try:
        value = _parse_millis(variable, variables[variable])
    except ValueError as exc:
        found.issues.append((None, str(exc)))
        return
    if override and isinstance(service.get("telemetry"), dict):
        service["telemetry"].pop("metrics_interval", None)
    path = ("service", "telemetry", "metrics_interval")
    _fill(service, path[1:], value, path, variable, found)


# --- error messages ---------------------------------------------------------------------------


def _describe(error: Mapping[str, Any]) -> str:
    """One pydantic error as a sentence: the allowed keys for a typo, the got-value otherwise."""
    kind, message, value = error["type"], error["msg"], error.get("input")
    if kind == "extra_forbidden":
        allowed = _allowed_keys(tuple(error["loc"][:-1]))
        key = str(error["loc"][-1])
        return f"unknown option{_suggest(key, allowed)}; allowed: {', '.join(allowed)}" if allowed else "unknown option"
    if kind == "missing":
        return "required option is missing"
    if kind == "value_error":
        return message.removeprefix("Value error, ")
    if kind not in _STANDARD_ERROR_TYPES:
        return message
    shown = f"a {type(value).__name__}" if isinstance(value, (dict, list)) and len(repr(value)) > 60 else repr(value)
    return f"{message.split(', unable to')[0]}, got {shown}"


def _allowed_keys(path: OptionPath) -> list[str]:
    """The option names of the section at ``path`` (for 'did you mean' on unknown keys)."""
    model: type[BaseModel] | None = Config
    parts = list(path)
    while parts and model is not None:
        part = parts.pop(0)
        if model is Config and part in _COMPONENT_KINDS and parts:
            model = _COMPONENT_KINDS[str(part)].get(component_type(str(parts.pop(0))))
            continue
        spec = model.model_fields.get(str(part))
        model = _model_in(spec.annotation) if spec else None
    return list(model.model_fields) if model else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, type(int | None)):
        for member in get_args(annotation):
            found = _model_in(member)
            if found:
                return found
    return None


def _format_path(path: OptionPath) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _format_issue(
    path: OptionPath | None, message: str, source: str, root: yaml.Node | None, origins: Mapping[OptionPath, str]
) -> str:
    """``file:line:col: option.path: message``; no position for what the file did not write."""
    if path is None:
        return message
    where = ""
    if root is not None and origins.get(path, "$").startswith("$"):  # not taken from OTEL_*
        mark = _node_at(root, path).start_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}: "
    return f"{where}{_format_path(path)}: {message}"
