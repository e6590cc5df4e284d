"""The gpu receiver end to end: the real agent (`otelbpf run`) exporting to the real rotel
collector, reading NVML through the real pynvml.

Here there is no driver: the agent must start, run its other receivers, count the failed
nvmlInit once and export no GPU metric; `otelbpf doctor` must say so. With the stand-in
libnvidia-ml.so.1 (examples/fakenvml/fakenvml.c) on LD_LIBRARY_PATH, where a driver's would be
found, every value its script gives must arrive exactly as the semantic conventions name it.
"""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from harness.agent import REPO, AgentProcess, otlp_grpc

pytestmark = pytest.mark.bpf

FAKE_DIR = REPO / "build" / "examples" / "fakenvml"
GPU0 = "GPU-00000000-0000-4000-8000-000000000000"
GPU1 = "GPU-11111111-1111-4111-8111-111111111111"
GIB = 1 << 30


def _driver_here() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


no_driver_only = pytest.mark.skipif(_driver_here(), reason="a driver's libnvidia-ml.so.1 loads here")


def config(collector, tmp: Path, receivers: list[str]) -> Path:
    exporter = otlp_grpc(collector)
    name = exporter.pop("name")
    doc = {
        "receivers": {"gpu": {"interval": "100ms"}, "cuda": {"search_paths": []}},
        "processors": {"batch": {"timeout": "100ms"}},
        "exporters": {name: exporter},
        "service": {
            "pipelines": {"metrics": {"receivers": receivers, "processors": ["batch"], "exporters": [name]}},
            "telemetry": {"metrics_interval": "300ms", "drain_interval": "20ms", "log_level": "info"},
        },
    }
    path = tmp / "otelbpf.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def gpu_process() -> Iterator[int]:
    """A real process: the one the stand-in says holds 3 GiB on GPU 0 (so its resource is real),
    and the --pid target of the agent that runs without a driver."""
    proc = subprocess.Popen(["sleep", "120"])
    yield proc.pid
    proc.kill()
    proc.wait()


@no_driver_only
def test_without_a_driver_the_agent_runs_its_other_receivers_and_counts_the_failed_init(
    otlp_collector, tmp_path, gpu_process
):
    cfg = config(otlp_collector, tmp_path, ["cuda", "gpu"])
    # --pid: the cuda receiver probes only that process's libraries (none), not every CUDA
    # library the host's processes map, whose detach would take a minute here
    with AgentProcess(["-c", str(cfg), "--pid", str(gpu_process)]) as agent:
        agent.wait_ready()
        otlp_collector.wait_for(
            lambda: otlp_collector.latest_points("otelbpf.gpu.nvml.failures"), what="the failed nvmlInit, counted"
        )
        otlp_collector.wait_for(lambda: otlp_collector.latest_points("otelbpf.events.received"), what="a second export")
        assert agent.stop() == 0, agent.output
    [failure] = otlp_collector.latest_points("otelbpf.gpu.nvml.failures")
    assert failure.attributes == {"function": "nvmlInit", "reason": "library_not_found"}
    assert failure.value == 1
    assert agent.output.count("NVML cannot be opened (library_not_found)") == 1, agent.output
    assert not [p for p in otlp_collector.metric_points() if p.name.startswith(("hw.", "otelbpf.gpu.process"))]


@no_driver_only
def test_doctor_says_the_gpu_receiver_stays_idle():
    out = subprocess.run(
        [sys.executable, "-m", "otelbpf.cli", "doctor"], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert re.search(r"^MISSING\s+NVML\s+no driver — the gpu receiver stays idle$", out.stdout, re.M), out.stdout
    assert "Optional features unavailable" in out.stdout and "NVML" in out.stdout.split("Optional features")[1]


def test_the_stand_in_drivers_values_arrive_exactly(otlp_collector, tmp_path, gpu_process):
    assert (FAKE_DIR / "libnvidia-ml.so.1").exists(), "run examples/build.sh"
    cfg = config(otlp_collector, tmp_path, ["gpu"])
    env = {"LD_LIBRARY_PATH": str(FAKE_DIR), "FAKENVML": f"pid={gpu_process},step_ms=50"}
    c = otlp_collector
    with AgentProcess(["-c", str(cfg)], env=env) as agent:
        agent.wait_ready()
        c.wait_for(
            lambda: [p for p in c.latest_points("hw.gpu.utilization", **{"hw.id": GPU0}) if p.value == 1.0],
            timeout=30,
            what="GPU 0 at 100 % after its ramp",
        )
        c.wait_for(lambda: c.latest_points("hw.errors"), what="the XID event")
        assert agent.stop() == 0, agent.output

    ramp = [p.value for p in c.metric_points("hw.gpu.utilization") if p.attributes["hw.id"] == GPU0]
    assert all(0.0 <= v <= 1.0 for v in ramp) and ramp[-1] == 1.0
    [idle] = c.latest_points("hw.gpu.utilization", **{"hw.id": GPU1})
    assert idle.value == 0.0 and idle.unit == "1" and idle.kind == "gauge"
    assert idle.attributes == {
        "hw.id": GPU1,
        "hw.type": "gpu",
        "hw.name": "gpu1",
        "hw.model": "NVIDIA H100 80GB HBM3",
        "hw.vendor": "NVIDIA",
        "hw.driver_version": "580.65.06-fake",
        "otelbpf.gpu.pci.bus_id": "00000000:86:00.0",
        "hw.gpu.task": "general",
    }

    def latest(name: str, hw_id: str = GPU0, **filters) -> float:
        [point] = c.latest_points(name, **{"hw.id": hw_id}, **filters)
        return point.value

    assert latest("hw.gpu.memory.usage") == 3 * GIB and latest("hw.gpu.memory.usage", GPU1) == 0
    assert latest("hw.gpu.memory.limit") == latest("hw.gpu.memory.limit", GPU1) == 80 * GIB
    assert latest("hw.gpu.memory.utilization") == 3 / 80
    assert latest("otelbpf.gpu.memory_controller.utilization") == 0.5
    assert latest("hw.power") == 300.0
    assert c.latest_points("hw.power", **{"hw.id": GPU1}) == []  # NOT_SUPPORTED there: left out, not 0
    assert latest("otelbpf.gpu.clock.frequency", **{"otelbpf.gpu.clock": "sm"}) == 1_980_000_000
    assert latest("otelbpf.gpu.clock.frequency", **{"otelbpf.gpu.clock": "memory"}) == 2_619_000_000
    assert latest("hw.temperature", f"{GPU0}/temperature") == 50.0
    assert latest("otelbpf.gpu.pcie.throughput", **{"network.io.direction": "transmit"}) == 1000 * 1024
    assert latest("otelbpf.gpu.pcie.throughput", **{"network.io.direction": "receive"}) == 2000 * 1024
    tx = latest("hw.gpu.io", **{"network.io.direction": "transmit"})
    assert tx > 0 and latest("hw.gpu.io", **{"network.io.direction": "receive"}) == 2 * tx  # one read, both
    assert c.latest_points("hw.gpu.io", **{"hw.id": GPU1}) == []  # no NVLink there
    [xid] = c.latest_points("hw.errors")
    assert (xid.attributes["hw.id"], xid.attributes["error.type"], xid.attributes["otelbpf.gpu.xid"], xid.value) == (
        GPU1,
        "xid",
        79,
        1,
    )
    assert xid.kind == "sum" and xid.is_monotonic

    [memory] = c.latest_points("otelbpf.gpu.process.memory.usage")
    assert memory.value == 3 * GIB and memory.attributes["process.pid"] == gpu_process
    assert memory.resource["process.pid"] == gpu_process and memory.attributes["hw.id"] == GPU0
    [busy] = c.latest_points("otelbpf.gpu.process.utilization")
    assert busy.value == 1.0 and busy.attributes["process.pid"] == gpu_process

    failures = {
        (p.attributes["function"], p.attributes["reason"]): p.value
        for p in c.latest_points("otelbpf.gpu.nvml.failures")
    }
    assert failures == {
        ("nvmlDeviceGetPowerUsage", "not_supported"): 1,
        ("nvmlDeviceGetFieldValues.nvlink", "not_supported"): 2,
    }
    assert {(p.attributes["hw.id"], p.attributes["hw.state"], p.value) for p in c.latest_points("hw.status")} == {
        (GPU0, "ok", 1),
        (GPU0, "failed", 0),
        (GPU1, "ok", 1),
        (GPU1, "failed", 0),
    }
    assert "XID 79 on GPU 1" in agent.output
    assert os.path.exists(f"/proc/{gpu_process}")  # the process NVML named was only read
