"""Name OS threads after their job (``top -H``, /proc/PID/task/*/comm).

Python's threading names are invisible to the OS; the benchmarks measure the
drain thread's CPU by this name.
"""

from __future__ import annotations

import ctypes
import ctypes.util

_PR_SET_NAME = 15
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def name_os_thread(name: str) -> None:
    """Set the calling thread's kernel name (truncated to 15 bytes)."""
    _libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
