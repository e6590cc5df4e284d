"""Profiles as OTLP profiles (opentelemetry-proto ``profiles/v1development``), the signal the
Collector's ``otlp``/``otlphttp`` exporters and receivers carry in a ``profiles`` pipeline.

- ``otlp`` (gRPC): ``opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export``.
- ``otlphttp``: ``POST {endpoint}/v1development/profiles`` (the Collector's default path for
  the signal, or ``profiles_endpoint`` as given), ``Content-Type: application/x-protobuf``.

Encoding (``encode_request``): one ``ExportProfilesServiceRequest`` per batch with one
``ProfilesDictionary`` shared by all its profiles: strings, mappings, locations, functions,
stacks and attributes each stored once, at an index whose zero entry is the empty value the
format requires. One ``ResourceProfiles`` per watched process, whose resource is the one its
spans and metrics carry (``service.name``, ``process.pid``, ``container.id``, ...), scope
``otelbpf.profiling``. The format has one sample type per ``Profile``: a CPU profile (samples
and CPU time) becomes two OTLP profiles over the same stacks. Frames carry
``profile.frame.type`` (``native``, ``kernel``, ``cpython``); mappings carry their GNU build
id (``process.executable.build_id.gnu``); labels other than those the resource already
says (service, host, pid) become profile attributes.

Sending happens on one thread from a bounded queue, so the profiler hands over and returns:
when the queue is full the oldest profile is dropped and counted
(``otelbpf.export.dropped{signal=profiles,reason=queue_full}``). The OTLP spec's retryable
answers (gRPC UNAVAILABLE, RESOURCE_EXHAUSTED, ...; HTTP 429, 502, 503, 504) and connection
errors are retried with exponential back-off (the server's RetryInfo / Retry-After first)
until ``retry.max_elapsed_time``; other errors are not, and every profile given up on is
counted (``failures`` and ``dropped``). Profiles a server rejects in a partial success are
counted as ``dropped{reason=rejected}`` in OTLP profiles (one per sample type).
"""

from __future__ import annotations

import gzip
import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import Protocol

import grpc
import requests
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2 as service_pb2
from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2_grpc as service_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.profiles.v1development import profiles_pb2
from opentelemetry.proto.resource.v1 import resource_pb2

from otelbpf.base.health import Health
from otelbpf.config import OtlpExporterConfig, OtlpHttpExporterConfig, RetryConfig, to_seconds
from otelbpf.correlate.profile_record import SCOPE, Profile
from otelbpf.correlate.stacks import Frame
from otelbpf.export.encoded_profile import ProfileRecord
from otelbpf.export.sender import Permanent, QueuedExporter, QueuedSender, Retry, retry_after

log = logging.getLogger(__name__)

#: Profile labels the resource already carries (as service.name, host.name, process.pid).
RESOURCE_LABELS = {"service_name": "service.name", "host_name": "host.name", "process_pid": "process.pid"}
FRAME_TYPE = "profile.frame.type"
FRAME_TYPES = {"native": "native", "kernel": "kernel", "python": "cpython"}
BUILD_ID = "process.executable.build_id.gnu"
#: Profile records per request: a CPU profile of a busy process holds thousands of stacks,
#: and a Collector's gRPC server takes 4 MiB per message by default.
BATCH_RECORDS = 16
DEFAULT_QUEUE_SIZE = 256

# The OTLP spec's retryable outcomes.
_RETRY_CODES = {
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DATA_LOSS,
}
_RETRY_HTTP = {429, 502, 503, 504}

# --- encoding ---------------------------------------------------------------------------------


def any_value(value: object) -> common_pb2.AnyValue:
    """An attribute value as OTLP's AnyValue (sequences as arrays, anything else as its text)."""
    if isinstance(value, bool):
        return common_pb2.AnyValue(bool_value=value)
    if isinstance(value, int):
        if -(1 << 63) <= value < 1 << 63:
            return common_pb2.AnyValue(int_value=value)
        return common_pb2.AnyValue(string_value=str(value))
    if isinstance(value, float):
        return common_pb2.AnyValue(double_value=value)
    if isinstance(value, (list, tuple)):
        return common_pb2.AnyValue(array_value=common_pb2.ArrayValue(values=[any_value(v) for v in value]))
    return common_pb2.AnyValue(string_value=str(value))


def _hashable(value: object) -> object:
    return tuple(_hashable(v) for v in value) if isinstance(value, (list, tuple)) else (type(value).__name__, value)


class Dictionary:
    """The ``ProfilesDictionary`` of one request: every table starts with its zero value and
    holds each distinct item once (identity by value, as the format asks)."""

    def __init__(self) -> None:
        self.message = d = profiles_pb2.ProfilesDictionary()
        d.string_table.append("")
        for table in (
            d.mapping_table,
            d.location_table,
            d.function_table,
            d.link_table,
            d.attribute_table,
            d.stack_table,
        ):
            table.add()
        self._strings: dict[str, int] = {"": 0}
        self._mappings: dict[tuple[object, ...], int] = {}
        self._functions: dict[tuple[object, ...], int] = {}
        self._locations: dict[tuple[object, ...], int] = {}
        self._stacks: dict[tuple[int, ...], int] = {}
        self._attributes: dict[tuple[object, ...], int] = {}

    def string(self, text: str) -> int:
        index = self._strings.get(text)
        if index is None:
            index = self._strings[text] = len(self.message.string_table)
            self.message.string_table.append(text)
        return index

    def attribute(self, key: str, value: object, unit: str = "") -> int:
        ident = (key, _hashable(value), unit)
        index = self._attributes.get(ident)
        if index is None:
            index = self._attributes[ident] = len(self.message.attribute_table)
            self.message.attribute_table.add(
                key_strindex=self.string(key), value=any_value(value), unit_strindex=self.string(unit)
            )
        return index

    def attributes(self, attrs: Mapping[str, object]) -> list[int]:
        return [self.attribute(k, v) for k, v in sorted(attrs.items())]

    def _mapping(self, f: Frame) -> int:
        start, end, offset = f.mapping
        if f.kind != "native" or (not f.path and not end):
            return 0
        ident = (f.path, start, end, offset, f.build_id)
        index = self._mappings.get(ident)
        if index is None:
            index = self._mappings[ident] = len(self.message.mapping_table)
            self.message.mapping_table.add(
                memory_start=start,
                memory_limit=end,
                file_offset=offset,
                filename_strindex=self.string(f.path),
                attribute_indices=[self.attribute(BUILD_ID, f.build_id)] if f.build_id else [],
            )
        return index

    def _function(self, f: Frame) -> int:
        ident = (f.function, f.filename, f.start_line)
        index = self._functions.get(ident)
        if index is None:
            index = self._functions[ident] = len(self.message.function_table)
            name = self.string(f.function)
            self.message.function_table.add(
                name_strindex=name,
                system_name_strindex=name,
                filename_strindex=self.string(f.filename),
                start_line=f.start_line,
            )
        return index

    def location(self, f: Frame) -> int:
        mapping = self._mapping(f)
        ident = (f.kind, mapping, f.address, f.function, f.filename, f.line, f.start_line)
        index = self._locations.get(ident)
        if index is None:
            index = self._locations[ident] = len(self.message.location_table)
            kind = FRAME_TYPES.get(f.kind)
            self.message.location_table.add(
                mapping_index=mapping,
                address=f.address,
                lines=[profiles_pb2.Line(function_index=self._function(f), line=f.line)],
                attribute_indices=[self.attribute(FRAME_TYPE, kind)] if kind else [],
            )
        return index

    def stack(self, frames: Sequence[Frame]) -> int:
        """The stack of ``frames`` (leaf first, as OTLP wants them)."""
        locations = tuple(self.location(f) for f in frames)
        index = self._stacks.get(locations)
        if index is None:
            index = self._stacks[locations] = len(self.message.stack_table)
            self.message.stack_table.add(location_indices=locations)
        return index


def resource_of(record: ProfileRecord) -> dict[str, object]:
    """The record's process resource; from its labels where the exporter got none."""
    if record.resource:
        return dict(record.resource)
    out: dict[str, object] = {}
    for label, key in RESOURCE_LABELS.items():
        if label in record.labels:
            value = record.labels[label]
            out[key] = int(value) if key == "process.pid" and str(value).isdigit() else value
    return out


def _resource(attrs: Mapping[str, object]) -> resource_pb2.Resource:
    return resource_pb2.Resource(attributes=[common_pb2.KeyValue(key=k, value=any_value(v)) for k, v in attrs.items()])


def _add_profiles(d: Dictionary, scope: profiles_pb2.ScopeProfiles, profile: Profile) -> int:
    """One OTLP profile per sample type of ``profile``, sharing its stacks; how many were added."""
    extra = {k: v for k, v in profile.labels.items() if k not in RESOURCE_LABELS}
    common = d.attributes(extra)
    rows = []
    for sample in profile.samples:
        own = {k: v for k, v in sample.labels.items() if k not in RESOURCE_LABELS and extra.get(k) != v}
        rows.append((d.stack(sample.frames), d.attributes(own), sample.values))
    period_type = None
    if profile.period_type is not None:
        period_type = profiles_pb2.ValueType(
            type_strindex=d.string(profile.period_type[0]), unit_strindex=d.string(profile.period_type[1])
        )
    for i, (type_, unit) in enumerate(profile.sample_types):
        out = scope.profiles.add(
            sample_type=profiles_pb2.ValueType(type_strindex=d.string(type_), unit_strindex=d.string(unit)),
            time_unix_nano=profile.start_ns,
            duration_nano=max(profile.end_ns - profile.start_ns, 0),
            period=profile.period,
            profile_id=uuid.uuid4().bytes,
            attribute_indices=common,
        )
        if period_type is not None:
            out.period_type.CopyFrom(period_type)
        for stack, attrs, values in rows:
            if values[i]:
                out.samples.add(stack_index=stack, attribute_indices=attrs, values=[values[i]])
    return len(profile.sample_types)


def encode_request(records: Sequence[ProfileRecord]) -> service_pb2.ExportProfilesServiceRequest:
    """The records as one request: a ``ResourceProfiles`` per distinct resource, one dictionary."""
    from otelbpf import __version__

    d = Dictionary()
    request = service_pb2.ExportProfilesServiceRequest()
    by_resource: dict[tuple[object, ...], profiles_pb2.ScopeProfiles] = {}
    for record in records:
        if record.profile is None:
            raise ValueError("a profile record without its profile cannot be sent as OTLP")
        attrs = resource_of(record)
        ident = tuple(sorted((k, _hashable(v)) for k, v in attrs.items()))
        scope = by_resource.get(ident)
        if scope is None:
            rp = request.resource_profiles.add(resource=_resource(attrs))
            scope = by_resource[ident] = rp.scope_profiles.add(
                scope=common_pb2.InstrumentationScope(name=SCOPE.name, version=SCOPE.version or __version__)
            )
        _add_profiles(d, scope, record.profile)
    request.dictionary.CopyFrom(d.message)
    return request


# --- transports -------------------------------------------------------------------------------


class Transport(Protocol):
    def send(self, request: service_pb2.ExportProfilesServiceRequest) -> service_pb2.ExportProfilesServiceResponse:
        """Send once; raise ``Retry`` or ``Permanent`` when it did not go."""

    def close(self) -> None: ...


def _retry_info_s(error: grpc.RpcError) -> float | None:
    """The server's ``google.rpc.RetryInfo`` delay, if its status details carry one."""
    from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]

    trailers = getattr(error, "trailing_metadata", lambda: None)() or ()
    for key, value in trailers:
        if key != "grpc-status-details-bin":
            continue
        status = status_pb2.Status()
        try:
            status.ParseFromString(value)
        except DecodeError:
            return None
        for detail in status.details:
            info = error_details_pb2.RetryInfo()
            if detail.Unpack(info):
                delay: float = info.retry_delay.seconds + info.retry_delay.nanos / 1e9
                return delay
    return None


class GrpcTransport:
    def __init__(self, cfg: OtlpExporterConfig) -> None:
        from otelbpf.export.factory import grpc_credentials, warn_traced_headers

        warn_traced_headers(cfg)
        compression = grpc.Compression.Gzip if cfg.compression == "gzip" else grpc.Compression.NoCompression
        if cfg.insecure:
            self._channel = grpc.insecure_channel(cfg.target, compression=compression)
        else:
            self._channel = grpc.secure_channel(cfg.target, grpc_credentials(cfg), compression=compression)
        self._export = service_grpc.ProfilesServiceStub(self._channel).Export
        self._metadata = tuple(cfg.headers.items())
        self._timeout = to_seconds(cfg.timeout)

    def send(self, request: service_pb2.ExportProfilesServiceRequest) -> service_pb2.ExportProfilesServiceResponse:
        try:
            response: service_pb2.ExportProfilesServiceResponse = self._export(
                request, timeout=self._timeout, metadata=self._metadata
            )
            return response
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
            detail = f"{code.name}: {exc.details() if hasattr(exc, 'details') else exc}"
            if code in _RETRY_CODES:
                raise Retry(detail, _retry_info_s(exc)) from None
            raise Permanent(detail) from None

    def close(self) -> None:
        self._channel.close()


class HttpTransport:
    def __init__(self, cfg: OtlpHttpExporterConfig) -> None:
        self._url = cfg.url("profiles")
        self._gzip = cfg.compression == "gzip"
        self._timeout = to_seconds(cfg.timeout)
        self._session = requests.Session()
        self._session.headers.update(cfg.headers)
        self._session.headers["Content-Type"] = "application/x-protobuf"
        if self._gzip:
            self._session.headers["Content-Encoding"] = "gzip"
        if cfg.tls.ca_file:
            self._session.verify = cfg.tls.ca_file
        if cfg.tls.cert_file and cfg.tls.key_file:
            self._session.cert = (cfg.tls.cert_file, cfg.tls.key_file)

    def send(self, request: service_pb2.ExportProfilesServiceRequest) -> service_pb2.ExportProfilesServiceResponse:
        body = request.SerializeToString()
        try:
            resp = self._session.post(
                self._url, data=gzip.compress(body, 6) if self._gzip else body, timeout=self._timeout
            )
        except requests.RequestException as exc:
            raise Retry(str(exc)) from None
        if resp.status_code < 300:
            answer = service_pb2.ExportProfilesServiceResponse()
            if resp.content and "protobuf" in resp.headers.get("Content-Type", ""):
                try:
                    answer.ParseFromString(resp.content)
                except DecodeError:  # the data went; an odd answer is only logged
                    log.info("otlp profiles: the server's answer did not parse (%d bytes)", len(resp.content))
            return answer
        detail = f"HTTP {resp.status_code}: {resp.text[:200].strip()}"
        if resp.status_code in _RETRY_HTTP:
            raise Retry(detail, retry_after(resp.headers.get("Retry-After")))
        raise Permanent(detail)

    def close(self) -> None:
        self._session.close()


def transport_for(cfg: OtlpExporterConfig | OtlpHttpExporterConfig) -> Transport:
    return GrpcTransport(cfg) if isinstance(cfg, OtlpExporterConfig) else HttpTransport(cfg)


# --- the exporter -----------------------------------------------------------------------------


class OtlpProfileExporter(QueuedExporter[ProfileRecord]):
    """Queue, batch, send with retries; never blocks the caller (see the module doc)."""

    def __init__(
        self,
        name: str,
        transport: Transport,
        health: Health,
        *,
        retry: RetryConfig | None = None,
        max_queue_size: int = DEFAULT_QUEUE_SIZE,
    ) -> None:
        self.name = name
        self._transport = transport
        self._sender: QueuedSender[ProfileRecord] = QueuedSender(
            name,
            "profiles",
            health,
            self._send,
            retry=retry or RetryConfig(),
            max_queue_size=max_queue_size,
            batch_size=BATCH_RECORDS,
            on_close=transport.close,
        )

    def _send(self, batch: list[ProfileRecord]) -> None:
        try:
            request = encode_request(batch)
        except (ValueError, TypeError) as exc:
            raise Permanent(f"not encodable: {exc}", reason="unencodable") from None
        answer = self._transport.send(request)
        rejected = answer.partial_success.rejected_profiles
        if rejected:
            log.warning(
                "otlp profiles exporter %s: the server rejected %d profiles: %s",
                self.name,
                rejected,
                answer.partial_success.error_message[:200],
            )
            self._sender.drop(rejected, "rejected")


def otlp_profile_exporter(
    name: str,
    cfg: OtlpExporterConfig | OtlpHttpExporterConfig,
    health: Health,
) -> OtlpProfileExporter:
    """The exporter an ``otlp``/``otlphttp`` entry of the profiles pipeline builds (back-off
    and queue at the Pyroscope exporter's defaults: the OTLP configs' SDK exporters keep their own)."""
    return OtlpProfileExporter(name, transport_for(cfg), health)
