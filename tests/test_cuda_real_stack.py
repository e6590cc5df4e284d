"""The CUDA path on the real stack: programs built here by nvcc 13, NVIDIA's real
``libcudart.so.13`` (the toolkit's, byte-identical to PyPI's ``nvidia-cuda-runtime``),
the real agent and a real OTLP collector.

With no driver every CUDA call returns an error, but the program runs on: the static
constructors register every kernel, each ``<<<>>>`` site goes through
``__cudaGetKernel`` and ``__cudaLaunchKernel`` into ``cudaLaunchKernel``, and the
probes see all of it. Names and exact counts are asserted against what the program says
it did. (What only a driver makes happen, heap handles from ``__cudaGetKernel`` and the
runtime calling the driver, is covered with the CUDA 13 stand-in elsewhere and by
``../shared/gpu`` on a GPU.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from harness.agent import AgentProcess, config, otlp_grpc
from harness.nvcc import nvcc as harness_nvcc

pytestmark = pytest.mark.bpf

SOURCE = Path(__file__).parent / "data" / "cuda" / "kernels.cu"

#: Device names the program's kernels register (nvcc 13's mangling, demangled).
PLAIN = "plain(float*)"
SCALE = "void ns::scale<float>(float*, float)"
FUNCTOR = "void apply<Scale>(float*, Scale)"


@pytest.fixture(scope="module")
def programs() -> dict[str, Path]:
    """kernels.cu built with the shared runtime (and a stripped copy) and the static one."""
    out = Path(tempfile.mkdtemp(prefix="otelbpf-nvcc-"))
    nvcc = harness_nvcc()
    built = {"shared": out / "kernels_shared", "static": out / "kernels_static"}
    subprocess.run(
        [nvcc, "--extended-lambda", "-cudart", "shared", "-o", str(built["shared"]), str(SOURCE)],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [nvcc, "--extended-lambda", "-o", str(built["static"]), str(SOURCE)], check=True, capture_output=True
    )
    built["stripped"] = out / "kernels_stripped"
    shutil.copy(built["shared"], built["stripped"])
    subprocess.run(["strip", str(built["stripped"])], check=True)
    return built


def _cudart_of(program: Path) -> Path:
    ldd = subprocess.run(["ldd", str(program)], capture_output=True, text=True, check=True).stdout
    line = next(x for x in ldd.splitlines() if "libcudart.so.13" in x)
    return Path(os.path.realpath(line.split("=>")[1].split("(")[0].strip()))


def _summary(output: str) -> dict:
    return json.loads(next(x for x in output.splitlines() if x.startswith('{"rounds"')))


def _launches(c, pid: int) -> dict[str, int]:
    return {
        p.attributes["cuda.api.function"]: p.value
        for p in c.latest_points("cuda.kernel.launches", **{"process.pid": pid})
    }


def _names(c, pid: int) -> dict[str, tuple[str, int]]:
    """kernel name -> (name source, launches sampled) from the launch spans."""
    out: dict[str, tuple[str, int]] = {}
    for s in c.spans():
        if s.resource.get("process.pid") == pid and "cuda.kernel.name" in s.attributes:
            name, source = s.attributes["cuda.kernel.name"], s.attributes["cuda.kernel.name_source"]
            out[name] = (source, out.get(name, ("", 0))[1] + 1)
    return out


@pytest.mark.parametrize("build", ["shared", "static"])
def test_nvcc13_program_on_the_real_runtime_every_launch_counted_once_and_named(
    otlp_collector, programs, tmp_path, build
):
    """``-cudart shared`` (libcudart.so.13) and nvcc's default static runtime (inside the
    executable, local .symtab symbols only)."""
    rounds = 7
    cfg = config(otlp_grpc(otlp_collector), tmp=tmp_path, cuda={"launch_sample_every": 1})
    with AgentProcess(["-c", str(cfg), "--", str(programs[build]), str(rounds)]) as agent:
        assert agent.wait() == 0, agent.output
    w = _summary(agent.output)
    assert w["malloc"] != 0  # no driver here: the calls fail, the launches still happen
    c, pid = otlp_collector, w["pid"]
    c.wait_for(
        lambda: _launches(c, pid) == {"cudaLaunchKernel": 4 * rounds, "cudaLaunchKernelExC": rounds},
        what=f"exact launch counts, got {_launches(c, pid)}",
    )
    names = _names(c, pid)
    lost = {p.attributes.get("reason", "?"): p.value for p in c.latest_points("otelbpf.events.lost") if p.value}
    detail = f"names {names}, events lost {lost}; agent output:\n{agent.output[-6000:]}"
    named = c.latest_points("otelbpf.cuda.kernel_launches.named", **{"process.pid": pid})
    sources = {p.attributes["otelbpf.name_source"]: p.value for p in named}
    # Every kernel is named from its registration, the lambda's by its device name (not
    # the host wrapper nvcc generates for it), none from a bare address. (One in three or
    # four runs named them all by symbol: a metrics export named the launch map's kernels
    # before the registrations on the ring were processed, and the symbol stuck.)
    assert names[PLAIN] == ("registration", 2 * rounds), detail
    assert names[SCALE] == ("registration", rounds), detail
    assert names[FUNCTOR] == ("registration", rounds), detail
    lam = [n for n in names if n.startswith("void apply<") and "lambda" in n]
    assert len(lam) == 1 and names[lam[0]] == ("registration", rounds), detail
    assert len(names) == 4, detail
    assert sources == {"registration": 5 * rounds}, detail
    errors = {
        (p.attributes["cuda.api.function"], p.attributes["cuda.error.code"]): p.value
        for p in c.latest_points("cuda.api.errors", **{"process.pid": pid})
    }
    assert errors[("cudaMalloc", w["malloc"])] == 1 and errors[("cudaFree", w["free"])] == 1


@pytest.mark.parametrize("build", ["shared", "stripped"])
def test_attached_late_launches_are_counted_and_named_from_the_binary(otlp_collector, programs, tmp_path, build):
    """A job that ran for days before the agent: registration is long past. Launches are
    still counted exactly. Without a driver the handle is the host stub, named by its ELF
    symbol; in a stripped binary each kernel is named by where it was launched from
    (object+offset, and the caller's offset), never by a bare address."""
    rounds = 5
    program = programs[build]
    cfg = config(otlp_grpc(otlp_collector), tmp=tmp_path, cuda={"launch_sample_every": 1})
    gate = tmp_path / "go"
    prog = subprocess.Popen([str(program), str(rounds), str(gate)], stdout=subprocess.PIPE, text=True)
    try:
        assert prog.stdout.readline().strip() == "ready"
        with AgentProcess(["-c", str(cfg), "--pid", str(prog.pid)]) as agent:
            agent.wait_ready()
            agent.wait_attached(_cudart_of(program))
            gate.touch()
            out, _ = prog.communicate(timeout=60)
            w = json.loads(out.strip().splitlines()[-1])
            c, pid = otlp_collector, w["pid"]
            c.wait_for(
                lambda: _launches(c, pid) == {"cudaLaunchKernel": 4 * rounds, "cudaLaunchKernelExC": rounds},
                what="exact launch counts",
            )
            c.wait_for(lambda: sum(n for _, n in _names(c, pid).values()) == 5 * rounds, what="all launch spans")
            agent.stop()
    finally:
        if prog.poll() is None:
            prog.kill()
    names = _names(c, pid)
    if build == "stripped":
        assert all(
            src == "launch_site" and n.startswith(f"[launched at {program.name}+0x") for n, (src, _) in names.items()
        ), names
        assert len(names) == 5, names  # one per kernel and API: none share a name
    else:
        assert {names[n] for n in (SCALE, FUNCTOR)} == {("symbol", rounds)}, names
        assert names[PLAIN] == ("symbol", 2 * rounds), names
        assert len(names) == 4 and all(src == "symbol" for src, _ in names.values()), names


def _wheel_cudart13() -> Path:
    import nvidia  # the PyPI wheel `nvidia-cuda-runtime` 13.x: nvidia/cu13/lib, PyTorch's layout

    for root in nvidia.__path__:
        candidate = Path(root) / "cu13" / "lib" / "libcudart.so.13"
        if candidate.exists():
            return candidate
    pytest.fail("the nvidia-cuda-runtime 13 wheel is not installed (scripts/setup.sh --test installs the test extras)")


def test_the_cu13_wheel_in_pytorchs_layout_and_short_lived_processes(otlp_collector, programs, tmp_path):
    """Host mode, the CUDA 13 runtime from the PyPI wheel where PyTorch cu130 loads it from
    (``nvidia/cu13/lib``): an nvcc program and three ``python -c`` processes that load it,
    allocate once and exit, each started after the agent, are every one counted."""
    wheel = _wheel_cudart13()
    cfg = config(
        otlp_grpc(otlp_collector),
        tmp=tmp_path,
        cuda={"launch_sample_every": 1, "search_paths": [str(wheel.parent / "libcudart.so*")]},
    )
    short = (
        "import ctypes, os, sys; lib = ctypes.CDLL(sys.argv[1]); p = ctypes.c_void_p(); "
        "print(os.getpid(), lib.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(1024)))"
    )
    with AgentProcess(["-c", str(cfg)]) as agent:
        agent.wait_ready()
        run = subprocess.run(
            [str(programs["shared"]), "3"],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "LD_LIBRARY_PATH": str(wheel.parent)},
        )
        w = _summary(run.stdout)
        pids = []
        for _ in range(3):
            out = subprocess.run(
                [sys.executable, "-c", short, str(wheel)], capture_output=True, text=True, check=True
            ).stdout.split()
            pids.append(int(out[0]))
            assert int(out[1]) != 0  # no driver
        c = otlp_collector
        c.wait_for(
            lambda: _launches(c, w["pid"]) == {"cudaLaunchKernel": 12, "cudaLaunchKernelExC": 3},
            what="the nvcc program's launches",
        )
        for pid in pids:
            c.wait_for(
                lambda pid=pid: (
                    {
                        p.attributes["cuda.api.function"]: p.value
                        for p in c.latest_points("cuda.api.calls", **{"process.pid": pid})
                    }
                    == {"cudaMalloc": 1}
                ),
                what=f"the one cudaMalloc of short-lived process {pid}",
            )
        agent.stop()
    assert f"probes to {wheel}" in agent.output
