"""End to end: HTTP/1.x, HTTP/2 and gRPC spans from the real agent's socket probes.

Real servers (stdlib ThreadingHTTPServer, grpcio) and real clients in their own
processes or in this one, the real agent (`otelbpf run`) watching the host with
a port filter, and a real OTLP collector (rotel) receiving what it exports.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from harness import grpc_demo
from harness.agent import FAKE_CUDART, REPO, AgentProcess
from otelbpf.families.http.protocols.http2 import PREFACE

pytestmark = pytest.mark.bpf

SECRETS = ("tok-secret", "cookie-secret", "key-secret", "server-secret", "body-secret")


def free_ports(n: int) -> list[int]:
    socks = [socket.create_server(("127.0.0.1", 0)) for _ in range(n)]
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def write_config(tmp: Path, collector, ports: list[int], *, cuda: bool = False, **http: object) -> Path:
    receivers = ["http", "cuda"] if cuda else ["http"]
    doc = {
        "receivers": {
            "http": {"processes": "all", "ports": ports, **http},
            **({"cuda": {"search_paths": []}} if cuda else {}),
        },
        "processors": {"batch": {"timeout": "100ms"}},
        "exporters": {"otlp": {"endpoint": collector.grpc_endpoint, "timeout": "2s"}},
        "service": {
            "pipelines": {
                "traces": {"receivers": receivers, "processors": ["batch"], "exporters": ["otlp"]},
                "metrics": {"receivers": receivers, "processors": ["batch"], "exporters": ["otlp"]},
            },
            "telemetry": {"metrics_interval": "300ms", "drain_interval": "20ms"},
        },
    }
    path = tmp / "otelbpf.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@contextlib.contextmanager
def agent_running(tmp: Path, collector, ports: list[int], **options):
    with AgentProcess(["-c", str(write_config(tmp, collector, ports, **options))]) as agent:
        agent.wait_ready()
        yield agent
        assert agent.proc.poll() is None, agent.output
        # Detaching is slow on this kernel under load (each waits out a grace period): in host
        # mode with CUDA, every library other tests left mapped adds its uprobes.
        assert agent.stop(timeout=120) == 0, agent.output


@contextlib.contextmanager
def app(*args: str, module: str | None = None, env: dict[str, str] | None = None):
    """A service from harness/http_apps.py (or grpc_demo, or ``module``) in its own process,
    once it listens."""
    argv = list(args)
    if module is None:
        module = "harness.grpc_demo" if args[0] == "grpc" else "harness.http_apps"
        argv = argv[1:] if args[0] == "grpc" else argv
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *argv],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO / "tests",
        env={**os.environ, "PYTHONPATH": str(REPO / "tests"), **(env or {})},
    )
    try:
        assert proc.stdout.readline().startswith("ready"), "service did not start"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def spans(c, *, pid: int | None = None, kind: str | None = None, path: str | None = None):
    return [
        s
        for s in c.spans()
        if s.scope_name == "otelbpf.http"
        and (pid is None or s.attributes.get("process.pid") == pid)
        and (kind is None or s.kind == f"SPAN_KIND_{kind.upper()}")
        and (path is None or s.attributes.get("url.path") == path)
    ]


def problems(c, reason: str) -> int:
    return sum(p.value for p in c.latest_points("otelbpf.http.problems", reason=reason))


def assert_child(child, parent) -> None:
    assert child.trace_id == parent.trace_id and child.parent_span_id == parent.span_id, (child, parent)


def test_threading_server_spans_links_metrics_and_redaction(otlp_collector, tmp_path):
    (port,) = free_ports(1)
    c = otlp_collector
    with (
        app("backend", str(port)) as backend,
        agent_running(
            tmp_path,
            c,
            [port],
            capture_headers=["x-request-id", "authorization", "x-api-key", "set-cookie"],
            redact_headers=["x-api-key"],
        ),
    ):
        conn = http.client.HTTPConnection("127.0.0.1", port)
        secret_headers = {"Authorization": "Bearer tok-secret", "Cookie": "c=cookie-secret", "X-Api-Key": "key-secret"}
        for i, (method, path, body) in enumerate(
            [
                ("GET", "/a?token=tok-secret", None),
                ("GET", "/status/503", None),
                ("GET", "/status/404", None),
                ("POST", "/items", b"body-secret"),
            ]
        ):
            conn.request(method, path, body=body, headers={**secret_headers, "X-Request-Id": f"rid-{i}"})
            conn.getresponse().read()
        conn.close()
        server = c.wait_for(
            lambda: len(spans(c, pid=backend.pid, kind="server")) == 4 and spans(c, pid=backend.pid, kind="server"),
            what="4 server spans",
        )
        client = c.wait_for(
            lambda: len(spans(c, pid=os.getpid(), kind="client")) == 4 and spans(c, pid=os.getpid(), kind="client"),
            what="4 client spans",
        )
        by_rid = {s.attributes["http.request.header.x-request-id"][0]: s for s in server}
        got = {
            r: (
                s.name,
                s.attributes["http.request.method"],
                s.attributes["url.path"],
                s.attributes["http.response.status_code"],
                s.status_code,
            )
            for r, s in by_rid.items()
        }
        assert got == {
            "rid-0": ("GET", "GET", "/a", 200, "STATUS_CODE_UNSET"),
            "rid-1": ("GET", "GET", "/status/503", 503, "STATUS_CODE_ERROR"),
            "rid-2": ("GET", "GET", "/status/404", 404, "STATUS_CODE_UNSET"),
            "rid-3": ("POST", "POST", "/items", 201, "STATUS_CODE_UNSET"),
        }
        s = by_rid["rid-3"]
        assert s.attributes["http.request.body.size"] == len(b"body-secret")
        assert s.attributes["server.port"] == port and s.attributes["client.address"] == "127.0.0.1"
        assert s.attributes["network.protocol.version"] == "1.1" and s.attributes["thread.id"] > 0
        assert s.resource["process.pid"] == backend.pid
        for cs in client:
            peer = by_rid[cs.attributes["http.request.header.x-request-id"][0]]
            assert_child(peer, cs)  # same host: the server span is the client span's child
            assert cs.attributes["server.port"] == port
        assert {s.attributes["http.response.status_code"]: s.status_code for s in client}[404] == "STATUS_CODE_ERROR"
        everything = repr([(s.attributes, s.status_message) for s in c.spans()])
        assert not [secret for secret in SECRETS if secret in everything]
        assert not any(
            k.endswith(("authorization", "x-api-key", "set-cookie", "cookie")) for s in server for k in s.attributes
        )
        f = {"process.pid": backend.pid}
        hist = c.wait_for(
            lambda: c.latest_points("http.server.request.duration", **f, **{"http.response.status_code": 503}),
            what="RED metrics",
        )
        assert hist[0].count == 1 and hist[0].attributes["error.type"] == "503"
        assert hist[0].attributes["http.response.status_class"] == "5xx"
        ok = c.latest_points("http.server.request.duration", **f, **{"http.response.status_class": "2xx"})
        assert sum(p.count for p in ok) == 2


def test_concurrent_clients_each_span_pairs_with_its_own_peer(otlp_collector, tmp_path):
    (port,) = free_ports(1)
    c = otlp_collector
    with app("backend", str(port)) as backend, agent_running(tmp_path, c, [port]):

        def client(t: int) -> None:
            conn = http.client.HTTPConnection("127.0.0.1", port)
            for i in range(25):
                conn.request("GET", f"/c{t}-{i}")
                assert conn.getresponse().read() == f"/c{t}-{i}".encode()
            conn.close()

        threads = [threading.Thread(target=client, args=(t,)) for t in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        server = c.wait_for(
            lambda: len(spans(c, pid=backend.pid, kind="server")) == 150 and spans(c, pid=backend.pid, kind="server"),
            timeout=20,
            what="150 server spans",
        )
        c.wait_for(lambda: len(spans(c, pid=os.getpid(), kind="client")) == 150, timeout=20, what="150 client spans")
        client_spans = {s.attributes["url.path"]: s for s in spans(c, pid=os.getpid(), kind="client")}
        assert sorted(s.attributes["url.path"] for s in server) == sorted(
            f"/c{t}-{i}" for t in range(6) for i in range(25)
        )
        for s in server:
            assert_child(s, client_spans[s.attributes["url.path"]])


def test_keep_alive_1000_requests_on_one_connection(otlp_collector, tmp_path):
    (port,) = free_ports(1)
    c = otlp_collector
    with app("backend", str(port)) as backend, agent_running(tmp_path, c, [port]):
        conn = http.client.HTTPConnection("127.0.0.1", port)
        for i in range(1000):
            conn.request("GET", f"/k{i}")
            conn.getresponse().read()
        conn.close()
        server = c.wait_for(
            lambda: len(spans(c, pid=backend.pid, kind="server")) >= 1000 and spans(c, pid=backend.pid, kind="server"),
            timeout=30,
            what="1000 server spans",
        )
        assert sorted(int(s.attributes["url.path"][2:]) for s in server) == list(range(1000))
        assert len({s.attributes["client.port"] for s in server}) == 1
        points = c.wait_for(
            lambda: [
                p
                for p in c.latest_points("http.server.request.duration", **{"process.pid": backend.pid})
                if p.count == 1000
            ],
            timeout=10,
            what="1000 requests counted",
        )
        assert points[0].attributes["http.request.method"] == "GET"
        assert c.latest_points("otelbpf.events.lost", reason="socket_ring_full")[0].value == 0


def test_one_trace_over_two_processes_with_downstream_call_and_cuda(otlp_collector, tmp_path):
    front_port, back_port = free_ports(2)
    c = otlp_collector
    with (
        app("backend", str(back_port)) as backend,
        app("frontend", str(front_port), str(back_port), str(FAKE_CUDART)) as frontend,
        agent_running(tmp_path, c, [front_port, back_port], cuda=True),
    ):
        time.sleep(0.5)  # the agent's first /proc scan attaches the CUDA probes to the frontend
        conn = http.client.HTTPConnection("127.0.0.1", front_port)
        for _ in range(3):
            conn.request("GET", "/predict")
            assert conn.getresponse().read() == b"prediction"
        conn.close()
        c.wait_for(
            lambda: (
                len(spans(c, pid=backend.pid, kind="server")) == 3
                and len([s for s in c.spans("cudaMemcpy") if s.resource["process.pid"] == frontend.pid]) == 3
            ),
            timeout=20,
            what="backend spans and CUDA spans",
        )
        front_server = spans(c, pid=frontend.pid, kind="server")
        front_client = spans(c, pid=frontend.pid, kind="client")
        back_server = spans(c, pid=backend.pid, kind="server")
        assert len(front_server) == len(front_client) == len(back_server) == 3
        cuda = [s for s in c.spans() if s.scope_name == "otelbpf.cuda" and s.resource["process.pid"] == frontend.pid]
        for top in front_server:
            assert top.attributes["url.path"] == "/predict"
            [down] = [s for s in front_client if s.parent_span_id == top.span_id]
            assert_child(down, top)
            assert down.attributes["server.port"] == back_port and down.attributes["url.path"] == "/work"
            [leaf] = [s for s in back_server if s.parent_span_id == down.span_id]
            assert_child(leaf, down)
            kids = sorted(s.name for s in cuda if s.parent_span_id == top.span_id)
            assert kids == ["cudaFree", "cudaMalloc", "cudaMemcpy"]
            assert all(s.trace_id == top.trace_id for s in cuda if s.parent_span_id == top.span_id)
            assert len({top.trace_id, down.trace_id, leaf.trace_id}) == 1


def test_grpc_unary_and_server_streaming_with_non_ok_status(otlp_collector, tmp_path):
    (port,) = free_ports(1)
    c = otlp_collector
    with agent_running(tmp_path, c, [port]), app("grpc", str(port)) as server:
        caller = subprocess.run(
            [sys.executable, "-m", "harness.grpc_demo", "--call", str(port), "5"],
            cwd=REPO / "tests",
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert caller.returncode == 0, caller.stderr
        served = c.wait_for(
            lambda: len(spans(c, pid=server.pid, kind="server")) == 6 and spans(c, pid=server.pid, kind="server"),
            timeout=20,
            what="6 gRPC server spans",
        )
        unary = sorted((s for s in served if s.name == "demo.Echo/Unary"), key=lambda s: s.start_ns)
        [streaming] = [s for s in served if s.name == "demo.Echo/Stream"]
        assert [s.attributes["rpc.grpc.status_code"] for s in unary] == [0, 0, 0, 0, 5]
        for s in served:
            assert s.attributes["rpc.system"] == "grpc" and s.attributes["rpc.service"] == "demo.Echo"
            assert s.attributes["network.protocol.version"] == "2" and s.attributes["http.response.status_code"] == 200
            assert s.status_code == "STATUS_CODE_UNSET"  # NOT_FOUND, FAILED_PRECONDITION: not server errors
        assert streaming.attributes["rpc.grpc.status_code"] == 9 and streaming.attributes["rpc.method"] == "Stream"
        assert streaming.attributes["http.response.body.size"] == 3 * (5 + 4)
        called = c.wait_for(
            lambda: (
                len(spans(c, pid=caller_pid(c, server.pid), kind="client")) == 6
                and spans(c, pid=caller_pid(c, server.pid), kind="client")
            ),
            timeout=20,
            what="client spans",
        )
        [stream_client] = [s for s in called if s.name == "demo.Echo/Stream"]
        assert stream_client.status_code == "STATUS_CODE_ERROR"
        assert stream_client.status_message == grpc_demo.STREAM_ERROR
        by_id = {s.span_id: s for s in called}
        assert all(s.parent_span_id in by_id and s.trace_id == by_id[s.parent_span_id].trace_id for s in served)
        points = c.wait_for(
            lambda: c.latest_points("rpc.server.duration", **{"process.pid": server.pid, "rpc.method": "Unary"}),
            what="rpc metrics",
        )
        assert {p.attributes["rpc.grpc.status_code"]: p.count for p in points} == {0: 4, 5: 1}


def caller_pid(c, server_pid: int) -> int:
    pids = {s.attributes["process.pid"] for s in spans(c, kind="client") if s.name.startswith("demo.Echo")}
    return next(iter(pids - {server_pid}), -1)


def test_concurrent_requests_on_one_asyncio_thread_are_marked_and_not_linked(otlp_collector, tmp_path):
    front_port, back_port = free_ports(2)
    c = otlp_collector
    with (
        app("backend", str(back_port)) as backend,
        app("asyncio", str(front_port), str(back_port)) as front,
        agent_running(tmp_path, c, [front_port, back_port]),
    ):
        # Both requests are sent before either answer is read: two client threads could start
        # more than the server's 300 ms apart under load, and the first request would then
        # rightly be the only one in flight (and parent its call).
        conns = [http.client.HTTPConnection("127.0.0.1", front_port) for _ in range(2)]
        for conn in conns:
            conn.request("GET", "/slow")
        for conn in conns:
            assert conn.getresponse().read() == b"async"
            conn.close()
        served = c.wait_for(
            lambda: len(spans(c, pid=front.pid, kind="server")) == 2 and spans(c, pid=front.pid, kind="server"),
            what="2 asyncio server spans",
        )
        downstream = c.wait_for(
            lambda: len(spans(c, pid=front.pid, kind="client")) == 2 and spans(c, pid=front.pid, kind="client"),
            what="2 downstream client spans",
        )
        assert len({s.attributes["thread.id"] for s in served}) == 1  # one event-loop thread served both
        assert all(s.attributes["otelbpf.thread.concurrent_requests"] for s in served)
        # Either request could have caused either call: neither is linked, rather than one wrongly.
        assert all(d.parent_span_id == "" for d in downstream)
        leaves = c.wait_for(
            lambda: len(spans(c, pid=backend.pid, kind="server")) == 2 and spans(c, pid=backend.pid, kind="server"),
            what="backend spans",
        )
        assert sorted(s.parent_span_id for s in leaves) == sorted(d.span_id for d in downstream)


def test_incoming_traceparent_is_adopted(otlp_collector, tmp_path):
    (port,) = free_ports(1)
    c = otlp_collector
    trace_id, span_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    with app("backend", str(port)) as backend, agent_running(tmp_path, c, [port]):
        conn = http.client.HTTPConnection("127.0.0.1", port)
        conn.request("GET", "/traced", headers={"traceparent": f"00-{trace_id}-{span_id}-01"})
        conn.getresponse().read()
        [s] = c.wait_for(lambda: spans(c, pid=backend.pid, kind="server", path="/traced"), what="server span")
        assert (s.trace_id, s.parent_span_id) == (trace_id, span_id)
        assert s.attributes["otelbpf.parent.source"] == "traceparent"


def _normal_request_still_traced(c, port: int, backend_pid: int, path: str) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port)
    conn.request("GET", path)
    conn.getresponse().read()
    conn.close()
    c.wait_for(lambda: spans(c, pid=backend_pid, kind="server", path=path), what=f"a span for {path} afterwards")


def test_random_bytes_on_a_socket_are_counted_not_parsed(otlp_collector, tmp_path):
    (port,) = free_ports(1)
    c = otlp_collector
    with app("backend", str(port)) as backend, agent_running(tmp_path, c, [port]):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"\x00\x01" + os.urandom(3000))
        with contextlib.suppress(OSError):
            s.recv(100)
        s.close()
        c.wait_for(
            lambda: c.latest_points("otelbpf.http.connections", protocol="unknown"), what="unknown protocol counted"
        )
        assert sum(p.value for p in c.latest_points("otelbpf.http.unparsed_bytes", protocol="unknown")) >= 3002
        _normal_request_still_traced(c, port, backend.pid, "/after-garbage")


def _h2_frame(ftype: int, flags: int, stream: int, payload: bytes, length: int | None = None) -> bytes:
    n = len(payload) if length is None else length
    return n.to_bytes(3, "big") + bytes([ftype, flags]) + struct.pack(">I", stream) + payload


def _send_and_close(port: int, data: bytes) -> None:
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(data)
    time.sleep(0.2)
    s.close()


def test_truncated_http2_frame_is_counted(otlp_collector, tmp_path):
    (port,) = free_ports(1)
    c = otlp_collector
    with agent_running(tmp_path, c, [port]), app("grpc", str(port)):
        _send_and_close(port, PREFACE + _h2_frame(4, 0, 0, b"") + _h2_frame(1, 4, 1, b"\x82" * 10, length=100))
        c.wait_for(lambda: problems(c, "truncated_frame") >= 1, what="truncated frame counted")
        grpc_demo.call(port, 1)
        c.wait_for(
            lambda: [s for s in spans(c, kind="server") if s.name == "demo.Echo/Stream"], what="later gRPC traced"
        )


def test_hpack_garbage_is_counted(otlp_collector, tmp_path):
    (port,) = free_ports(1)
    c = otlp_collector
    garbage = bytes([0xFF, 0xFF, 0xFF, 0xFF, 0x7F]) + os.urandom(40)
    with agent_running(tmp_path, c, [port]), app("grpc", str(port)):
        _send_and_close(port, PREFACE + _h2_frame(4, 0, 0, b"") + _h2_frame(1, 5, 1, garbage))
        c.wait_for(lambda: problems(c, "hpack_error") >= 1, what="HPACK error counted")
        grpc_demo.call(port, 1)
        c.wait_for(
            lambda: [s for s in spans(c, kind="server") if s.name == "demo.Echo/Stream"], what="later gRPC traced"
        )


def test_connection_opened_before_the_agent_is_joined_at_the_next_request(otlp_collector, tmp_path):
    (port,) = free_ports(1)
    c = otlp_collector
    with app("backend", str(port)) as backend:
        conn = http.client.HTTPConnection("127.0.0.1", port)
        for i in range(3):
            conn.request("GET", f"/before-{i}")
            conn.getresponse().read()
        with agent_running(tmp_path, c, [port]):
            conn.request("GET", "/first-seen")  # its bytes only tell the agent that the fd exists
            conn.getresponse().read()
            time.sleep(0.5)
            for i in range(3):
                conn.request("GET", f"/after-{i}")
                conn.getresponse().read()
            server = c.wait_for(
                lambda: len(spans(c, pid=backend.pid, kind="server")) >= 3 and spans(c, pid=backend.pid, kind="server"),
                what="spans on the old connection",
            )
            assert {s.attributes["url.path"] for s in server} >= {"/after-0", "/after-1", "/after-2"}
            assert not [s for s in server if s.attributes["url.path"].startswith("/before")]
            c.wait_for(lambda: problems(c, "joined_midstream") >= 1, what="joined connection counted")
        conn.close()


def test_peer_reset_mid_response_is_an_error_span_and_counted(otlp_collector, tmp_path):
    (port,) = free_ports(1)
    c = otlp_collector
    listener = socket.create_server(("127.0.0.1", port))

    def reset_server() -> None:
        peer, _ = listener.accept()
        peer.recv(65536)
        peer.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\npartial")
        time.sleep(0.1)
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        peer.close()

    with agent_running(tmp_path, c, [port]):
        t = threading.Thread(target=reset_server)
        t.start()
        client = subprocess.run(
            [
                sys.executable,
                "-c",
                f"""
import http.client
c = http.client.HTTPConnection('127.0.0.1', {port})
c.request('GET', '/will-reset')
r = c.getresponse()
try:
    r.read()
except (ConnectionResetError, http.client.IncompleteRead):
    print('reset')
""",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        t.join()
        listener.close()
        assert "reset" in client.stdout, client.stderr
        [span] = c.wait_for(lambda: [s for s in spans(c, kind="client", path="/will-reset")], what="client span")
        assert span.status_code == "STATUS_CODE_ERROR" and span.attributes["error.type"] == "connection_reset"
        assert span.attributes["http.response.status_code"] == 200
        c.wait_for(lambda: problems(c, "connection_reset") >= 1, what="reset counted")
