"""The drop-in default: no config file, only the standard OTLP variable. Request tracing is
on for the processes that use a GPU library (and the workers they fork), nothing else: an
HTTP server that runs CUDA shows its request spans with CUDA children at the collector; a
plain server beside it on the same host is not traced. Over HTTPS the same: a streaming
server that loaded a GPU library is traced through OpenSSL (the tls receiver is on by
default), an HTTPS server that loaded none is not, however much libssl it uses."""

from __future__ import annotations

import ctypes
import http.client
import json
import re
import shutil
import ssl
import time
from pathlib import Path

import pytest

from harness.agent import FAKE_CUDART, AgentProcess
from harness.streaming_apps import TOKENS
from harness.tls_apps import make_cert
from test_http_agent import app, free_ports, spans

pytestmark = pytest.mark.bpf
TLS_APPS = "harness.tls_apps"


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


def post(port: int, context: ssl.SSLContext, body: dict) -> bytes:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context)
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    data = conn.getresponse().read()
    conn.close()
    return data


def test_defaults_trace_https_of_gpu_processes_only(otlp_collector, tmp_path: Path):
    gpu_port, plain_port = free_ports(2)
    cert, key = make_cert(tmp_path)
    tls = (str(cert), str(key))
    context = ssl.create_default_context(cafile=str(cert))
    c = otlp_collector
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": c.grpc_endpoint, "OTEL_METRIC_EXPORT_INTERVAL": "500"}
    with (
        app("sse-tls", str(gpu_port), *tls, module=TLS_APPS, env={"LOAD_LIBRARY": str(FAKE_CUDART)}) as gpu,
        app("providers", str(plain_port), *tls, module=TLS_APPS) as other,
        AgentProcess([], env=env) as agent,
    ):
        agent.wait_ready()
        time.sleep(0.5)
        for _ in range(2):
            assert b"[DONE]" in post(gpu_port, context, {"model": "m", "stream": True, "max_tokens": 3})
            assert post(plain_port, context, {"model": "m", "max_tokens": 3})
        c.wait_for(
            lambda: len(spans(c, pid=gpu.pid, kind="server")) == 2,
            timeout=30,
            what="the GPU server's HTTPS request spans",
        )
        agent.stop()
    for top in spans(c, pid=gpu.pid, kind="server"):
        assert (top.attributes["url.scheme"], top.attributes["url.path"]) == ("https", "/v1/chat/completions")
        assert top.attributes["gen_ai.usage.output_tokens"] == len(TOKENS)
    assert spans(c, pid=other.pid) == []  # libssl alone makes no process a GPU process


def _system_libssl() -> Path:
    """The libssl this Python's ``ssl`` maps (Debian's libssl.so.3)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1]
        if Path(path).name.startswith("libssl.so"):
            return Path(path)
    raise AssertionError("Python's ssl maps no libssl")


def test_a_libssl_only_untraced_processes_map_is_not_probed(otlp_collector, tmp_path: Path):
    """A uprobe traps in every process that maps its file, traced or not (the filter runs in BPF,
    after the trap: ~9 us a TLS call here), so by default a libssl file is probed only once a
    process that uses a GPU library maps it. Each server here loads its own copy of the system's
    libssl (LD_LIBRARY_PATH): which copies the agent probed says whose TLS calls trap. A plain
    HTTPS server started before the agent and one started after it: their copies are left alone;
    a GPU server that loads its copy first (Python's ssl) and the CUDA runtime after: its copy is
    probed at that open, before it runs on, and its first request is traced. The test process
    itself uses a GPU library (the CUDA stand-in, loaded here): the servers it starts are its
    children, and an exec ends what a child inherits (discovery.c), so the plain ones stay plain."""
    ctypes.CDLL(str(FAKE_CUDART))  # as earlier tests of a run may have done: the parent is a library user
    gpu_port, early_port, late_port = free_ports(3)
    cert, key = make_cert(tmp_path)
    tls = (str(cert), str(key))
    context = ssl.create_default_context(cafile=str(cert))
    copies = {}
    for name in ("gpu", "early", "late"):
        (tmp_path / name).mkdir()
        copies[name] = shutil.copy2(_system_libssl(), tmp_path / name / _system_libssl().name)
    c = otlp_collector
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": c.grpc_endpoint, "OTEL_METRIC_EXPORT_INTERVAL": "500"}

    def private(name: str, **more: str) -> dict[str, str]:
        return {"LD_LIBRARY_PATH": str(tmp_path / name), **more}

    with (
        app("providers", str(early_port), *tls, module=TLS_APPS, env=private("early")) as early,
        AgentProcess([], env=env) as agent,
    ):
        agent.wait_ready()
        with (
            app("providers", str(late_port), *tls, module=TLS_APPS, env=private("late")) as late,
            app("sse-tls", str(gpu_port), *tls, module=TLS_APPS, env=private("gpu", LOAD_LIBRARY=str(FAKE_CUDART))),
        ):
            for name, pid in (("early", early.pid), ("late", late.pid)):
                assert str(copies[name]) in Path(f"/proc/{pid}/maps").read_text()
            assert b"[DONE]" in post(gpu_port, context, {"model": "m", "stream": True, "max_tokens": 3})
            for port in (early_port, late_port):
                assert post(port, context, {"model": "m", "max_tokens": 3})
            c.wait_for(
                lambda: any(s.attributes.get("url.scheme") == "https" for s in spans(c, kind="server")),
                timeout=30,
                what="the GPU server's first HTTPS request",
            )
        agent.stop()
    probed = re.findall(r"attached \d+ probes to (\S+) \(libssl\)", agent.output)
    assert str(copies["gpu"]) in probed, agent.output
    assert str(copies["early"]) not in probed and str(copies["late"]) not in probed, probed
    for name in ("early", "late"):
        assert f"{copies[name]} (libssl): not probed while no process that uses a GPU library maps it" in agent.output
