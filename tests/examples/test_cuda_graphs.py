"""CUDA Graphs under the real agent: a real nvcc 13 program (examples/cuda/nvcc/graphs.cu) that
captures a graph and replays it, builds one node by node, and then misuses graphs (a capture
invalidated, an update refused, an executable graph destroyed while launched and launched again,
a capture never ended).

- On the CUDA 13 stand-in (``-cudart shared`` with the stand-in libcudart.so.13 first on the
  library path): graphs run as on a GPU (captures record, the runtime calls the driver), so every
  count is exact: a graph replayed 100 times reads 100 runs of each kernel it captured.
- On NVIDIA's real libcudart.so.13 (shared and nvcc's static runtime), with no driver: every call
  returns 35 at the driver boundary, no capture begins, and each call is still seen once.

Expected numbers come from the program's plan (graphs.cu's header), never from the output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from harness.agent import BUILD, AgentProcess, config, otlp_grpc
from harness.nvcc import nvcc as harness_nvcc

pytestmark = pytest.mark.bpf

SOURCE = Path(__file__).resolve().parents[2] / "examples" / "cuda" / "nvcc" / "graphs.cu"
FAKE_CUDART13 = BUILD / "fakecudart13" / "libcudart.so.13"
ADD_ONE, SCALE = "add_one(float*)", "scale(float*, float)"


@pytest.fixture(scope="module")
def programs() -> dict[str, Path]:
    out = Path(tempfile.mkdtemp(prefix="otelbpf-graphs-"))
    nvcc = harness_nvcc()
    flags = ["-O2", "-g", "-Xcompiler", "-fno-omit-frame-pointer", "-I", str(SOURCE.parent)]
    built = {"shared": out / "graphs_shared", "static": out / "graphs_static"}
    subprocess.run([nvcc, *flags, "-cudart", "shared", str(SOURCE), "-o", str(built["shared"])], check=True)
    subprocess.run([nvcc, *flags, str(SOURCE), "-o", str(built["static"]), "-ldl"], check=True)
    return built


def _run(program: Path, replays: int, otlp_collector, tmp_path: Path, standin: bool) -> tuple[dict, str]:
    cfg = config(otlp_grpc(otlp_collector), tmp=tmp_path)
    env = ["env", f"LD_LIBRARY_PATH={FAKE_CUDART13.parent}"] if standin else []
    with AgentProcess(["-c", str(cfg), "--", *env, str(program), str(replays)]) as agent:
        assert agent.wait() == 0, agent.output
    line = next(x for x in agent.output.splitlines() if x.startswith('{"program": "nvcc_graphs"'))
    return json.loads(line), agent.output


def _by(c, metric: str, pid: int, key: str = "cuda.api.function") -> dict:
    return {p.attributes[key]: p.value for p in c.latest_points(metric, **{"process.pid": pid})}


def _graph_kernels(c, pid: int) -> dict[tuple[str, int], int]:
    return {
        (p.attributes["cuda.kernel.name"], p.attributes["cuda.graph.id"]): p.value
        for p in c.latest_points("cuda.kernel.launches.top", **{"process.pid": pid})
        if "cuda.graph.id" in p.attributes
    }


def test_a_graph_replayed_100_times_reads_100_runs_of_each_captured_kernel(otlp_collector, programs, tmp_path):
    if not FAKE_CUDART13.exists():
        pytest.fail(f"{FAKE_CUDART13} is missing: run examples/build.sh")
    n = 100
    w, output = _run(programs["shared"], n, otlp_collector, tmp_path, standin=True)
    codes = w["return_codes"]
    assert codes["cudaGraphLaunch"] == {"0": n + 13, "400": 1}, w  # the stand-in ran the plan
    assert w["driver_calls"]["cuGraphLaunch"] == n + 14  # the runtime called the driver each time
    c, pid = otlp_collector, w["pid"]
    # graph 1 (captured: add_one, scale, add_one) ran n times, then once more before its destroy;
    # graph 2 (built: scale) 10 times, once with add_one after its update, once with scale again
    # after its node's kernel was set in the executable graph
    want = {(ADD_ONE, 1): 2 * (n + 1), (SCALE, 1): n + 1, (SCALE, 2): 11, (ADD_ONE, 2): 1}
    c.wait_for(lambda: _graph_kernels(c, pid) == want, what=f"graph kernels, got {_graph_kernels(c, pid)}")
    # the five launches made while capturing are not launches; the plain one is; each graph launch
    # is counted once (the runtime's, not the driver's inside it)
    assert _by(c, "cuda.kernel.launches", pid) == {"cudaLaunchKernel": 1, "cudaGraphLaunch": n + 14}
    assert _by(c, "cuda.graph.kernel.launches", pid) == {"cudaGraphLaunch": 3 * (n + 1) + 12}
    c.wait_for(
        lambda: (
            _by(c, "otelbpf.cuda.graph.anomalies", pid, "reason")
            == {
                "capture_invalidated": 1,
                "update_failed": 1,
                "destroyed_in_flight": 1,
                "unknown_exec": 1,
                "capture_abandoned": 1,
            }
        ),
        what=f"graph anomalies, got {_by(c, 'otelbpf.cuda.graph.anomalies', pid, 'reason')}",
    )
    calls = _by(c, "cuda.api.calls", pid)
    assert {f: calls.get(f) for f in ("cudaStreamBeginCapture", "cudaStreamEndCapture", "cudaGraphInstantiate")} == {
        "cudaStreamBeginCapture": 3,
        "cudaStreamEndCapture": 2,
        "cudaGraphInstantiate": 2,
    }
    assert not [f for f in calls if f.startswith("cu") and not f.startswith("cuda")]  # the driver's: inside
    c.wait_for(lambda: len([s for s in c.spans("cudaGraphLaunch") if s.resource.get("process.pid") == pid]) == n + 14)
    spans = [s for s in c.spans("cudaGraphLaunch") if s.resource.get("process.pid") == pid]
    first = [s for s in spans if s.attributes.get("cuda.graph.id") == 1 and s.attributes["cuda.api.return_code"] == 0]
    assert len(first) == n + 1
    assert {s.attributes["cuda.graph.kernel_count"] for s in first} == {3}
    assert {tuple(s.attributes["cuda.graph.kernel_names"]) for s in first} == {(ADD_ONE, SCALE)}, output[-3000:]


@pytest.mark.parametrize("build", ["shared", "static"])
def test_on_the_real_runtime_every_graph_call_is_seen_once_up_to_the_driver(otlp_collector, programs, tmp_path, build):
    n = 5
    w, output = _run(programs[build], n, otlp_collector, tmp_path, standin=False)
    codes = w["return_codes"]
    assert set(codes["cudaGraphLaunch"]) == {"35"} and w["driver_calls"] is None  # no driver here
    c, pid = otlp_collector, w["pid"]
    # no capture began (35): the six launches ran (as far as they could), none recorded
    c.wait_for(
        lambda: _by(c, "cuda.kernel.launches", pid) == {"cudaLaunchKernel": 6, "cudaGraphLaunch": n + 14},
        what=f"launches, got {_by(c, 'cuda.kernel.launches', pid)}",
    )
    planned = {f: sum(by.values()) for f, by in codes.items() if f != "cudaGraphLaunch"}
    c.wait_for(
        lambda: {f: v for f, v in _by(c, "cuda.api.calls", pid).items()} == planned,
        what=f"every call once, got {_by(c, 'cuda.api.calls', pid)} for {planned}",
    )
    errors = {
        (p.attributes["cuda.api.function"], p.attributes["cuda.error.code"]): p.value
        for p in c.latest_points("cuda.api.errors", **{"process.pid": pid})
    }
    assert errors[("cudaStreamBeginCapture", 35)] == 3 and errors[("cudaGraphLaunch", 35)] == n + 14
    assert _graph_kernels(c, pid) == {}
    assert _by(c, "otelbpf.cuda.graph.anomalies", pid, "reason") == {"unknown_exec": n + 14}, output[-3000:]


DRIVER_ONLY = r"""
import ctypes, json, os, sys
cu = ctypes.CDLL(sys.argv[1])
V = ctypes.c_void_p
n = int(sys.argv[2])
assert cu.cuInit(0) == 0
f, g, e = V(), V(), V()
assert cu.cuModuleGetFunction(ctypes.byref(f), None, b"_Z6decodePf") == 0
stream = V(0x5EED)  # the stand-in takes any handle but the legacy stream's
rc = {"begin": cu.cuStreamBeginCapture_v2(stream, 0)}
launch = lambda: cu.cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, stream, None, None)
rc["launches"] = [launch(), launch()]
rc["end"] = cu.cuStreamEndCapture(stream, ctypes.byref(g))
rc["instantiate"] = cu.cuGraphInstantiateWithFlags(ctypes.byref(e), g, ctypes.c_ulonglong(0))
rc["graph_launches"] = sorted({cu.cuGraphLaunch(e, stream) for _ in range(n)})
rc["plain"] = launch()
rc["sync"] = cu.cuStreamSynchronize(stream)
print(json.dumps({"pid": os.getpid(), "rc": rc}))
"""


def test_a_direct_driver_user_captures_and_replays(otlp_collector, tmp_path):
    """Triton- or JAX-style: the driver API only (cuStreamBeginCapture_v2, cuLaunchKernel,
    cuGraphLaunch), no runtime above it: the driver probes alone follow the capture."""
    driver = BUILD / "fakecuda" / "libcuda.so.1"
    n = 50
    cfg = config(otlp_grpc(otlp_collector), tmp=tmp_path)
    with AgentProcess(["-c", str(cfg), "--", sys.executable, "-c", DRIVER_ONLY, str(driver), str(n)]) as agent:
        assert agent.wait() == 0, agent.output
    w = json.loads(next(x for x in agent.output.splitlines() if x.startswith('{"pid"')))
    assert w["rc"] == {
        "begin": 0,
        "launches": [0, 0],
        "end": 0,
        "instantiate": 0,
        "graph_launches": [0],
        "plain": 0,
        "sync": 0,
    }
    c, pid = otlp_collector, w["pid"]
    want = {("decode(float*)", 1): 2 * n}
    c.wait_for(lambda: _graph_kernels(c, pid) == want, what=f"graph kernels, got {_graph_kernels(c, pid)}")
    assert _by(c, "cuda.kernel.launches", pid) == {"cuGraphLaunch": n, "cuLaunchKernel": 1}
    assert _by(c, "cuda.graph.kernel.launches", pid) == {"cuGraphLaunch": 2 * n}


def test_attached_late_a_captured_graphs_kernels_are_still_named(otlp_collector, programs, tmp_path):
    """The agent attached after the program registered its kernels (a server up for days): the
    graphs it captures and builds afterwards are counted exactly and their kernels named (by the
    host stub's symbol or the handles looked up since), never left unresolved."""
    n = 20
    gate = tmp_path / "go"
    env = {**os.environ, "LD_LIBRARY_PATH": str(FAKE_CUDART13.parent)}
    cmd = [str(programs["shared"]), str(n), str(gate)]
    prog = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert prog.stdout is not None and prog.stdout.readline().strip() == "ready"
        cfg = config(otlp_grpc(otlp_collector), tmp=tmp_path)
        with AgentProcess(["-c", str(cfg), "--pid", str(prog.pid)]) as agent:
            agent.wait_ready()
            agent.wait_attached(FAKE_CUDART13)
            gate.touch()
            out, _ = prog.communicate(timeout=60)
            w = json.loads(out.strip().splitlines()[-1])
            c, pid = otlp_collector, w["pid"]
            want = {(ADD_ONE, 1): 2 * (n + 1), (SCALE, 1): n + 1, (SCALE, 2): 11, (ADD_ONE, 2): 1}
            c.wait_for(lambda: _graph_kernels(c, pid) == want, what=f"graph kernels, got {_graph_kernels(c, pid)}")
            agent.stop()
    finally:
        if prog.poll() is None:
            prog.kill()
