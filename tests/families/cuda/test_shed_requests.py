"""The CUDA calls of HTTP requests head sampling shed (issue 38), end to end with the real agent.

A threaded HTTP server whose handler makes CUDA calls through the stand-in runtime (a copy in,
kernel launches, a synchronize, an allocation and its free) is sampled at 1/4 in the kernel.
Planted: N requests, each with CALLS CUDA calls of which LAUNCHES launches and COPY bytes
copied. Expected, from that alone:

- in the trace backend (OTLP), every CUDA span of the server has its request as parent (no root
  left by a shed request), every kept request has its CALLS children, and each child carries
  its request's sampling threshold (``ot=th:c``: a child of a 1/4-kept request stands for 4);
- the CUDA metrics count every call the clients caused, shed or kept: N x LAUNCHES launches,
  N x 4 API calls, N x COPY bytes; ``otelbpf.cuda.spans.shed`` counts the shed requests' spans;
- the agent's own files, which the diagnosis and the report read, hold every call's span, as
  without sampling (the diagnosis's span loader sees N x CALLS CUDA spans of the process).
"""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import time

import pytest
import yaml

from harness.agent import FAKE_CUDART, REPO
from otelbpf.analyze.diagnose import SpanLoader
from otelbpf.analyze.summary import read_spans
from test_http_agent import free_ports, write_config
from test_http_load_agent import agent_running, server_count

pytestmark = pytest.mark.bpf

N = 48
LAUNCHES = 3
COPY = 4096
#: malloc, memcpy, the launches (each an event: launch_sample_every 1), synchronize, free
CALLS = 4 + LAUNCHES

#: A threaded HTTP/1.1 server (argv: port, CUDA runtime, launches per request): each GET makes
#: its CUDA calls on the handler's thread, between reading the request and answering it.
APP = r"""
import ctypes, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

rt = ctypes.CDLL(sys.argv[2])
launches = int(sys.argv[3])


class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


rt.cudaLaunchKernel.argtypes = [ctypes.c_void_p, Dim3, Dim3, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
rt.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
rt.cudaFree.argtypes = [ctypes.c_void_p]
rt.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
# the CUDA 12 stand-in launches any host function (named after its symbol)
kernel = ctypes.cast(rt.cudaGetLastError, ctypes.c_void_p)
host = ctypes.create_string_buffer(4096)


def work():
    ptr = ctypes.c_void_p()
    rcs = [rt.cudaMalloc(ctypes.byref(ptr), 4096), rt.cudaMemcpy(ptr, host, 4096, 1)]
    rcs += [rt.cudaLaunchKernel(kernel, Dim3(1, 1, 1), Dim3(32, 1, 1), None, 0, None) for _ in range(launches)]
    rcs += [rt.cudaStreamSynchronize(None), rt.cudaFree(ptr)]
    return not any(rcs)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        body = b"ok" if work() else b"cuda failed"
        self.send_response(200 if body == b"ok" else 500)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
print("ready", flush=True)
server.serve_forever()
"""


def total(c, metric: str, pid: int) -> int:
    return int(sum(p.value for p in c.latest_points(metric, **{"process.pid": pid})))


def test_cuda_calls_of_shed_requests_stay_out_of_traces_and_in_every_count(otlp_collector, tmp_path):
    c = otlp_collector
    (port,) = free_ports(1)
    out = tmp_path / "out"
    cfg = write_config(tmp_path, c, [port], cuda=True, sampling_probability=0.25, adaptive_sampling=False)
    doc = yaml.safe_load(cfg.read_text())
    # launches as events (spans), and the agent's own files beside the OTLP exporter
    doc["receivers"]["cuda"]["launch_sample_every"] = 1
    doc["exporters"]["file"] = {"directory": str(out)}
    for pipeline in doc["service"]["pipelines"].values():
        pipeline["exporters"].append("file")
    cfg.write_text(yaml.safe_dump(doc))
    server = subprocess.Popen(
        [sys.executable, "-c", APP, str(port), str(FAKE_CUDART), str(LAUNCHES)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "tests")},
    )
    try:
        assert server.stdout.readline().startswith("ready")
        with agent_running(cfg):
            time.sleep(0.5)  # the agent's first /proc scan attaches the CUDA probes to the server
            conn = http.client.HTTPConnection("127.0.0.1", port)
            for _ in range(N):
                conn.request("GET", "/predict")
                response = conn.getresponse()
                assert (response.status, response.read()) == (200, b"ok")
            conn.close()
            c.wait_for(
                lambda: (
                    server_count(c, server.pid) == N
                    and total(c, "cuda.kernel.launches", server.pid) == N * LAUNCHES
                    and total(c, "cuda.api.calls", server.pid) == N * 4
                ),
                timeout=30,
                what=f"{N} requests and their CUDA calls counted",
            )
            time.sleep(0.7)  # the spans of the last batch
    finally:
        server.kill()
        server.wait()
    top = [
        s
        for s in c.spans()
        if s.scope_name == "otelbpf.http" and s.kind == "SPAN_KIND_SERVER" and s.attributes["process.pid"] == server.pid
    ]
    cuda = [s for s in c.spans() if s.scope_name == "otelbpf.cuda" and s.resource["process.pid"] == server.pid]
    assert 0 < len(top) < N, len(top)  # 1/4 of 48: P(none or all) < 1e-5
    states = c.trace_states()
    kept = {s.span_id: s for s in top}
    # no CUDA span without its request: every one is a kept request's child, in its trace
    assert all(s.parent_span_id in kept for s in cuda), [s.name for s in cuda if s.parent_span_id not in kept]
    assert all(s.trace_id == kept[s.parent_span_id].trace_id for s in cuda)
    assert not any(s.attributes.get("otelbpf.sampling.shed") for s in cuda)
    for request in top:
        kids = [s for s in cuda if s.parent_span_id == request.span_id]
        assert len(kids) == CALLS, sorted(k.name for k in kids)
        assert sum("LaunchKernel" in k.name for k in kids) == LAUNCHES, sorted(k.name for k in kids)
        # the request's threshold holds for its children: each stands for 4 calls
        assert states[request.span_id] == "ot=th:c"
        assert {states[k.span_id] for k in kids} == {"ot=th:c"}
    # every call counted, whatever its request's fate
    assert total(c, "cuda.memcpy.bytes", server.pid) == N * COPY
    assert total(c, "otelbpf.cuda.spans.shed", server.pid) == (N - len(top)) * CALLS
    # the files the diagnosis reads hold every call, as without sampling
    loader = SpanLoader()
    read_spans(str(out), [loader])
    [files] = [spans for (_host, pid), spans in loader.spans.items() if pid == server.pid]
    assert len(files) == N * CALLS, len(files)
    assert sum("LaunchKernel" in s.name for s in files) == N * LAUNCHES


#: A server that reads each request and closes the connection without answering, then makes
#: CUDA calls of its own on the same thread (argv: port, CUDA runtime): work for no request.
CLOSER = r"""
import ctypes, socket, sys

rt = ctypes.CDLL(sys.argv[2])
rt.cudaFree.argtypes = [ctypes.c_void_p]
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(8)
print("ready", flush=True)
while True:
    conn, _ = s.accept()
    conn.recv(4096)
    conn.close()
    ptr = ctypes.c_void_p()
    assert rt.cudaMalloc(ctypes.byref(ptr), 64) == 0
    assert rt.cudaFree(ptr) == 0
"""


def test_a_shed_request_closed_unanswered_leaves_its_thread_unshed(otlp_collector, tmp_path):
    """Every request is shed (probability 2^-20), and each is closed without a response: the
    CUDA calls the thread makes after the close serve no request, and reach the trace backend.
    The server starts after the agent: an accept() entered before the agent is not seen, and the
    first connection it returns has no known end to sample by (sockets.c: role unknown)."""
    c = otlp_collector
    (port,) = free_ports(1)
    n = 5
    cfg = write_config(tmp_path, c, [port], cuda=True, sampling_probability=2.0**-20, adaptive_sampling=False)
    with agent_running(cfg):
        server = subprocess.Popen(
            [sys.executable, "-c", CLOSER, str(port), str(FAKE_CUDART)], stdout=subprocess.PIPE, text=True
        )
        try:
            assert server.stdout.readline().startswith("ready")
            for _ in range(n):
                with socket.create_connection(("127.0.0.1", port)) as conn:
                    conn.sendall(b"GET /never HTTP/1.1\r\nHost: x\r\n\r\n")
                    assert conn.recv(16) == b""  # closed unanswered
            c.wait_for(
                lambda: len([s for s in c.spans("cudaFree") if s.resource["process.pid"] == server.pid]) >= n,
                timeout=30,
                what="the CUDA calls after each close, as spans",
            )
            time.sleep(0.7)  # two more exports: the counts of the last request
            counted = (total(c, "cuda.api.calls", server.pid), server_count(c, server.pid))
        finally:
            server.kill()
            server.wait()
    assert counted == (2 * n, n)  # every request shed and counted, every call counted
    mine = [s for s in c.spans() if s.scope_name == "otelbpf.cuda" and s.resource["process.pid"] == server.pid]
    assert sorted(s.name for s in mine) == sorted(["cudaFree", "cudaMalloc"] * n), mine
    assert all(not s.parent_span_id for s in mine)
