"""Head sampling on a server this project did not write: uvicorn (the ASGI server FastAPI and
vLLM's OpenAI-compatible server run on), every request shed by the draw, so everything the
metrics say comes from the kernel's counts. The job plants, on kept-alive connections, streamed
token responses of at least ``STREAM_S`` each, plain 200s and 404s; the exported
``http.server.request.duration`` must hold each status's count exactly, and the streamed ones'
time to their last token, not to their headers."""

from __future__ import annotations

import http.client

import pytest

from harness import asgi_apps
from test_http_agent import app, free_ports, write_config
from test_http_load_agent import agent_running, decisions

pytestmark = pytest.mark.bpf


def test_uvicorn_requests_shed_in_the_kernel_are_counted_by_status_and_timed_to_their_end(otlp_collector, tmp_path):
    c = otlp_collector
    (port,) = free_ports(1)
    plan = {"stream": 6, "health": 9, "missing": 5}
    with app(str(port), module="harness.asgi_apps") as server:
        cfg = write_config(tmp_path, c, [port], sampling_probability=2.0**-20, adaptive_sampling=False)
        with agent_running(cfg, "--pid", str(server.pid)):
            conns = [http.client.HTTPConnection("127.0.0.1", port) for _ in range(2)]
            for i in range(max(plan.values())):  # interleaved over two keep-alive connections
                for kind, n in plan.items():
                    if i >= n:
                        continue
                    conn = conns[i % 2]
                    if kind == "stream":
                        conn.request("POST", "/generate", body=b"{}")
                        assert conn.getresponse().read().count(b"data: ") == len(asgi_apps.TOKENS)
                    else:
                        conn.request("GET", "/health" if kind == "health" else "/missing")
                        response = conn.getresponse()
                        response.read()
                        assert response.status == (200 if kind == "health" else 404)
            for conn in conns:
                conn.close()  # each connection's last request is counted at its close

            def by_status() -> dict[int, tuple[int, float]]:
                out: dict[int, tuple[int, float]] = {}
                for p in c.latest_points("http.server.request.duration", **{"process.pid": server.pid}):
                    n, s = out.get(p.attributes["http.response.status_code"], (0, 0.0))
                    out[p.attributes["http.response.status_code"]] = (n + p.count, s + p.sum)
                return out

            total = sum(plan.values())
            c.wait_for(
                lambda: sum(n for n, _ in by_status().values()) >= total and decisions(c)["probability"] >= total,
                timeout=20,
                what="every request counted and decided",
            )
            seen = decisions(c)
            counted = by_status()
    assert {status: n for status, (n, _) in counted.items()} == {200: plan["stream"] + plan["health"], 404: 5}
    assert seen["probability"] == total and seen["kept"] == 0, seen
    # the 200s' time is at least the streams' own (an old kernel timed them to their headers: ~0)
    assert counted[200][1] >= plan["stream"] * asgi_apps.STREAM_S, counted
    mine = [s for s in c.spans() if s.scope_name == "otelbpf.http" and s.attributes.get("process.pid") == server.pid]
    assert not mine
