"""End to end: streamed responses, OpenAI-compatible completions, and a batching engine's CUDA
step linked to the requests it served, through the real agent.

Real servers in their own processes (harness/streaming_apps.py: a stdlib HTTP/1.1 server streaming
SSE in chunked encoding with known gaps and a final ``usage`` event, a grpcio server-streaming
method with the same pacing, and an asyncio server handing requests to a batching thread that
calls the CUDA stand-in once per batch), real clients in this process, the real agent
(`otelbpf run --pid` on the three services, one for the module) and the real OTLP collector
(rotel) receiving what it exports.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
import yaml

from harness.agent import FAKE_CUDART, REPO, AgentProcess
from harness.otlp import OtlpCollector
from harness.streaming_apps import BATCH_WINDOW_S, FIRST_S, GAP_S, TOKENS, generate

pytestmark = pytest.mark.bpf

#: Seconds a loaded 2-core VM may add to a server's sleep before a write leaves it.
SLACK = 0.25


@contextlib.contextmanager
def service(kind: str, port: int, *args: str):
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.streaming_apps", kind, str(port), *args],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO / "tests",
        env={**os.environ, "PYTHONPATH": str(REPO / "tests")},
    )
    try:
        assert proc.stdout.readline().startswith("ready"), f"{kind} service did not start"
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """The collector, both services and one agent watching their ports, for every test here."""
    socks = [socket.create_server(("127.0.0.1", 0)) for _ in range(3)]
    sse_port, grpc_port, batch_port = (s.getsockname()[1] for s in socks)
    for s in socks:
        s.close()
    tmp = tmp_path_factory.mktemp("streaming")
    with OtlpCollector() as collector:
        doc = {
            "receivers": {
                "http": {"processes": "all", "ports": [sse_port, grpc_port, batch_port]},
                "cuda": {"search_paths": []},
            },
            "processors": {"batch": {"timeout": "100ms"}},
            "exporters": {"otlp": {"endpoint": collector.grpc_endpoint, "timeout": "2s"}},
            "service": {
                "pipelines": {
                    p: {"receivers": ["http", "cuda"], "processors": ["batch"], "exporters": ["otlp"]}
                    for p in ("traces", "metrics")
                },
                "telemetry": {"metrics_interval": "300ms", "drain_interval": "20ms"},
            },
        }
        (tmp / "otelbpf.yaml").write_text(yaml.safe_dump(doc))
        with (
            service("sse", sse_port) as sse,
            service("grpc", grpc_port) as grpc_server,
            service("batch", batch_port, str(FAKE_CUDART)) as batch,
            AgentProcess(
                [
                    "-c",
                    str(tmp / "otelbpf.yaml"),  # the services only: not others' CUDA on the host
                    *(arg for p in (sse, grpc_server, batch) for arg in ("--pid", str(p.pid))),
                ]
            ) as agent,
        ):
            agent.wait_ready()
            yield collector, (sse_port, sse.pid), (grpc_port, grpc_server.pid), (batch_port, batch.pid)
            assert agent.proc.poll() is None, agent.output
            assert agent.stop(timeout=120) == 0, agent.output


def server_spans(c, pid: int, name_prefix: str = "") -> list:
    return [
        s
        for s in c.spans()
        if s.scope_name == "otelbpf.http"
        and s.kind == "SPAN_KIND_SERVER"
        and s.attributes.get("process.pid") == pid
        and s.name.startswith(name_prefix)
    ]


def completion(port: int, stream: bool) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    body = json.dumps(
        {
            "messages": [{"role": "user", "content": "secret-prompt"}],
            "model": "tiny-llm",
            "stream": stream,
            "max_tokens": 7,
        }
    )
    conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
    data = conn.getresponse().read()
    conn.close()
    return data


def test_sse_completion_time_to_first_token_chunks_usage_and_metrics(stack):
    c, (port, pid), _, _ = stack
    for stream in (True, True, False):
        assert completion(port, stream)
    spans = c.wait_for(
        lambda: len(server_spans(c, pid)) == 3 and server_spans(c, pid), timeout=20, what="3 completion server spans"
    )
    streamed = [s.attributes for s in spans if "otelbpf.http.response.events" in s.attributes]
    [plain] = [s.attributes for s in spans if "otelbpf.http.response.events" not in s.attributes]
    assert len(streamed) == 2
    events = len(TOKENS) + 2  # the tokens, the usage event, [DONE]
    for a in streamed:
        assert (
            a["gen_ai.operation.name"],
            a["gen_ai.provider.name"],
            a["gen_ai.request.model"],
            a["gen_ai.response.model"],
            a["gen_ai.usage.input_tokens"],
            a["gen_ai.usage.output_tokens"],
        ) == ("chat", "openai", "tiny-llm", "tiny-llm-served", 7, len(TOKENS))
        assert a["otelbpf.http.response.events"] == events and a["otelbpf.http.response.chunks"] == events
        assert FIRST_S <= a["otelbpf.http.response.time_to_first_event"] < FIRST_S + SLACK
        assert a["otelbpf.http.response.time_to_first_byte"] < a["otelbpf.http.response.time_to_first_chunk"]
        assert GAP_S * 0.9 <= a["otelbpf.http.response.event_gap.max"] < GAP_S + SLACK
        assert list(a["gen_ai.response.finish_reasons"]) == ["stop"]
    assert (plain["gen_ai.usage.output_tokens"], plain["gen_ai.response.id"]) == (len(TOKENS), "cmpl-json")
    everything = repr([(s.attributes, s.status_message) for s in c.spans()])
    assert "secret-prompt" not in everything and "forty" not in everything  # content is not captured by default

    f = {"process.pid": pid, "gen_ai.request.model": "tiny-llm"}
    [ttft] = c.wait_for(
        lambda: [p for p in c.latest_points("gen_ai.server.time_to_first_token", **f) if p.count == 2],
        what="time to first token",
    )
    assert FIRST_S * 2 <= ttft.sum < (FIRST_S + SLACK) * 2
    assert ttft.explicit_bounds[:4] == [0.001, 0.005, 0.01, 0.02] and ttft.attributes["server.port"] == port
    [tpot] = c.latest_points("gen_ai.server.time_per_output_token", **f)
    assert tpot.count == 2 and GAP_S * 0.9 * 2 <= tpot.sum < (GAP_S + SLACK) * 2
    [duration] = c.latest_points("gen_ai.server.request.duration", **f)
    assert duration.count == 3 and duration.attributes["gen_ai.operation.name"] == "chat"
    gaps = c.latest_points("otelbpf.http.server.response.gap", **{"process.pid": pid, "otelbpf.stream.unit": "event"})
    assert gaps[0].count == 2 * (events - 1)


def test_grpc_server_streaming_messages_are_timed(stack):
    c, _, (port, pid), _ = stack
    assert generate(port) == [t.encode() for t in TOKENS]
    [span] = c.wait_for(lambda: server_spans(c, pid, "demo.Tokens/Generate"), timeout=20, what="the gRPC span")
    a = span.attributes
    assert a["rpc.grpc.status_code"] == 0 and a["otelbpf.http.response.chunks"] == len(TOKENS)
    assert FIRST_S <= a["otelbpf.http.response.time_to_first_chunk"] < FIRST_S + SLACK
    assert GAP_S * 0.9 <= a["otelbpf.http.response.chunk_gap.max"] < GAP_S + SLACK
    gaps = c.wait_for(
        lambda: c.latest_points(
            "otelbpf.http.server.response.gap", **{"process.pid": pid, "otelbpf.stream.unit": "data_frame"}
        ),
        what="DATA frame gaps",
    )
    assert gaps[0].count == len(TOKENS) - 1


def test_a_batching_engine_step_is_linked_to_every_request_in_its_batch(stack):
    """Three requests read by an asyncio loop, served by one CUDA step on the engine thread: the step's
    CUDA spans have no parent (no request owns them) and a link to each of the three server spans."""
    c, _, _, (port, pid) = stack
    time.sleep(0.5)  # the agent's first /proc scan attaches the CUDA probes to the service

    def call() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/generate")
        assert conn.getresponse().read() == b"batched"
        conn.close()

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
        time.sleep(BATCH_WINDOW_S / 10)  # all within the window: one batch
    for t in threads:
        t.join()
    served = c.wait_for(
        lambda: len(server_spans(c, pid)) == 3 and server_spans(c, pid), timeout=20, what="3 server spans"
    )
    [malloc] = c.wait_for(
        lambda: [s for s in c.spans("cudaMalloc") if s.resource["process.pid"] == pid],
        timeout=20,
        what="the batch's cudaMalloc span",
    )
    assert malloc.parent_span_id == ""
    assert sorted(span_id for _, span_id, _ in malloc.links) == sorted(s.span_id for s in served)
    assert {trace_id for trace_id, _, _ in malloc.links} == {s.trace_id for s in served}
    assert malloc.attributes["otelbpf.links.in_flight"] == 3
    assert all(s.attributes["thread.id"] != malloc.attributes["thread.id"] for s in served)
