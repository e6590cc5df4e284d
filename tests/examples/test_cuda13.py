"""The stand-ins behave like CUDA 13, and real nvcc 13 programs run on both runtimes (no BPF here).

What the agent tests rely on: kernel handles differ from host stubs; every runtime call enters
the driver (the stand-in driver counts its own calls, so "the runtime called the driver" is
checked without probes); nvcc programs report exactly the launches asked for, with 35 from the
real libcudart.so.13 (no driver here) and 0 from the stand-in.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("built")

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build" / "examples"
WORKLOAD = BUILD / "cuda_workload"
FAKE_CUDART12 = BUILD / "fakecudart" / "libcudart.so.12"
FAKE_CUDART13 = BUILD / "fakecudart13" / "libcudart.so.13"
FAKE_CUDA = BUILD / "fakecuda" / "libcuda.so.1"
NVCC_DIR = BUILD / "nvcc"
REAL_CUDART13 = Path("/usr/local/cuda-13.0/lib64/libcudart.so.13")
NVCC = Path("/usr/local/cuda-13.0/bin/nvcc")


@pytest.fixture(scope="module")
def nvcc_built() -> Path:
    """The nvcc programs; a missing toolkit fails under CI=true and skips elsewhere."""
    if not (NVCC_DIR / "nvcc_launches").exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"no nvcc programs in {NVCC_DIR}: CI needs the CUDA 13 toolkit ({NVCC})")
        pytest.skip("no nvcc here")
    return NVCC_DIR


@pytest.fixture(scope="module")
def real_cudart13() -> Path:
    if not REAL_CUDART13.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"no {REAL_CUDART13}: CI needs the CUDA 13 toolkit")
        pytest.skip("no real libcudart.so.13 here")
    return REAL_CUDART13


def run_json(cmd: list[object], env: dict[str, str] | None = None) -> dict:
    result = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})}
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def nonzero(counts: dict[str, int]) -> dict[str, int]:
    return {name: n for name, n in counts.items() if n}


def on_stand_in() -> dict[str, str]:
    return {"LD_LIBRARY_PATH": str(FAKE_CUDART13.parent)}


# ---- cuda_workload --cuda13


def test_cuda13_handles_are_driver_heap_pointers_not_host_stubs() -> None:
    s = run_json([WORKLOAD, "--lib", FAKE_CUDART13, "--cuda13", "--iterations", 3, "--launches-per-iter", 4])
    calls = nonzero(s["calls"])
    assert calls["__cudaLaunchKernel"] == 12 and "cudaLaunchKernel" not in calls
    assert calls["__cudaGetKernel"] == 3, "once per call site (kernel), not per launch"
    assert calls["__cudaRegisterFunction"] == 3 and calls["__cudaRegisterFatBinary"] == 1
    assert calls["__cudaPushCallConfiguration"] == calls["__cudaPopCallConfiguration"] == 12
    assert s["return_codes"]["__cudaLaunchKernel"] == {"0": 12}
    handles = [int(k["handle"], 16) for k in s["kernels"]]
    stubs = [int(k["host_stub"], 16) for k in s["kernels"]]
    assert len(set(handles)) == 3 and not set(handles) & set(stubs)
    for k in s["kernels"]:
        assert k["get_kernel_rc"] == 0 and k["device_name"] == k["symbol"]
        assert (
            k["device_stub_symbol"].startswith("_Z") and "__device_stub__" + k["symbol"][1:] in k["device_stub_symbol"]
        )
    # the runtime entered the driver once per launch, with the handles from cuLibraryGetKernel
    assert s["driver_calls"]["cuLaunchKernel"] == 12
    assert s["driver_calls"]["cuLibraryGetKernel"] == 3 and s["driver_calls"]["cuLibraryLoadData"] == 1


def test_cuda13_ptsz_and_late_registration(tmp_path: Path) -> None:
    s = run_json(
        [
            WORKLOAD,
            "--lib",
            FAKE_CUDART13,
            "--cuda13",
            "--ptsz",
            "--register-late",
            "--iterations",
            2,
            "--launches-per-iter",
            3,
        ]
    )
    assert nonzero(s["calls"])["__cudaLaunchKernel_ptsz"] == 6
    assert s["driver_calls"]["cuLaunchKernel_ptsz"] == 6 and "cuLaunchKernel" not in s["driver_calls"]


def test_cuda13_launch_ex_passes_host_functions() -> None:
    s = run_json(
        [WORKLOAD, "--lib", FAKE_CUDART13, "--cuda13", "--launch-ex", "--iterations", 1, "--launches-per-iter", 5]
    )
    calls = nonzero(s["calls"])
    assert calls["cudaLaunchKernelExC"] == 5 and "__cudaGetKernel" not in calls
    assert s["return_codes"]["cudaLaunchKernelExC"] == {"0": 5} and s["driver_calls"]["cuLaunchKernelEx"] == 5
    assert all(k["handle"] is None for k in s["kernels"])


def test_cuda13_runtime_rejects_unregistered_host_functions() -> None:
    """Without --cuda13 nothing is registered: CUDA 13 answers 98, CUDA 12 takes any host function."""
    s13 = run_json([WORKLOAD, "--lib", FAKE_CUDART13, "--iterations", 1, "--launches-per-iter", 3])
    assert s13["return_codes"]["cudaLaunchKernel"] == {"98": 3} and "cuLaunchKernel" not in s13["driver_calls"]
    s12 = run_json([WORKLOAD, "--lib", FAKE_CUDART12, "--iterations", 1, "--launches-per-iter", 3])
    assert s12["return_codes"]["cudaLaunchKernel"] == {"0": 3}
    assert s12["driver_calls"]["cuLaunchKernel"] == 3 and s12["driver_calls"]["cuModuleGetFunction"] == 3


def test_cuda13_workload_on_the_real_runtime_keeps_host_stubs_as_handles(real_cudart13: Path) -> None:
    s = run_json([WORKLOAD, "--lib", real_cudart13, "--cuda13", "--iterations", 1, "--launches-per-iter", 3])
    assert s["return_codes"]["__cudaLaunchKernel"] == {"35": 3}
    assert all(k["get_kernel_rc"] == 35 and k["handle"] == k["host_stub"] for k in s["kernels"])
    assert s["driver_calls"] is None


def test_every_runtime_call_enters_the_driver() -> None:
    s = run_json(
        [
            WORKLOAD,
            "--lib",
            FAKE_CUDART12,
            "--iterations",
            2,
            "--launches-per-iter",
            3,
            "--async",
            "--graph-launches",
            1,
            "--events",
            "--async-alloc",
            "--host-memory",
            "registered",
        ]
    )
    not_ready = s["return_codes"].pop("cudaEventQuery")  # 600 while the launches before it "run"
    assert set(not_ready) <= {"0", "600"} and sum(not_ready.values()) == 2
    assert all(set(codes) <= {"0"} for codes in s["return_codes"].values())
    d, c = s["driver_calls"], s["calls"]
    assert d["cuLaunchKernel"] == c["cudaLaunchKernel"] == 6
    assert d["cuMemAllocAsync"] == c["cudaMallocAsync"] == 2 and d["cuMemFreeAsync"] == c["cudaFreeAsync"] == 2
    assert d["cuMemcpyHtoDAsync_v2"] == d["cuMemcpyDtoHAsync_v2"] == 2
    assert d["cuStreamSynchronize"] == c["cudaStreamSynchronize"] == 2
    assert d["cuCtxSynchronize"] == c["cudaDeviceSynchronize"] == 2
    assert d["cuGraphLaunch"] == c["cudaGraphLaunch"] == 2
    assert d["cuEventCreate"] == 1 and d["cuEventRecord"] == d["cuEventQuery"] == d["cuEventSynchronize"] == 2
    assert d["cuStreamWaitEvent"] == 2 and d["cuEventDestroy_v2"] == 1
    assert d["cuMemHostRegister_v2"] == c["cudaHostRegister"] == 2 and d["cuMemHostUnregister"] == 2
    assert s["roundtrip"] == {"checked": 2, "mismatched": 0}


def test_driver_options_count_each_call() -> None:
    s = run_json(
        [
            WORKLOAD,
            "--lib",
            FAKE_CUDART13,
            "--driver-lib",
            FAKE_CUDA,
            "--iterations",
            2,
            "--launches-per-iter",
            2,
            "--driver-copies",
            "--vmm",
            "--driver-ptsz",
            "--driver-graph-launches",
            1,
            "--host-memory",
            "pinned",
            "--alloc-bytes",
            8192,
            "--h2d-bytes",
            8192,
            "--d2h-bytes",
            8192,
        ]
    )
    codes = {name: c for name, c in s["return_codes"].items() if name.startswith("cu") and not name.startswith("cuda")}
    assert all(set(c) <= {"0"} for c in codes.values()), codes
    calls = nonzero(s["calls"])
    # the runtime's cudaMemcpy calls (2 H2D, 2 D2H) come on top of the workload's own
    assert s["driver_calls"]["cuMemcpyHtoD_v2"] == s["driver_calls"]["cuMemcpyDtoH_v2"] == 4
    for name in (
        "cuMemcpyDtoD_v2",
        "cuMemcpy",
        "cuMemcpy2D_v2",
        "cuMemcpy3D_v2",
        "cuMemAddressReserve",
        "cuMemCreate",
        "cuMemMap",
        "cuMemUnmap",
        "cuMemRelease",
        "cuMemAddressFree",
        "cuGraphLaunch",
    ):
        assert calls[name] == 2 == s["driver_calls"][name], name
    assert calls["cuLaunchKernel_ptsz"] == 4 and calls["cudaMallocHost"] == calls["cudaFreeHost"] == 2
    assert s["driver_calls"]["cuMemAllocHost_v2"] == 2
    assert s["driver_memcpy"]["cuMemcpyHtoD_v2"] == {"calls": 2, "bytes": 2 * 8192}
    assert len(s["host_buffers"]) == 1 and s["host_buffers"][0]["in"] != "0x0"


def test_no_driver_means_35_everywhere(tmp_path: Path) -> None:
    s = run_json(
        [WORKLOAD, "--lib", FAKE_CUDART13, "--cuda13", "--iterations", 1, "--launches-per-iter", 2],
        env={"FAKECUDA_DRIVER": str(tmp_path / "missing.so")},
    )
    assert {name: set(c) for name, c in s["return_codes"].items() if c and not name.startswith("__cudaPop")} == {
        "cudaMalloc": {"35"},
        "cudaFree": {"35"},
        "cudaMemcpy": {"35"},
        "cudaDeviceSynchronize": {"35"},
        "cudaGetLastError": {"35"},
        "__cudaGetKernel": {"35"},
        "__cudaLaunchKernel": {"35"},
    }
    launched = [k for k in s["kernels"] if k["launches"]]
    assert len(launched) == 2 and all(k["handle"] == k["host_stub"] for k in launched), "it stays the host function"


def test_thunks_jump_into_cudaLaunchKernel() -> None:
    out = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", str(FAKE_CUDART13)], capture_output=True, text=True, check=True
    ).stdout
    for thunk, target in (
        ("__cudaLaunchKernel", "cudaLaunchKernel"),
        ("__cudaLaunchKernel_ptsz", "cudaLaunchKernel_ptsz"),
    ):
        body = out.split(f"<{thunk}>:\n")[1].split("\n\n")[0].splitlines()
        ops = [line.split("\t")[1].split()[0] for line in body if "\t" in line][:5]
        assert ops == ["endbr64", "push", "mov", "pop", "jmp"], (thunk, ops)
        assert body[4].endswith(f"<{target}>")
    dyn = subprocess.run(
        ["nm", "-D", "--defined-only", str(FAKE_CUDART13)], capture_output=True, text=True, check=True
    ).stdout
    assert "__cudaGetKernel@@libcudart.so.13" in dyn and "cudaGetKernel@@libcudart.so.13" in dyn
    dyn12 = subprocess.run(
        ["nm", "-D", "--defined-only", str(FAKE_CUDART12)], capture_output=True, text=True, check=True
    ).stdout
    assert "__cudaGetKernel" not in dyn12 and "__cudaRegisterFunction@@libcudart.so.12" in dyn12


# ---- real nvcc 13 programs


@pytest.mark.parametrize("program", ["nvcc_launches", "nvcc_launches.stripped"])
def test_nvcc_program_on_both_runtimes(nvcc_built: Path, real_cudart13: Path, program: str) -> None:
    args = [nvcc_built / program, "--launches", 23, "--ex-launches", 4]
    real = run_json(args)
    assert real["launches"] == 23 and real["ex_launches"] == 4 and real["driver_calls"] is None
    assert real["return_codes"]["launch"] == {"35": 23} and real["return_codes"]["cudaLaunchKernelEx"] == {"35": 4}
    assert real["per_kind"] == {"plain": 5, "namespaced": 5, "templated": 5, "functor": 4, "lambda": 4}
    fake = run_json(args, env=on_stand_in())
    assert fake["return_codes"] == {
        "cudaMalloc": {"0": 1},
        "launch": {"0": 23},
        "cudaLaunchKernelEx": {"0": 4},
        "cudaDeviceSynchronize": {"0": 1},
        "cudaFree": {"0": 1},
    }
    d = fake["driver_calls"]
    assert d["cuLaunchKernel"] == 23 and d["cuLaunchKernelEx"] == 4
    assert d["cuLibraryGetKernel"] == 5, "one handle per kernel: __cudaGetKernel once per call site"
    assert d["cuMemAlloc_v2"] == d["cuMemFree_v2"] == 1


def test_nvcc_program_undefined_symbols_are_all_in_the_stand_in(nvcc_built: Path) -> None:
    need = subprocess.run(
        ["nm", "-D", "--undefined-only", str(nvcc_built / "nvcc_launches")], capture_output=True, text=True, check=True
    ).stdout
    have = subprocess.run(
        ["nm", "-D", "--defined-only", str(FAKE_CUDART13)], capture_output=True, text=True, check=True
    ).stdout
    wanted = {line.split()[-1] for line in need.splitlines() if "@libcudart.so.13" in line}
    assert wanted and wanted <= {line.split()[-1].replace("@@", "@") for line in have.splitlines()}


def test_static_runtime_program_has_no_dynamic_cuda(nvcc_built: Path, real_cudart13: Path) -> None:
    s = run_json([nvcc_built / "nvcc_launches_static", "--launches", 7])
    assert s["return_codes"]["launch"] == {"35": 7}
    dyn = subprocess.run(
        ["nm", "-D", str(nvcc_built / "nvcc_launches_static")], capture_output=True, text=True, check=True
    ).stdout
    assert "cudaLaunchKernel" not in dyn
    local = subprocess.run(
        ["nm", str(nvcc_built / "nvcc_launches_static")], capture_output=True, text=True, check=True
    ).stdout.split()
    assert "cudaLaunchKernel" in local, "the runtime lives in the executable's .symtab"


def test_nvcc_library_dlopened_late(nvcc_built: Path, real_cudart13: Path) -> None:
    lib = nvcc_built / "libnvcc_kernels.so"
    assert (
        ".symtab" not in subprocess.run(["readelf", "-S", str(lib)], capture_output=True, text=True, check=True).stdout
    ), "stripped"
    args = [nvcc_built / "nvcc_dlopen_host", "--lib", lib, "--launches", 9]
    real = run_json(args)
    assert real["return_codes"]["launch"] == {"35": 9}
    fake = run_json(args, env=on_stand_in())
    assert fake["return_codes"]["launch"] == {"0": 9} and fake["driver_calls"]["cuLaunchKernel"] == 9


def test_nvcc_program_waits_for_its_file(nvcc_built: Path, tmp_path: Path) -> None:
    go = tmp_path / "go"
    proc = subprocess.Popen(
        [str(nvcc_built / "nvcc_launches"), "--launches", "2", "--wait-for-file", str(go)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **on_stand_in()},
    )
    try:
        assert "waiting for" in proc.stderr.readline()
        assert proc.poll() is None
        go.touch()
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert json.loads(out)["return_codes"]["launch"] == {"0": 2}
