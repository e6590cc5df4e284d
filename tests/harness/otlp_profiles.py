"""An OTLP profiles receiver for tests: a real grpcio server implementing the generated
``ProfilesService`` (opentelemetry-proto ``collector/profiles/v1development``), since rotel
(the collector the other OTLP tests use) carries traces, metrics and logs only.

Every request is checked as a consumer would read it (``check``): each dictionary table
starts with its zero value, every index points inside its table, every sample has one value.
A request that fails the check is answered INVALID_ARGUMENT and kept in ``errors``.
``decode`` turns a request into flat samples (resource, sample type, frames leaf first).
``fail_next(n, code)`` makes the next ``n`` calls fail with ``code`` (retry tests).
"""

from __future__ import annotations

import threading
import time
from concurrent import futures
from dataclasses import dataclass

import grpc
from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2 as service_pb2
from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2_grpc as service_grpc
from opentelemetry.proto.common.v1 import common_pb2

Request = service_pb2.ExportProfilesServiceRequest


def plain(value: common_pb2.AnyValue) -> object:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [plain(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


@dataclass(frozen=True)
class DecodedFrame:
    function: str
    filename: str
    line: int
    kind: str  # profile.frame.type, "" where none
    mapping: str  # the mapping's file name, "" where none
    build_id: str


@dataclass(frozen=True)
class DecodedSample:
    resource: dict
    scope: str
    sample_type: tuple[str, str]
    period_type: tuple[str, str]
    frames: tuple[DecodedFrame, ...]  # leaf first
    value: int
    attributes: dict  # the profile's and the sample's

    def functions(self) -> list[str]:
        return [f.function for f in self.frames]


def check(request: Request) -> None:
    """Raise ``ValueError`` where the request breaks the format's rules."""
    d = request.dictionary
    tables = {
        "mapping_table": d.mapping_table,
        "location_table": d.location_table,
        "function_table": d.function_table,
        "link_table": d.link_table,
        "attribute_table": d.attribute_table,
        "stack_table": d.stack_table,
    }
    if not d.string_table or d.string_table[0] != "":
        raise ValueError("string_table[0] must be the empty string")
    for name, table in tables.items():
        if not table or table[0].ByteSize() != 0:
            raise ValueError(f"{name}[0] must be the zero value")

    def within(index: int, table, what: str) -> None:
        if not 0 <= index < len(table):
            raise ValueError(f"{what} index {index} outside its table ({len(table)})")

    strings = d.string_table
    for m in d.mapping_table:
        within(m.filename_strindex, strings, "mapping filename")
        for a in m.attribute_indices:
            within(a, d.attribute_table, "mapping attribute")
    for loc in d.location_table:
        within(loc.mapping_index, d.mapping_table, "location mapping")
        for line in loc.lines:
            within(line.function_index, d.function_table, "line function")
        for a in loc.attribute_indices:
            within(a, d.attribute_table, "location attribute")
    for f in d.function_table:
        for i in (f.name_strindex, f.system_name_strindex, f.filename_strindex):
            within(i, strings, "function string")
    for a in d.attribute_table:
        within(a.key_strindex, strings, "attribute key")
        within(a.unit_strindex, strings, "attribute unit")
    for s in d.stack_table:
        for i in s.location_indices:
            within(i, d.location_table, "stack location")
    for rp in request.resource_profiles:
        for sp in rp.scope_profiles:
            for p in sp.profiles:
                within(p.sample_type.type_strindex, strings, "sample type")
                within(p.sample_type.unit_strindex, strings, "sample unit")
                for a in p.attribute_indices:
                    within(a, d.attribute_table, "profile attribute")
                for s in p.samples:
                    within(s.stack_index, d.stack_table, "sample stack")
                    for a in s.attribute_indices:
                        within(a, d.attribute_table, "sample attribute")
                    if len(s.values) != 1:
                        raise ValueError(f"a sample has {len(s.values)} values, one per profile expected")


def decode(request: Request) -> list[DecodedSample]:
    d = request.dictionary
    s = d.string_table

    def attrs(indices) -> dict:
        return {s[d.attribute_table[i].key_strindex]: plain(d.attribute_table[i].value) for i in indices}

    def frame(index: int) -> DecodedFrame:
        loc = d.location_table[index]
        fn = d.function_table[loc.lines[0].function_index] if loc.lines else None
        m = d.mapping_table[loc.mapping_index]
        return DecodedFrame(
            s[fn.name_strindex] if fn else "",
            s[fn.filename_strindex] if fn else "",
            loc.lines[0].line if loc.lines else 0,
            str(attrs(loc.attribute_indices).get("profile.frame.type", "")),
            s[m.filename_strindex],
            str(attrs(m.attribute_indices).get("process.executable.build_id.gnu", "")),
        )

    out = []
    for rp in request.resource_profiles:
        resource = {kv.key: plain(kv.value) for kv in rp.resource.attributes}
        for sp in rp.scope_profiles:
            for p in sp.profiles:
                common = attrs(p.attribute_indices)
                st = (s[p.sample_type.type_strindex], s[p.sample_type.unit_strindex])
                pt = (s[p.period_type.type_strindex], s[p.period_type.unit_strindex])
                for sample in p.samples:
                    frames = tuple(frame(i) for i in d.stack_table[sample.stack_index].location_indices)
                    out.append(
                        DecodedSample(
                            resource,
                            sp.scope.name,
                            st,
                            pt,
                            frames,
                            sample.values[0],
                            {**common, **attrs(sample.attribute_indices)},
                        )
                    )
    return out


class _Service(service_grpc.ProfilesServiceServicer):
    def __init__(self, receiver: OtlpProfilesReceiver) -> None:
        self._r = receiver

    def Export(self, request, context):  # noqa: N802 - name fixed by the generated stub
        return self._r._export(request, context)


class OtlpProfilesReceiver:
    """OTLP/gRPC profiles receiver on a loopback port (a free one unless given); ``close()`` ends it."""

    def __init__(self, port: int = 0) -> None:
        self.requests: list[Request] = []
        self.metadata: list[dict[str, str]] = []
        self.errors: list[str] = []
        self.calls = 0
        self.reject = 0  # profiles to report rejected in each answer
        self._fail: list[grpc.StatusCode] = []
        self._lock = threading.Lock()
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="otlp-profiles"),
            options=[("grpc.max_receive_message_length", 64 << 20)],
        )
        service_grpc.add_ProfilesServiceServicer_to_server(_Service(self), self._server)
        self.port = self._server.add_insecure_port(f"127.0.0.1:{port}")
        self._server.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fail_next(self, n: int, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE) -> None:
        with self._lock:
            self._fail.extend([code] * n)

    def _export(self, request: Request, context: grpc.ServicerContext) -> service_pb2.ExportProfilesServiceResponse:
        with self._lock:
            self.calls += 1
            failing = self._fail.pop(0) if self._fail else None
        if failing is not None:
            context.abort(failing, "told to fail")
        try:
            check(request)
        except ValueError as exc:
            with self._lock:
                self.errors.append(str(exc))
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        with self._lock:
            self.requests.append(request)
            self.metadata.append(dict(context.invocation_metadata()))
        answer = service_pb2.ExportProfilesServiceResponse()
        if self.reject:
            answer.partial_success.rejected_profiles = self.reject
            answer.partial_success.error_message = "told to reject"
        return answer

    def samples(self) -> list[DecodedSample]:
        with self._lock:
            requests = list(self.requests)
        return [s for r in requests for s in decode(r)]

    def wait_for(self, predicate, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self):
                return True
            time.sleep(0.02)
        return predicate(self)

    def close(self) -> None:
        self._server.stop(grace=None)
