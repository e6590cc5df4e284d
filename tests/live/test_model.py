"""Snapshot -> tables: two metric collections and the spans in between go through the agent's
own LiveState (the SDK's metric and span objects, as the correlators make them), then
model.build; rates, percentiles, RED numbers, ranks and findings are checked exactly."""

from __future__ import annotations

import os

from opentelemetry.sdk.metrics.export import HistogramDataPoint, MetricsData, ResourceMetrics, ScopeMetrics
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import SpanKind

from otelbpf.correlate import metrics as m
from otelbpf.correlate.spans import make_span, scope
from otelbpf.live import model
from otelbpf.live.state import MAX_TEXT, LiveState

S = 1_000_000_000
MS = 1_000_000
T0 = 1_700_000_000 * S
GPU = Resource({"service.name": "train", "process.pid": 100})
RANK0 = Resource({"service.name": "job", "process.pid": 200})
RANK1 = Resource({"service.name": "job", "process.pid": 201})
AGENT = Resource({"service.name": "otelbpf", "process.pid": 1})
CUDA, HTTP, NCCL = scope("otelbpf.cuda"), scope("otelbpf.http"), scope("otelbpf.nccl")


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


def sync_hist(count: int, seconds: float) -> HistogramDataPoint:
    return HistogramDataPoint(
        attributes={"cuda.api.function": "cudaStreamSynchronize"},
        start_time_unix_nano=T0,
        time_unix_nano=T0,
        count=count,
        sum=seconds,
        bucket_counts=[count],
        explicit_bounds=[],
        min=0.0,
        max=seconds,
    )


def collection(k: int) -> MetricsData:
    """The k-th collection: counts that grow by known amounts per collection."""
    gpu = [
        m.cumulative_sum(
            "cuda.api.calls",
            "{call}",
            "",
            [({"cuda.api.function": "cudaMemcpy"}, 100 * k), ({"cuda.api.function": "cudaLaunchKernel"}, 1000 * k)],
            T0,
            T0,
        ),
        m.cumulative_sum(
            "cuda.kernel.launches", "{launch}", "", [({"cuda.api.function": "cudaLaunchKernel"}, 1000 * k)], T0, T0
        ),
        m.cumulative_sum(
            "cuda.kernel.launches.top",
            "{launch}",
            "",
            [({"cuda.kernel.name": "gemm"}, 800 * k), ({"cuda.kernel.name": "relu"}, 200 * k)],
            T0,
            T0,
        ),
        m.cumulative_sum("cuda.memcpy.bytes", "By", "", [({"cuda.memcpy.direction": "H2D"}, (1 << 20) * k)], T0, T0),
        m.cumulative_sum(
            "cuda.memcpy.host_bytes",
            "By",
            "",
            [
                ({"cuda.memcpy.direction": "H2D", "cuda.memcpy.host_memory": "pageable"}, (3 << 18) * k),
                ({"cuda.memcpy.direction": "H2D", "cuda.memcpy.host_memory": "pinned"}, (1 << 18) * k),
            ],
            T0,
            T0,
        ),
        m.gauge("cuda.memory.in_use", "By", "", [({}, 4096 * k)], T0),
        m.gauge("cuda.memory.high_water", "By", "", [({}, 8192)], T0),
        m.histogram("cuda.sync.duration", "s", "", [sync_hist(10 * k, 0.5 * k)]),
    ]
    ranks = [
        ResourceMetrics(
            r,
            [
                ScopeMetrics(
                    NCCL,
                    [
                        m.cumulative_sum(
                            "nccl.collectives", "{call}", "", [({"nccl.op": "AllReduce"}, 20 * k)], T0, T0
                        ),
                        *(
                            [
                                m.cumulative_sum(
                                    "nccl.straggler",
                                    "{collective}",
                                    "",
                                    [({"nccl.straggler.class": "compute-slow"}, 3 * k)],
                                    T0,
                                    T0,
                                )
                            ]
                            if r is RANK1
                            else []
                        ),
                    ],
                    "",
                )
            ],
            "",
        )
        for r in (RANK0, RANK1)
    ]
    agent = ResourceMetrics(
        AGENT,
        [
            ScopeMetrics(
                scope("otelbpf.agent"),
                [
                    m.cumulative_sum(
                        "otelbpf.events.received", "{event}", "", [({"ring": "events"}, 5000 * k)], T0, T0
                    ),
                    m.cumulative_sum(
                        "otelbpf.events.lost", "{event}", "", [({"reason": "ring_buffer_full"}, 7)], T0, T0
                    ),
                    m.cumulative_sum("process.cpu.time", "s", "", [({"cpu.mode": "user"}, 0.25 * k)], T0, T0),
                    m.gauge("process.memory.usage", "By", "", [({}, 150 << 20)], T0),
                ],
                "",
            )
        ],
        "",
    )
    return MetricsData([ResourceMetrics(GPU, [ScopeMetrics(CUDA, gpu, "")], ""), *ranks, agent])


def spans() -> list:
    out = []
    for i in range(1, 101):  # copies of 1..100 ms, all pageable: the diagnosis sees them
        t = T0 + i * 200 * MS
        out.append(
            make_span(
                "cudaMemcpy",
                resource=GPU,
                scope=CUDA,
                start_ns=t,
                end_ns=t + i * MS,
                attributes={
                    "cuda.api.function": "cudaMemcpy",
                    "thread.id": 7,
                    "cuda.memcpy.bytes": 1 << 20,
                    "cuda.memcpy.direction": "H2D",
                    "cuda.memcpy.host_memory": "pageable",
                },
            )
        )
    for i in range(10):  # one route, two statuses; 4 of 10 are 500s
        t = T0 + i * S
        out.append(
            make_span(
                "GET",
                resource=GPU,
                scope=HTTP,
                start_ns=t,
                end_ns=t + (i + 1) * MS,
                kind=SpanKind.SERVER,
                attributes={
                    "http.request.method": "GET",
                    "url.path": "/infer",
                    "http.response.status_code": 500 if i < 4 else 200,
                },
            )
        )
    for rank, res in enumerate((RANK0, RANK1)):
        out.append(
            make_span(
                "ncclAllReduce",
                resource=res,
                scope=NCCL,
                start_ns=T0,
                end_ns=T0 + MS,
                attributes={"nccl.rank": rank, "x": "y" * 1000},
            )
        )
    return out


def state_with_two_collections() -> tuple[dict, dict]:
    clock = Clock()
    state = LiveState(min_interval_s=0, clock=clock)
    state.on_metrics(collection(1))
    first = state.snapshot()
    clock.now += 2 * S
    state.on_spans(spans())
    state.on_metrics(collection(3))
    return first, state.snapshot()


def test_the_snapshot_is_plain_json_of_metrics_and_spans() -> None:
    first, second = state_with_two_collections()
    assert first["spans"] == [] and second["metrics_time_unix_nano"] - first["metrics_time_unix_nano"] == 2 * S
    assert second["version"] == 1 and second["agent_pid"] == os.getpid()
    req = next(s for s in second["spans"] if s["name"] == "GET")
    assert req["kind"] == 2 and req["pid"] == 100 and req["scope"] == "otelbpf.http" and len(req["span_id"]) == 16
    assert len(next(s for s in second["spans"] if "x" in s["attributes"])["attributes"]["x"]) == MAX_TEXT + 3


def test_rates_come_from_two_collections() -> None:
    t = model.build(*state_with_two_collections())
    [gpu, *_] = t.processes
    assert (gpu.pid, gpu.gpu, gpu.calls_per_s, gpu.launches_per_s) == (100, True, 1100.0, 1000.0)
    assert gpu.bytes_per_s == {"H2D": float(1 << 20)}
    assert gpu.host_bytes_per_s == {"H2D pageable": float(3 << 18), "H2D pinned": float(1 << 18)}
    assert (gpu.memory_in_use, gpu.memory_high_water, gpu.sync_wait_share) == (3 * 4096, 8192, 0.5)
    kernels = [(k.kernel, k.launches, k.launches_per_s) for k in t.kernels]
    assert kernels == [("gemm", 2400, 800.0), ("relu", 600, 200.0)]
    agent = t.agent
    assert (agent.events_per_s, agent.events_received, agent.lost) == (5000.0, 15000, 7) and agent.cpu_share == 0.25
    assert t.metrics_age_s == 0.0


def test_latency_percentiles_and_red_numbers_come_from_the_recent_spans() -> None:
    t = model.build(*state_with_two_collections())
    memcpy = next(a for a in t.apis if a.api == "cudaMemcpy")
    assert (memcpy.calls, memcpy.calls_per_s, memcpy.spans) == (300, 100.0, 100)
    assert (memcpy.p50_ms, memcpy.p95_ms, memcpy.p99_ms) == (50.0, 95.0, 99.0)
    [route] = t.routes
    assert (route.route, route.requests, route.errors, route.p50_ms, route.p95_ms) == ("GET /infer", 10, 4, 5.0, 10.0)
    assert route.per_s == round(10 / 9.01, 2)


def test_ranks_name_the_current_straggler_and_findings_come_from_the_diagnosis() -> None:
    t = model.build(*state_with_two_collections())
    assert [(r.rank, r.pid, r.collectives, r.collectives_per_s, r.straggled, r.current_straggler) for r in t.ranks] == [
        (0, 200, 60, 20.0, 0, False),
        (1, 201, 60, 20.0, 9, True),
    ]
    causes = {(f["cause"], f["process"]) for f in t.findings}
    assert ("pageable_copies", "train (pid 100)") in causes and ("nccl_straggler", "job (pid 201)") in causes
    pageable = next(f for f in t.findings if f["cause"] == "pageable_copies")
    assert pageable["evidence"]["copies"] == 100 and pageable["evidence"]["span_ids"]


def test_before_a_second_collection_rates_are_means_since_the_start_and_none_across_a_restarted_counter() -> None:
    first, second = state_with_two_collections()
    assert model.build(None, first).processes[0].calls_per_s is None  # collected at the counters' start
    t = model.build(None, second)  # 3,300 calls since the start, 2 s before: rates from the first collection
    assert t.processes[0].calls_per_s == 3300 / 2 and t.apis[0].calls_per_s is not None
    back = model.build(second, {**first, "metrics_time_unix_nano": second["metrics_time_unix_nano"] + S})
    assert back.processes[0].calls_per_s == 1100.0  # counts fell: counted from zero, not negative


def test_a_head_sampled_request_counts_for_its_adjusted_count() -> None:
    """Under head sampling (families/http/sampling.py) a kept request stands for 2^shift of them:
    the route's requests, errors and percentiles estimate every request, not the traced ones."""
    clock = Clock()
    state = LiveState(min_interval_s=0, clock=clock)
    state.on_metrics(collection(1))
    planted = [(1, 4, 200), (2, 1, 200), (10, 2, 500)]  # (ms, adjusted count, status)
    state.on_spans(
        [
            make_span(
                "POST",
                resource=GPU,
                scope=HTTP,
                start_ns=T0 + i * S,
                end_ns=T0 + i * S + ms * MS,
                kind=SpanKind.SERVER,
                attributes={
                    "http.request.method": "POST",
                    "url.path": "/generate",
                    "http.response.status_code": status,
                    model.ADJUSTED_COUNT: adjusted,
                },
            )
            for i, (ms, adjusted, status) in enumerate(planted)
        ]
    )
    [route] = model.build(None, state.snapshot()).routes
    assert (route.route, route.requests, route.errors) == ("POST /generate", 7, 2)
    # 7 requests: 4 of 1 ms, 1 of 2 ms, 2 of 10 ms; the median is the 4th (1 ms), p95 the 7th
    assert (route.p50_ms, route.p95_ms) == (1.0, 10.0)
    assert route.per_s == round(7 / (2 + 10 / 1e3), 2)


def test_the_agent_row_says_what_share_of_requests_head_sampling_kept() -> None:
    def agent(k: int) -> MetricsData:  # per collection: 100 kept, 500 shed by the draw, 400 for the backlog
        decided = [({"decision": "kept"}, 100 * k), ({"decision": "probability"}, 500 * k)]
        decided += [({"decision": "backlog"}, 400 * k), ({"decision": "red_map_full"}, 7 * k)]
        sampled = m.cumulative_sum("otelbpf.http.sampled", "{request}", "", decided, T0, T0)
        return MetricsData([ResourceMetrics(AGENT, [ScopeMetrics(scope("otelbpf.agent"), [sampled], "")], "")])

    clock = Clock()
    state = LiveState(min_interval_s=0, clock=clock)
    state.on_metrics(agent(1))
    first = state.snapshot()
    clock.now += 2 * S
    state.on_metrics(agent(3))
    row = model.build(first, state.snapshot()).agent
    assert row is not None and row.http_kept_share == 0.1  # red_map_full ones are among the shed
    assert model.build(None, LiveState(min_interval_s=0, clock=clock).snapshot()).agent is None
