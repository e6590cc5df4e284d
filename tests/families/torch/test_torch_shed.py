"""The torch operators of HTTP requests head sampling shed, end to end with the real agent: real
eBPF, real PyTorch (the CPU wheel), a real HTTP server, a real OTLP collector.

A threaded HTTP/1.1 server runs OPS ``torch.mm`` calls on the handler's thread for each request,
between reading it and answering; the kernel samples requests at 1/4 (bpf/sockets.c) and marks
the operators of a shed one (bpf/torch.c, EVF_SHED). Planted: N requests. Expected, from that:

- in the trace backend, every operator span of the server is a kept request's child, in its
  trace, with its sampling threshold (``ot=th:c``); each kept request has its OPS operators;
- ``otelbpf.torch.operator.calls`` counts every call (N x OPS mm), kept or shed, and
  ``otelbpf.torch.spans.shed`` the shed requests' operator spans.
"""

from __future__ import annotations

import http.client
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from test_http_agent import free_ports, write_config
from test_http_load_agent import agent_running, server_count

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.bpf

LIB = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
N = 40
OPS = 3

APP = r"""
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import torch

torch.set_num_threads(1)
a, b = torch.randn(8, 16), torch.randn(16, 4)
ops = int(sys.argv[2])


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        for _ in range(ops):
            torch.mm(a, b)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
print("ready", flush=True)
server.serve_forever()
"""


def total(c, metric: str, pid: int, **attrs: object) -> int:
    return int(sum(p.value for p in c.latest_points(metric, **{"process.pid": pid}, **attrs)))


def test_operators_of_shed_requests_stay_out_of_traces_and_in_every_count(otlp_collector, tmp_path):
    c = otlp_collector
    (port,) = free_ports(1)
    cfg = write_config(tmp_path, c, [port], sampling_probability=0.25, adaptive_sampling=False)
    doc = yaml.safe_load(cfg.read_text())
    doc["receivers"]["torch"] = {"search_paths": []}
    for pipeline in doc["service"]["pipelines"].values():
        pipeline["receivers"] = ["http", "torch"]
    cfg.write_text(yaml.safe_dump(doc))
    server = subprocess.Popen([sys.executable, "-c", APP, str(port), str(OPS)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().startswith("ready")
        with agent_running(cfg, "--pid", str(server.pid)) as agent:
            agent.wait_attached(LIB, timeout=120)
            conn = http.client.HTTPConnection("127.0.0.1", port)
            for _ in range(N):
                conn.request("GET", "/predict")
                response = conn.getresponse()
                assert (response.status, response.read()) == (200, b"ok")
            conn.close()
            c.wait_for(
                lambda: (
                    server_count(c, server.pid) == N
                    and total(c, "otelbpf.torch.operator.calls", server.pid, **{"torch.operator.name": "mm"}) == N * OPS
                ),
                timeout=30,
                what=f"{N} requests and their operators counted",
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
    ops = [s for s in c.spans() if s.scope_name == "otelbpf.torch" and s.resource["process.pid"] == server.pid]
    assert 0 < len(top) < N, len(top)  # 1/4 of 40: P(none or all) < 1e-4
    kept = {s.span_id: s for s in top}
    # no operator span without its request (a shed request's would be a root)
    assert all(s.parent_span_id in kept for s in ops), [s.name for s in ops if s.parent_span_id not in kept]
    assert all(s.trace_id == kept[s.parent_span_id].trace_id for s in ops)
    states = c.trace_states()
    for request in top:
        kids = [s for s in ops if s.parent_span_id == request.span_id]
        assert [k.name for k in kids] == ["mm"] * OPS
        assert {states[k.span_id] for k in kids} == {"ot=th:c"}
    assert total(c, "otelbpf.torch.spans.shed", server.pid) == (N - len(top)) * OPS
