"""Reading /proc: the one parser of ``/proc/PID/maps`` that every layer uses.

A process can exit between any two reads, so readers return what they could read (an
empty list for a process that is gone) instead of raising.
"""

from __future__ import annotations

from dataclasses import dataclass

DELETED = " (deleted)"


@dataclass(frozen=True)
class Mapping:
    """One line of /proc/PID/maps. ``path`` is as the kernel prints it ("" for anonymous
    memory, ``[heap]``-style names for special mappings, " (deleted)" kept)."""

    start: int
    end: int
    offset: int
    path: str
    executable: bool = True

    @property
    def file(self) -> str:
        """The file's path without the kernel's " (deleted)" mark ("" if not file-backed)."""
        return self.path.removesuffix(DELETED) if self.path.startswith("/") else ""

    @property
    def range_name(self) -> str:
        """The mapping's name under /proc/PID/map_files."""
        return f"{self.start:x}-{self.end:x}"


def parse_maps(text: str, *, files_only: bool = True) -> list[Mapping]:
    """Mappings of a maps text; only file-backed ones unless ``files_only`` is False."""
    out = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 5:
            continue
        path = parts[5] if len(parts) == 6 else ""
        if files_only and not path.startswith("/"):
            continue
        lo, _, hi = parts[0].partition("-")
        out.append(Mapping(int(lo, 16), int(hi, 16), int(parts[2], 16), path, "x" in parts[1]))
    return out


def read_maps(pid: int, *, files_only: bool = True) -> list[Mapping]:
    """``parse_maps`` of a live process; empty when it is gone or cannot be read."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return parse_maps(f.read(), files_only=files_only)
    except OSError:
        return []
