"""HTTP under load, end to end: the real agent sheds spans in the kernel, never counts.

- A C epoll server (bench/http_server.c, built here) under a real load generator (two client
  processes on raw keep-alive sockets, each counting the responses it read in full: ~100k
  requests/s here) with a 4-page ring and an 8 KiB backlog: far more records than the ring
  holds arrive between two drains, so most requests are shed, and the exported
  ``http.server.request.duration`` count must still equal the clients' own count, nothing lost
  in the kernel.
- A model server streaming its tokens (server-sent events in chunked encoding), every request
  shed by the draw: each is counted once, timed to its stream's last chunk (as a kept request's
  span is), not to its status line.
- A frontend that calls a backend and CUDA per request, sampled at 1/4: every kept request
  keeps its CUDA calls and its downstream call as children (same thread, in time), carries its
  sampling (``ot=th:c``, adjusted count 4), and no span points to a request that was shed nor
  stands for one (a shed request's CUDA calls are no root spans).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import streaming_apps
from harness.agent import FAKE_CUDART, REPO, AgentProcess
from otelbpf.families.http.probes import DECISIONS
from test_http_agent import app, free_ports, write_config

pytestmark = pytest.mark.bpf

#: One load process: CONNS keep-alive connections, one request in flight on each, for SECONDS;
#: prints the responses it read in full (its own count).
LOAD = r"""
import socket, sys, time
port, conns, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
REQ = b"GET /load HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(conns)]
done = 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    for s in socks:
        s.sendall(REQ)
    for s in socks:
        buf = b""
        while True:
            head, sep, rest = buf.partition(b"\r\n\r\n")
            if sep:
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                if len(rest) >= length:
                    break
            chunk = s.recv(4096)
            if not chunk:
                raise SystemExit("server closed")
            buf += chunk
        done += 1
for s in socks:
    s.close()
print(done)
"""


@contextlib.contextmanager
def agent_running(cfg: Path, *args: str):
    with AgentProcess(["-c", str(cfg), *args]) as agent:
        agent.wait_ready()
        yield agent
        assert agent.proc.poll() is None, agent.output
        assert agent.stop(timeout=120) == 0, agent.output


@contextlib.contextmanager
def c_server(tmp: Path, port: int):
    binary = tmp / "http_server"
    subprocess.run(["cc", "-O2", "-o", str(binary), str(REPO / "bench/http_server.c")], check=True)
    proc = subprocess.Popen([str(binary), str(port), "0"])
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port)).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "server did not listen"
                time.sleep(0.05)
        yield proc
    finally:
        proc.kill()
        proc.wait()


def decisions(c) -> dict[str, int]:
    return {d: int(sum(p.value for p in c.latest_points("otelbpf.http.sampled", decision=d))) for d in DECISIONS}


def server_count(c, pid: int) -> int:
    return sum(p.count for p in c.latest_points("http.server.request.duration", **{"process.pid": pid}))


def test_request_count_stays_exact_when_a_small_ring_sheds_spans(otlp_collector, tmp_path):
    c = otlp_collector
    (port,) = free_ports(1)
    with c_server(tmp_path, port) as server:
        cfg = write_config(tmp_path, c, [port], ring_buffer_size="16KiB", sampling_backlog="8KiB")
        # the server alone (--pid): in host mode other processes' records (other fds looked up)
        # share the small ring, and a burst of theirs can fill it whatever HTTP sheds
        with agent_running(cfg, "--pid", str(server.pid)):
            loads = [
                subprocess.Popen([sys.executable, "-c", LOAD, str(port), "4", "3"], stdout=subprocess.PIPE, text=True)
                for _ in range(2)
            ]
            made = sum(int(p.communicate(timeout=60)[0]) for p in loads)
            assert all(p.returncode == 0 for p in loads)
            counted = c.wait_for(
                lambda: server_count(c, server.pid) >= made and server_count(c, server.pid),
                timeout=20,
                what=f"{made} requests counted",
            )
            time.sleep(0.7)  # two more exports: nothing more may come
            counted = server_count(c, server.pid)
            seen = decisions(c)
    spans = [s for s in c.spans() if s.scope_name == "otelbpf.http" and s.attributes.get("process.pid") == server.pid]
    assert made > 2000, made
    assert counted == made, (counted, made, seen)
    # every request was decided in the kernel, most were shed, and the ring never overflowed
    assert sum(n for d, n in seen.items() if d != "red_map_full") == made, seen
    assert seen["backlog"] + seen["probability"] > made // 2, seen
    assert 0 < len(spans) < made // 2
    assert sum(p.value for p in c.latest_points("otelbpf.events.lost", reason="socket_ring_full")) == 0
    kinds = {p.attributes["http.response.status_code"] for p in c.latest_points("http.server.request.duration")}
    assert kinds == {200}


def test_a_shed_streamed_response_is_timed_to_its_last_chunk(otlp_collector, tmp_path):
    c = otlp_collector
    (port,) = free_ports(1)
    n = 4
    # the headers go out at once; the last token FIRST_S + 4 gaps later, then the last chunk
    planted = streaming_apps.FIRST_S + (len(streaming_apps.TOKENS) - 1) * streaming_apps.GAP_S
    request = json.dumps({"model": "m", "stream": True, "max_tokens": 3})
    with app("sse", str(port), module="harness.streaming_apps") as server:
        cfg = write_config(tmp_path, c, [port], sampling_probability=2.0**-20, adaptive_sampling=False)
        with agent_running(cfg, "--pid", str(server.pid)):
            conn = http.client.HTTPConnection("127.0.0.1", port)
            for _ in range(n):  # one keep-alive connection, held open: each ends at its last chunk
                conn.request("POST", "/v1/chat/completions", body=request, headers={"Content-Type": "application/json"})
                assert b"data: [DONE]" in conn.getresponse().read()
            c.wait_for(lambda: server_count(c, server.pid) == n, timeout=20, what=f"{n} streamed requests counted")
            conn.close()
            time.sleep(0.7)  # two more exports: nothing more may come
            seen = decisions(c)
            points = c.latest_points("http.server.request.duration", **{"process.pid": server.pid})
    assert sum(p.count for p in points) == n and seen["probability"] == n, (points, seen)
    assert [p.attributes["http.response.status_code"] for p in points] == [200]
    assert min(p.min for p in points) >= planted, (points, planted)
    assert not [
        s for s in c.spans() if s.scope_name == "otelbpf.http" and s.attributes.get("process.pid") == server.pid
    ]


def test_sampled_requests_keep_their_cuda_calls_and_downstream_call(otlp_collector, tmp_path):
    front_port, back_port = free_ports(2)
    c = otlp_collector
    env = {**os.environ, "PYTHONPATH": str(REPO / "tests")}

    def app(*args: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-m", "harness.http_apps", *args], stdout=subprocess.PIPE, text=True, env=env
        )
        assert proc.stdout.readline().startswith("ready")
        return proc

    backend = app("backend", str(back_port))
    frontend = app("frontend", str(front_port), str(back_port), str(FAKE_CUDART))
    n = 48
    try:
        cfg = write_config(
            tmp_path, c, [front_port, back_port], cuda=True, sampling_probability=0.25, adaptive_sampling=False
        )
        with agent_running(cfg):
            time.sleep(0.5)  # the agent's first /proc scan attaches the CUDA probes to the frontend
            conn = http.client.HTTPConnection("127.0.0.1", front_port)
            for _ in range(n):
                conn.request("GET", "/predict")
                assert conn.getresponse().read() == b"prediction"
            conn.close()
            c.wait_for(
                lambda: (
                    server_count(c, frontend.pid) == n
                    # kept requests' CUDA spans sent, shed ones' counted
                    and len(
                        [
                            s
                            for s in c.spans()
                            if s.scope_name == "otelbpf.cuda" and s.resource["process.pid"] == frontend.pid
                        ]
                    )
                    + sum(p.value for p in c.latest_points("otelbpf.cuda.spans.shed", **{"process.pid": frontend.pid}))
                    == 3 * n
                ),
                timeout=30,
                what=f"{n} frontend requests counted and their CUDA spans",
            )
            time.sleep(0.5)  # the HTTP spans of the last batch
    finally:
        for proc in (frontend, backend):
            proc.kill()
            proc.wait()
    http_spans = [s for s in c.spans() if s.scope_name == "otelbpf.http"]
    front = [s for s in http_spans if s.attributes.get("process.pid") == frontend.pid]
    top = [s for s in front if s.kind == "SPAN_KIND_SERVER"]
    down = [s for s in front if s.kind == "SPAN_KIND_CLIENT"]
    cuda = [s for s in c.spans() if s.scope_name == "otelbpf.cuda" and s.resource["process.pid"] == frontend.pid]
    assert 0 < len(top) < n, len(top)  # 1/4 of 48: P(none or all) < 1e-5
    by_id = {s.span_id: s for s in top}
    states = c.trace_states()
    for span in top:
        assert span.attributes["otelbpf.http.sampling.adjusted_count"] == 4
        assert states[span.span_id] == "ot=th:c"  # p = 1/4: T = 2^56 - 2^54 = 0xc0000000000000
        # a malloc, a copy and a free (runtime or driver names, as the cuda receiver reports them)
        kids = sorted(s.name for s in cuda if s.parent_span_id == span.span_id)
        assert len(kids) == 3 and all(k.startswith("cu") for k in kids), kids
        [call] = [s for s in down if s.parent_span_id == span.span_id]
        assert call.trace_id == span.trace_id and call.attributes["url.path"] == "/work"
    # the downstream calls of shed requests were shed with them; nothing points to a shed request
    assert len(down) == len(top)
    assert all(s.parent_span_id in by_id for s in down)
    # the CUDA calls of shed requests stay out of the traces (tests/families/cuda/test_shed_requests.py)
    assert all(s.parent_span_id in by_id for s in cuda)
    assert len(cuda) == 3 * len(top)
    seen = decisions(c)
    # the frontend's calls made for shed requests were shed with them (the other ends draw on
    # their own: this test's client, the frontend serving, the backend serving)
    assert seen["parent"] == n - len(top), seen
