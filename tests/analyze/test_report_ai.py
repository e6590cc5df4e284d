"""The report's AI flame graph over a folder the real exporters wrote: CUDA spans nested under a
request and a torch operator, CUDA memory and CPU profiles through the pprof file exporter.
Each weight's tree, its legend (what it rests on) and how much of the metrics' count the spans
hold."""

from __future__ import annotations

from pathlib import Path

from test_diagnose import MS, T0, Trace
from test_report import charts, node

from otelbpf.analyze.report import render
from otelbpf.analyze.report_ai import CUDA_API
from otelbpf.base.health import Health
from otelbpf.correlate.profile_record import CALL_SAMPLE_TYPES, CPU_SAMPLE_TYPES, MEMORY_SAMPLE_TYPES, Profile, Sample
from otelbpf.correlate.spans import make_span, new_context, scope
from otelbpf.correlate.stacks import Frame
from otelbpf.export.encoded_profile import encoded
from otelbpf.export.profile_export import PprofFileExporter

PID = 21
CUDA, TORCH, HTTP = scope("otelbpf.cuda"), scope("otelbpf.torch"), scope("otelbpf.http")


def spans(directory: Path) -> None:
    """A request -> aten::linear -> its CUDA calls (thread 7), and one launch outside any request.
    Launch spans are 1 in 10 (``otelbpf.sample_every``); the metrics count 60 launches."""
    t = Trace(PID)
    request, op = new_context(), new_context()
    t.spans.append(
        make_span(
            "POST /infer", resource=t.res, scope=HTTP, start_ns=T0, end_ns=T0 + 50 * MS, attributes={}, context=request
        )
    )
    t.spans.append(
        make_span(
            "aten::linear",
            resource=t.res,
            scope=TORCH,
            start_ns=T0 + MS,
            end_ns=T0 + 40 * MS,
            attributes={},
            context=op,
            parent=request,
        )
    )

    def cuda(name: str, start_ms: int, dur_ns: int, parent=op, thread: int | None = 7, **attrs) -> None:
        thread_attr = {} if thread is None else {"thread.id": thread}
        t.spans.append(
            make_span(
                name,
                resource=t.res,
                scope=CUDA,
                start_ns=T0 + start_ms * MS,
                end_ns=T0 + start_ms * MS + dur_ns,
                parent=parent,
                attributes={"cuda.api.function": name, **thread_attr, **attrs},
            )
        )

    for i in range(3):
        cuda("cudaLaunchKernel", 2 + i, 5_000, **{"cuda.kernel.name": "gemm", "otelbpf.sample_every": 10})
    cuda("cudaLaunchKernel", 60, 5_000, parent=None, **{"cuda.kernel.name": "warmup", "otelbpf.sample_every": 10})
    cuda(
        "cudaMemcpyAsync",
        10,
        1 * MS,
        **{
            "cuda.memcpy.bytes": 1 << 20,
            "cuda.memcpy.direction": "H2D",
            "cuda.memcpy.async": True,
            "cuda.memcpy.host_memory": "pageable",
        },
    )
    cuda(
        "cudaMemcpy", 20, 1 * MS, **{"cuda.memcpy.bytes": 4, "cuda.memcpy.direction": "D2H", "cuda.memcpy.async": False}
    )
    cuda("cudaStreamSynchronize", 30, 2 * MS)
    cuda("cudaStreamSynchronize", 35, 1 * MS, thread=None)  # no thread named: the ancestry is the root
    t.t = T0 + 100 * MS
    t.export(directory, launches=80)


def profiles(directory: Path) -> None:
    """Two intervals of CUDA memory (2 MiB allocated by one stack in each; 1 MiB, then 3 MiB in use)
    and one CPU interval: 40 samples inside cudaStreamSynchronize, 60 in plain Python."""
    labels = {"service_name": f"job{PID}"}
    alloc = [Frame("cudaMalloc"), Frame("py:alloc", "python", "train.py", 3), Frame("main")]
    memory = [
        Profile(
            "memory",
            "cuda_memory",
            labels,
            PID,
            T0,
            T0 + end * MS,
            0,
            MEMORY_SAMPLE_TYPES,
            "inuse_space",
            samples=[Sample(alloc, [1, 2 << 20, 1, inuse << 20], {})],
        )
        for end, inuse in ((1000, 1), (2000, 3))
    ]
    cpu = Profile(
        "process_cpu",
        "cpu",
        labels,
        PID,
        T0,
        T0 + 2000 * MS,
        99,
        CPU_SAMPLE_TYPES,
        "cpu",
        samples=[
            Sample(
                [
                    Frame("sched_yield"),
                    Frame("cudaStreamSynchronize"),
                    Frame("py:step", "python", "train.py", 9),
                    Frame("main"),
                ],
                [40, 400 * MS],
                {},
            ),
            Sample([Frame("py:step", "python", "train.py", 9), Frame("main")], [60, 600 * MS], {}),
        ],
    )
    ex = PprofFileExporter(str(directory), Health())
    ex.export([encoded(p) for p in (*memory, cpu)])
    ex.shutdown()


def test_each_weight_its_tree_and_what_it_rests_on(tmp_path: Path) -> None:
    spans(tmp_path)
    profiles(tmp_path)
    page, _findings, problems = render(str(tmp_path))
    assert problems == []
    (ai,) = [f for f in charts(page)["flames"] if f["weights"][0]["key"] == "launches"]
    w = {x["key"]: x for x in ai["weights"]}
    assert list(w) == ["launches", "copied", "sync", "allocated", "cpu_in_cuda"]  # the switch's order
    assert all(f"<option value='{i}'>{x['label']}</option>" in page for i, x in enumerate(ai["weights"]))
    under = ("thread 7", "POST /infer", "aten::linear")  # the span ancestry, the thread at the root
    # launches: sampled spans scaled by sample_every; 40 of the 80 the metrics counted
    assert node(w["launches"]["tree"], *under, "cudaLaunchKernel", "gemm")["value"] == 30
    assert node(w["launches"]["tree"], "thread 7", "cudaLaunchKernel", "warmup")["value"] == 10
    assert w["launches"]["coverage"].startswith(
        "The spans hold 50% of what the metrics counted (80 launches): the rest"
    )
    assert "not a Python stack" in w["launches"]["rests_on"]
    # bytes copied, by direction and host memory
    assert node(w["copied"]["tree"], *under, "cudaMemcpyAsync", "H2D pageable")["value"] == 1 << 20
    # the 4-byte read is under 0.2% of the graph: its frame is left out, its bytes stay in its parent's total
    assert node(w["copied"]["tree"], *under)["value"] == (1 << 20) + 4
    assert [c["name"] for c in node(w["copied"]["tree"], *under)["children"]] == ["cudaMemcpyAsync"]
    # waiting for the GPU: the synchronize and the blocking copy, not the async one
    sync = w["sync"]["tree"]
    assert node(sync, *under, "cudaStreamSynchronize")["value"] == 2 * MS
    assert node(sync, *under, "cudaMemcpy", "D2H")["value"] == 1 * MS and sync["value"] == 4 * MS
    assert node(sync, "POST /infer", "aten::linear", "cudaStreamSynchronize")["value"] == 1 * MS
    # allocations: every interval's, on the merged stack with the CUDA function on top
    assert node(w["allocated"]["tree"], "main", "py:alloc", "cudaMalloc")["value"] == 4 << 20
    assert "Python + native stacks" in w["allocated"]["rests_on"]
    # CPU samples inside a CUDA call only
    cpu = w["cpu_in_cuda"]["tree"]
    assert cpu["value"] == 400 * MS and node(cpu, "main", "py:step", "cudaStreamSynchronize", "sched_yield")
    # the memory-in-use graph is the last interval's balance, not a sum
    assert "cuda_memory profile: 3.0 MiB inuse_space (in use at the last interval" in page


def test_cuda_api_frames() -> None:
    assert all(CUDA_API.match(n) for n in ("cudaMemcpyAsync", "cuLaunchKernel", "ncclAllReduce", "cublasSgemm_v2"))
    assert not any(CUDA_API.match(n) for n in ("cuda_helper.py", "curl_easy_perform", "main", "py:cuda"))


def test_the_cuda_calls_profiles_put_the_code_under_copies_and_waits(tmp_path: Path) -> None:
    """With the profiling receiver's cuda_calls profiles (issue 32, item 5), the copied and waiting
    weights are every call's, on the Python + native stack that made it, not the span ancestry;
    no separate cuda_calls flame graph is drawn."""
    spans(tmp_path)
    profiles(tmp_path)
    step = [Frame("py:step", "python", "train.py", 9), Frame("main")]
    calls = Profile(
        "cuda",
        "cuda_calls",
        {"service_name": f"job{PID}"},
        PID,
        T0,
        T0 + 2000 * MS,
        0,
        CALL_SAMPLE_TYPES,
        "cuda_wait",
        samples=[
            Sample([Frame("cudaStreamSynchronize"), *step], [2, 3 * MS, 0, 0], {}),
            Sample([Frame("cudaMemcpy"), Frame("py:load", "python", "train.py", 5), Frame("main")], [1, MS, 4, 0], {}),
            Sample([Frame("cudaMemcpyAsync"), *step], [1, 1000, 1 << 20, 0], {}),
            # two sampled launches of 64 (launch_stack_every), the kernel above the API call
            Sample([Frame("gemm_kernel(float*)"), Frame("cudaLaunchKernel"), *step], [128, 0, 0, 128], {}),
        ],
    )
    ex = PprofFileExporter(str(tmp_path), Health())
    ex.export([encoded(calls)])
    ex.shutdown()
    page, _findings, problems = render(str(tmp_path))
    assert problems == []
    (ai,) = [f for f in charts(page)["flames"] if f["weights"][0]["key"] == "calls_launches"]
    w = {x["key"]: x for x in ai["weights"]}
    # the launches too: on the code that launched them, not the span ancestry
    assert list(w) == ["calls_launches", "calls_copied", "calls_sync", "allocated", "cpu_in_cuda"]
    launched = w["calls_launches"]["tree"]
    assert node(launched, "main", "py:step", "cudaLaunchKernel", "gemm_kernel(float*)")["value"] == 128
    assert "launch_stack_every" in w["calls_launches"]["rests_on"]
    wait = w["calls_sync"]["tree"]
    assert node(wait, "main", "py:step", "cudaStreamSynchronize")["value"] == 3 * MS
    assert node(wait, "main", "py:load", "cudaMemcpy")["value"] == MS and wait["value"] == 4 * MS + 1000
    assert node(w["calls_copied"]["tree"], "main", "py:step", "cudaMemcpyAsync")["value"] == 1 << 20
    assert "merged Python + native stack" in w["calls_sync"]["rests_on"]
    assert "ancestry" not in w["calls_sync"]["rests_on"] + w["calls_copied"]["rests_on"]
    assert not [f for f in charts(page)["flames"] if f["weights"][0]["key"] == "cuda_calls"]
