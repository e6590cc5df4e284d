"""Drive NVIDIA's real CUDA runtime from Python with ctypes, as a framework would.

Loads the genuine libcudart.so.12 shipped in the PyPI wheel nvidia-cuda-runtime-cu12 (or the
library given with --lib) and runs, per iteration: cudaMalloc, cudaMemcpy host-to-device,
cudaLaunchKernel, cudaStreamSynchronize, cudaDeviceSynchronize, cudaFree. On a machine with no
GPU every call returns 35 (cudaErrorInsufficientDriver), yet each one really enters the real
library with real arguments, which is what the agent's uprobes need to see. Prints a JSON
summary of the calls and their return codes on stdout.

The kernel passed to cudaLaunchKernel is the address of libc's `abs`: a real function in a
real ELF file, so an agent that symbolises the `func` argument has something to find.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

CUDA_MEMCPY_HOST_TO_DEVICE = 1


class Dim3(ctypes.Structure):
    """CUDA's dim3, passed by value in two registers under the x86-64 SysV ABI."""

    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


def wheel_libcudart() -> Path:
    """Path of libcudart.so.12 inside the installed nvidia-cuda-runtime-cu12 wheel."""
    spec = importlib.util.find_spec("nvidia.cuda_runtime")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "real_cudart: the nvidia-cuda-runtime-cu12 wheel is not installed in this Python "
            "(pip install nvidia-cuda-runtime-cu12), or pass --lib PATH"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "lib" / "libcudart.so.12"
        if candidate.exists():
            return candidate
    raise SystemExit("real_cudart: nvidia-cuda-runtime-cu12 has no lib/libcudart.so.12; reinstall it or pass --lib PATH")


def load_runtime(path: Path) -> ctypes.CDLL:
    """Open the library and declare the C signatures of the calls made, so ctypes passes them exactly."""
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise SystemExit(f"real_cudart: cannot load --lib {path}: {exc}") from exc
    c_void_p, c_size_t, c_int = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    signatures = {
        "cudaMalloc": [ctypes.POINTER(c_void_p), c_size_t],
        "cudaMemcpy": [c_void_p, c_void_p, c_size_t, c_int],
        "cudaLaunchKernel": [c_void_p, Dim3, Dim3, ctypes.POINTER(c_void_p), c_size_t, c_void_p],
        "cudaStreamSynchronize": [c_void_p],
        "cudaDeviceSynchronize": [],
        "cudaFree": [c_void_p],
    }
    for name, argtypes in signatures.items():
        try:
            fn = getattr(lib, name)
        except AttributeError as exc:
            raise SystemExit(f"real_cudart: {path} does not export {name}; is it a CUDA runtime library?") from exc
        fn.argtypes, fn.restype = argtypes, c_int
    lib.cudaGetErrorString.argtypes, lib.cudaGetErrorString.restype = [c_int], ctypes.c_char_p
    return lib


def kernel_address() -> tuple[int, str]:
    """Address of libc's `abs`, used as the kernel's host-stub address, and the symbol's name."""
    libc = ctypes.CDLL("libc.so.6")
    return ctypes.cast(libc.abs, ctypes.c_void_p).value, "abs"


def run(lib: ctypes.CDLL, iterations: int, nbytes: int) -> dict:
    """Make the calls and return what was called, with which sizes, and what came back."""
    calls: Counter[str] = Counter()
    codes: dict[str, Counter[int]] = defaultdict(Counter)

    def call(name: str, *args: object) -> int:
        calls[name] += 1
        rc = getattr(lib, name)(*args)
        codes[name][rc] += 1
        return rc

    func, func_symbol = kernel_address()
    host = (ctypes.c_ubyte * nbytes).from_buffer_copy((bytes(range(256)) * (nbytes // 256 + 1))[:nbytes])
    n = ctypes.c_int(nbytes // 4)
    for _ in range(iterations):
        dev = ctypes.c_void_p()
        call("cudaMalloc", ctypes.byref(dev), nbytes)
        call("cudaMemcpy", dev, host, nbytes, CUDA_MEMCPY_HOST_TO_DEVICE)
        args = (ctypes.c_void_p * 2)(ctypes.addressof(dev), ctypes.addressof(n))
        call("cudaLaunchKernel", func, Dim3(max(1, n.value // 256), 1, 1), Dim3(256, 1, 1), args, 0, None)
        call("cudaStreamSynchronize", None)
        call("cudaDeviceSynchronize")
        call("cudaFree", dev)
    failures = sorted({rc for counter in codes.values() for rc in counter if rc != 0})
    return {
        "workload": "real_cudart",
        "pid": os.getpid(),
        "tid": threading.get_native_id(),
        "iterations": iterations,
        "bytes": nbytes,
        "kernel_func": {"symbol": func_symbol, "library": "libc.so.6", "address": hex(func)},
        "calls": dict(calls),
        "return_codes": {name: {str(rc): count for rc, count in counter.items()} for name, counter in codes.items()},
        "memcpy": {"h2d": {"calls": calls["cudaMemcpy"], "bytes": calls["cudaMemcpy"] * nbytes}},
        "error_strings": {str(rc): lib.cudaGetErrorString(rc).decode() for rc in failures},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lib", type=Path, help="CUDA runtime to load (default: libcudart.so.12 from the wheel)")
    parser.add_argument("--iterations", type=int, default=10, help="iterations of the call sequence (default 10)")
    parser.add_argument("--bytes", type=int, default=1 << 20, help="bytes to allocate and copy (default 1048576)")
    parser.add_argument("--wait-for-file", type=Path, help="after loading the library, wait until this file exists")
    args = parser.parse_args(argv)
    if args.iterations < 0 or args.bytes < 1:
        parser.error("--iterations must be >= 0 and --bytes >= 1")
    path = args.lib or wheel_libcudart()
    lib = load_runtime(path)
    if args.wait_for_file:
        print(f"real_cudart: pid {os.getpid()} waiting for {args.wait_for_file}", file=sys.stderr, flush=True)
        while not args.wait_for_file.exists():
            time.sleep(0.001)
    summary = run(lib, args.iterations, args.bytes)
    summary["lib"] = str(path)
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
