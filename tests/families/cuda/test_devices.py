"""Which device a CUDA call was made for (``cuda.device.id``), end to end with the real agent.

A job (Python, ctypes, under ``otelbpf run``) plants, with the stand-ins' two devices and
FAKECUDA_KERNEL_US = 20 ms a kernel:

- thread A drives both devices in turn through the runtime, STEPS times: ``cudaSetDevice(0)``,
  a kernel, a synchronize (20 ms); ``cudaSetDevice(1)``, 2 kernels, a synchronize (40 ms); 30 ms
  of host sleep. Device 0 has nothing queued from its synchronize's return to the next step's
  ``cudaSetDevice(0)``: inside that gap the thread spends ~40 ms in device 1's calls; device 1's
  gap holds device 0's ~20 ms. Each device's gap after the last step has no next call: open, not
  charged (STEPS - 1 gaps each). The diagnosis (analyze/)
  must charge exactly that to ``other_device``, by device;
- thread B sets its context through the driver (a primary context pushed, a context created,
  popped, set, popped again) with an allocation after each: each allocation carries the device
  of the context then current, none before the first and after the last.

And the real libcudart.so.13 (no driver: every call returns 35): ``cudaSetDevice`` is probed and
fires, is counted as a call and an error, sets nothing (the calls after it carry no device).
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from harness.agent import FAKE_CUDA, FAKE_CUDART, AgentProcess, config
from harness.c_header import defines
from otelbpf.analyze.diagnose import diagnose
from otelbpf.analyze.summary import read_spans
from otelbpf.base import events

pytestmark = pytest.mark.bpf

REAL_CUDART13 = Path("/usr/local/cuda-13.0/lib64/libcudart.so.13")
STEPS = 6
KERNEL_S = 0.020

JOB = r"""
import ctypes, sys, threading, time

rt, drv, steps = ctypes.CDLL(sys.argv[1]), ctypes.CDLL(sys.argv[2]), int(sys.argv[3])


class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


rt.cudaLaunchKernel.argtypes = [ctypes.c_void_p, Dim3, Dim3, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
rt.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
kernel = ctypes.cast(rt.cudaGetLastError, ctypes.c_void_p)  # the CUDA 12 stand-in runs any host function


def check(rc):
    if rc:
        raise SystemExit(f"CUDA error {rc}")


def step(device, kernels):
    check(rt.cudaSetDevice(device))
    for _ in range(kernels):
        check(rt.cudaLaunchKernel(kernel, Dim3(1, 1, 1), Dim3(32, 1, 1), None, 0, None))
    check(rt.cudaStreamSynchronize(None))


def both_devices():
    for _ in range(steps):
        step(0, 1)
        step(1, 2)
        time.sleep(0.03)


def contexts():
    ptr, p1, made, out = ctypes.c_uint64(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()

    def alloc():
        check(drv.cuMemAlloc_v2(ctypes.byref(ptr), 4096))
        check(drv.cuMemFree_v2(ptr))

    alloc()  # no context set yet
    check(drv.cuDevicePrimaryCtxRetain(ctypes.byref(p1), 1))
    check(drv.cuCtxPushCurrent_v2(p1))
    alloc()  # device 1
    check(drv.cuCtxCreate_v4(ctypes.byref(made), None, 0, 0))
    alloc()  # device 0 (made, pushed)
    check(drv.cuCtxPopCurrent_v2(ctypes.byref(out)))
    alloc()  # device 1 again
    check(drv.cuCtxSetCurrent(made))
    alloc()  # device 0 (the top replaced)
    check(drv.cuCtxPopCurrent_v2(ctypes.byref(out)))
    alloc()  # none
    check(drv.cuCtxDestroy_v2(made))


check(rt.cudaGetLastError())  # the runtime binds the driver
threads = [threading.Thread(target=both_devices), threading.Thread(target=contexts)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("job done", flush=True)
"""

#: The real CUDA 13 runtime with no driver: cudaSetDevice(1) fails (35), then an allocation.
REAL_JOB = r"""
import ctypes, sys
rt = ctypes.CDLL(sys.argv[1])
ptr = ctypes.c_void_p()
print("rc", rt.cudaSetDevice(1), rt.cudaMalloc(ctypes.byref(ptr), 4096), flush=True)
"""


class Spans:
    """Every CUDA span of the folder: (name, thread, start, attributes)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, int, int, dict[str, Any]]] = []

    def span(self, key: object, scope: str | None, sp: dict[str, Any], a: dict[str, Any], d: int) -> None:
        if scope == "otelbpf.cuda":
            self.rows.append((sp["name"], int(a["thread.id"]), int(sp["startTimeUnixNano"]), a))


def run_job(tmp_path: Path, lib: Path, script: str, *args: str) -> tuple[Path, AgentProcess]:
    out = tmp_path / "out"
    cfg = config({"name": "file", "directory": str(out)}, tmp=tmp_path, cuda={"launch_sample_every": 1})
    with AgentProcess(
        ["-c", str(cfg), "--", sys.executable, "-c", script, str(lib), *args],
        env={"FAKECUDA_KERNEL_US": str(int(KERNEL_S * 1e6))},
    ) as agent:
        assert agent.wait() == 0, agent.output
    return out, agent


def test_the_device_shift_is_common_hs() -> None:
    common = (Path(__file__).resolve().parents[3] / "bpf" / "common.h").read_text()
    assert defines(common)["CUDA_DEVICE_SHIFT"].value == events.CUDA_DEVICE_SHIFT


def test_each_call_carries_its_threads_device_and_the_idle_budget_is_per_device(tmp_path):
    out, agent = run_job(tmp_path, FAKE_CUDART, JOB, str(FAKE_CUDA), str(STEPS))
    assert "job done" in agent.output, agent.output
    spans = Spans()
    read_spans(str(out), [spans])
    rows = sorted(spans.rows, key=lambda r: r[2])
    by_thread: dict[int, list[tuple[str, Any]]] = {}
    for name, tid, _start, a in rows:
        by_thread.setdefault(tid, []).append((name, a.get("cuda.device.id")))
    [a_calls] = [c for c in by_thread.values() if any(n == "cudaSetDevice" for n, _d in c)]
    [b_calls] = [c for c in by_thread.values() if any(n == "cuMemAlloc_v2" for n, _d in c)]
    # thread A: every call carries the device set before it (cudaSetDevice its own)
    assert Counter(a_calls) == Counter(
        {
            ("cudaSetDevice", 0): STEPS,
            ("cudaLaunchKernel", 0): STEPS,
            ("cudaStreamSynchronize", 0): STEPS,
            ("cudaSetDevice", 1): STEPS,
            ("cudaLaunchKernel", 1): 2 * STEPS,
            ("cudaStreamSynchronize", 1): STEPS,
        }
    ), Counter(a_calls)
    # thread B: the driver's context stack, followed
    assert [d for n, d in b_calls if n == "cuMemAlloc_v2"] == [None, 1, 0, 1, 0, None], b_calls
    # the diagnosis: device 0's gaps hold device 1's synchronizes (40 ms planted), device 1's
    # hold device 0's (20 ms); a synchronize waits for its kernels less the host's time from
    # their launch to it (2 ms at most: a launch or two)
    [finding] = [f for f in diagnose(str(out)) if f.cause == "other_device"]
    by_device = finding.evidence["by_device"]
    assert set(by_device) == {"device 0", "device 1"}, by_device
    launching, slack = 0.002, 0.010  # slack: the set-device call, a late wake-up on this 2-core machine
    for device, kernels in (("device 1", 2), ("device 0", 1)):
        planted, gaps = kernels * KERNEL_S, STEPS - 1
        assert (planted - launching) * gaps <= by_device[device] <= (planted + slack) * gaps, by_device


def test_the_real_cuda13_runtime_set_device_fires_and_sets_nothing_when_it_fails(tmp_path):
    if not REAL_CUDART13.exists():  # as tests/examples/test_cuda13.py: CI must have the toolkit
        if os.environ.get("CI") == "true":
            pytest.fail(f"no {REAL_CUDART13}: CI needs the CUDA 13 toolkit")
        pytest.skip("no real libcudart.so.13 here")
    out, agent = run_job(tmp_path, REAL_CUDART13, REAL_JOB)
    assert "rc 35 35" in agent.output, agent.output
    spans = Spans()
    read_spans(str(out), [spans])
    calls = {name: a for name, _tid, _start, a in spans.rows}
    assert calls["cudaSetDevice"]["cuda.api.return_code"] == 35
    assert calls["cudaSetDevice"]["cuda.device.id"] == 1  # the device it was asked for
    assert "cuda.device.id" not in calls["cudaMalloc"]  # nothing was set
    errors = [line for line in (out / "metrics.jsonl").read_text().splitlines() if "cudaSetDevice" in line]
    assert errors and '"cuda.api.errors"' in errors[-1], "cudaSetDevice's error counted"
