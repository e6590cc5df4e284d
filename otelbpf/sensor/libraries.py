"""Find the library files to probe: on disk (globs), in running processes
(``/proc/*/maps``), and from the openat events discovery.c reports.

A uprobe belongs to a file's inode, not to a process: once a library file is
probed, every process that maps it, now or later, is covered. So discovery
is about finding *files*; processes only tell us where files are.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from otelbpf.sensor.family import LibraryKind, ProbeFamily


@dataclass(frozen=True)
class LibraryFile:
    """A library file as seen from this agent, identified by its inode."""

    path: str            # a path this agent can open (may go through /proc/PID/root)
    shown_path: str      # the path the process or config names it by
    family: str
    kind: str
    key: tuple[int, int]  # (st_dev, st_ino)


def _classify(path: str, families: Iterable[ProbeFamily]) -> tuple[ProbeFamily, LibraryKind] | None:
    base = os.path.basename(path)
    for fam in families:
        kind = fam.library_kind(base)
        if kind is not None:
            return fam, kind
    return None


def _make(path: str, shown: str, families: Iterable[ProbeFamily]) -> LibraryFile | None:
    found = _classify(shown, families)
    if found is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return LibraryFile(path, shown, found[0].name, found[1].name, (st.st_dev, st.st_ino))


def from_globs(patterns: Iterable[str], families: list[ProbeFamily]) -> Iterator[LibraryFile]:
    """Library files matching the configured search globs (symlinks resolved)."""
    for pattern in patterns:
        for match in glob.iglob(pattern, recursive=True):
            real = os.path.realpath(match)
            lib = _make(real, real, families)
            if lib is not None:
                yield lib


def mapped_paths(pid: int) -> set[str]:
    """Distinct file paths mapped executable by ``pid`` (empty if it is gone)."""
    paths = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and "x" in parts[1] and parts[5].startswith("/"):
                    paths.add(parts[5].rstrip("\n").removesuffix(" (deleted)"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return paths


def in_process(pid: int, path: str, families: list[ProbeFamily]) -> LibraryFile | None:
    """Resolve a path as ``pid`` sees it (its mount namespace, its cwd)."""
    if not os.path.isabs(path):
        try:
            path = os.path.join(os.readlink(f"/proc/{pid}/cwd"), path)
        except OSError:
            return None
    through_root = f"/proc/{pid}/root{path}"
    lib = _make(through_root, path, families)
    if lib is None and os.path.exists(path):
        lib = _make(path, path, families)
    return lib


def from_process(pid: int, families: list[ProbeFamily]) -> Iterator[LibraryFile]:
    for path in mapped_paths(pid):
        lib = in_process(pid, path, families)
        if lib is not None:
            yield lib


def all_pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]
