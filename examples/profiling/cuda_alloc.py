"""Device allocations from two Python call sites, through a CUDA runtime library (ctypes).

    python cuda_alloc.py LIBCUDART PHASE_SECONDS [BURST]

1. spins PHASE_SECONDS on the CPU (the profiler learns this is a Python process);
2. alloc_weights() allocates 3 x 1 MiB, alloc_activations() 2 x 2 MiB; holds them
   PHASE_SECONDS;
3. frees the three 1 MiB blocks; holds the rest PHASE_SECONDS; exits (the rest is leaked).
With BURST, instead: after the spin, burst() allocates BURST x 4 KiB back to back, frees the
first 40% of them, holds the rest PHASE_SECONDS and exits.
Prints one JSON line with what it did.
"""

import ctypes
import json
import sys
import time

MIB = 1 << 20


def spin(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(i * i for i in range(10_000))


def malloc(lib, size):
    ptr = ctypes.c_void_p()
    rc = lib.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(size))
    if rc != 0:
        raise SystemExit(f"cudaMalloc returned {rc}")
    return ptr.value


def alloc_weights(lib):
    return [malloc(lib, MIB) for _ in range(3)]  # SITE: weights


def alloc_activations(lib):
    return [malloc(lib, 2 * MIB) for _ in range(2)]  # SITE: activations


def burst(lib, count):
    return [malloc(lib, 4096) for _ in range(count)]  # SITE: burst


def main(path, phase, count=0):
    lib = ctypes.CDLL(path)
    lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    lib.cudaFree.argtypes = [ctypes.c_void_p]
    spin(phase)
    if count:
        blocks = burst(lib, count)
        freed = count * 4 // 10
        for p in blocks[:freed]:
            lib.cudaFree(ctypes.c_void_p(p))
        time.sleep(phase)
        print(json.dumps({"allocated": count, "freed": freed}), flush=True)
        return
    weights = alloc_weights(lib)
    activations = alloc_activations(lib)
    time.sleep(phase)
    for p in weights:
        lib.cudaFree(ctypes.c_void_p(p))
    time.sleep(phase)
    print(json.dumps({"weights": len(weights), "activations": len(activations)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 0)
