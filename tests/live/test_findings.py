"""The live diagnosis exported: LiveState (as the agent feeds it) -> FindingsReporter -> the
``otelbpf.finding`` spans, linked to the spans their evidence cites, and the cost gauges."""

from __future__ import annotations

from opentelemetry.sdk.metrics.export import MetricsData, ResourceMetrics, ScopeMetrics
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan

from otelbpf.correlate import metrics as m
from otelbpf.correlate.spans import make_span, scope
from otelbpf.analyze.diagnose import EVIDENCE_SPANS
from otelbpf.live.findings import FindingsReporter
from otelbpf.live.state import LiveState

S = 1_000_000_000
MS = 1_000_000
T0 = 1_700_000_000 * S
GPU = Resource({"service.name": "train", "process.pid": 100})
RANK = Resource({"service.name": "job", "process.pid": 201})


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


def pageable_copies(n: int, start: int) -> list[ReadableSpan]:
    """``n`` pageable host-to-device copies of 20 ms, one every 40 ms: half the window; each
    followed at once by a launch (the idle time after a blocking copy is the copy's)."""
    launches = [
        make_span(
            "cudaLaunchKernel",
            resource=GPU,
            scope=scope("otelbpf.cuda"),
            start_ns=start + i * 40 * MS + 20 * MS + 50_000,
            end_ns=start + i * 40 * MS + 20 * MS + 60_000,
            attributes={"cuda.api.function": "cudaLaunchKernel", "thread.id": 7},
        )
        for i in range(n)
    ]
    copies = [
        make_span(
            "cudaMemcpy",
            resource=GPU,
            scope=scope("otelbpf.cuda"),
            start_ns=start + i * 40 * MS,
            end_ns=start + i * 40 * MS + 20 * MS,
            attributes={
                "cuda.api.function": "cudaMemcpy",
                "thread.id": 7,
                "cuda.memcpy.bytes": 1 << 20,
                "cuda.memcpy.direction": "H2D",
                "cuda.memcpy.host_memory": "pageable",
            },
        )
        for i in range(n)
    ]
    return sorted(launches + copies, key=lambda s: s.start_time)


def collection(k: int) -> MetricsData:
    """The k-th metrics collection: the GPU process's calls, and a rank the NCCL correlator
    found late (the live view shows the processes of the last collection)."""
    calls = m.cumulative_sum("cuda.api.calls", "{call}", "", [({"cuda.api.function": "cudaMemcpy"}, 50 * k)], T0, T0)
    late = m.cumulative_sum(
        "nccl.straggler", "{collective}", "", [({"nccl.straggler.class": "compute-slow"}, 3 * k)], T0, T0
    )
    return MetricsData(
        [
            ResourceMetrics(GPU, [ScopeMetrics(scope("otelbpf.cuda"), [calls], "")], ""),
            ResourceMetrics(RANK, [ScopeMetrics(scope("otelbpf.nccl"), [late], "")], ""),
        ]
    )


def reporter(state: LiveState, clock: Clock, repeat_s: float = 60.0) -> tuple[FindingsReporter, list]:
    sent: list[ReadableSpan] = []
    resources = {100: GPU, 201: RANK}
    return FindingsReporter(state.snapshot, resources.__getitem__, sent.extend, repeat_s, clock), sent


def test_a_finding_becomes_a_span_linked_to_its_evidence_and_cost_gauges() -> None:
    clock = Clock()
    state = LiveState(min_interval_s=0, clock=clock)
    copies = pageable_copies(50, T0)
    state.on_spans(copies)
    state.on_metrics(collection(1))
    r, sent = reporter(state, clock)
    clock.now = T0 + 3 * S
    out = r.collect()

    by_cause = {s.attributes["otelbpf.finding.cause"]: s for s in sent}
    assert set(by_cause) == {"pageable_copies", "nccl_straggler"}
    span = by_cause["pageable_copies"]
    assert span.name == "otelbpf.finding" and span.resource is GPU
    assert span.instrumentation_scope.name == "otelbpf.diagnose"
    assert span.attributes["otelbpf.finding.evidence.copies"] == 50
    assert span.attributes["otelbpf.finding.cost"] > 0 and span.attributes["otelbpf.finding.fix"]
    # Linked to the copies its evidence cites (diagnose keeps EVIDENCE_SPANS of them), in
    # their own traces; it starts with the earliest of them.
    linked = {(link.context.trace_id, link.context.span_id) for link in span.links}
    cited = [c for c in copies if (c.context.trace_id, c.context.span_id) in linked]
    assert len(linked) == len(cited) == EVIDENCE_SPANS
    assert span.start_time == min(c.start_time for c in cited) and span.end_time == clock.now
    assert by_cause["nccl_straggler"].resource is RANK
    assert "late on 3 collectives" in by_cause["nccl_straggler"].attributes["otelbpf.finding.summary"]

    gauges = {
        (res.attributes["process.pid"], metric.name, p.attributes["otelbpf.finding.cause"]): p.value
        for res, sc, metrics in out
        for metric in metrics
        for p in metric.data.data_points
    }
    assert gauges[(100, "otelbpf.finding.cost", "pageable_copies")] == span.attributes["otelbpf.finding.cost"]
    assert 0.3 < gauges[(100, "otelbpf.finding.share", "pageable_copies")] <= 1.0
    assert (201, "otelbpf.finding.cost", "nccl_straggler") in gauges


def test_a_finding_is_sent_again_only_after_the_repeat_interval_and_forgotten_when_gone() -> None:
    clock = Clock()
    state = LiveState(min_interval_s=0, clock=clock)
    state.on_spans(pageable_copies(50, T0))
    r, sent = reporter(state, clock, repeat_s=60)
    clock.now = T0 + 3 * S
    r.collect()
    assert len(sent) == 1
    clock.now += 10 * S
    assert r.collect() and len(sent) == 1  # gauges at every collection, the span once
    clock.now += 60 * S
    r.collect()
    assert len(sent) == 2 and r.spans_sent == 2
    # The copies leave the live ring (a healthy phase's spans replace them): no finding, no
    # gauge; when they come back the finding is new again and sent at once.
    healthy = LiveState(max_spans=10, min_interval_s=0, clock=clock)
    r2, sent2 = reporter(healthy, clock)
    healthy.on_spans(pageable_copies(50, T0))
    r2.collect()
    healthy.on_spans(
        [make_span("x", resource=GPU, scope=scope("otelbpf.http"), start_ns=T0, end_ns=T0 + 1, attributes={})] * 10
    )
    clock.now += 1 * S
    assert r2.collect() == []
    healthy.on_spans(pageable_copies(50, T0 + 100 * S))
    clock.now += 1 * S
    r2.collect()
    assert len(sent2) == 2


def test_nothing_new_since_the_last_collection_is_not_diagnosed_again() -> None:
    clock = Clock()
    state = LiveState(min_interval_s=3600, clock=clock)  # the snapshot is cached
    state.on_spans(pageable_copies(50, T0))
    r, sent = reporter(state, clock)
    assert r.collect() and len(sent) == 1
    assert r.collect() == []


def test_off_cpu_spans_of_the_sched_receiver_give_live_host_side_findings() -> None:
    """A launching thread that waits 30 ms on a futex before each of its 20 launches (a slow
    data loader): the live diagnosis sees the sched receiver's off_cpu spans too."""
    clock = Clock()
    state = LiveState(min_interval_s=0, clock=clock)
    cuda, sched = scope("otelbpf.cuda"), scope("otelbpf.sched")
    spans = []
    for i in range(20):
        t = T0 + i * 40 * MS
        spans.append(
            make_span(
                "off_cpu",
                resource=GPU,
                scope=sched,
                start_ns=t,
                end_ns=t + 30 * MS,
                attributes={
                    "thread.id": 7,
                    "thread.name": "train",
                    "otelbpf.sched.reason": "futex",
                    "otelbpf.sched.blocked_ns": 30 * MS,
                    "otelbpf.sched.runqueue_ns": 0,
                },
            )
        )
        spans.append(
            make_span(
                "cudaLaunchKernel",
                resource=GPU,
                scope=cuda,
                start_ns=t + 31 * MS,
                end_ns=t + 31 * MS + 10_000,
                attributes={"cuda.api.function": "cudaLaunchKernel", "thread.id": 7},
            )
        )
        spans.append(  # the step ends with a synchronize: the GPU's queue is empty until the next launch
            make_span(
                "cudaStreamSynchronize",
                resource=GPU,
                scope=cuda,
                start_ns=t + 31 * MS + 20_000,
                end_ns=t + 32 * MS,
                attributes={"cuda.api.function": "cudaStreamSynchronize", "thread.id": 7},
            )
        )
    state.on_spans(spans)
    r, sent = reporter(state, clock)
    clock.now = T0 + 2 * S
    r.collect()
    [starved] = [s for s in sent if s.attributes["otelbpf.finding.cause"] == "input_starvation"]
    assert starved.attributes["otelbpf.finding.evidence.waits"] == 19  # the first precedes any CUDA call
    assert {link.context.span_id for link in starved.links} <= {s.context.span_id for s in spans if s.name == "off_cpu"}


def test_the_live_findings_join_the_profilers_timeline_as_diagnose_does() -> None:
    """Each step: a synchronize, then 14 ms of Python (tokenize) before the next launch. With
    the profiler's CPU timeline handed to the live state, the live finding names the function
    and its time, as ``otelbpf diagnose`` does from the files."""
    from otelbpf.correlate.profile_record import CPU_SAMPLE_TYPES, CpuTimeline, Profile

    clock = Clock()
    state = LiveState(min_interval_s=0, clock=clock)
    cuda = scope("otelbpf.cuda")
    spans, rows = [], []
    t = T0
    for i in range(60):
        for name, dur in (("cudaLaunchKernel", 10_000), ("cudaStreamSynchronize", 30 * MS)):
            spans.append(
                make_span(
                    name,
                    resource=GPU,
                    scope=cuda,
                    start_ns=t,
                    end_ns=t + dur,
                    attributes={"cuda.api.function": name, "thread.id": 7},
                )
            )
            t += dur
        if i % 3 == 0:  # ~one sample per 14 ms gap at 99 Hz: every third gap, two samples
            rows += [(t + 2 * MS, 1, 0), (t + 9 * MS, 1, 0)]
        elif i % 3 == 1:
            rows.append((t + 5 * MS, 1, 0))
        t += 14 * MS
    period = 1_000_000_000 // 99
    timeline = CpuTimeline(1 << 20, period, [("tokenize", "/job/train.py", 12, "")], {7: rows})
    profile = Profile("process_cpu", "cpu", {}, 100, T0, t + S, 99, CPU_SAMPLE_TYPES, "cpu", timeline=timeline)
    state.on_spans(spans)
    state.on_profiles([profile])
    r, sent = reporter(state, clock)
    clock.now = t + 2 * S
    r.collect()
    [code] = [s for s in sent if s.attributes["otelbpf.finding.cause"] == "host_code"]
    assert "tokenize (train.py:12)" in code.attributes["otelbpf.finding.summary"]
    assert abs(code.attributes["otelbpf.finding.cost"] - 60 * period / 1e9) < 0.01
