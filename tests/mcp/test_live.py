"""`otelbpf mcp --live`: the same tools over a running agent's state socket (the agent's own
LiveState and StateServer, fed the SDK objects its correlators make), through the SDK's
client; an agent that went away is a tool error and the server answers again once one is back."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
from mcp import Client
from opentelemetry.sdk.metrics.export import MetricsData, ResourceMetrics, ScopeMetrics
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import SpanKind

from otelbpf.correlate import metrics as m
from otelbpf.correlate.spans import make_span, scope
from otelbpf.live.endpoint import StateServer
from otelbpf.live.state import LiveState
from otelbpf.mcp.live import LiveSource
from otelbpf.mcp.server import build

MS = 1_000_000
T0 = 1_700_000_000_000_000_000
WEB = Resource({"service.name": "web", "process.pid": 10})
RANKS = [Resource({"service.name": "job", "process.pid": 20 + r}) for r in (0, 1)]
CUDA, HTTP, NCCL = scope("otelbpf.cuda"), scope("otelbpf.http"), scope("otelbpf.nccl")


def agent_state() -> tuple[LiveState, dict]:
    state = LiveState(min_interval_s=0)
    spans, ids = [], {}
    req = make_span(
        "GET",
        resource=WEB,
        scope=HTTP,
        start_ns=T0,
        end_ns=T0 + 400 * MS,
        kind=SpanKind.SERVER,
        attributes={"http.request.method": "GET", "url.path": "/infer", "http.response.status_code": 200},
    )
    spans.append(req)
    for i in range(20):  # pageable copies under the request: 20 x 10 ms in a 400 ms window
        t = T0 + i * 20 * MS
        spans.append(
            make_span(
                "cudaMemcpy",
                resource=WEB,
                scope=CUDA,
                start_ns=t,
                end_ns=t + 10 * MS,
                parent=req.context,
                attributes={
                    "cuda.api.function": "cudaMemcpy",
                    "thread.id": 7,
                    "cuda.memcpy.bytes": 1 << 20,
                    "cuda.memcpy.direction": "H2D",
                    "cuda.memcpy.host_memory": "pageable",
                },
            )
        )
    for rank, res in enumerate(RANKS):
        for seq in range(1, 4):
            t = T0 + seq * 100 * MS + rank * 30 * MS
            spans.append(
                make_span(
                    "ncclAllReduce",
                    resource=res,
                    scope=NCCL,
                    start_ns=t,
                    end_ns=t + MS,
                    attributes={
                        "nccl.comm.id": "00000000000000aa",
                        "nccl.seq": seq,
                        "nccl.rank": rank,
                        "nccl.nranks": 2,
                    },
                )
            )
    state.on_spans(spans)
    ids["request"] = (f"{req.context.trace_id:032x}", f"{req.context.span_id:016x}")
    state.on_metrics(
        MetricsData(
            [
                ResourceMetrics(
                    WEB,
                    [
                        ScopeMetrics(
                            CUDA,
                            [
                                m.cumulative_sum(
                                    "cuda.memcpy.bytes",
                                    "By",
                                    "",
                                    [({"cuda.memcpy.direction": "H2D"}, 20 << 20)],
                                    T0,
                                    T0,
                                )
                            ],
                            "",
                        )
                    ],
                    "",
                ),
                *[
                    ResourceMetrics(
                        res,
                        [
                            ScopeMetrics(
                                NCCL,
                                [
                                    m.cumulative_sum(
                                        "nccl.collectives", "{call}", "", [({"nccl.op": "AllReduce"}, 3)], T0, T0
                                    ),
                                    *(
                                        [
                                            m.cumulative_sum(
                                                "nccl.straggler",
                                                "{collective}",
                                                "",
                                                [({"nccl.straggler.class": "host-slow"}, 3)],
                                                T0,
                                                T0,
                                            )
                                        ]
                                        if res is RANKS[1]
                                        else []
                                    ),
                                ],
                                "",
                            )
                        ],
                        "",
                    )
                    for res in RANKS
                ],
            ]
        )
    )
    return state, ids


def ask(source: LiveSource, *calls: tuple[str, dict]) -> list[tuple[bool, object]]:
    async def go():
        out = []
        async with Client(build(source)) as client:
            for name, args in calls:
                r = await client.call_tool(name, args)
                out.append((r.is_error, r.content[0].text if r.is_error else json.loads(r.content[0].text)))
        return out

    return anyio.run(go)


def test_the_tools_answer_from_the_live_state_with_citations(tmp_path: Path) -> None:
    state, ids = agent_state()
    server = StateServer(state.snapshot, str(tmp_path / "run"))
    try:
        (e1, procs), (e2, gpu), (e3, slow), (e4, found), (e5, ranks), (e6, cmp), (e7, flame) = ask(
            LiveSource(server.path),
            ("list_processes", {}),
            ("gpu_summary", {"pid": 10}),
            ("slow_requests", {}),
            ("findings", {}),
            ("stragglers", {}),
            ("compare_ranks", {"a": 0, "b": 1}),
            ("flamegraph_top", {"profile": "x.pb.gz"}),
        )
    finally:
        server.close()
    assert not any((e1, e2, e3, e4, e5, e6)) and e7 and "not in the live state" in flame
    assert {p["pid"] for p in procs["processes"]} == {10, 20, 21} and procs["files"][0].startswith("live: agent pid")
    assert gpu["processes"][0]["bytes_copied"] == {"H2D": 20 << 20}
    [req] = slow["requests"]
    assert (req["trace_id"], req["span_id"]) == ids["request"] and len(req["cuda_children"]) == 20
    assert req["cuda_share"] == 0.5
    pageable = next(f for f in found["findings"] if f["cause"] == "pageable_copies")
    assert pageable["process"] == "web (pid 10)" and len(pageable["evidence"]["spans"]) == 5
    assert all(c["trace_id"] == ids["request"][0] for c in pageable["evidence"]["spans"])
    late = next(r for r in ranks["ranks"] if r["current_straggler"])
    assert (late["rank"], late["pid"], late["straggled"], late["straggler_class"]) == (1, 21, 3, "host-slow")
    assert len(late["evidence"]["latest_entries"]) == 3
    assert cmp["communicators"][0]["b_entered_later"] == 3


def test_an_agent_that_went_away_is_a_tool_error_then_one_that_is_back_answers(tmp_path: Path) -> None:
    state, _ = agent_state()
    run = tmp_path / "run"
    server = StateServer(state.snapshot, str(run))
    path = server.path
    server.close()

    async def go():
        async with Client(build(LiveSource(path))) as client:
            gone = await client.call_tool("list_processes", {})
            back = StateServer(state.snapshot, str(run))
            try:
                again = await client.call_tool("list_processes", {})
            finally:
                back.close()
            return gone, again

    gone, again = anyio.run(go)
    assert gone.is_error and "no such socket" in gone.content[0].text
    assert not again.is_error and json.loads(again.content[0].text)["total"] == 3
