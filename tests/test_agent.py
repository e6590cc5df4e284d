"""End to end: the real agent, real eBPF, real workloads, a real collector.

Every test here runs `otelbpf run` as a child process, drives processes that
call a CUDA library (NVIDIA's real libcudart from the wheel, or the built
stand-in whose calls succeed), and asserts on what reached rotel over OTLP,
comparing with what each workload reports it did.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import cxxfilt
import pytest

from harness.agent import (
    FAKE_CUDA,
    FAKE_CUDART,
    WORKLOAD,
    AgentProcess,
    config,
    finish,
    otlp_grpc,
    otlp_http,
    real_cudart,
    run_attached,
    start_workload,
)

pytestmark = pytest.mark.bpf


def _summary_from(output: str) -> dict:
    line = next(x for x in output.splitlines() if x.startswith('{"workload"'))
    return json.loads(line)


def _value(collector, name: str, **filters):
    points = collector.latest_points(name, **filters)
    assert len(points) == 1, f"{name} {filters}: {points}"
    return points[0].value


def _spans(collector, pid: int, name: str | None = None):
    return [s for s in collector.spans(name) if s.resource.get("process.pid") == pid]


def test_command_mode_exports_exact_spans_and_metrics_over_grpc(otlp_collector, tmp_path):
    cfg = config(otlp_grpc(otlp_collector), tmp=tmp_path, cuda={"launch_sample_every": 1})
    with AgentProcess(
        [
            "-c",
            str(cfg),
            "--",
            str(WORKLOAD),
            "--lib",
            str(FAKE_CUDART),
            "--iterations",
            "3",
            "--launches-per-iter",
            "4",
            "--alloc-bytes",
            "8192",
            "--h2d-bytes",
            "4096",
            "--d2h-bytes",
            "1024",
        ]
    ) as agent:
        assert agent.wait() == 0, agent.output
    w = _summary_from(agent.output)
    pid = w["pid"]
    c = otlp_collector
    c.wait_for(lambda: len(_spans(c, pid, "cudaLaunchKernel")) == 12, what="12 sampled launch spans")
    c.wait_for(lambda: c.latest_points("cuda.kernel.launches", **{"process.pid": pid}), what="launch metric")

    copies = _spans(c, pid, "cudaMemcpy")
    assert (
        sorted((s.attributes["cuda.memcpy.direction"], s.attributes["cuda.memcpy.bytes"]) for s in copies)
        == [("D2H", 1024)] * 3 + [("H2D", 4096)] * 3
    )
    assert all(s.attributes["cuda.api.return_code"] == 0 and s.status_code != "STATUS_CODE_ERROR" for s in copies)
    assert all(s.attributes["cuda.memcpy.async"] is False and s.end_ns > s.start_ns for s in copies)
    mallocs = _spans(c, pid, "cudaMalloc")
    assert [s.attributes["cuda.memory.bytes"] for s in mallocs] == [8192] * 3
    frees = _spans(c, pid, "cudaFree")
    assert sorted(s.attributes["cuda.memory.address"] for s in frees) == sorted(
        s.attributes["cuda.memory.address"] for s in mallocs
    )
    assert len(_spans(c, pid, "cudaDeviceSynchronize")) == 3

    launches = _spans(c, pid, "cudaLaunchKernel")
    by_name = {}
    for s in launches:
        by_name.setdefault(s.attributes["cuda.kernel.name"], []).append(s)
    expected = {k["name"]: k for k in w["kernels"]}
    assert {n: len(v) for n, v in by_name.items()} == {n: k["launches"] for n, k in expected.items()}
    for name, spans in by_name.items():
        k = expected[name]
        s = spans[0]
        assert [s.attributes[f"cuda.grid.{a}"] for a in "xyz"] == k["grid"]
        assert [s.attributes[f"cuda.block.{a}"] for a in "xyz"] == k["block"]
        assert s.attributes["cuda.kernel.function_address"] == k["address"]

    res = launches[0].resource
    assert res["service.name"] == "cuda_workload"
    assert res["process.executable.path"] == str(WORKLOAD)
    assert "--iterations 3" in res["process.command_line"]

    f = {"process.pid": pid}
    assert _value(c, "cuda.kernel.launches", **f, **{"cuda.api.function": "cudaLaunchKernel"}) == 12
    assert _value(c, "cuda.memcpy.bytes", **f, **{"cuda.memcpy.direction": "H2D"}) == 3 * 4096
    assert _value(c, "cuda.memcpy.bytes", **f, **{"cuda.memcpy.direction": "D2H"}) == 3 * 1024
    assert _value(c, "cuda.api.calls", **f, **{"cuda.api.function": "cudaMemcpy"}) == 6
    assert _value(c, "cuda.memory.high_water", **f) == 8192
    assert _value(c, "cuda.memory.in_use", **f) == 0
    top = {p.attributes["cuda.kernel.name"]: p.value for p in c.latest_points("cuda.kernel.launches.top", **f)}
    assert top == {n: k["launches"] for n, k in expected.items()}
    hist = c.latest_points("cuda.sync.duration", **f, **{"cuda.api.function": "cudaDeviceSynchronize"})[0]
    assert hist.count == 3 and hist.unit == "s"
    assert c.latest_points("otelbpf.events.lost", reason="ring_buffer_full")[0].value == 0
    assert c.latest_points("otelbpf.events.skipped", ring="events")[0].value == 0
    # The rings' sizes, and the most that waited in the events ring: at least one 64-byte event
    # at some drain (the workload's events), never more than the ring.
    sizes = {p.attributes["ring"]: p.value for p in c.latest_points("otelbpf.ring.size")}
    assert sizes["events"] == 16 << 20 and sizes["strevents"] == 256 << 10
    peaks = [p.value for p in c.metric_points("otelbpf.ring.usage") if p.attributes.get("ring") == "events"]
    assert 64 <= max(peaks) <= 16 << 20


def test_real_libcudart_errors_over_http(otlp_collector, tmp_path):
    """NVIDIA's own libcudart, no GPU: every call returns 35, and that is what gets counted."""
    cfg = config(otlp_http(otlp_collector), tmp=tmp_path, cuda={"launch_errors": True})
    lib = real_cudart()
    with AgentProcess(
        ["-c", str(cfg), "--", str(WORKLOAD), "--lib", str(lib), "--iterations", "4", "--launches-per-iter", "2"]
    ) as agent:
        assert agent.wait() == 0, agent.output
    w = _summary_from(agent.output)
    pid = w["pid"]
    c = otlp_collector
    c.wait_for(lambda: c.latest_points("cuda.api.errors", **{"process.pid": pid}), what="error metrics")
    for func, codes in w["return_codes"].items():
        for code, n in codes.items():
            if code == "0" or func.startswith("cudaGet"):
                continue
            assert (
                _value(
                    c,
                    "cuda.api.errors",
                    **{"process.pid": pid, "cuda.api.function": func, "cuda.error.code": int(code)},
                )
                == n
            ), func
    err = c.latest_points("cuda.api.errors", **{"process.pid": pid, "cuda.api.function": "cudaMalloc"})[0]
    assert err.attributes["cuda.error.name"] == "cudaErrorInsufficientDriver"
    spans = _spans(c, pid, "cudaMemcpy")
    assert len(spans) == 8
    assert all(s.status_code == "STATUS_CODE_ERROR" and s.attributes["cuda.api.return_code"] == 35 for s in spans)
    assert _value(c, "cuda.kernel.launches", **{"process.pid": pid, "cuda.api.function": "cudaLaunchKernel"}) == 8


def test_host_mode_sees_later_processes_unusual_paths_and_attributes_per_process(otlp_collector, tmp_path):
    odd = tmp_path / "opt weird" / "conda-ish" / "lib"
    odd.mkdir(parents=True)
    shutil.copy(FAKE_CUDART, odd / "libcudart.so.12")
    cfg = config(otlp_grpc(otlp_collector), tmp=tmp_path)
    with AgentProcess(["-c", str(cfg)]) as agent:
        agent.wait_ready()
        # Both start after the agent; one uses a library the agent has never seen on disk.
        gate = tmp_path / "go"
        a = start_workload(
            "--wait-for-file",
            str(gate),
            "--iterations",
            "2",
            "--h2d-bytes",
            "1000",
            "--d2h-bytes",
            "0",
            "--alloc-bytes",
            "1000",
        )
        b = start_workload(
            "--wait-for-file",
            str(gate),
            "--iterations",
            "5",
            "--h2d-bytes",
            "3000",
            "--d2h-bytes",
            "0",
            "--alloc-bytes",
            "3000",
            lib=odd / "libcudart.so.12",
        )
        agent.wait_attached(FAKE_CUDART)
        agent.wait_attached(odd / "libcudart.so.12")
        gate.touch()  # both run at once from here
        wa, wb = finish(a), finish(b)
        c = otlp_collector
        for w, per in ((wa, 1000), (wb, 3000)):
            f = {"process.pid": w["pid"], "cuda.memcpy.direction": "H2D"}
            assert c.wait_for(lambda f=f: c.latest_points("cuda.memcpy.bytes", **f), what=f"bytes of {w['pid']}")
            expected = w["options"]["iterations"] * per
            c.wait_for(
                lambda f=f, expected=expected: _value(c, "cuda.memcpy.bytes", **f) == expected,
                what=f"exact bytes of pid {w['pid']}",
            )
        assert agent.stop() == 0
    assert "libcudart.so.12" in agent.output and "opt weird" in agent.output


def test_library_dlopened_after_the_agent_started(otlp_collector, tmp_path):
    """A process that was already running when the agent started, and loads CUDA later."""
    gate = tmp_path / "go"
    script = textwrap.dedent(f"""
        import ctypes, os, time
        while not os.path.exists({str(gate)!r}):
            time.sleep(0.01)
        lib = ctypes.CDLL({str(FAKE_CUDART)!r})
        time.sleep(0.3)
        p = ctypes.c_void_p()
        assert lib.cudaMalloc(ctypes.byref(p), 12345) == 0
        assert lib.cudaFree(p) == 0
    """)
    proc = subprocess.Popen([sys.executable, "-c", script])
    cfg = config(otlp_grpc(otlp_collector), tmp=tmp_path)
    with AgentProcess(["-c", str(cfg)]) as agent:
        agent.wait_ready()
        gate.touch()
        assert proc.wait(30) == 0
        c = otlp_collector
        c.wait_for(lambda: _spans(c, proc.pid, "cudaMalloc"), what="cudaMalloc span of the late loader")
        assert _spans(c, proc.pid, "cudaMalloc")[0].attributes["cuda.memory.bytes"] == 12345
        assert agent.stop() == 0


def test_pid_mode_attaches_to_a_running_process_and_ignores_others(otlp_collector, tmp_path):
    """--pid: the library is already mapped (found by the /proc scan); other processes stay unseen."""
    gate = tmp_path / "go"
    watched = start_workload(
        "--wait-for-file",
        str(gate),
        "--iterations",
        "2",
        "--h2d-bytes",
        "777",
        "--d2h-bytes",
        "0",
        "--alloc-bytes",
        "1000",
    )
    other = start_workload("--wait-for-file", str(gate), "--iterations", "2")
    cfg = config(otlp_grpc(otlp_collector), tmp=tmp_path)
    try:
        with AgentProcess(["-c", str(cfg), "--pid", str(watched.pid)]) as agent:
            agent.wait_ready()
            gate.touch()
            w, o = finish(watched), finish(other)
            c = otlp_collector
            f = {"process.pid": w["pid"], "cuda.memcpy.direction": "H2D"}
            c.wait_for(
                lambda: c.latest_points("cuda.memcpy.bytes", **f) and _value(c, "cuda.memcpy.bytes", **f) == 2 * 777,
                what="bytes of the watched pid",
            )
            assert agent.stop() == 0
        assert not [s for s in c.spans() if s.resource.get("process.pid") == o["pid"]]
        assert not c.latest_points("cuda.memcpy.bytes", **{"process.pid": o["pid"]})
    finally:
        for p in (watched, other):
            if p.poll() is None:
                p.kill()


def test_process_exiting_mid_call_is_reported_and_agent_keeps_running(otlp_collector, tmp_path):
    cfg = config(otlp_grpc(otlp_collector), tmp=tmp_path)
    with AgentProcess(["-c", str(cfg)]) as agent:
        agent.wait_ready()
        w = run_attached(agent, "--async", "--iterations", "4", "--exit-midway")
        c = otlp_collector
        pid = w["pid"]
        sync = c.wait_for(
            lambda: [s for s in _spans(c, pid, "cudaStreamSynchronize") if s.attributes.get("otelbpf.incomplete")],
            what="incomplete sync span",
        )
        assert sync[0].status_code == "STATUS_CODE_ERROR" and "exited before" in sync[0].status_message
        assert sync[0].attributes["cuda.stream"] == "0x5eedffff"
        c.wait_for(
            lambda: c.latest_points("otelbpf.cuda.anomalies", **{"process.pid": pid}, reason="incomplete"),
            what="incomplete counted",
        )
        # Still working afterwards.
        w2 = run_attached(agent, "--iterations", "1")
        c.wait_for(lambda: _spans(c, w2["pid"], "cudaMalloc"), what="spans of the next process")
        assert agent.proc.poll() is None
        assert agent.stop() == 0


def test_driver_api_with_names_from_cuModuleGetFunction(otlp_collector, tmp_path):
    cfg = config(otlp_grpc(otlp_collector), tmp=tmp_path, cuda={"launch_sample_every": 1})
    with AgentProcess(
        [
            "-c",
            str(cfg),
            "--",
            str(WORKLOAD),
            "--lib",
            str(FAKE_CUDART),
            "--driver-lib",
            str(FAKE_CUDA),
            "--iterations",
            "2",
            "--launches-per-iter",
            "2",
        ]
    ) as agent:
        assert agent.wait() == 0, agent.output
    w = _summary_from(agent.output)
    c = otlp_collector
    spans = c.wait_for(lambda: _spans(c, w["pid"], "cuLaunchKernel"), what="driver launch spans")
    names = {s.attributes["cuda.kernel.name"] for s in spans}
    expected = {cxxfilt.demangle(k["name"]) if k["name"].startswith("_Z") else k["name"] for k in w["driver_kernels"]}
    assert names == expected == {"vector_add(float*, float*, float*, int)", "triton_poi_fused_add_mul_0"}
    c.wait_for(
        lambda: c.latest_points(
            "cuda.kernel.launches", **{"process.pid": w["pid"], "cuda.api.function": "cuLaunchKernel"}
        ),
        what="driver launch count",
    )
    assert (
        _value(c, "cuda.kernel.launches", **{"process.pid": w["pid"], "cuda.api.function": "cuLaunchKernel"})
        == w["calls"]["cuLaunchKernel"]
    )
    assert len(_spans(c, w["pid"], "cuMemAlloc_v2")) == w["calls"]["cuMemAlloc_v2"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_detaches_every_probe(otlp_collector, tmp_path, sig):
    cfg = config(otlp_grpc(otlp_collector), tmp=tmp_path)
    with AgentProcess(["-c", str(cfg)], env={"OTELBPF_DETACH": "background"}) as agent:
        agent.wait_ready()
        w = run_attached(agent, "--iterations", "1")
        otlp_collector.wait_for(lambda: _spans(otlp_collector, w["pid"]), what="some spans")
        assert agent.stop(sig) == 0
    # The agent hands its probes to a process that releases them (a uprobe's release waits
    # out an RCU grace period under a global kernel mutex, ~0.1 s each), and exits at once.
    import re

    reaper = int(re.search(r"releasing \d+ probes in the background \(pid (\d+)\)", agent.output).group(1))
    deadline = time.monotonic() + 300
    while Path(f"/proc/{reaper}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not Path(f"/proc/{reaper}").exists(), "the probes were not all released"
    # none of this agent's (BCC names a tracefs uprobe it made ..._bcc_PID); another process's,
    # such as a BCC tool killed with -9 earlier on the host, are not this test's to judge
    events = Path("/sys/kernel/tracing/uprobe_events").read_text().splitlines()
    assert [e for e in events if e.split()[0].endswith(f"_bcc_{agent.proc.pid}")] == []
    assert "attached" in agent.output


def test_exporter_down_at_start_and_mid_run_bounded_counted_and_recovers(otlp_collector, tmp_path):
    """Spans beyond the queue are dropped and counted, failed exports are
    counted, memory stays bounded, and export resumes when the collector does."""
    c = otlp_collector
    c.stop()
    cfg = config(otlp_grpc(c, timeout="1s"), tmp=tmp_path)
    cfg.write_text(
        cfg.read_text().replace("timeout: 100ms", "timeout: 100ms\n    send_batch_size: 20\n    max_queue_size: 40")
    )

    def total(name: str, **filters) -> float:
        return sum(p.value for p in c.latest_points(name, **filters))

    def fresh(name: str, since_ns: int):
        """The agent's newest point of ``name`` taken after ``since_ns``, if any."""
        pts = [p for p in c.latest_points(name, **{"service.name": "otelbpf"}) if p.time_ns > since_ns]
        return pts[0] if pts else None

    def outage_then_recovery(iterations: int) -> None:
        run_attached(agent, "--iterations", str(iterations), "--launches-per-iter", "0")
        time.sleep(2.5)  # longer than the exporter's timeout: exports fail, not just retry
        c.start()
        back = time.time_ns()
        # The backlog (at most the queue) drains first; then new spans flow again.
        c.wait_for(
            lambda: (p := fresh("otelbpf.spans.queued", back)) is not None and p.value == 0,
            timeout=20,
            what="the queue drained after the collector came back",
        )
        w = run_attached(agent, "--iterations", "1")
        c.wait_for(lambda: _spans(c, w["pid"], "cudaMalloc"), timeout=20, what="spans after recovery")

    with AgentProcess(["-c", str(cfg)]) as agent:
        agent.wait_ready()
        outage_then_recovery(150)  # down from the start: 600 spans into a queue of 40
        c.wait_for(
            lambda: total("otelbpf.export.dropped") >= 150 * 4 - 40 - 2 * 20,
            timeout=20,
            what="drops counted for what the queue could not hold",
        )
        dropped, failures = total("otelbpf.export.dropped"), total("otelbpf.export.failures", signal="traces")
        c.stop()
        outage_then_recovery(20)  # down again mid-run
        c.wait_for(
            lambda: total("otelbpf.export.failures", signal="traces") > failures,
            timeout=20,
            what="failed span exports of the second outage counted",
        )
        c.wait_for(
            lambda: total("otelbpf.export.dropped") > dropped, timeout=20, what="drops of the second outage counted"
        )
        rss = c.latest_points("process.memory.usage", **{"service.name": "otelbpf"})[0].value
        assert rss < 400 << 20
        assert agent.proc.poll() is None
        assert agent.stop() == 0


def test_env_only_configuration_and_service_name_from_target(otlp_collector, tmp_path):
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp_collector.grpc_endpoint, "OTEL_METRIC_EXPORT_INTERVAL": "300"}
    with AgentProcess(
        ["--", "env", "OTEL_SERVICE_NAME=trainer", str(WORKLOAD), "--lib", str(FAKE_CUDART), "--iterations", "1"],
        env=env,
    ) as agent:
        assert agent.wait() == 0, agent.output
    c = otlp_collector
    spans = c.wait_for(lambda: c.spans("cudaMalloc"), what="spans via env-configured exporter")
    assert spans[0].resource["service.name"] == "trainer", spans[0].resource
    assert "otelbpf.process.exited" not in spans[0].resource  # described while it lived


def test_no_privileges_is_a_clear_error(tmp_path):
    cfg = config({"name": "file", "directory": str(tmp_path / "out")}, tmp=tmp_path)
    drop = ["setpriv", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all", "--"]
    out = subprocess.run(
        [*drop, sys.executable, "-m", "otelbpf.cli", "run", "-c", str(cfg), "--duration", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert "run it as root" in out.stderr and "CAP_SYS_ADMIN" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_second_start_loads_the_programs_from_the_cache_and_sees_the_same(otlp_collector, tmp_path):
    """The first start compiles and keeps the programs in service.program_cache; the second,
    with the same config, loads them from there (no compile) and traces the same calls."""
    import yaml

    cfg = config(otlp_grpc(otlp_collector), tmp=tmp_path, cuda={"launch_sample_every": 1})
    doc = yaml.safe_load(cfg.read_text())
    doc["service"]["program_cache"] = {"directory": str(tmp_path / "cache")}
    cfg.write_text(yaml.safe_dump(doc))
    args = ["--iterations", "2", "--launches-per-iter", "3", "--alloc-bytes", "4096"]
    args += ["--h2d-bytes", "512", "--d2h-bytes", "256"]
    seen = []
    for _ in range(2):
        with AgentProcess(["-c", str(cfg), "--", str(WORKLOAD), "--lib", str(FAKE_CUDART), *args]) as agent:
            assert agent.wait() == 0, agent.output
        pid = _summary_from(agent.output)["pid"]
        c = otlp_collector
        c.wait_for(lambda c=c, pid=pid: len(_spans(c, pid, "cudaLaunchKernel")) == 6, what="6 launch spans")
        c.wait_for(lambda c=c, pid=pid: len(_spans(c, pid, "cudaFree")) == 2, what="2 frees")
        names = sorted(s.name for s in _spans(c, pid))
        seen.append(("(programs from the cache)" in agent.output, names))
    assert [cached for cached, _ in seen] == [False, True]
    assert seen[0][1] == seen[1][1]
    assert {"cudaLaunchKernel", "cudaMalloc", "cudaMemcpy", "cudaFree"} <= set(seen[1][1])
