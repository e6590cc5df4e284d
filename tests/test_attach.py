"""Attaching that never loses a process, and the CUDA runtime linked into executables.

Real eBPF, real processes, NVIDIA's real libcudart.so.13 (no driver: every call returns
35 quickly, and the probes still fire) and real nvcc 13 programs:

- a process that exits before its library is attached does not keep that library from
  being probed in the processes after it;
- an attach that fails is retried with back-off until it works, or until the file is gone;
- nvcc's default static runtime (local .symtab symbols of the executable) is probed, from
  its constructors on under ``otelbpf run --``; a stripped one is reported, not probed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from harness.agent import AgentProcess, config, otlp_grpc, wait_until
from otelbpf.base.events import Kind
from otelbpf.families.cuda.probes import cuda_family
from otelbpf.sensor import elf, libraries
from otelbpf.sensor.sensor import Sensor, SensorOptions

pytestmark = pytest.mark.bpf

CUDART13 = Path("/usr/local/cuda-13.0/lib64/libcudart.so.13")

#: dlopen the library named by argv[1], call cudaMalloc once, print pid and return code.
MALLOC_ONCE = (
    "import ctypes, json, os, sys\n"
    "lib = ctypes.CDLL(sys.argv[1])\n"
    "p = ctypes.c_void_p()\n"
    "print(json.dumps({'pid': os.getpid(), 'rc': lib.cudaMalloc(ctypes.byref(p), 4096)}))\n"
)
#: dlopen the library, then wait for a line on stdin (so it can be killed while mapping it).
LOAD_AND_WAIT = "import ctypes, sys\nctypes.CDLL(sys.argv[1])\nprint('ready', flush=True)\nsys.stdin.readline()\n"


@pytest.fixture(scope="module")
def cudart13() -> Path:
    if not CUDART13.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{CUDART13} is missing: .ci/run must install the CUDA 13 toolkit")
        pytest.skip(f"no {CUDART13}")
    return CUDART13.resolve()


@pytest.fixture
def fresh_cudart(cudart13: Path, tmp_path: Path) -> Path:
    """A copy of the real runtime: an inode no agent has attached to yet."""
    lib = tmp_path / "lib" / "libcudart.so.13"
    lib.parent.mkdir()
    shutil.copy(cudart13, lib)
    return lib


def malloc_once(lib: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", MALLOC_ONCE, str(lib)], capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(out.stdout)


def _points(c, name: str, **filters) -> dict:
    return {tuple(sorted(p.attributes.items())): p.value for p in c.latest_points(name, **filters)}


def _value(c, name: str, **filters):
    points = c.latest_points(name, **filters)
    return points[0].value if len(points) == 1 else None


def _api(c, pid: int, function: str):
    return _value(c, "cuda.api.errors", **{"process.pid": pid, "cuda.api.function": function})


# -- short-lived processes ----------------------------------------------------------------


def test_a_process_exiting_before_the_attach_does_not_poison_its_library(otlp_collector, tmp_path, fresh_cudart):
    cfg = config(otlp_grpc(otlp_collector), tmp=tmp_path)
    with AgentProcess(["-c", str(cfg)]) as agent:
        agent.wait_ready()
        # Loads the library the agent has never seen, and is gone within milliseconds: long
        # before the ~60 probes are in place.
        subprocess.run(
            [sys.executable, "-c", "import ctypes, sys; ctypes.CDLL(sys.argv[1])", str(fresh_cudart)],
            check=True,
            timeout=60,
        )
        agent.wait_attached(fresh_cudart)
        second = malloc_once(fresh_cudart)
        assert second["rc"] == 35
        c = otlp_collector
        c.wait_for(lambda: _api(c, second["pid"], "cudaMalloc") == 1, what="the second process's cudaMalloc")
        assert agent.stop() == 0
    assert f"probes to {fresh_cudart} (cudart)" in agent.output


def test_a_library_seen_through_a_process_gone_before_the_attach_is_attached_by_its_host_path(tmp_path, fresh_cudart):
    """Deterministically what a short-lived process does: the library is found through
    /proc/PID/root while the process lives, and the process is gone when the attach runs
    (or in its middle: every probe left then failed, by the next process's root as well)."""
    families = [cuda_family(["cudart"])]
    loader = subprocess.Popen(
        [sys.executable, "-c", LOAD_AND_WAIT, str(fresh_cudart)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert loader.stdout.readline().strip() == "ready"
    seen = libraries.in_process(loader.pid, str(fresh_cudart), families)
    assert seen is not None and seen.path == f"/proc/{loader.pid}/root{fresh_cudart}"
    loader.kill()
    loader.wait()

    events: list[np.ndarray] = []
    # Watch an idle process that maps no CUDA library: the test process may have loaded
    # runtimes in earlier tests, and those would be attached (and counted) at start.
    idle = subprocess.Popen(["sleep", "300"])
    sensor = Sensor(
        SensorOptions(families, pids=[idle.pid]), lambda ring, arr: events.append(arr) if ring == "events" else None
    )
    sensor.start()
    try:
        sensor._attach(seen)  # as discovery does with what the open event said
        # At once by the host path (the same inode), not by the gone root and a retry.
        assert not sensor.attach_stats.by_reason and sensor.attach_stats.retrying == 0
        [attached] = [lib for lib in sensor.attached_libraries() if lib.key == seen.key]
        assert attached.path == str(fresh_cudart)
        sites = elf.resolve(str(fresh_cudart), next(k for k in families[0].libraries if k.name == "cudart").symbols)
        kind = next(k for k in families[0].libraries if k.name == "cudart")
        expected = sum(
            (spec.entry is not None) + (spec.ret is not None)
            for spec in kind.probes
            for _ in spec.select(sites.get(spec.symbol, []))
        )
        assert sensor.attach_stats.probes == expected and sensor.attach_stats.retrying == 0

        sensor.watch_pid(os.getpid())
        proc = subprocess.run(
            [sys.executable, "-c", MALLOC_ONCE, str(fresh_cudart)], capture_output=True, text=True, check=True
        )
        pid = json.loads(proc.stdout)["pid"]

        def mallocs() -> int:
            arr = np.concatenate(events) if events else np.zeros(0)
            return int(((arr["pid"] == pid) & (arr["kind"] == Kind.CUDA_MALLOC)).sum()) if len(arr) else 0

        assert wait_until(lambda: mallocs() == 1, timeout=10), "the next process's cudaMalloc was not seen"
    finally:
        sensor.stop()
        idle.kill()
        idle.wait()


def test_a_library_gone_with_its_container_is_given_up_and_counted(tmp_path, cudart13):
    """Seen only inside a process's own mount namespace: once it is gone, no path leads to
    the file any more; the retry stops and says so."""
    if shutil.which("unshare") is None:
        pytest.skip("util-linux unshare is not installed")
    mnt = tmp_path / "ns"
    mnt.mkdir()
    shown = f"{mnt}/libcudart.so.13"
    script = (
        f"mount -t tmpfs none {mnt} && cp {cudart13} {mnt}/ && "
        f"exec {sys.executable} -c {shlex.quote(LOAD_AND_WAIT)} {shown}"
    )
    proc = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "ready"
    families = [cuda_family(["cudart"])]
    seen = libraries.in_process(proc.pid, shown, families)
    assert seen is not None and not os.path.exists(shown)
    proc.kill()
    proc.wait()
    sensor = Sensor(SensorOptions(families, pids=[os.getpid()]), lambda ring, arr: None)
    sensor.start()
    try:
        sensor._attach(seen)
        assert wait_until(lambda: sensor.attach_stats.by_reason["gone"] == 1, timeout=10)
        assert sensor.attach_stats.retrying == 0
        assert seen.key not in {lib.key for lib in sensor.attached_libraries()}
        time.sleep(0.5)
        assert sensor.attach_stats.by_reason == {"symbols": 1, "gone": 1}  # no more attempts
    finally:
        sensor.stop()


# -- retries --------------------------------------------------------------------------------


@pytest.mark.parametrize("outcome", ["fixed", "deleted"])
def test_a_failed_attach_is_retried_with_back_off(otlp_collector, tmp_path, cudart13, outcome):
    """A library half written (as while a package is unpacked) fails to attach, and is
    retried after 0.1 s, 0.2 s, 0.4 s, ...: it attaches once complete, with no process
    opening it in between; deleted, it is given up."""
    lib = tmp_path / "lib" / "libcudart.so.13"
    lib.parent.mkdir()
    data = cudart13.read_bytes()
    lib.write_bytes(data[: len(data) // 2])
    cfg = config(otlp_grpc(otlp_collector), tmp=tmp_path, cuda={"search_paths": [str(lib.parent / "libcudart*")]})
    with AgentProcess(["-c", str(cfg)]) as agent:
        agent.wait_ready()
        assert wait_until(lambda: f"retrying {lib} in 0.4s (attempt 3 failed)" in agent.output, timeout=60), (
            agent.output
        )
        delays = [float(d) for d in re.findall(rf"retrying {re.escape(str(lib))} in ([0-9.]+)s", agent.output)]
        assert delays[:3] == [0.1, 0.2, 0.4]
        c = otlp_collector
        if outcome == "fixed":
            with open(lib, "r+b") as f:  # completed in place: the same inode
                f.seek(len(data) // 2)
                f.write(data[len(data) // 2 :])
            agent.wait_attached(lib, timeout=30)
            w = malloc_once(lib)
            c.wait_for(lambda: _api(c, w["pid"], "cudaMalloc") == 1, what="cudaMalloc after the late attach")
        else:
            lib.unlink()
            assert wait_until(lambda: "the file is gone: no more retries" in agent.output, timeout=30), agent.output
        c.wait_for(lambda: _value(c, "otelbpf.libraries.retrying") == 0, what="nothing left to retry")
        failures = _points(c, "otelbpf.attach.failures")
        assert failures[(("reason", "symbols"),)] >= 3
        if outcome == "deleted":
            assert failures[(("reason", "gone"),)] == 1
            assert f"probes to {lib} (" not in agent.output
        assert agent.stop() == 0


# -- the CUDA runtime linked statically ------------------------------------------------------


def _summary(output: str) -> dict:
    return json.loads(next(line for line in output.splitlines() if line.startswith('{"pid"')))


def test_static_runtime_under_run_is_probed_from_its_constructors(otlp_collector, tmp_path, nvcc_programs):
    """Paused at exec, attached by .symtab, resumed: the constructor's cudaMalloc and every
    kernel registration (the launches' names) are seen."""
    program = nvcc_programs["static"]
    cfg = config(otlp_grpc(otlp_collector), tmp=tmp_path, cuda={"launch_sample_every": 1})
    with AgentProcess(["-c", str(cfg), "--", str(program), "5"]) as agent:
        assert agent.wait() == 0, agent.output
    w = _summary(agent.output)
    assert (w["early_malloc"], w["malloc"], w["free"]) == (35, 35, 35)
    c, pid = otlp_collector, w["pid"]
    c.wait_for(lambda: _api(c, pid, "cudaMalloc") == 2, what="both cudaMalloc calls (constructor and main)")
    assert _api(c, pid, "cudaFree") == 1
    c.wait_for(
        lambda: _value(c, "cuda.kernel.launches", **{"process.pid": pid, "cuda.api.function": "cudaLaunchKernel"}) == 5,
        what="5 launches",
    )
    spans = [s for s in c.spans() if s.resource.get("process.pid") == pid and "cuda.kernel.name" in s.attributes]
    assert [(s.attributes["cuda.kernel.name"], s.attributes["cuda.kernel.name_source"]) for s in spans] == [
        ("bump(int*)", "registration")
    ] * 5
    assert f"probes to {program} (cudart_static)" in agent.output


def test_static_runtime_started_after_the_agent_is_found_at_exec(otlp_collector, tmp_path, nvcc_programs):
    program = nvcc_programs["static"]
    cfg = config(otlp_grpc(otlp_collector), tmp=tmp_path)
    gate = tmp_path / "go"
    with AgentProcess(["-c", str(cfg)]) as agent:
        agent.wait_ready()
        proc = subprocess.Popen([str(program), "4", str(gate)], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "ready"
            agent.wait_attached(program)
            gate.touch()
            out, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        w = json.loads(out.strip().splitlines()[-1])
        c, pid = otlp_collector, w["pid"]
        c.wait_for(
            lambda: (
                _value(c, "cuda.kernel.launches", **{"process.pid": pid, "cuda.api.function": "cudaLaunchKernel"}) == 4
            ),
            what="4 launches",
        )
        c.wait_for(lambda: _api(c, pid, "cudaFree") == 1, what="cudaFree")
        assert agent.stop() == 0


def test_stripped_static_runtime_is_reported_not_probed(otlp_collector, tmp_path, nvcc_programs):
    program = nvcc_programs["stripped"]
    cfg = config(otlp_grpc(otlp_collector), tmp=tmp_path)
    with AgentProcess(["-c", str(cfg), "--", str(program), "3"]) as agent:
        assert agent.wait() == 0, agent.output
    w = _summary(agent.output)
    c = otlp_collector
    c.wait_for(
        lambda: _points(c, "otelbpf.attach.failures").get((("reason", "no_symbols"),)) == 1,
        what="the stripped program counted once",
    )
    assert re.search(rf"attach failed \(no_symbols\): {re.escape(str(program))} \(cudart_static\)", agent.output)
    assert not c.latest_points("cuda.kernel.launches", **{"process.pid": w["pid"]})
