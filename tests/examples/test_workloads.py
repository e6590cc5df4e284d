"""The CUDA workloads and stand-in libraries do what their JSON summaries say (no BPF here).

Agent tests compare what the agent observed with these summaries, so the summaries must be
exact: every count below follows from the options given. The stand-in libraries are checked
in-process through ctypes, each test loading its own copy so that state (cuInit, the kernel
time read at load) starts fresh.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import cxxfilt
import pytest
from elftools.elf.elffile import ELFFile

pytestmark = pytest.mark.usefixtures("built")

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build"
WORKLOAD = BUILD / "examples" / "cuda_workload"
FAKE_CUDART = BUILD / "examples" / "fakecudart" / "libcudart.so.12"
FAKE_CUDART13 = BUILD / "examples" / "fakecudart13" / "libcudart.so.13"
FAKE_CUDA = BUILD / "examples" / "fakecuda" / "libcuda.so.1"
LAUNCH_LOOP = BUILD / "bench" / "launch_loop"
NOPFUNC = BUILD / "bench" / "libnopfunc.so"
REAL_CUDART_PY = ROOT / "examples" / "cuda" / "real_cudart.py"

KERNEL_NAMES = [
    "vector_add(float*, float*, float*, int)",
    "ml::softmax_forward(float*, float const*, int)",
    "void at::native::elementwise_kernel<128, 4>(int, float*)",
]
RUNTIME_CALLS = [
    "cudaMalloc",
    "cudaFree",
    "cudaMemcpy",
    "cudaMemcpyAsync",
    "cudaMemcpyAsync_ptsz",
    "cudaStreamSynchronize",
    "cudaStreamSynchronize_ptsz",
    "cudaDeviceSynchronize",
    "cudaLaunchKernel",
    "cudaLaunchKernel_ptsz",
    "cudaLaunchKernelExC",
    "cudaGraphLaunch",
    "cudaGetLastError",
]
ENDBR64 = bytes.fromhex("f30f1efa")


class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


@pytest.fixture(scope="session")
def real_cudart() -> Path:
    import nvidia.cuda_runtime

    return Path(list(nvidia.cuda_runtime.__path__)[0]) / "lib" / "libcudart.so.12"


def run_workload(*args: object, env: dict[str, str] | None = None) -> dict:
    result = subprocess.run(
        [str(WORKLOAD), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def nonzero(counts: dict[str, int]) -> dict[str, int]:
    return {name: n for name, n in counts.items() if n}


def fresh_copy(lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch | None = None) -> ctypes.CDLL:
    """Load a private copy of lib, so this test sees the library's state from its start.

    A runtime gets a private copy of the driver too (FAKECUDA_DRIVER, read at its first call):
    the driver holds the state (memory, stream time) and is loaded once per process.
    """
    copy = tmp_path / lib.name
    shutil.copy(lib, copy)
    if monkeypatch is not None:
        driver = tmp_path / "driver" / FAKE_CUDA.name
        driver.parent.mkdir(exist_ok=True)
        shutil.copy(FAKE_CUDA, driver)
        monkeypatch.setenv("FAKECUDA_DRIVER", str(driver))
    return ctypes.CDLL(str(copy))


def runtime(lib: ctypes.CDLL) -> ctypes.CDLL:
    vp, size, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    lib.cudaMalloc.argtypes = [ctypes.POINTER(vp), size]
    lib.cudaFree.argtypes = [vp]
    lib.cudaMemcpy.argtypes = [vp, vp, size, i]
    lib.cudaLaunchKernel.argtypes = [vp, Dim3, Dim3, ctypes.POINTER(vp), size, vp]
    lib.cudaStreamSynchronize.argtypes = [vp]
    lib.cudaGetErrorString.argtypes, lib.cudaGetErrorString.restype = [i], ctypes.c_char_p
    return lib


def first_bytes(lib: Path, count: int = 5) -> dict[str, bytes]:
    """The first bytes of every function the library exports, read from the file."""
    with lib.open("rb") as f:
        elf = ELFFile(f)
        text = elf.get_section_by_name(".text")
        data = text.data()
        return {
            sym.name: data[sym["st_value"] - text["sh_addr"] :][:count]
            for sym in elf.get_section_by_name(".dynsym").iter_symbols()
            if sym["st_info"]["type"] == "STT_FUNC" and sym["st_shndx"] != "SHN_UNDEF"
        }


# ---- cuda_workload on the stand-in libraries


def test_sequence_counts_follow_the_options() -> None:
    s = run_workload(
        "--lib",
        FAKE_CUDART,
        "--iterations",
        4,
        "--launches-per-iter",
        5,
        "--alloc-bytes",
        8192,
        "--h2d-bytes",
        8192,
        "--d2h-bytes",
        1024,
        "--graph-launches",
        1,
    )
    assert nonzero(s["calls"]) == {
        "cudaMalloc": 4,
        "cudaMemcpy": 8,
        "cudaLaunchKernel": 20,
        "cudaGraphLaunch": 4,
        "cudaDeviceSynchronize": 4,
        "cudaFree": 4,
        "cudaGetLastError": 1,
    }
    assert all(codes == {"0": s["calls"][name]} for name, codes in s["return_codes"].items() if codes)
    assert s["memcpy"] == {"h2d": {"calls": 4, "bytes": 4 * 8192}, "d2h": {"calls": 4, "bytes": 4 * 1024}}
    assert s["roundtrip"] == {"checked": 4, "mismatched": 0}, "the fake cudaMemcpy must really copy"
    assert [k["launches"] for k in s["kernels"]] == [8, 8, 4]
    assert s["tids"] == [s["pid"]] and s["exited_midway"] is None and s["error_strings"] == {}


def test_kernels_are_mangled_host_stubs_in_the_binary() -> None:
    s = run_workload("--lib", FAKE_CUDART, "--iterations", 1)
    assert [k["name"] for k in s["kernels"]] == KERNEL_NAMES
    symbols = subprocess.run(["nm", str(WORKLOAD)], capture_output=True, text=True, check=True).stdout.split()
    for k in s["kernels"]:
        assert cxxfilt.demangle(k["symbol"]) == k["name"]
        assert k["symbol"] in symbols
    # 1 MiB of floats is 262144 elements; softmax_forward takes 512 per block on a 4-high grid
    assert s["kernels"][1]["grid"] == [512, 4, 1] and s["kernels"][1]["shared_mem"] == 1024


def test_async_ptsz_uses_only_the_ptsz_variants() -> None:
    s = run_workload("--lib", FAKE_CUDART, "--iterations", 3, "--launches-per-iter", 2, "--async", "--ptsz")
    assert nonzero(s["calls"]) == {
        "cudaMalloc": 3,
        "cudaMemcpyAsync_ptsz": 6,
        "cudaLaunchKernel_ptsz": 6,
        "cudaStreamSynchronize_ptsz": 3,
        "cudaDeviceSynchronize": 3,
        "cudaFree": 3,
        "cudaGetLastError": 1,
    }
    assert s["streams"] == ["0x5eed0001"] and s["roundtrip"]["mismatched"] == 0


def test_launch_ex_with_driver_library() -> None:
    s = run_workload(
        "--lib", FAKE_CUDART, "--driver-lib", FAKE_CUDA, "--iterations", 2, "--launches-per-iter", 3, "--launch-ex"
    )
    calls = nonzero(s["calls"])
    assert calls["cudaLaunchKernelExC"] == 6 and "cudaLaunchKernel" not in calls
    assert {k: calls[k] for k in calls if k.startswith("cu") and not k.startswith("cuda")} == {
        "cuInit": 1,
        "cuModuleGetFunction": 2,
        "cuMemAlloc_v2": 2,
        "cuLaunchKernelEx": 6,
        "cuMemFree_v2": 2,
    }
    handles = [k["handle"] for k in s["driver_kernels"]]
    assert len(set(handles)) == 2 and "0x0" not in handles
    assert [k["launches"] for k in s["driver_kernels"]] == [4, 2]
    assert all(set(codes) <= {"0"} for codes in s["return_codes"].values())


def test_threads_run_the_whole_sequence_each() -> None:
    s = run_workload("--lib", FAKE_CUDART, "--iterations", 2, "--launches-per-iter", 4, "--threads", 3, "--async")
    assert len(set(s["tids"])) == 3 and s["tids"][0] == s["pid"]
    assert s["streams"] == ["0x5eed0001", "0x5eed0002", "0x5eed0003"]
    assert s["calls"]["cudaLaunchKernel"] == 24 and s["calls"]["cudaStreamSynchronize"] == 6
    assert s["roundtrip"] == {"checked": 6, "mismatched": 0}


def test_leak_keeps_buffers_allocated() -> None:
    s = run_workload(
        "--lib",
        FAKE_CUDART,
        "--iterations",
        2,
        "--leak",
        3,
        "--alloc-bytes",
        4096,
        "--h2d-bytes",
        4096,
        "--d2h-bytes",
        4096,
    )
    assert len(set(s["leaked"])) == 3 and "0x0" not in s["leaked"]
    assert s["calls"]["cudaMalloc"] == 5 and s["calls"]["cudaFree"] == 2


def test_exit_midway_leaves_a_sync_in_flight() -> None:
    # Each fake kernel takes 1 s: the helper's 2 queued kernels keep it inside
    # cudaStreamSynchronize for 2 s, and the process must be gone long before that.
    start = time.monotonic()
    s = run_workload("--lib", FAKE_CUDART, "--iterations", 1, "--exit-midway", env={"FAKECUDA_KERNEL_US": "1000000"})
    assert time.monotonic() - start < 1.5
    midway = s["exited_midway"]
    assert midway["iteration"] == 0 and midway["unfreed"] != "0x0" and midway["helper_launches"] == 2
    assert midway["helper_tid"] not in (0, s["pid"])
    assert s["calls"]["cudaStreamSynchronize"] == 1 and s["return_codes"]["cudaStreamSynchronize"] == {}
    assert s["calls"]["cudaMalloc"] == 1 and s["calls"]["cudaFree"] == 0 and s["calls"]["cudaMemcpy"] == 1


def test_delays_and_wait_for_file_order_the_library_load(tmp_path: Path) -> None:
    go = tmp_path / "go"
    proc = subprocess.Popen(
        [
            str(WORKLOAD),
            "--lib",
            str(FAKE_CUDART),
            "--iterations",
            "1",
            "--delay-before-dlopen-ms",
            "300",
            "--wait-for-file",
            str(go),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(0.1)
        assert str(FAKE_CUDART) not in Path(f"/proc/{proc.pid}/maps").read_text()
        assert "waiting for" in proc.stderr.readline()
        assert str(FAKE_CUDART) in Path(f"/proc/{proc.pid}/maps").read_text()
        time.sleep(0.1)
        assert proc.poll() is None, "must not start its calls before the file exists"
        go.touch()
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err
    assert json.loads(out)["calls"]["cudaMalloc"] == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "--lib PATH is required"),
        (["--lib", "/nonexistent/libcudart.so.12"], "cannot load --lib /nonexistent/libcudart.so.12"),
        (["--lib", str(FAKE_CUDART), "--iterations", "x"], "--iterations wants a whole number, got 'x'"),
        (["--lib", str(FAKE_CUDART), "--alloc-bytes", "10", "--h2d-bytes", "20"], "must not exceed --alloc-bytes"),
        (["--lib", str(FAKE_CUDART), "--ptsz", "--launch-ex"], "--launch-ex has no _ptsz variant"),
        (["--lib", str(FAKE_CUDA)], "does not export cudaMalloc; is it a CUDA runtime library?"),
    ],
)
def test_workload_explains_bad_invocations(args: list[str], message: str) -> None:
    result = subprocess.run([str(WORKLOAD), *args], capture_output=True, text=True, timeout=30)
    assert result.returncode != 0 and message in result.stderr


# ---- the real libcudart.so.12 (no GPU: every call fails with 35)


def test_workload_on_real_libcudart_sees_error_35(real_cudart: Path) -> None:
    s = run_workload(
        "--lib", real_cudart, "--iterations", 2, "--launches-per-iter", 3, "--async", "--graph-launches", 1, "--leak", 1
    )
    for name in RUNTIME_CALLS:
        if s["calls"][name]:
            assert s["return_codes"][name] == {"35": s["calls"][name]}, name
    assert s["calls"]["cudaLaunchKernel"] == 6 and s["roundtrip"]["checked"] == 0
    assert s["error_strings"] == {"35": "CUDA driver version is insufficient for CUDA runtime version"}


def test_real_cudart_py_gets_35_everywhere(real_cudart: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(REAL_CUDART_PY), "--iterations", "3", "--bytes", "4096"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    s = json.loads(result.stdout)
    assert Path(s["lib"]) == real_cudart
    assert s["calls"] == dict.fromkeys(
        ["cudaMalloc", "cudaMemcpy", "cudaLaunchKernel", "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaFree"],
        3,
    )
    assert all(codes == {"35": 3} for codes in s["return_codes"].values())
    assert s["memcpy"]["h2d"] == {"calls": 3, "bytes": 3 * 4096} and s["kernel_func"]["symbol"] == "abs"


def test_real_cudart_py_on_the_stand_in_succeeds() -> None:
    result = subprocess.run(
        [sys.executable, str(REAL_CUDART_PY), "--lib", str(FAKE_CUDART), "--iterations", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert all(codes == {"0": 2} for codes in json.loads(result.stdout)["return_codes"].values())


# ---- the stand-in libraries themselves


def test_fake_runtime_memory_and_copies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = runtime(fresh_copy(FAKE_CUDART, tmp_path, monkeypatch))
    dev, other = ctypes.c_void_p(), ctypes.c_void_p()
    assert cuda.cudaMalloc(ctypes.byref(dev), 0) == 2
    assert cuda.cudaMalloc(ctypes.byref(dev), (1 << 30) + 1) == 2
    assert cuda.cudaGetLastError() == 2 and cuda.cudaGetLastError() == 0
    assert cuda.cudaMalloc(ctypes.byref(dev), 4096) == 0 and cuda.cudaMalloc(ctypes.byref(other), 4096) == 0
    src = ctypes.create_string_buffer(bytes(range(256)) * 16, 4096)
    dst = ctypes.create_string_buffer(4096)
    assert cuda.cudaMemcpy(dev, src, 4096, 1) == 0
    assert cuda.cudaMemcpy(other, dev, 4096, 3) == 0
    assert cuda.cudaMemcpy(dst, other, 4096, 2) == 0
    assert dst.raw == src.raw
    assert cuda.cudaMemcpy(dst, other, 4096, 5) == 1, "kind > 4 is invalid"
    assert cuda.cudaMemcpy(dst, src, 16, 1) == 1, "H2D needs a device destination"
    assert cuda.cudaMemcpy(dev, src, 4097, 1) == 1, "a copy must fit its allocation"
    assert cuda.cudaFree(dev) == 0 and cuda.cudaFree(dev) == 1 and cuda.cudaFree(ctypes.c_void_p(0x1234)) == 1
    assert cuda.cudaFree(None) == 0
    assert cuda.cudaGetErrorString(35) == b"CUDA driver version is insufficient for CUDA runtime version"


def test_fake_runtime_launch_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = runtime(fresh_copy(FAKE_CUDART, tmp_path, monkeypatch))
    func = ctypes.cast(ctypes.CDLL("libc.so.6").abs, ctypes.c_void_p)
    ok = Dim3(1, 1, 1), Dim3(256, 1, 1)
    assert cuda.cudaLaunchKernel(func, *ok, None, 0, None) == 0
    assert cuda.cudaLaunchKernel(None, *ok, None, 0, None) == 98
    assert cuda.cudaLaunchKernel(func, Dim3(1, 1, 1), Dim3(1025, 1, 1), None, 0, None) == 9
    assert cuda.cudaLaunchKernel(func, Dim3(0, 1, 1), Dim3(1, 1, 1), None, 0, None) == 9
    assert cuda.cudaGetLastError() == 9 and cuda.cudaGetLastError() == 0
    assert cuda.cudaGraphLaunch(None, None) == 1


def test_fake_sync_waits_for_the_kernels_queued_on_that_stream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKECUDA_KERNEL_US", "20000")  # read when the driver's copy loads
    cuda = runtime(fresh_copy(FAKE_CUDART, tmp_path, monkeypatch))
    func = ctypes.cast(ctypes.CDLL("libc.so.6").abs, ctypes.c_void_p)
    busy, idle = ctypes.c_void_p(0x5EED0001), ctypes.c_void_p(0x5EED0002)

    def timed(fn, *args) -> float:
        start = time.monotonic()
        assert fn(*args) == 0
        return time.monotonic() - start

    for _ in range(10):
        assert cuda.cudaLaunchKernel(func, Dim3(1, 1, 1), Dim3(32, 1, 1), None, 0, busy) == 0
    assert timed(cuda.cudaStreamSynchronize, idle) < 0.1, "another stream's work must not hold it up"
    assert timed(cuda.cudaStreamSynchronize, busy) >= 0.15  # 200 ms queued, some already spent
    assert timed(cuda.cudaStreamSynchronize, busy) < 0.1, "nothing is left to wait for"
    for _ in range(4):
        cuda.cudaLaunchKernel(func, Dim3(1, 1, 1), Dim3(32, 1, 1), None, 0, idle)
    assert timed(cuda.cudaDeviceSynchronize) >= 0.07


def test_fake_driver(tmp_path: Path) -> None:
    cu = fresh_copy(FAKE_CUDA, tmp_path)
    vp = ctypes.c_void_p
    cu.cuModuleGetFunction.argtypes = [ctypes.POINTER(vp), vp, ctypes.c_char_p]
    cu.cuMemFree_v2.argtypes = [ctypes.c_ulonglong]
    cu.cuLaunchKernel.argtypes = [vp] + [ctypes.c_uint] * 7 + [vp, ctypes.POINTER(vp), ctypes.POINTER(vp)]
    f, g, h = vp(), vp(), vp()
    assert cu.cuModuleGetFunction(ctypes.byref(f), None, b"k") == 3, "nothing works before cuInit"
    assert cu.cuInit(1) == 1 and cu.cuInit(0) == 0
    assert cu.cuModuleGetFunction(ctypes.byref(f), None, b"triton_k") == 0
    assert cu.cuModuleGetFunction(ctypes.byref(g), None, b"triton_k") == 0
    assert cu.cuModuleGetFunction(ctypes.byref(h), None, b"other_k") == 0
    assert f.value == g.value != h.value
    dptr = ctypes.c_ulonglong()
    assert cu.cuMemAlloc_v2(ctypes.byref(dptr), ctypes.c_size_t(0)) == 1
    assert cu.cuMemAlloc_v2(ctypes.byref(dptr), ctypes.c_size_t(1 << 20)) == 0 and dptr.value
    params = (vp * 1)(ctypes.addressof(dptr))
    assert cu.cuLaunchKernel(f, 8, 1, 1, 128, 1, 1, 0, None, params, None) == 0
    assert cu.cuLaunchKernel(None, 8, 1, 1, 128, 1, 1, 0, None, params, None) == 1
    assert cu.cuLaunchKernel(f, 8, 1, 1, 128, 1, 1, 0, None, params, params) == 1, "params and extra exclude each other"
    assert cu.cuMemFree_v2(dptr.value) == 0 and cu.cuMemFree_v2(dptr.value) == 1


def test_fake_libraries_look_like_nvidias() -> None:
    dyn = subprocess.run(
        ["nm", "-D", "--defined-only", str(FAKE_CUDART)], capture_output=True, text=True, check=True
    ).stdout
    assert "cudaLaunchKernel@@libcudart.so.12" in dyn, "same symbol version as the real library"
    assert "devmem_alloc" not in dyn
    soname = subprocess.run(["readelf", "-d", str(FAKE_CUDA)], capture_output=True, text=True, check=True).stdout
    assert "[libcuda.so.1]" in soname


def test_first_instructions_are_as_documented() -> None:
    # GCC gives leaf functions no frame (examples/cuda/README.md lists them)
    leaf_functions = {
        "cudaGetErrorString",
        "__cudaRegisterFatBinaryEnd",
        "__cudaInitModule",
        "__cudaRegisterVar",
        "__cudaRegisterManagedVar",
        "cuInit",
        "cuDriverGetVersion",
        "cuMemGetAllocationGranularity",
        "fakecuda_calls",
    }
    for lib in (FAKE_CUDART, FAKE_CUDART13, FAKE_CUDA):
        for name, code in first_bytes(lib).items():
            assert code[:4] == ENDBR64, name
            assert (code[4] == 0x55) == (name not in leaf_functions), name
    nops = first_bytes(NOPFUNC, 6)
    assert nops["nop5_func"].startswith(bytes.fromhex("0f1f440000"))
    assert nops["endbr_push_func"].startswith(ENDBR64 + b"\x55")
    assert nops["push_func"].startswith(b"\x55")
    assert nops["nop1_func"].startswith(b"\x90")
    assert nops["mov_func"].startswith(b"\xb8")


# ---- benchmark driver and build


def test_launch_loop_modes() -> None:
    loop = subprocess.run(
        [str(LAUNCH_LOOP), "--lib", str(FAKE_CUDART), "--calls", "20000", "--runs", "3"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    s = json.loads(loop.stdout)
    assert s["return_code"] == 0 and len(s["ns_per_call"]) == 3 and s["median_ns_per_call"] > 0
    rate = subprocess.run(
        [str(LAUNCH_LOOP), "--lib", str(NOPFUNC), "--func", "nop5_func", "--rate", "20000", "--seconds", "0.3"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    r = json.loads(rate.stdout)
    assert r["mode"] == "rate" and r["calls"] == pytest.approx(6000, rel=0.05)


def test_build_is_idempotent() -> None:
    before = {p: p.stat().st_mtime_ns for p in (WORKLOAD, FAKE_CUDART, FAKE_CUDA, LAUNCH_LOOP, NOPFUNC)}
    result = subprocess.run([str(ROOT / "examples" / "build.sh")], capture_output=True, text=True, check=True)
    assert result.stdout == ""
    assert before == {p: p.stat().st_mtime_ns for p in before}
