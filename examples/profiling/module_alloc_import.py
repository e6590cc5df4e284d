"""Imported by module_alloc.py: its top level spins and allocates device memory through the
library module_alloc.py loaded (see there). Its code object is freed once the import is
done: the profile names its frames, lines included, from what the kernel copied."""

import ctypes
import sys
import time

_main = sys.modules["__main__"]
_end = time.monotonic() + _main.seconds
while time.monotonic() < _end:
    _total = sum(i * i for i in range(1000))  # HOT: import_spin

allocated = 0
for _ in range(2):
    _ptr = ctypes.c_void_p()
    if _main.lib.cudaMalloc(ctypes.byref(_ptr), ctypes.c_size_t(1 << 20)) != 0:  # SITE: import_alloc
        raise SystemExit("cudaMalloc failed")
    allocated += 1 << 20
