"""Give back resident memory the agent holds and does not use: free heap pages, the clean
pages of read-only file mappings, and large blocks once they are freed.

RSS counts every page of a library's code the process ever touched. Most of an agent's code
runs once, at start: config validation (pydantic-core), the compile (LLVM, clang), ELF and
BTF reading, numpy's and OpenSSL's initialization. Those pages are clean copies of the files:
``madvise(MADV_DONTNEED)`` on a read-only private file mapping drops them, and the kernel reads
a page in again (from the page cache, usually) if it is ever run again, so only the code the
running agent uses comes back. A mapping that holds any anonymous page (relocated data, written
copy-on-write) is never touched: dropping it would lose what was written.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import re
from collections.abc import Callable

log = logging.getLogger(__name__)

_MADV_DONTNEED = 4
_M_MMAP_THRESHOLD = -3  # mallopt(3)
#: Blocks this large or larger get pages of their own, returned when freed: glibc's initial value.
MMAP_THRESHOLD = 128 * 1024
_MAPPING = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) \S+ \S+ \S+\s+(.*)$")
#: Paths that are not regular files' pages (devices, memfds): never dropped.
_NOT_FILES = ("/dev/", "/memfd:", "/proc/", "/sys/")


def trim_heap() -> None:
    """glibc's ``malloc_trim(0)``: free pages of every arena back to the kernel."""
    name = ctypes.util.find_library("c")
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError) as exc:  # not glibc (musl has no malloc_trim)
        log.debug("malloc_trim: %s", exc)


def fix_mmap_threshold(nbytes: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``nbytes``: a block that large is mapped on its own and
    unmapped when freed, whatever was freed before. Returns whether it was set.

    glibc raises the threshold, up to 32 MiB, to the size of each mapped block freed, so after
    one transient 12 MiB buffer (libtorch_cpu.so's symbol table, read when a torch process
    appears) every block up to 12 MiB comes from the thread's arena instead. Freed there, it
    stays resident behind the small blocks allocated after it. In the agent under bench/churn.py
    one thread's arena grew 50 MiB in the 5 s the torch job started and kept ~35 of it; with the
    threshold fixed, the agent's anonymous memory 40 s in was 82.7 MiB instead of 101.2, and an
    hour of that churn stayed 24-39 MiB lower (docs/BENCHMARKS.md). ``mallopt`` setting it also
    stops the raising. A value set by ``GLIBC_TUNABLES=glibc.malloc.mmap_threshold=...`` is
    the operator's: kept."""
    if "glibc.malloc.mmap_threshold" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    try:
        return bool(ctypes.CDLL(ctypes.util.find_library("c")).mallopt(_M_MMAP_THRESHOLD, nbytes) == 1)
    except (OSError, AttributeError) as exc:  # not glibc
        log.debug("mallopt: %s", exc)
        return False


def every_file(path: str) -> bool:
    """Any regular file's mapping (not a device's or a memfd's)."""
    return path.startswith("/") and not path.startswith(_NOT_FILES)


def drop_file_pages(wanted: Callable[[str], bool] = every_file, smaps: str = "/proc/self/smaps") -> int:
    """``MADV_DONTNEED`` on every read-only private mapping of a file ``wanted`` accepts (by
    path) that holds no anonymous page; returns the resident bytes those mappings had."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    dropped = 0
    for start, end, rss, anon in _candidates(wanted, smaps):
        if anon or not rss:
            continue
        if libc.madvise(start, end - start, _MADV_DONTNEED) != 0:
            log.debug("madvise %#x-%#x: %s", start, end, os.strerror(ctypes.get_errno()))
            continue
        dropped += rss
    return dropped


def _candidates(wanted: Callable[[str], bool], smaps: str) -> list[tuple[int, int, int, int]]:
    """(start, end, resident bytes, anonymous bytes) of the read-only private file mappings
    ``wanted`` accepts."""
    out: list[list[int]] = []
    current: list[int] | None = None
    with open(smaps) as f:
        for line in f:
            m = _MAPPING.match(line)
            if m is not None:
                perms, path = m.group(3), m.group(4)
                take = "w" not in perms and perms[3] == "p" and every_file(path) and wanted(path)
                current = [int(m.group(1), 16), int(m.group(2), 16), 0, 0] if take else None
                if current is not None:
                    out.append(current)
            elif current is not None and line.startswith(("Rss:", "Anonymous:")):
                current[2 if line[0] == "R" else 3] = int(line.split()[1]) * 1024
    return [(a, b, c, d) for a, b, c, d in out]
