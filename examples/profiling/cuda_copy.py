"""Copies and synchronizes from two Python call sites, through a CUDA runtime library (ctypes):
the code the AI flame graphs put under them.

    python cuda_copy.py LIBCUDART PHASE_SECONDS

1. spins PHASE_SECONDS on the CPU (the profiler learns this is a Python process);
2. copy_batch() copies 1 MiB host to device 8 times (cudaMemcpy);
3. wait_step() synchronizes the device 12 times (cudaDeviceSynchronize);
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
    time.sleep(phase)
    print(json.dumps({"copies": 8, "bytes": 8 * MIB, "syncs": 12}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
