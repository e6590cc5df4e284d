"""Kernel addresses -> function names, from /proc/kallsyms (as root the addresses are real)."""

from __future__ import annotations

import bisect
import time
from array import array

import numpy as np


class KernelSymbols:
    """Sorted text symbols of the running kernel (and its modules); re-read at most every
    ``refresh_s`` when an address falls outside what is known (a module loaded since).

    Kept as a flat array of addresses and one byte string of names with their offsets:
    the ~120k symbols of a distribution kernel took 24 MiB as Python ints and strings,
    ~3 MiB this way. Looked up with ``bisect`` on the ``array``: one address at a time, as
    the profiler asks, numpy's searchsorted cost ~5x more per call (a fifth of the profile
    thread's time on an idle host)."""

    def __init__(self, path: str = "/proc/kallsyms", refresh_s: float = 60.0) -> None:
        self._path = path
        self._refresh_s = refresh_s
        self._read_at = 0.0
        self._addrs = array("Q")
        self._order = np.zeros(0, dtype=np.uint32)  # address i is symbol _order[i] of the file
        self._starts = np.zeros(1, dtype=np.uint32)  # symbol j's name is _names[_starts[j]:_starts[j + 1]]
        self._names = bytearray()
        self._load()

    def _load(self) -> None:
        addrs, starts, names = array("Q"), array("I", [0]), bytearray()
        try:
            with open(self._path, "rb") as f:
                for line in f:
                    parts = line.split()
                    if len(parts) >= 3 and parts[1] in (b"t", b"T", b"w", b"W"):
                        addr = int(parts[0], 16)
                        if addr:
                            addrs.append(addr)
                            names += parts[2] + (b" " + parts[3] if len(parts) > 3 else b"")
                            starts.append(len(names))
        except OSError:
            pass
        # Names stay in file order: the sorted position i names symbol _order[i]. Reordering the
        # name bytes took one Python bytes object per symbol (~15 MiB of transient objects for
        # ~120k symbols, left as fragmented heap); the permutation is 4 bytes a symbol.
        order = np.argsort(np.frombuffer(addrs, dtype=np.uint64), kind="stable")
        self._addrs = array("Q", np.frombuffer(addrs, dtype=np.uint64)[order].tobytes())
        self._order = order.astype(np.uint32)
        self._starts = np.frombuffer(starts, dtype=np.uint32)
        self._names = names  # not copied to bytes: that doubled the peak
        self._read_at = time.monotonic()

    def __len__(self) -> int:
        return len(self._addrs)

    def lookup(self, addr: int) -> str | None:
        """The function containing ``addr``, or None (kallsyms unreadable or hidden)."""
        i = bisect.bisect_right(self._addrs, addr) - 1
        if (i < 0 or i == len(self._addrs) - 1) and time.monotonic() - self._read_at > self._refresh_s:
            self._load()
            i = bisect.bisect_right(self._addrs, addr) - 1
        if i < 0:
            return None
        j = int(self._order[i])
        return self._names[int(self._starts[j]) : int(self._starts[j + 1])].decode("utf-8", errors="replace")
