"""Host mode loses no job's first second (issue 36): a process that opens a probed library
the agent has not attached yet is stopped at that open until the probes are in.

Real eBPF, the real agent in host mode (no ``--pid``, no command), NVIDIA's real
libcudart.so.13 copied to a fresh path for every test (an inode no agent has seen: the
first job of a new image on a node), real nvcc 13 programs. Each test's expected counts are
what its programs did, said by themselves.

The agent is host-wide: other processes on the machine may be paused too, so what is
asserted of the pause is read per process (its "pid N resumed after" line, its run time),
never from host-wide counters.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from harness.agent import AgentProcess, config, otlp_grpc, wait_until
from harness.nvcc import nvcc as harness_nvcc

pytestmark = pytest.mark.bpf

CUDART13 = Path("/usr/local/cuda-13.0/lib64/libcudart.so.13")
KERNELS = Path(__file__).parent / "data" / "cuda" / "kernels.cu"

#: The issue's first measured case: ~100 ms, cudaMalloc x7 and cudaMemcpy x3, then exit.
ELEVEN_CALLS = (
    "import ctypes, json, os, sys\n"
    "lib = ctypes.CDLL(sys.argv[1])\n"
    "p = ctypes.c_void_p()\n"
    "rc = [lib.cudaMalloc(ctypes.byref(p), 4096) for _ in range(7)]\n"
    "buf = ctypes.create_string_buffer(64)\n"
    "rc += [lib.cudaMemcpy(buf, buf, ctypes.c_size_t(64), 4) for _ in range(3)]\n"
    "print(json.dumps({'pid': os.getpid(), 'rc': rc}))\n"
)
#: ``python -c`` that allocates once and exits.
MALLOC_ONCE = (
    "import ctypes, os, sys; lib = ctypes.CDLL(sys.argv[1]); p = ctypes.c_void_p(); "
    "print(os.getpid(), lib.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(1024)))"
)
#: N children forked at once, each dlopens argv[1], allocates once and exits; prints their pids.
MANY = (
    "import ctypes, os, sys\n"
    "n, lib = int(sys.argv[2]), sys.argv[1]\n"
    "r, w = os.pipe()\n"
    "pids = []\n"
    "for _ in range(n):\n"
    "    pid = os.fork()\n"
    "    if pid == 0:\n"
    "        os.close(w); os.read(r, 1)\n"
    "        l = ctypes.CDLL(lib); p = ctypes.c_void_p(); l.cudaMalloc(ctypes.byref(p), 64)\n"
    "        os._exit(0)\n"
    "    pids.append(pid)\n"
    "os.close(r); os.close(w)\n"
    "bad = [p for p in pids if os.waitpid(p, 0)[1] != 0]\n"
    "print(' '.join(map(str, pids)), 'bad', len(bad))\n"
)


@pytest.fixture(scope="module")
def cudart13() -> Path:
    if not CUDART13.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{CUDART13} is missing: .ci/run must install the CUDA 13 toolkit")
        pytest.skip(f"no {CUDART13}")
    return CUDART13.resolve()


def fresh_copy(cudart13: Path, folder: Path) -> Path:
    """The real runtime at a path and inode no agent has seen."""
    folder.mkdir(parents=True)
    lib = folder / "libcudart.so.13"
    shutil.copy(cudart13, lib)
    return lib


def _calls(c, pid: int) -> dict[str, int]:
    return {
        p.attributes["cuda.api.function"]: p.value for p in c.latest_points("cuda.api.calls", **{"process.pid": pid})
    }


def _resumed(agent: AgentProcess, pid: int) -> float | None:
    """How long the agent says it kept ``pid`` stopped, or None if it never stopped it."""
    m = re.search(rf"pid {pid} resumed after ([0-9.]+)s", agent.output)
    return float(m.group(1)) if m else None


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except FileNotFoundError:
        return "gone"


def _agent(otlp_collector, tmp_path: Path, max_pause: str = "5s", *, nccl: bool = False) -> AgentProcess:
    """The agent in host mode with ``service.host_pause.max_pause`` (and the nccl receiver)."""
    cfg = config(otlp_grpc(otlp_collector), tmp=tmp_path)
    doc = yaml.safe_load(cfg.read_text())
    if nccl:
        doc["receivers"]["nccl"] = {"search_paths": []}
        for pipeline in doc["service"]["pipelines"].values():
            pipeline["receivers"].append("nccl")
    doc["service"]["host_pause"] = {"enabled": True, "max_pause": max_pause}  # auto would too: no terminal here
    cfg.write_text(yaml.safe_dump(doc))
    return AgentProcess(["-c", str(cfg)])


def test_a_never_seen_runtime_is_probed_from_its_first_call(otlp_collector, tmp_path, cudart13):
    """The issue's case: a ~100 ms process on a library the agent never attached loses none
    of its 11 calls; a ``python -c`` that allocates once, the same; processes that open no
    probed library are never stopped, nor one whose library path is known."""
    lib = fresh_copy(cudart13, tmp_path / "env" / "lib")
    with _agent(otlp_collector, tmp_path) as agent:
        agent.wait_ready()
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-c", ELEVEN_CALLS, str(lib)], capture_output=True, text=True, check=True)
        took = time.monotonic() - t0
        w = json.loads(out.stdout)
        assert all(rc == 35 for rc in w["rc"])  # no driver: each call fails quickly, probed all the same
        c = otlp_collector
        c.wait_for(lambda: _calls(c, w["pid"]) == {"cudaMalloc": 7, "cudaMemcpy": 3}, what="all 11 calls")
        paused = _resumed(agent, w["pid"])
        assert paused is not None and paused < took, agent.output[-4000:]
        # allocates once and exits, on the same (now attached) library: counted, not stopped
        pid, rc = map(
            int,
            subprocess.run(
                [sys.executable, "-c", MALLOC_ONCE, str(lib)], capture_output=True, text=True, check=True
            ).stdout.split(),
        )
        assert rc == 35
        c.wait_for(lambda: _calls(c, pid) == {"cudaMalloc": 1}, what="the one cudaMalloc")
        # no probed library: libm and libz through the same loader, and a library-like name
        plain = (
            "import ctypes, ctypes.util, os; ctypes.CDLL(ctypes.util.find_library('m')); "
            "ctypes.CDLL(ctypes.util.find_library('z')); print(os.getpid())"
        )
        plain_pids = [
            int(subprocess.run([sys.executable, "-c", plain], capture_output=True, text=True, check=True).stdout)
            for _ in range(3)
        ]
        c.wait_for(
            lambda: any(p.value >= 1 for p in c.latest_points("otelbpf.pauses", outcome="probed")),
            what="the pause counted",
        )
        assert agent.stop() == 0
    assert _resumed(agent, pid) is None
    assert all(_resumed(agent, p) is None for p in plain_pids)
    assert f"probes to {lib} (cudart)" in agent.output


@pytest.fixture(scope="module")
def shared_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """kernels.cu built with ``-cudart shared`` (test_cuda_real_stack.py's program)."""
    out = tmp_path_factory.mktemp("nvcc") / "kernels_shared"
    subprocess.run(
        [harness_nvcc(), "--extended-lambda", "-cudart", "shared", "-o", str(out), str(KERNELS)],
        check=True,
        capture_output=True,
    )
    return out


def test_a_short_nvcc_program_on_a_never_seen_runtime_every_launch_counted_and_named(
    otlp_collector, tmp_path, cudart13, shared_program
):
    """A ~200 ms nvcc program whose libcudart.so.13 the agent never saw (LD_LIBRARY_PATH to
    a fresh copy): its constructors register every kernel after the loader's open, so every
    launch is counted once and named from its registration."""
    lib = fresh_copy(cudart13, tmp_path / "image" / "lib")
    rounds = 3
    cfg = config(otlp_grpc(otlp_collector), tmp=tmp_path, cuda={"launch_sample_every": 1})
    with AgentProcess(["-c", str(cfg)]) as agent:
        agent.wait_ready()
        run = subprocess.run(
            [str(shared_program), str(rounds)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "LD_LIBRARY_PATH": str(lib.parent)},
        )
        w = json.loads(next(x for x in run.stdout.splitlines() if x.startswith('{"rounds"')))
        c, pid = otlp_collector, w["pid"]
        c.wait_for(
            lambda: (
                {
                    p.attributes["cuda.api.function"]: p.value
                    for p in c.latest_points("cuda.kernel.launches", **{"process.pid": pid})
                }
                == {"cudaLaunchKernel": 4 * rounds, "cudaLaunchKernelExC": rounds}
            ),
            what="exact launch counts",
        )
        sources = {
            p.attributes["otelbpf.name_source"]: p.value
            for p in c.latest_points("otelbpf.cuda.kernel_launches.named", **{"process.pid": pid})
        }
        assert sources == {"registration": 5 * rounds}, agent.output[-4000:]
        assert agent.stop() == 0
    assert _resumed(agent, pid) is not None, agent.output[-4000:]


def test_a_paused_process_is_resumed_after_max_pause_and_at_once_when_the_agent_is_killed(
    otlp_collector, tmp_path, cudart13
):
    """The agent frozen (SIGSTOP: it can resume nothing): the kernel still stops a process at
    a new library's open, and the guard resumes it after max_pause, unprobed. Killed with
    SIGKILL while a process is stopped: the guard resumes it at once and closes the gate, so
    nothing is stopped after."""
    with _agent(otlp_collector, tmp_path, max_pause="1s") as agent:
        agent.wait_ready()
        agent.proc.send_signal(signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            lib = fresh_copy(cudart13, tmp_path / "a")
            subprocess.run([sys.executable, "-c", MALLOC_ONCE, str(lib)], capture_output=True, check=True, timeout=30)
            bounded = time.monotonic() - t0
            assert 1.0 <= bounded < 4.0, bounded
            lib = fresh_copy(cudart13, tmp_path / "b")
            stopped = subprocess.Popen([sys.executable, "-c", MALLOC_ONCE, str(lib)], stdout=subprocess.PIPE, text=True)
            wait_until(lambda: _state(stopped.pid) == "T", timeout=10)
            t0 = time.monotonic()
            agent.proc.kill()
        finally:
            agent.proc.send_signal(signal.SIGCONT)
        # Timed before the agent is waited for: a killed agent takes seconds to exit while the
        # kernel releases its probes one RCU grace period each (18 s once in a full run), and
        # the process must run again long before that.
        stopped.communicate(timeout=30)
        resumed = time.monotonic() - t0
        agent.proc.wait(120)  # 18 s once, past 30 s once in a full run beside other work
        assert stopped.returncode == 0
        assert resumed < 0.9  # resumed by the guard, not by max_pause
        # the gate is closed: a new library stops nothing now, though the programs may linger
        lib = fresh_copy(cudart13, tmp_path / "c")
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-c", MALLOC_ONCE, str(lib)], capture_output=True, check=True, timeout=30)
        assert time.monotonic() - t0 < 0.9
    assert "resumed after 1s, unprobed" in agent.output


def test_a_hundred_processes_opening_a_new_library_at_once_are_all_counted(otlp_collector, tmp_path, cudart13):
    """100 processes open the same never-seen library at once: one attach, each stopped
    until it is in, each resumed; every cudaMalloc counted, nothing left stopped. One killed
    while stopped is taken out of the paused map by its exit."""
    lib = fresh_copy(cudart13, tmp_path / "lib")
    with _agent(otlp_collector, tmp_path, max_pause="20s") as agent:
        agent.wait_ready()
        out = subprocess.run(
            [sys.executable, "-c", MANY, str(lib), "100"], capture_output=True, text=True, check=True, timeout=120
        ).stdout.split()
        assert out[-2:] == ["bad", "0"]
        pids = [int(p) for p in out[:-2]]
        c = otlp_collector
        c.wait_for(
            lambda: sum(_calls(c, p).get("cudaMalloc", 0) for p in pids) == 100,
            what="100 cudaMalloc",
            timeout=60,
        )
        # stopped, then killed before the agent could resume it: nothing left behind
        agent.proc.send_signal(signal.SIGSTOP)
        try:
            victim = subprocess.Popen([sys.executable, "-c", MALLOC_ONCE, str(fresh_copy(cudart13, tmp_path / "v"))])
            wait_until(lambda: _state(victim.pid) == "T", timeout=10)
            victim.kill()
            victim.wait(10)
        finally:
            agent.proc.send_signal(signal.SIGCONT)
        assert agent.stop() == 0
    assert f"pid {victim.pid} resumed" not in agent.output  # killed, never resumed: no error either
    assert "discovery step failed" not in agent.output


STRIPPED_LIB = """
__global__ void k_a(float *x) { if (x) x[0] = 1; }
__global__ void k_b(float *x, int n) { if (x) x[n] = 2; }
__global__ void k_c(float *x) { if (x) x[1] = 3; }
extern "C" int launch_all(int rounds)
{
    for (int i = 0; i < rounds; i++) {
        k_a<<<1, 1>>>(nullptr);
        k_b<<<1, 1>>>(nullptr, 0);
        k_c<<<1, 1>>>(nullptr);
    }
    return 3 * rounds;
}
"""
#: dlopen the stripped library (its constructors register its kernels), launch, exit at once.
DLOPEN_AND_LAUNCH = "import ctypes, os, sys; n = ctypes.CDLL(sys.argv[1]).launch_all(3); print(os.getpid(), n)"


@pytest.fixture(scope="module")
def stripped_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CUDA library built by nvcc 13 (``-cudart shared``) and stripped: no symbol names
    its kernels, only their registrations do."""
    folder = tmp_path_factory.mktemp("stripped")
    (folder / "lib.cu").write_text(STRIPPED_LIB)
    lib = folder / "libstripk.so"
    subprocess.run(
        [harness_nvcc(), "-cudart", "shared", "-shared", "-Xcompiler", "-fPIC", "-o", str(lib), str(folder / "lib.cu")],
        check=True,
        capture_output=True,
    )
    subprocess.run(["strip", str(lib)], check=True)
    return lib


@pytest.mark.parametrize("runtime", ["never seen", "known"])
def test_a_stripped_library_dlopened_by_a_short_program_has_its_kernels_named_from_registration(
    otlp_collector, tmp_path, cudart13, stripped_library, runtime
):
    """The issue's third case: the registrations of a stripped library's kernels are read
    while the process lives (or from its mapped file), never left a bare address, whether its
    runtime is one the agent never saw (the process is stopped at its open) or not."""
    lib = fresh_copy(cudart13, tmp_path / "rt")
    cfg = config(otlp_grpc(otlp_collector), tmp=tmp_path, cuda={"launch_sample_every": 1})
    env = {**os.environ, "LD_LIBRARY_PATH": str(lib.parent)}
    with AgentProcess(["-c", str(cfg)]) as agent:
        agent.wait_ready()
        if runtime == "known":
            subprocess.run([sys.executable, "-c", MALLOC_ONCE, str(lib)], check=True, capture_output=True)
            agent.wait_attached(lib)
        out = subprocess.run(
            [sys.executable, "-c", DLOPEN_AND_LAUNCH, str(stripped_library)],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
        pid, launched = map(int, out.stdout.split())
        assert launched == 9
        c = otlp_collector

        def names() -> dict[str, int]:
            found: dict[str, int] = {}
            for s in c.spans():
                if s.resource.get("process.pid") == pid and "cuda.kernel.name" in s.attributes:
                    key = f"{s.attributes['cuda.kernel.name']} ({s.attributes['cuda.kernel.name_source']})"
                    found[key] = found.get(key, 0) + 1
            return found

        expected = {
            "k_a(float*) (registration)": 3,
            "k_b(float*, int) (registration)": 3,
            "k_c(float*) (registration)": 3,
        }
        c.wait_for(lambda: names() == expected, what=f"9 launches named from registration, got {names()}")
        assert agent.stop() == 0


@pytest.mark.usefixtures("built")
def test_a_four_rank_nccl_job_on_never_seen_libraries_has_every_communicator(otlp_collector, tmp_path):
    """The issue's second case: a 4-rank job started after the agent, its NCCL and CUDA
    libraries (the stand-ins: ranks meet in the collective, as NCCL's do) at a path the agent
    never attached. A rank that opens a library before its probes are in is stopped until they
    are (one at least; the others may open it after), so each ``ncclCommInitRank`` is a span
    with its rank and the communicator all four share, and every collective after it carries
    ``nccl.rank.source=init``."""
    from harness.agent import BUILD

    new = tmp_path / "image"
    for part in ("fakenccl", "fakecudart", "fakecuda"):  # the runtime opens ../fakecuda/libcuda.so.1
        shutil.copytree(BUILD / part, new / part)
    iterations = 5
    with _agent(otlp_collector, tmp_path, nccl=True) as agent:
        agent.wait_ready()
        out = subprocess.run(
            [
                str(BUILD / "nccl_job"),
                *("--ranks", "4", "--iterations", str(iterations)),
                *("--lib", str(new / "fakenccl" / "libnccl.so.2")),
                *("--cudart", str(new / "fakecudart" / "libcudart.so.12")),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        job = json.loads(out.stdout.strip().splitlines()[-1])
        pids = {r["rank"]: r["pid"] for r in job["ranks"]}
        assert sorted(pids) == [0, 1, 2, 3] and all(r["exit"] == 0 for r in job["ranks"]), job
        c = otlp_collector

        def mine(name: str) -> dict[int, list]:
            return {rank: [s for s in c.spans(name) if s.resource["process.pid"] == pid] for rank, pid in pids.items()}

        c.wait_for(lambda: all(len(v) == iterations for v in mine("ncclAllReduce").values()), what="every collective")
        assert agent.stop() == 0
    inits = mine("ncclCommInitRank")
    assert all(len(v) == 1 for v in inits.values()), {r: len(v) for r, v in inits.items()}
    assert {r: (v[0].attributes["nccl.rank"], v[0].attributes["nccl.nranks"]) for r, v in inits.items()} == {
        r: (r, 4) for r in pids
    }
    assert len({v[0].attributes["nccl.comm.id"] for v in inits.values()}) == 1
    for rank, spans in mine("ncclAllReduce").items():
        assert {(s.attributes["nccl.rank"], s.attributes["nccl.rank.source"]) for s in spans} == {(rank, "init")}
    # the first rank at the never-seen path is stopped; a rank that opens it once the probes are
    # in (the path known in its cgroup) is not, which under load can be all but one of them
    assert any(_resumed(agent, pid) is not None for pid in pids.values()), agent.output[-4000:]
    assert f"probes to {new / 'fakenccl' / 'libnccl.so.2'} (nccl)" in agent.output
