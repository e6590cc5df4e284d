"""The NVML sampler through the real pynvml: against no driver at all (this host), and against
the stand-in libnvidia-ml.so.1 (examples/fakenvml/fakenvml.c, whose script its header gives)
in a child process whose LD_LIBRARY_PATH finds it, as a driver's would be found."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from otelbpf.base.health import Health
from otelbpf.families.gpu.nvml import LIBRARY, NvmlSampler, nvml_family, probe

REPO = Path(__file__).resolve().parents[3]
FAKE_DIR = REPO / "build" / "examples" / "fakenvml"
GIB = 1 << 30


def _driver_here() -> bool:
    try:
        ctypes.CDLL(LIBRARY)
    except OSError:
        return False
    return True


@pytest.mark.skipif(_driver_here(), reason="a driver's libnvidia-ml.so.1 loads here")
def test_without_a_driver_the_sampler_counts_once_and_ends():
    health, delivered = Health(), []
    sampler = NvmlSampler(delivered.append, health, interval_s=0.01)
    sampler.start()
    assert sampler.ready.wait(5)
    sampler._thread.join(5)
    assert not sampler._thread.is_alive()  # nothing left running, nothing polled
    sampler.stop()
    assert sampler.unavailable == "library_not_found"
    assert delivered == [] and sampler.devices == []
    assert health.snapshot() == [
        ("otelbpf.gpu.nvml.failures", {"function": "nvmlInit", "reason": "library_not_found"}, 1)
    ]
    assert probe() == (False, "library_not_found")


def test_the_family_has_no_c_and_starts_and_stops_the_sampler():
    calls = []

    class Recorder:
        def start(self) -> None:
            calls.append("start")

        def stop(self) -> None:
            calls.append("stop")

    family = nvml_family(Recorder())  # type: ignore[arg-type]
    assert (family.name, family.c_file, family.libraries, family.rings) == ("gpu", "", (), ())
    family.on_load(object())
    family.on_unload(object())
    assert calls == ["start", "stop"]


SAMPLE_FOR = textwrap.dedent("""
    import json, sys, time
    from otelbpf.base.health import Health
    from otelbpf.families.gpu.nvml import NvmlSampler, probe
    health, samples = Health(), []
    sampler = NvmlSampler(samples.append, health, interval_s=0.05)
    sampler.start()
    time.sleep(float(sys.argv[1]))
    sampler.stop()
    print(json.dumps({
        "probe": probe(),
        "devices": [d.__dict__ for d in sampler.devices],
        "samples": [{"devices": [{**d.__dict__, "device": d.device.index} for d in s.devices],
                     "processes": [{**p.__dict__, "device": p.device.index} for p in s.processes],
                     "xids": [(x.device.index, x.xid) for x in s.xids],
                     "lost": [d.index for d in s.lost]} for s in samples],
        "health": health.snapshot(),
    }))
""")


@pytest.fixture(scope="module")
def fake_run() -> dict:
    """1.5 s of samples every 50 ms from the stand-in, its ramp in 50 ms steps (100 % at 0.5 s),
    GPU 1 lost at 1.2 s, with this test's pid as the process on GPU 0."""
    assert (FAKE_DIR / LIBRARY).exists(), "run examples/build.sh"
    env = {**os.environ, "LD_LIBRARY_PATH": str(FAKE_DIR), "FAKENVML": f"pid={os.getpid()},lost_ms=1200,step_ms=50"}
    out = subprocess.run(
        [sys.executable, "-c", SAMPLE_FOR, "1.5"], env=env, cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_devices_are_named_as_the_driver_names_them(fake_run):
    assert fake_run["probe"] == [True, "driver 580.65.06-fake, 2 GPU(s)"]
    assert fake_run["devices"] == [
        {
            "index": 0,
            "uuid": "GPU-00000000-0000-4000-8000-000000000000",
            "name": "NVIDIA H100 80GB HBM3",
            "pci_bus_id": "00000000:3B:00.0",
            "driver_version": "580.65.06-fake",
        },
        {
            "index": 1,
            "uuid": "GPU-11111111-1111-4111-8111-111111111111",
            "name": "NVIDIA H100 80GB HBM3",
            "pci_bus_id": "00000000:86:00.0",
            "driver_version": "580.65.06-fake",
        },
    ]


def test_gpu0_readings_follow_the_script(fake_run):
    gpu0 = [d for s in fake_run["samples"] for d in s["devices"] if d["device"] == 0]
    assert len(gpu0) >= 15  # every 50 ms for 1.5 s, on a loaded machine
    ramp = [d["utilization"] for d in gpu0]
    assert set(ramp) <= {i / 10 for i in range(11)} and ramp == sorted(ramp)
    assert ramp[0] <= 0.1 and ramp[-1] == 1.0 and len(set(ramp)) >= 5  # it ramps, and it got to 100 %
    assert all(d["memory_busy"] == pytest.approx(int(d["utilization"] * 100) // 2 / 100) for d in gpu0)
    last = gpu0[-1]
    assert (last["memory_used"], last["memory_total"]) == (3 * GIB, 80 * GIB)
    assert (last["power_w"], last["sm_clock_hz"], last["memory_clock_hz"]) == (300.0, 1_980_000_000, 2_619_000_000)
    assert last["temperature_c"] == 50.0
    assert (last["pcie_tx_bytes_per_s"], last["pcie_rx_bytes_per_s"]) == (1000 * 1024, 2000 * 1024)
    # NVLink: cumulative KiB in the script (t, 2t), bytes here; energy 300 mJ per ms
    assert last["nvlink_rx_bytes"] == 2 * last["nvlink_tx_bytes"] and last["nvlink_tx_bytes"] >= 1200 * 1024
    assert last["energy_j"] >= 0.3 * 1200
    tx = [d["nvlink_tx_bytes"] for d in gpu0]
    assert tx == sorted(tx)


def test_the_process_on_gpu0_with_its_memory_and_utilization(fake_run):
    procs = [p for s in fake_run["samples"] for p in s["processes"]]
    assert {(p["pid"], p["device"], p["memory_used"]) for p in procs} == {(os.getpid(), 0, 3 * GIB)}
    assert procs[-1]["utilization"] == 1.0 and procs[-1]["memory_busy"] == 0.5


def test_gpu1_unsupported_calls_are_asked_once_and_its_loss_ends_its_reading(fake_run):
    gpu1 = [d for s in fake_run["samples"] for d in s["devices"] if d["device"] == 1]
    assert gpu1 and all(d["power_w"] is None and d["nvlink_tx_bytes"] is None for d in gpu1)
    assert all(d["utilization"] == 0.0 and d["memory_used"] == 0 for d in gpu1)
    assert fake_run["samples"][-1]["devices"][-1]["device"] == 0  # lost at 1.2 s: no longer in samples
    assert len(gpu1) < len(fake_run["samples"])
    assert [s["lost"] for s in fake_run["samples"]] == [[]] * len(gpu1) + [[1]] * (len(fake_run["samples"]) - len(gpu1))
    failures = {(a["function"], a["reason"]): n for name, a, n in fake_run["health"]}
    assert failures == {
        ("nvmlDeviceGetPowerUsage", "not_supported"): 1,
        ("nvmlDeviceGetFieldValues.nvlink", "not_supported"): 2,  # TX and RX, once
        ("nvmlDeviceGetUtilizationRates", "gpu_is_lost"): 1,  # the first call after the loss; none after
    }


def test_one_xid_event_from_gpu1(fake_run):
    assert [x for s in fake_run["samples"] for x in s["xids"]] == [[1, 79]]
