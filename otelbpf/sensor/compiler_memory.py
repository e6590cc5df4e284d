"""Give back the memory the BPF compile used, once the program is loaded.

BCC compiles with clang and LLVM in this process: ~60 MiB of the agent's resident memory
after start-up is theirs, and none of it is used again (probes attach by name and
address; a tail call loaded later is already compiled). Three parts:

- the heap LLVM freed, which glibc keeps mapped: ``malloc_trim(0)`` returns the free pages
  of every arena (~26 MiB here);
- ``BPF.free_bcc_memory()``: BCC's own helper drops the text pages of libbcc (which embeds
  LLVM when built statically, as upstream does);
- Debian's libbcc links LLVM and clang as shared libraries instead, so their code pages
  (~80 MiB of libLLVM and libclang-cpp touched by one compile) are dropped here the same
  way: ``madvise(MADV_DONTNEED)`` on their read-only file mappings. The kernel reads a page
  again from the file if it is ever run again; only mappings with no anonymous (private,
  written) pages are touched, so relocated data is never discarded.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import re
from typing import Any

log = logging.getLogger(__name__)

#: Libraries only the compile uses (file basenames).
_COMPILER_LIBS = re.compile(r"lib(LLVM|clang-cpp|clang)[-.]")
_MADV_DONTNEED = 4
_MAPPING = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) \S+ \S+ \S+\s+(.*)$")


def release(bpf: Any) -> int:
    """Give back what the compile left resident. Returns the bytes of compiler code
    pages dropped (the heap part is not measurable from here)."""
    try:
        bpf.free_bcc_memory()
    except Exception as exc:  # an older BCC without it: the rest still helps
        log.debug("free_bcc_memory: %s", exc)
    dropped = drop_code_pages(_COMPILER_LIBS)
    trim_heap()
    return dropped


def trim_heap() -> None:
    """glibc's ``malloc_trim(0)``: free pages of every arena back to the kernel."""
    name = ctypes.util.find_library("c")
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError) as exc:  # not glibc (musl has no malloc_trim)
        log.debug("malloc_trim: %s", exc)


def drop_code_pages(libs: re.Pattern[str], smaps: str = "/proc/self/smaps") -> int:
    """``MADV_DONTNEED`` on every read-only file mapping of a library matching ``libs``
    that holds no anonymous page; returns the resident bytes those mappings had."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    dropped = 0
    for start, end, rss, anon in _candidates(libs, smaps):
        if anon or not rss:
            continue
        if libc.madvise(start, end - start, _MADV_DONTNEED) != 0:
            log.debug("madvise %#x-%#x: %s", start, end, os.strerror(ctypes.get_errno()))
            continue
        dropped += rss
    return dropped


def _candidates(libs: re.Pattern[str], smaps: str) -> list[tuple[int, int, int, int]]:
    """(start, end, resident bytes, anonymous bytes) of the read-only mappings of ``libs``."""
    out: list[tuple[int, int, int, int]] = []
    current: list[int] | None = None
    with open(smaps) as f:
        for line in f:
            m = _MAPPING.match(line)
            if m is not None:
                perms, path = m.group(3), m.group(4)
                wanted = "w" not in perms and perms[3] == "p" and libs.search(os.path.basename(path))
                current = [int(m.group(1), 16), int(m.group(2), 16), 0, 0] if wanted else None
                if current is not None:
                    out.append(current)  # type: ignore[arg-type]
            elif current is not None and line.startswith(("Rss:", "Anonymous:")):
                current[2 if line[0] == "R" else 3] = int(line.split()[1]) * 1024
    return [tuple(c) for c in out]  # type: ignore[misc]
