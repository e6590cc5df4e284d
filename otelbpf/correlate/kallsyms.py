"""Kernel addresses -> function names, from /proc/kallsyms (as root the addresses are real)."""

from __future__ import annotations

import bisect
import time


class KernelSymbols:
    """Sorted text symbols of the running kernel (and its modules); re-read at most every
    ``refresh_s`` when an address falls outside what is known (a module loaded since)."""

    def __init__(self, path: str = "/proc/kallsyms", refresh_s: float = 60.0) -> None:
        self._path = path
        self._refresh_s = refresh_s
        self._read_at = 0.0
        self._addrs: list[int] = []
        self._names: list[str] = []
        self._load()

    def _load(self) -> None:
        entries = []
        try:
            with open(self._path) as f:
                for line in f:
                    parts = line.split()
                    if len(parts) >= 3 and parts[1] in "tTwW":
                        addr = int(parts[0], 16)
                        if addr:
                            name = parts[2] + (f" {parts[3]}" if len(parts) > 3 else "")
                            entries.append((addr, name))
        except OSError:
            pass
        entries.sort()
        self._addrs = [a for a, _ in entries]
        self._names = [n for _, n in entries]
        self._read_at = time.monotonic()

    def lookup(self, addr: int) -> str | None:
        """The function containing ``addr``, or None (kallsyms unreadable or hidden)."""
        i = bisect.bisect_right(self._addrs, addr) - 1
        if (i < 0 or i == len(self._addrs) - 1) and time.monotonic() - self._read_at > self._refresh_s:
            self._load()
            i = bisect.bisect_right(self._addrs, addr) - 1
        return self._names[i] if i >= 0 else None
