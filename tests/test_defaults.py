"""The drop-in default: no config file, only the standard OTLP variable. Request tracing is
on for the processes that use a GPU library (and the workers they fork), nothing else: an
HTTP server that runs CUDA shows its request spans with CUDA children at the collector; a
plain server beside it on the same host is not traced."""

from __future__ import annotations

import http.client
import time

import pytest

from harness.agent import FAKE_CUDART, AgentProcess
from test_http_agent import app, free_ports, spans

pytestmark = pytest.mark.bpf


def test_defaults_trace_requests_of_gpu_processes_with_their_cuda_children(otlp_collector):
    front_port, back_port = free_ports(2)
    c = otlp_collector
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": c.grpc_endpoint, "OTEL_METRIC_EXPORT_INTERVAL": "500"}
    with (
        app("backend", str(back_port)) as backend,
        app("frontend", str(front_port), str(back_port), str(FAKE_CUDART)) as frontend,
        AgentProcess([], env=env) as agent,
    ):
        agent.wait_ready()
        time.sleep(0.5)
        conn = http.client.HTTPConnection("127.0.0.1", front_port)
        for _ in range(3):
            conn.request("GET", "/predict")
            assert conn.getresponse().read() == b"prediction"
        conn.close()
        direct = http.client.HTTPConnection("127.0.0.1", back_port)  # the plain server, called directly
        direct.request("GET", "/work")
        assert direct.getresponse().read() == b"done"
        direct.close()
        c.wait_for(
            lambda: (
                len(spans(c, pid=frontend.pid, kind="server")) == 3
                and len([s for s in c.spans("cudaMemcpy") if s.resource["process.pid"] == frontend.pid]) == 3
            ),
            timeout=30,
            what="the GPU server's request spans and CUDA spans",
        )
        agent.stop()
    assert "requests traced for" in agent.output
    cuda = [s for s in c.spans() if s.scope_name == "otelbpf.cuda" and s.resource["process.pid"] == frontend.pid]
    for top in spans(c, pid=frontend.pid, kind="server"):
        assert top.attributes["url.path"] == "/predict"
        assert sorted(s.name for s in cuda if s.parent_span_id == top.span_id) == [
            "cudaFree",
            "cudaMalloc",
            "cudaMemcpy",
        ]
    assert len(spans(c, pid=frontend.pid, kind="client")) == 3  # its calls to the backend
    assert spans(c, pid=backend.pid) == []  # no GPU library: not traced by default
