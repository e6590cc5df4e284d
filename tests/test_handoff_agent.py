"""End to end: CUDA work a request hands to a pool thread is that request's child, followed by
wake-ups (bpf/common.h: handoff_wakeup), with the default receivers (http + cuda, no sched).

Real servers in their own processes (harness/pool_apps.py): a ``ThreadPoolExecutor`` server whose
pool workers launch each request's CUDA work through the stand-in runtime, with the request's own
marker in the allocation's size, and an asyncio server whose loop thread hands work on while
several requests are open. Real clients here, the real agent (`otelbpf run --pid`, one for the
module) and the real OTLP collector (rotel).
"""

from __future__ import annotations

import contextlib
import http.client
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
from harness.pool_apps import LOOP_BATCH, MARKER_BYTES

pytestmark = pytest.mark.bpf


@contextlib.contextmanager
def service(kind: str, port: int):
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.pool_apps", kind, str(port), str(FAKE_CUDART)],
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
    """The collector, both services and one agent watching them, for every test here."""
    socks = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    pool_port, loop_port = (s.getsockname()[1] for s in socks)
    for s in socks:
        s.close()
    tmp = tmp_path_factory.mktemp("handoff")
    with OtlpCollector() as collector:
        doc = {
            "receivers": {"http": {"ports": [pool_port, loop_port]}, "cuda": {"search_paths": []}},
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
            service("pool", pool_port) as pool,
            service("loop", loop_port) as loop,
            AgentProcess(["-c", str(tmp / "otelbpf.yaml"), "--pid", str(pool.pid), "--pid", str(loop.pid)]) as agent,
        ):
            agent.wait_ready()
            time.sleep(0.5)  # the agent's first /proc scan attaches the CUDA probes to the services
            # A first request: the agent looks up the pool's listener (bound before it started).
            get_all(pool_port, ["/work/99/1"])
            yield collector, (pool_port, pool.pid), (loop_port, loop.pid)
            assert agent.proc.poll() is None, agent.output
            assert agent.stop(timeout=120) == 0, agent.output


def get_all(port: int, paths: list[str], stagger_s: float = 0.0) -> None:
    """Every path, each on its own connection, started ``stagger_s`` apart, all awaited."""
    bodies: dict[str, bytes] = {}

    def call(path: str) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", path)
        bodies[path] = conn.getresponse().read()
        conn.close()

    threads = [threading.Thread(target=call, args=(p,)) for p in paths]
    for t in threads:
        t.start()
        time.sleep(stagger_s)
    for t in threads:
        t.join()
    assert bodies == {p: f"done {p.split('/')[2]}".encode() for p in paths}


def served(c, pid: int, paths: list[str]) -> dict[str, object]:
    """path -> its server span, once all are exported."""

    def ready():
        spans = {
            s.attributes.get("url.path"): s
            for s in c.spans()
            if s.scope_name == "otelbpf.http"
            and s.kind == "SPAN_KIND_SERVER"
            and s.attributes.get("process.pid") == pid
        }
        return {p: spans[p] for p in paths} if all(p in spans for p in paths) else None

    return c.wait_for(ready, timeout=20, what=f"server spans of {paths}")


def mallocs(c, pid: int, markers: list[int]) -> dict[int, object]:
    """marker -> the cudaMalloc span of that request's work."""

    def ready():
        found = {
            int(s.attributes["cuda.memory.bytes"]) // MARKER_BYTES: s
            for s in c.spans("cudaMalloc")
            if s.resource["process.pid"] == pid
        }
        return {m: found[m] for m in markers} if all(m in found for m in markers) else None

    return c.wait_for(ready, timeout=20, what=f"cudaMalloc spans of markers {markers}")


def check_tied(servers: dict, work: dict, prefix: str, together: int, at_least: int) -> None:
    """No request's work is another request's child; at least ``at_least`` are their own request's
    children, tied by wake-up; the others are linked (a wake-up is evidence, not proof: a lock
    hand-off can name another thread, docs/design-notes.md)."""
    ids = {s.span_id: path for path, s in servers.items()}
    tied = 0
    for k, span in work.items():
        request = servers[f"{prefix}/{k}/{together}"]
        assert span.parent_span_id in ("", request.span_id), (
            f"request {k}'s work is a child of {ids.get(span.parent_span_id)}"
        )
        if span.parent_span_id:
            assert span.trace_id == request.trace_id
            assert span.attributes["otelbpf.causality"] == "wakeup"
            assert span.attributes["thread.id"] != request.attributes["thread.id"]
            tied += 1
        else:
            assert span.attributes["otelbpf.causality"] == "link"
            assert request.span_id in {span_id for _, span_id, _ in span.links}
    assert tied >= at_least, f"{tied} of {len(work)} tied by wake-up"


def test_a_pool_workers_cuda_work_is_a_child_of_the_request_that_handed_it(stack):
    """Four requests open at once, each read by its own handler thread and handed a little apart to
    a pool worker of its own: each request's allocation (its marker in the size) is that request's
    child, tied by wake-up, though the other three are open too (no same-thread parent, four
    candidates for a link)."""
    c, (port, pid), _ = stack
    paths = [f"/work/{k}/4" for k in range(1, 5)]
    get_all(port, paths, stagger_s=0.05)
    check_tied(served(c, pid, paths), mallocs(c, pid, [1, 2, 3, 4]), "/work", 4, at_least=3)


def test_work_handed_on_twice_is_followed_one_hop(stack):
    """Handler -> dispatcher thread -> worker thread: the worker's allocation is still the child
    of the request the handler read."""
    c, (port, pid), _ = stack
    paths = ["/hop/11/2", "/hop/12/2"]
    get_all(port, paths, stagger_s=0.05)
    check_tied(served(c, pid, paths), mallocs(c, pid, [11, 12]), "/hop", 2, at_least=1)


def test_work_handed_on_by_a_thread_serving_several_requests_stays_linked(stack):
    """An asyncio loop hands work on while LOOP_BATCH requests are open on its thread: no single
    request handed it, so no parent is guessed: each allocation links to the requests still open,
    its own among them."""
    c, _, (port, pid) = stack
    paths = [f"/loop/{k}" for k in range(21, 21 + LOOP_BATCH)]
    get_all(port, paths)
    servers, work = served(c, pid, paths), mallocs(c, pid, list(range(21, 21 + LOOP_BATCH)))
    requests = {s.span_id for s in servers.values()}
    for k, span in work.items():
        assert span.parent_span_id == "", f"request {k}'s work was given a guessed parent"
        assert span.attributes["otelbpf.causality"] == "link"
        linked = {span_id for _, span_id, _ in span.links}
        assert servers[f"/loop/{k}"].span_id in linked <= requests
