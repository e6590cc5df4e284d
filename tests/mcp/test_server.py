"""`otelbpf mcp` through the SDK's own client, over small folders the real file exporters
wrote: what each tool cites, and the bad input that must come back as a tool error while
the server goes on serving (unknown ids, huge limits, a line still being written, a corrupt
line, a missing folder, a path instead of a profile name, a corrupt profile)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp.client.streamable_http import streamable_http_client
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import SpanKind

from harness.agent import REPO
from mcp import Client
from otelbpf.base.safe_files import ReadDir
from otelbpf.correlate.spans import make_span, scope
from otelbpf.correlate.stacks import Frame
from otelbpf.export.jsonfile import FileSpanExporter
from otelbpf.export.pprof import CPU_SAMPLE_TYPES, ProfileBuilder
from otelbpf.mcp.folder import Folder
from otelbpf.mcp.server import MAX_LIMIT, TOKEN_ENV, BearerAuth, build, http_app

T0 = 1_700_000_000_000_000_000
MS = 1_000_000
TOOLS = {
    "list_processes",
    "gpu_summary",
    "top_kernels",
    "findings",
    "stragglers",
    "slow_requests",
    "trace",
    "flamegraph_top",
    "compare_ranks",
}


def _write(directory: Path) -> dict:
    """One GPU server (a slow and a fast request, CUDA children under each), two NCCL
    ranks of which rank 1 enters 30 ms late, and a CPU profile. Returns the ids planted."""
    web = Resource({"service.name": "web", "process.pid": 10, "host.name": "h"})
    http, cuda, nccl = scope("otelbpf.http"), scope("otelbpf.cuda"), scope("otelbpf.nccl")
    spans, planted = [], {}
    for i, dur in enumerate((50 * MS, 5 * MS)):
        t = T0 + i * 100 * MS
        req = make_span(
            "GET",
            resource=web,
            scope=http,
            start_ns=t,
            end_ns=t + dur,
            kind=SpanKind.SERVER,
            attributes={"http.request.method": "GET", "url.path": f"/r{i}", "http.response.status_code": 200},
        )
        copy = make_span(
            "cudaMemcpy",
            resource=web,
            scope=cuda,
            start_ns=t + MS,
            end_ns=t + 3 * MS,
            parent=req.context,
            attributes={"cuda.memcpy.bytes": 4096, "cuda.memcpy.direction": "H2D"},
        )
        spans += [req, copy]
        planted.setdefault("requests", []).append(
            (f"{req.context.trace_id:032x}", f"{req.context.span_id:016x}", f"{copy.context.span_id:016x}")
        )
    for rank in (0, 1):
        res = Resource({"service.name": "job", "process.pid": 20 + rank, "host.name": "h"})
        for seq in range(1, 6):
            t = T0 + seq * 200 * MS + rank * 30 * MS
            end = T0 + seq * 200 * MS + 40 * MS
            spans.append(
                make_span(
                    "ncclAllReduce",
                    resource=res,
                    scope=nccl,
                    start_ns=t,
                    end_ns=end,
                    attributes={
                        "nccl.comm.id": "00000000000000aa",
                        "nccl.seq": seq,
                        "nccl.rank": rank,
                        "nccl.nranks": 2,
                        "nccl.completion": "observed",
                    },
                )
            )
    ex = FileSpanExporter(str(directory))
    ex.export(spans)
    ex.shutdown()
    prof = ProfileBuilder(CPU_SAMPLE_TYPES, time_ns=T0, duration_ns=10**9, default_sample_type="cpu")
    prof.add([Frame("leaf"), Frame("main")], [3, 30], {})
    prof.add([Frame("other"), Frame("main")], [1, 10], {})
    (directory / "profiles").mkdir(mode=0o700)
    (directory / "profiles" / "web-10-cpu-1.pb.gz").write_bytes(prof.encode())
    return planted


@pytest.fixture
def folder(tmp_path: Path) -> tuple[Path, dict]:
    return tmp_path, _write(tmp_path)


def call(directory: Path, *calls: tuple[str, dict], between=None) -> list:
    """Call tools in one session; ``between(i)`` runs before call i (to change the folder)."""

    async def go() -> list:
        out = []
        async with Client(build(Folder(str(directory)))) as client:
            for i, (name, args) in enumerate(calls):
                if between:
                    between(i)
                r = await client.call_tool(name, args)
                out.append((r.is_error, r.content[0].text if r.is_error else json.loads(r.content[0].text)))
        return out

    return anyio.run(go)


def test_the_tools_are_listed_read_only(folder) -> None:
    async def go():
        async with Client(build(Folder(str(folder[0])))) as client:
            return (await client.list_tools()).tools

    tools = anyio.run(go)
    assert {t.name for t in tools} == TOOLS
    assert all(t.annotations.read_only_hint and not t.annotations.destructive_hint for t in tools)


def test_slow_requests_and_trace_cite_the_spans_they_rest_on(folder) -> None:
    directory, planted = folder
    [(err, slow)] = call(directory, ("slow_requests", {"limit": 1}))
    assert not err and slow["total"] == 2 and len(slow["requests"]) == 1
    trace_id, span_id, child = planted["requests"][0]  # the 50 ms one
    top = slow["requests"][0]
    assert (top["trace_id"], top["span_id"], top["route"]) == (trace_id, span_id, "GET /r0")
    assert [c["span_id"] for c in top["cuda_children"]] == [child] and top["cuda_share"] == 0.04
    [(err, tr)] = call(directory, ("trace", {"trace_id": trace_id.upper()}))
    assert not err and [(s["span_id"], s["depth"]) for s in tr["spans"]] == [(span_id, 0), (child, 1)]


def test_nccl_tools_name_the_late_rank_with_its_collectives(folder) -> None:
    (e1, strag), (e2, cmp) = call(folder[0], ("stragglers", {}), ("compare_ranks", {"a": 0, "b": 1}))
    assert not e1 and not e2
    [late] = strag["stragglers"]
    assert late["rank"] == 1 and late["pid"] == 21 and late["straggled"] == 5
    assert len(late["evidence"]["latest_entries"]) == 5
    [comm] = cmp["communicators"]
    assert comm["b_entered_later"] == 5 and comm["a_entered_later"] == 0 and comm["median_entry_gap_ms"] == -30.0
    assert comm["evidence"]["widest_gaps"][0]["b"]["span_id"]


def test_flamegraph_top_cites_file_and_samples(folder) -> None:
    [(err, top)] = call(folder[0], ("flamegraph_top", {"profile": "web-10-cpu-1.pb.gz", "n": 2}))
    assert not err and top["sample_type"] == "cpu" and top["total"] == 40
    assert [(f["function"], f["total"], f["self"]) for f in top["functions"]] == [("main", 40, 0), ("leaf", 30, 30)]
    assert top["functions"][0]["evidence"] == {"profile": "web-10-cpu-1.pb.gz", "samples": [0, 1]}


def test_bad_arguments_are_tool_errors_and_the_server_serves_on(folder) -> None:
    directory = folder[0]
    (directory / "profiles" / "bad-1-cpu-2.pb.gz").write_bytes(b"\x1f\x8bnot really")
    results = call(
        directory,
        ("trace", {"trace_id": "0" * 32}),
        ("trace", {"trace_id": "not-hex"}),
        ("slow_requests", {"limit": MAX_LIMIT + 1}),
        ("gpu_summary", {"pid": 4242}),
        ("flamegraph_top", {"profile": "../../../etc/passwd"}),
        ("flamegraph_top", {"profile": "bad-1-cpu-2.pb.gz"}),
        ("compare_ranks", {"a": 0, "b": 7}),
        ("trace", {"trace_id": "x" * 10_000}),
        ("list_processes", {}),
    )
    errors = [text for err, text in results[:-1] if err]
    assert len(errors) == len(results) - 1, results
    assert "no trace 000" in errors[0] and "not a trace id" in errors[1] and "less than or equal to 200" in errors[2]
    assert "no process with pid 4242" in errors[3] and "[10, 20, 21]" in errors[3]
    assert "no profile '../../../etc/passwd'" in errors[4] and "not gzip" in errors[5]
    assert "ranks seen: [0, 1]" in errors[6] and "trace_id" in errors[7]
    assert results[-1][0] is False and results[-1][1]["total"] == 3


def test_a_line_still_being_written_is_skipped_and_said(folder) -> None:
    directory = folder[0]
    with open(directory / "traces.jsonl", "a") as f:
        f.write('{"resourceSpans": [{"resource": {')  # the agent is mid-write
    [(err, out)] = call(directory, ("list_processes", {}))
    assert not err and out["lines_still_being_written"] == [f"{directory / 'traces.jsonl'}:2"]


def test_a_corrupt_line_names_file_and_line_then_a_fixed_folder_is_read_again(folder) -> None:
    directory = folder[0]
    good = (directory / "traces.jsonl").read_text()

    def between(i: int) -> None:
        (directory / "traces.jsonl").write_text(good + "{not json\n" if i == 0 else good)

    (e1, text), (e2, out) = call(directory, ("slow_requests", {}), ("slow_requests", {}), between=between)
    assert e1 and f"{directory / 'traces.jsonl'}:2: not OTLP-JSON" in text
    assert not e2 and out["total"] == 2


def test_a_missing_folder_and_one_past_the_size_cap_are_tool_errors(tmp_path: Path) -> None:
    [(err, text)] = call(tmp_path / "absent", ("findings", {}))
    assert err and "is not a directory" in text
    _write(tmp_path)

    async def go():
        async with Client(build(Folder(str(tmp_path), max_bytes=100))) as client:
            return await client.call_tool("gpu_summary", {})

    r = anyio.run(go)
    assert r.is_error and "more than the 0 MiB this server reads" in r.content[0].text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_http_needs_the_bearer_token(folder) -> None:
    import uvicorn

    token = "t" * 32
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            http_app(build(Folder(str(folder[0]))), token, "127.0.0.1"),
            host="127.0.0.1",
            port=port,
            log_level="warning",
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port}/mcp"
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": token}):
            assert httpx2.post(url, json=body, headers=headers).status_code == 401

        async def go():
            async with (
                httpx2.AsyncClient(headers={"authorization": f"Bearer {token}"}) as http,
                Client(streamable_http_client(url, http_client=http)) as client,
            ):
                return await client.call_tool("list_processes", {"limit": 1})

        r = anyio.run(go)
        assert not r.is_error and json.loads(r.content[0].text)["total"] == 3
    finally:
        server.should_exit = True
        thread.join(10)


def test_http_refuses_to_start_without_a_token_and_binds_to_localhost(folder, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    cmd = [sys.executable, "-m", "otelbpf.cli", "mcp", str(folder[0]), "--transport", "http"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 2 and f"set {TOKEN_ENV}" in r.stderr
    loose = tmp_path / "token"
    loose.write_text("s" * 32)
    loose.chmod(0o644)
    r = subprocess.run([*cmd, "--token-file", str(loose)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "readable by others" in r.stderr
    port = _free_port()
    proc = subprocess.Popen(
        [*cmd, "--port", str(port)],
        env={**env, TOKEN_ENV: "s" * 32},
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        listening = f"0100007F:{port:04X}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and listening not in Path("/proc/net/tcp").read_text():
            time.sleep(0.1)
        lines = [ln.split() for ln in Path("/proc/net/tcp").read_text().splitlines()[1:]]
        bound = [ln[1] for ln in lines if ln[1].endswith(f":{port:04X}") and ln[3] == "0A"]  # 0A: LISTEN
        assert bound == [listening]
    finally:
        proc.terminate()
        proc.wait(10)


def test_bearer_auth_passes_lifespan_through() -> None:
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["type"])

    anyio.run(BearerAuth(app, "x" * 16), {"type": "lifespan"}, None, None)
    assert seen == ["lifespan"]


def test_a_file_rotated_away_during_a_read_is_listed_again(folder, monkeypatch) -> None:
    directory = folder[0]
    real_open, rotated = ReadDir.open_binary, []

    def rotating_open(self: ReadDir, name: str):
        if name == "traces.jsonl" and not rotated:  # the agent rotates it just before our open
            rotated.append(directory / "traces-20260101T000000-1-000001.jsonl")
            os.rename(directory / name, rotated[0])
        return real_open(self, name)

    monkeypatch.setattr(ReadDir, "open_binary", rotating_open)
    data = Folder(str(directory)).load()
    assert rotated and len(data.spans) == 14 and data.files == [rotated[0].name]
