"""CUDA 13 as a GPU runs it, with the stand-in runtime and driver (examples/cuda/): launches
pass heap handles made by ``__cudaGetKernel``, and every runtime call enters the driver on
the same thread. The real CUDA 13 runtime cannot get this far here (it validates the driver),
so this is where count-once and handle naming are proven end to end; every count is checked
against what the workload says it called.
"""

from __future__ import annotations

import cxxfilt
import pytest

from harness.agent import BUILD, FAKE_CUDA, WORKLOAD, AgentProcess, config, finish, otlp_grpc, start_workload

pytestmark = pytest.mark.bpf

FAKE_CUDART13 = BUILD / "fakecudart13" / "libcudart.so.13"

#: Functions whose completed calls the agent counts in ``cuda.api.calls`` (paired probes
#: that become events; handle look-ups are facts, not calls).
COUNTED = {
    "cudaMalloc",
    "cudaFree",
    "cudaMemcpy",
    "cudaMemcpyAsync",
    "cudaMemcpyAsync_ptsz",
    "cudaStreamSynchronize",
    "cudaStreamSynchronize_ptsz",
    "cudaDeviceSynchronize",
    "cudaMallocAsync",
    "cudaFreeAsync",
    "cudaEventRecord",
    "cudaEventQuery",
    "cudaEventSynchronize",
    "cudaStreamWaitEvent",
    "cudaHostRegister",
    "cudaHostUnregister",
    "cudaMallocHost",
    "cudaFreeHost",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuMemcpyDtoD_v2",
    "cuMemcpy",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpy2D_v2",
    "cuMemcpy3D_v2",
    "cuStreamSynchronize",
    "cuCtxSynchronize",
    "cuMemCreate",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemRelease",
}


def _by(c, name: str, pid: int, key: str = "cuda.api.function") -> dict:
    return {p.attributes[key]: p.value for p in c.latest_points(name, **{"process.pid": pid})}


def _run(agent_args: list[str], workload: list[str], otlp_collector, tmp_path) -> tuple[dict, AgentProcess]:
    cfg = config(otlp_grpc(otlp_collector), tmp=tmp_path, cuda={"launch_sample_every": 1})
    with AgentProcess(
        ["-c", str(cfg), *agent_args, "--", str(WORKLOAD), "--lib", str(FAKE_CUDART13), *workload]
    ) as agent:
        assert agent.wait() == 0, agent.output
    line = next(x for x in agent.output.splitlines() if x.startswith('{"workload"'))
    import json

    return json.loads(line), agent


def test_every_call_counted_once_though_the_runtime_calls_the_driver(otlp_collector, tmp_path):
    w, _ = _run(
        [],
        [
            "--cuda13",
            "--iterations",
            "3",
            "--launches-per-iter",
            "4",
            "--events",
            "--async-alloc",
            "--host-memory",
            "pinned",
            "--driver-lib",
            str(FAKE_CUDA),
            "--driver-copies",
            "--vmm",
            "--driver-ptsz",
            "--driver-graph-launches",
            "1",
        ],
        otlp_collector,
        tmp_path,
    )
    c, pid = otlp_collector, w["pid"]
    drv = w["driver_calls"]
    # The runtime really did call the driver for each of its calls (what would be counted twice).
    assert drv["cuLaunchKernel"] == 12 and drv["cuMemAllocAsync"] == 3 and drv["cuEventQuery"] == 3, drv
    launches = {
        "cudaLaunchKernel": w["calls"]["__cudaLaunchKernel"],
        "cuLaunchKernel_ptsz": w["calls"]["cuLaunchKernel_ptsz"],
        "cuGraphLaunch": w["calls"]["cuGraphLaunch"],
    }
    assert launches["cudaLaunchKernel"] == 12
    c.wait_for(
        lambda: _by(c, "cuda.kernel.launches", pid) == launches,
        what=f"each launch once: {launches}, got {_by(c, 'cuda.kernel.launches', pid)}",
    )
    expected = {f: n for f, n in w["calls"].items() if n and f in COUNTED}
    c.wait_for(
        lambda: _by(c, "cuda.api.calls", pid) == expected,
        what=f"each call once: {expected}, got {_by(c, 'cuda.api.calls', pid)}",
    )
    # Every launch span names its kernel: runtime handles by registration, the workload's own
    # driver launches by the names it gave cuModuleGetFunction.
    spans = [s for s in c.spans() if s.resource.get("process.pid") == pid and "cuda.kernel.name" in s.attributes]
    runtime = {
        (s.attributes["cuda.kernel.name"], s.attributes["cuda.kernel.name_source"])
        for s in spans
        if s.name == "cudaLaunchKernel"
    }
    assert {n for n, _ in runtime} == {cxxfilt.demangle(k["device_name"]) for k in w["kernels"]}
    # The stand-in workload registers names from heap strings, gone with the process when it
    # exits before the agent reads them: then the handle's alias and host stub name it. (nvcc's
    # registration strings are in .rodata and read from the file: tests/test_cuda_real_stack.py.)
    assert {src for _, src in runtime} <= {"registration", "symbol"}, runtime
    driver = {
        (s.attributes["cuda.kernel.name"], s.attributes["cuda.kernel.name_source"])
        for s in spans
        if s.name == "cuLaunchKernel_ptsz"
    }
    assert driver == {
        (cxxfilt.demangle(k["name"]) if k["name"].startswith("_Z") else k["name"], "driver")
        for k in w["driver_kernels"]
    }
    # Pinned host buffers: every runtime copy is from or to page-locked memory.
    host = {
        (p.attributes["cuda.memcpy.direction"], p.attributes["cuda.memcpy.host_memory"]): p.value
        for p in c.latest_points("cuda.memcpy.host_bytes", **{"process.pid": pid})
    }
    assert (
        host[("H2D", "pinned")] >= w["memcpy"]["h2d"]["bytes"]
        and host[("D2H", "pinned")] >= w["memcpy"]["d2h"]["bytes"]
    )
    copies = [s for s in c.spans("cudaMemcpy") if s.resource.get("process.pid") == pid]
    assert copies and {s.attributes["cuda.memcpy.host_memory"] for s in copies} == {"pinned"}
    # VMM: mapped bytes are device memory in use while mapped; freed addresses carry sizes.
    frees = [s for s in c.spans() if s.resource.get("process.pid") == pid and s.name in ("cudaFreeAsync", "cuMemUnmap")]
    assert frees and all(s.attributes["cuda.memory.bytes"] > 0 for s in frees)
    errors = _by(c, "cuda.api.errors", pid)
    assert "cudaEventQuery" not in errors  # 600, not ready, is an answer


@pytest.mark.parametrize("memory", ["pageable", "registered"])
def test_pageable_and_registered_host_memory(otlp_collector, tmp_path, memory):
    w, _ = _run([], ["--cuda13", "--iterations", "2", "--host-memory", memory], otlp_collector, tmp_path)
    c, pid = otlp_collector, w["pid"]
    want = "pageable" if memory == "pageable" else "pinned"
    c.wait_for(
        lambda: (
            {
                (d, h)
                for d, h in (
                    tuple(p.attributes[k] for k in ("cuda.memcpy.direction", "cuda.memcpy.host_memory"))
                    for p in c.latest_points("cuda.memcpy.host_bytes", **{"process.pid": pid})
                )
            }
            == {("H2D", want), ("D2H", want)}
        ),
        what=f"copies from {want} memory",
    )


def test_attached_late_heap_handles_are_named(otlp_collector, tmp_path):
    """Registration happened before the agent came: the heap handles are named through
    what __cudaGetKernel said (handle -> host stub -> its symbol) or, where that too was
    missed, from the launches' return addresses inside __device_stub__<kernel>."""
    cfg = config(otlp_grpc(otlp_collector), tmp=tmp_path, cuda={"launch_sample_every": 1})
    gate = tmp_path / "go"
    with AgentProcess(["-c", str(cfg)]) as agent:
        agent.wait_ready()
        proc = start_workload(
            "--cuda13", "--iterations", "2", "--launches-per-iter", "3", "--wait-for-file", str(gate), lib=FAKE_CUDART13
        )
        try:
            agent.wait_attached(FAKE_CUDART13)
            gate.touch()
            w = finish(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
        c, pid = otlp_collector, w["pid"]
        c.wait_for(lambda: _by(c, "cuda.kernel.launches", pid) == {"cudaLaunchKernel": 6}, what="6 launches once")
        c.wait_for(
            lambda: len([s for s in c.spans("cudaLaunchKernel") if s.resource.get("process.pid") == pid]) == 6,
            what="6 launch spans",
        )
        agent.stop()
    spans = [s for s in c.spans("cudaLaunchKernel") if s.resource.get("process.pid") == pid]
    named = {(s.attributes["cuda.kernel.name"], s.attributes["cuda.kernel.name_source"]) for s in spans}
    assert all(k["handle"] != k["host_stub"] for k in w["kernels"])  # CUDA 13 handles, not host stubs
    assert {n for n, _ in named} == {cxxfilt.demangle(k["device_name"]) for k in w["kernels"]}, named
    assert {src for _, src in named} <= {"symbol", "device_stub"}, named
