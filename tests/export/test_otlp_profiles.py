"""OTLP profiles: the encoding of synthetic profiles (one dictionary, deduplicated, every
index valid), and the exporter against a real grpcio ProfilesService server and a local
HTTP server: delivery, retries, refusals, partial success, a bounded queue, and an endpoint
that is down (drops counted, the caller never held up)."""

from __future__ import annotations

import gzip
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
import pytest
from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2 as service_pb2

from harness.otlp_profiles import OtlpProfilesReceiver, check, decode
from otelbpf.base.health import Health
from otelbpf.config import OtlpExporterConfig, OtlpHttpExporterConfig, RetryConfig
from otelbpf.correlate.profile_record import CPU_SAMPLE_TYPES, MEMORY_SAMPLE_TYPES, Profile, Sample
from otelbpf.correlate.stacks import Frame
from otelbpf.export.encoded_profile import encoded
from otelbpf.export.otlp_profiles import (
    GrpcTransport,
    HttpTransport,
    OtlpProfileExporter,
    encode_request,
)

T0 = 1_700_000_000_000_000_000
LIBC = Frame(
    "memcpy",
    "native",
    module="libc.so.6",
    path="/usr/lib/libc.so.6",
    build_id="ab12",
    address=0x7F00_0010,
    mapping=(0x7F00_0000, 0x7F10_0000, 0x1000),
)
LIBX = Frame(
    "x_work",
    "native",
    module="libx.so",
    path="/opt/libx.so",
    address=0x5000_0020,
    mapping=(0x5000_0000, 0x5001_0000, 0),
)
KERNEL = Frame("do_syscall_64", "kernel", module="[kernel.kallsyms]", address=0xFFFF_FFFF_8100_0000)
LEAF = Frame("leaf", "python", "/w/t.py", 3, 1)
ROOT = Frame("root", "python", "/w/t.py", 9, 8)


def cpu_profile(pid: int = 42, service: str = "train", **labels: str) -> Profile:
    common = {"service_name": service, "host_name": "h", "process_pid": str(pid), **labels}
    samples = [
        Sample([LIBC, LEAF, ROOT], (3, 30), common),
        Sample([KERNEL, LIBC, LEAF, ROOT], (1, 10), common),
        Sample([LIBX, ROOT], (2, 20), {**common, "thread": "worker"}),
    ]
    return Profile(
        "process_cpu",
        "cpu",
        common,
        pid,
        T0,
        T0 + 10**10,
        99,
        CPU_SAMPLE_TYPES,
        "cpu",
        ("cpu", "nanoseconds"),
        10,
        samples,
    )


def resource(pid: int = 42, service: str = "train") -> dict:
    return {
        "service.name": service,
        "host.name": "h",
        "process.pid": pid,
        "container.id": "c0ffee",
        "process.command_args": ["python", "t.py"],
    }


def test_one_profile_per_sample_type_with_its_stacks_values_and_resource():
    request = encode_request([encoded(cpu_profile(env="prod"), resource())])
    check(request)
    samples = decode(request)
    assert len(request.resource_profiles) == 1
    assert {s.sample_type for s in samples} == set(CPU_SAMPLE_TYPES)
    assert {s.period_type for s in samples} == {("cpu", "nanoseconds")}
    by_type = {t: {tuple(s.functions()): s.value for s in samples if s.sample_type == t} for t in CPU_SAMPLE_TYPES}
    assert by_type[("samples", "count")] == {
        ("memcpy", "leaf", "root"): 3,
        ("do_syscall_64", "memcpy", "leaf", "root"): 1,
        ("x_work", "root"): 2,
    }
    assert by_type[("cpu", "nanoseconds")] == {
        ("memcpy", "leaf", "root"): 30,
        ("do_syscall_64", "memcpy", "leaf", "root"): 10,
        ("x_work", "root"): 20,
    }
    s = samples[0]
    assert s.resource == resource() and s.scope == "otelbpf.profiling"
    # the labels the resource already says are not repeated; the others stay, per sample where they differ
    assert {frozenset(x.attributes.items()) for x in samples} == {
        frozenset({("env", "prod")}),
        frozenset({("env", "prod"), ("thread", "worker")}),
    }
    frames = {f.function: f for x in samples for f in x.frames}
    assert frames["memcpy"] == frames["memcpy"].__class__("memcpy", "", 0, "native", "/usr/lib/libc.so.6", "ab12")
    assert (frames["leaf"].kind, frames["leaf"].filename, frames["leaf"].line) == ("cpython", "/w/t.py", 3)
    assert (frames["do_syscall_64"].kind, frames["do_syscall_64"].mapping) == ("kernel", "")
    p = request.resource_profiles[0].scope_profiles[0].profiles[0]
    assert (p.time_unix_nano, p.duration_nano, p.period) == (T0, 10**10, 10)
    ids = [p.profile_id for p in request.resource_profiles[0].scope_profiles[0].profiles]
    assert all(len(i) == 16 for i in ids) and len(set(ids)) == len(ids)


def test_dictionary_holds_each_item_once_across_profiles_and_processes():
    records = [encoded(cpu_profile(pid), resource(pid)) for pid in (42, 43)] + [encoded(cpu_profile(42), resource(42))]
    request = encode_request(records)
    check(request)
    d = request.dictionary
    for name in ("mapping_table", "location_table", "function_table", "attribute_table", "stack_table"):
        table = getattr(d, name)
        assert len({m.SerializeToString(deterministic=True) for m in table}) == len(table), name
    assert len(set(d.string_table)) == len(d.string_table)
    assert len(d.stack_table) == 1 + 3  # three distinct stacks, shared by all six profiles
    assert len(d.mapping_table) == 1 + 2  # libc and libx; kernel and Python frames have none
    assert len(d.function_table) == 1 + 5
    # one ResourceProfiles per process: the two pid-42 records share theirs
    pids = [
        [kv.value.int_value for kv in rp.resource.attributes if kv.key == "process.pid"][0]
        for rp in request.resource_profiles
    ]
    assert pids == [42, 43]
    assert [len(rp.scope_profiles[0].profiles) for rp in request.resource_profiles] == [4, 2]


def test_memory_profile_skips_zero_values_and_falls_back_to_labels_for_the_resource():
    labels = {"service_name": "infer", "host_name": "h", "process_pid": "7", "memory_device": "cuda"}
    alloc = Frame("cudaMalloc", "native")
    profile = Profile(
        "memory",
        "cuda_memory",
        labels,
        7,
        T0,
        T0 + 10**9,
        0,
        MEMORY_SAMPLE_TYPES,
        "inuse_space",
        samples=[Sample([alloc, ROOT], (2, 4096, 0, 0), labels), Sample([alloc, LEAF], (1, 512, 1, 512), labels)],
    )
    request = encode_request([encoded(profile)])  # no resource given: the labels say it
    check(request)
    samples = decode(request)
    assert samples[0].resource == {"service.name": "infer", "host.name": "h", "process.pid": 7}
    inuse = [s for s in samples if s.sample_type == ("inuse_space", "bytes")]
    assert [(s.functions(), s.value) for s in inuse] == [(["cudaMalloc", "leaf"], 512)]
    assert {s.attributes["memory_device"] for s in samples} == {"cuda"}
    p = request.resource_profiles[0].scope_profiles[0].profiles[0]
    assert not p.HasField("period_type")


def test_a_record_without_its_profile_is_refused():
    record = encoded(cpu_profile())
    with pytest.raises(ValueError, match="without its profile"):
        encode_request([record.__class__(**{**record.__dict__, "profile": None})])


# --- the exporter over gRPC -------------------------------------------------------------------

FAST_RETRY = RetryConfig(initial_interval="20ms", max_interval="50ms", max_elapsed_time="3s")


@pytest.fixture
def receiver():
    r = OtlpProfilesReceiver()
    yield r
    r.close()


def grpc_exporter(endpoint: str, health: Health, **kw) -> OtlpProfileExporter:
    cfg = OtlpExporterConfig(endpoint=endpoint, headers={"x-tenant": "t1"}, timeout="2s")
    return OtlpProfileExporter("otlp", GrpcTransport(cfg), health, retry=kw.pop("retry", FAST_RETRY), **kw)


def test_grpc_delivers_batches_with_headers(receiver):
    health = Health()
    e = grpc_exporter(receiver.endpoint, health)
    e.export([encoded(cpu_profile(pid), resource(pid)) for pid in range(100, 120)])
    e.shutdown()
    assert not receiver.errors
    assert health.get("otelbpf.export.sent", signal="profiles", exporter="otlp") == 20
    assert len(receiver.requests) >= 2  # 20 records go in batches of at most 16
    assert {s.resource["process.pid"] for s in receiver.samples()} == set(range(100, 120))
    assert all(m.get("x-tenant") == "t1" for m in receiver.metadata)


def test_grpc_retries_unavailable_and_gives_up_on_invalid_argument(receiver):
    health = Health()
    e = grpc_exporter(receiver.endpoint, health)
    receiver.fail_next(2, grpc.StatusCode.UNAVAILABLE)
    e.export([encoded(cpu_profile(), resource())])
    assert receiver.wait_for(lambda r: r.requests)
    assert health.get("otelbpf.export.retries", signal="profiles", exporter="otlp") == 2
    receiver.fail_next(1, grpc.StatusCode.INVALID_ARGUMENT)
    e.export([encoded(cpu_profile(), resource())])
    e.shutdown()
    assert receiver.calls == 4 and len(receiver.requests) == 1
    assert health.get("otelbpf.export.dropped", signal="profiles", reason="refused", exporter="otlp") == 1
    assert health.get("otelbpf.export.failures", signal="profiles", exporter="otlp") == 1


def test_rejected_profiles_of_a_partial_success_are_counted(receiver):
    health = Health()
    receiver.reject = 1
    e = grpc_exporter(receiver.endpoint, health)
    e.export([encoded(cpu_profile(), resource())])
    e.shutdown()
    assert health.get("otelbpf.export.dropped", signal="profiles", reason="rejected", exporter="otlp") == 1


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_endpoint_down_export_returns_at_once_and_every_drop_is_counted():
    health = Health()
    e = grpc_exporter(
        f"http://127.0.0.1:{closed_port()}",
        health,
        max_queue_size=3,
        retry=RetryConfig(initial_interval="20ms", max_interval="40ms", max_elapsed_time="300ms"),
    )
    records = [encoded(cpu_profile(pid), resource(pid)) for pid in range(10)]
    t0 = time.monotonic()
    for r in records:
        e.export([r])
    assert time.monotonic() - t0 < 0.1  # the profiler is never held up
    deadline = time.monotonic() + 10
    while health.get("otelbpf.export.dropped", signal="profiles", reason="export_failed", exporter="otlp") == 0:
        assert time.monotonic() < deadline, "the first batch was never given up on"
        time.sleep(0.02)
    e.shutdown(timeout_s=0.2)
    dropped = {
        reason: health.get("otelbpf.export.dropped", signal="profiles", reason=reason, exporter="otlp")
        for reason in ("queue_full", "export_failed", "shutdown")
    }
    assert dropped["queue_full"] >= 6  # the queue holds 3; the sender took at most one batch
    assert sum(dropped.values()) == 10
    assert health.get("otelbpf.export.retries", signal="profiles", exporter="otlp") >= 2
    assert health.get("otelbpf.export.sent", signal="profiles", exporter="otlp") == 0


def test_endpoint_back_up_gets_what_was_retried(receiver):
    health = Health()
    port = receiver.port
    receiver.close()
    e = grpc_exporter(f"http://127.0.0.1:{port}", health)
    e.export([encoded(cpu_profile(), resource())])
    deadline = time.monotonic() + 10
    while not health.get("otelbpf.export.retries", signal="profiles", exporter="otlp"):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    again = OtlpProfilesReceiver(port)  # the same port, as a collector that restarts
    try:
        assert again.wait_for(lambda r: r.requests, timeout=10)
        e.shutdown()
        assert health.get("otelbpf.export.sent", signal="profiles", exporter="otlp") == 1
    finally:
        again.close()


# --- the exporter over HTTP -------------------------------------------------------------------


class HttpProfiles:
    """A local OTLP/HTTP endpoint: decodes each POST as the Collector would, or answers ``fail``."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict, service_pb2.ExportProfilesServiceRequest]] = []
        self.fail: list[int] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if owner.fail:
                    self.send_response(owner.fail.pop(0))
                    self.send_header("Retry-After", "0")
                    self.end_headers()
                    return
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = service_pb2.ExportProfilesServiceRequest.FromString(body)
                check(request)
                owner.requests.append((self.path, dict(self.headers), request))
                answer = service_pb2.ExportProfilesServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def test_http_posts_gzipped_protobuf_to_the_profiles_path_and_retries_503():
    server = HttpProfiles()
    try:
        health = Health()
        server.fail = [503]
        cfg = OtlpHttpExporterConfig(endpoint=server.endpoint + "/", headers={"authorization": "Bearer x"})
        e = OtlpProfileExporter("otlphttp", HttpTransport(cfg), health, retry=FAST_RETRY)
        e.export([encoded(cpu_profile(), resource())])
        e.shutdown()
        assert health.get("otelbpf.export.retries", signal="profiles", exporter="otlphttp") == 1
        assert health.get("otelbpf.export.sent", signal="profiles", exporter="otlphttp") == 1
        [(path, headers, request)] = server.requests
        assert path == "/v1development/profiles"  # the Collector's otlphttp path for the signal
        assert headers["Content-Type"] == "application/x-protobuf" and headers["Content-Encoding"] == "gzip"
        assert headers["authorization"] == "Bearer x"
        assert {tuple(s.functions()) for s in decode(request)} >= {("memcpy", "leaf", "root")}
    finally:
        server.close()


def test_http_400_is_refused_without_retry():
    server = HttpProfiles()
    try:
        health = Health()
        server.fail = [400]
        e = OtlpProfileExporter(
            "otlphttp", HttpTransport(OtlpHttpExporterConfig(endpoint=server.endpoint)), health, retry=FAST_RETRY
        )
        e.export([encoded(cpu_profile(), resource())])
        e.shutdown()
        assert health.get("otelbpf.export.dropped", signal="profiles", reason="refused", exporter="otlphttp") == 1
        assert health.get("otelbpf.export.retries", signal="profiles", exporter="otlphttp") == 0
    finally:
        server.close()


# --- configuration: the Collector's otlp/otlphttp exporters carry profiles ------------------

PIPELINE = """\
receivers: {profiling: {cuda_memory: false}}
exporters: EXPORTERS
service: {pipelines: {profiles: {receivers: [profiling], exporters: [NAMES]}}}
"""


def profiles_config(exporters: str, names: str):
    from otelbpf.families.registry import load_config_text

    return load_config_text(PIPELINE.replace("EXPORTERS", exporters).replace("NAMES", names))


def test_otlp_and_otlphttp_in_the_profiles_pipeline_build_otlp_profile_exporters():
    from otelbpf.export.profile_export import profile_exporter

    config = profiles_config(
        '{otlp: {endpoint: "localhost:4317"}, otlphttp/p: {endpoint: "http://c:4318"}}', "otlp, otlphttp/p"
    )
    assert config.exporters["otlphttp/p"].url("profiles") == "http://c:4318/v1development/profiles"
    health = Health()
    built = [profile_exporter(n, c, health) for n, c in config.pipeline_exporters("profiles")]
    try:
        assert [type(e) for e in built] == [OtlpProfileExporter, OtlpProfileExporter]
    finally:
        for e in built:
            e.shutdown(timeout_s=0)


def test_otlphttp_for_profiles_needs_a_base_url_or_profiles_endpoint():
    from otelbpf.config import ConfigError

    with pytest.raises(ConfigError, match="set endpoint or profiles_endpoint here \\(the profiles pipeline"):
        profiles_config('{otlphttp: {traces_endpoint: "http://c:4318/v1/traces"}}', "otlphttp")
    config = profiles_config('{otlphttp: {profiles_endpoint: "http://c:4318/p"}}', "otlphttp")
    assert config.exporters["otlphttp"].url("profiles") == "http://c:4318/p"
