"""Module-level code that spins on the CPU and allocates device memory: a script's top level,
a module's import-time code (module_alloc_import.py), and code made by compile() and run
with exec(), each freed after it ran. Their frames are `<module>` frames of code objects
that run once and are gone: the profiler names them by what it copied at the sample.

    python module_alloc.py LIBCUDART SECONDS

1. spins SECONDS at the script's top level (the profiler learns this is a Python process);
2. imports module_alloc_import, whose top level spins SECONDS and allocates 2 x 1 MiB;
3. allocates 4 MiB at the script's top level;
4. compiles and runs GENERATED sources in turn (each a file name of its own, its top level
   one line lower than the last's; the allocator hands each the freed one's address), each
   spinning SECONDS and allocating 512 KiB;
5. holds everything SECONDS and exits (nothing is freed).
tests/test_profiling.py checks the lines marked HOT and SITE below and in the module.
Prints one JSON line with what it did.
"""

import ctypes
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
GENERATED = 3
TEMPLATE = """import time
_end = time.monotonic() + seconds
while time.monotonic() < _end:
    _total = sum(i * i for i in range(1000))
malloc(512 << 10)
"""
GENERATED_SPIN_LINE, GENERATED_ALLOC_LINE = 4, 5  # in TEMPLATE: + n for generated source n

sys.path.insert(0, HERE)
lib = ctypes.CDLL(sys.argv[1])
lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
seconds = float(sys.argv[2])
allocated = 0


def malloc(size):
    global allocated
    ptr = ctypes.c_void_p()
    if lib.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(size)) != 0:
        raise SystemExit("cudaMalloc failed")
    allocated += size


end = time.monotonic() + seconds
while time.monotonic() < end:
    total = sum(i * i for i in range(1000))  # HOT: script_spin

import module_alloc_import  # noqa: E402 I001  # SITE: script_import

ptr = ctypes.c_void_p()
rc = lib.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(4 << 20))  # SITE: script_alloc
if rc != 0:
    raise SystemExit(f"cudaMalloc returned {rc}")
allocated += 4 << 20

for n in range(GENERATED):
    code = compile("\n" * n + TEMPLATE, os.path.join(HERE, f"generated_{n}.py"), "exec")
    exec(code, {"seconds": seconds, "malloc": malloc})  # SITE: script_exec
    del code

time.sleep(seconds)
print(json.dumps({"allocated": allocated, "imported": module_alloc_import.allocated}), flush=True)
