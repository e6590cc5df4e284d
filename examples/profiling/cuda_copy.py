"""Copies, synchronizes and launches from three Python call sites, through a CUDA runtime
library (ctypes): the code the AI flame graphs put under them.

    python cuda_copy.py LIBCUDART PHASE_SECONDS

1. spins PHASE_SECONDS on the CPU (the profiler learns this is a Python process);
2. copy_batch() copies 1 MiB host to device 8 times (cudaMemcpy);
3. wait_step() synchronizes the device 12 times (cudaDeviceSynchronize);
4. run_layers() launches one kernel (libc's ``abs`` stands in for its host stub) 640 times
   (cudaLaunchKernel: 10 x the profiler's default launch_stack_every);
then holds PHASE_SECONDS and exits. Prints one JSON line with what it did.
"""

import ctypes
import json
import sys
import time

MIB = 1 << 20
HOST_TO_DEVICE = 1


def spin(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(i * i for i in range(10_000))


def copy_batch(lib, dst, src, n):
    for _ in range(n):
        if lib.cudaMemcpy(dst, src, ctypes.c_size_t(MIB), HOST_TO_DEVICE) != 0:  # SITE: copy
            raise SystemExit("cudaMemcpy failed")


def wait_step(lib, n):
    for _ in range(n):
        if lib.cudaDeviceSynchronize() != 0:  # SITE: sync
            raise SystemExit("cudaDeviceSynchronize failed")


class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


def run_layers(lib, kernel, n):
    one, block = Dim3(1, 1, 1), Dim3(32, 1, 1)
    for _ in range(n):
        if lib.cudaLaunchKernel(kernel, one, block, None, 0, None) != 0:  # SITE: launch
            raise SystemExit("cudaLaunchKernel failed")


def main(path, phase):
    lib = ctypes.CDLL(path)
    lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    spin(phase)
    dst = ctypes.c_void_p()
    if lib.cudaMalloc(ctypes.byref(dst), ctypes.c_size_t(MIB)) != 0:
        raise SystemExit("cudaMalloc failed")
    src = ctypes.create_string_buffer(MIB)
    copy_batch(lib, dst, src, 8)
    wait_step(lib, 12)
    lib.cudaLaunchKernel.argtypes = [ctypes.c_void_p, Dim3, Dim3, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    run_layers(lib, ctypes.cast(ctypes.CDLL(None).abs, ctypes.c_void_p), 640)
    time.sleep(phase)
    print(json.dumps({"copies": 8, "bytes": 8 * MIB, "syncs": 12, "launches": 640}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
