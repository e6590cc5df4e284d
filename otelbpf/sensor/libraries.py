"""Find the library files to probe: on disk (globs), in running processes
(``/proc/*/maps``), and from the openat and exec events discovery.c reports.

A uprobe belongs to a file's inode, not to a process: once a library file is
probed, every process that maps it, now or later, is covered. So discovery
is about finding *files*; processes only tell us where files are.

Libraries are recognised by file name. A runtime linked into an executable
(nvcc's default static cudart) has no name of its own: executables are
recognised by content (``LibraryKind.content_symbol`` in their ``.symtab``),
read once per inode and remembered in a bounded cache.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from otelbpf.base.procfs import read_maps
from otelbpf.sensor import elf
from otelbpf.sensor.family import LibraryKind, ProbeFamily

#: (st_dev, st_ino) of an executable -> (family, kind) it holds, or "" when none.
_verdicts: elf.LruCache[tuple[int, int], tuple[str, str] | str] = elf.LruCache(4096)


@dataclass(frozen=True)
class LibraryFile:
    """A library file as seen from this agent, identified by its inode."""

    path: str  # a path this agent can open (may go through /proc/PID/root)
    shown_path: str  # the path the process or config names it by
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
    return {m.file for m in read_maps(pid) if m.executable}


def in_process(pid: int, path: str, families: list[ProbeFamily]) -> LibraryFile | None:
    """Resolve a path as ``pid`` sees it (its mount namespace, its cwd).

    A process that is already gone (it opened the library and exited before
    this ran) left no namespace to look through: the path on the host stands
    in for it. The probes then cover the host's file, which is the same file
    unless the process ran in a container.
    """
    if not os.path.isabs(path):
        try:
            path = os.path.join(os.readlink(f"/proc/{pid}/cwd"), path)
        except OSError:
            return None
    through_root = f"/proc/{pid}/root{path}"
    lib = _make(through_root, path, families)
    if lib is None and not _root_visible(pid) and os.path.exists(path):
        lib = _make(path, path, families)
    return lib


def _root_visible(pid: int) -> bool:
    """Can the process's mount namespace still be looked through? Not once it has exited:
    gone, or a zombie not yet reaped (its /proc entry stays, its root link is gone: a
    short-lived process's library was missed when its parent had not reaped it yet)."""
    try:
        os.stat(f"/proc/{pid}/root/")
    except OSError:
        return False
    return True


def executable(pid: int, families: list[ProbeFamily], exec_path: str | None = None) -> LibraryFile | None:
    """The executable of ``pid`` when its content makes it a probed kind.

    Read through ``/proc/PID/exe`` (the very inode, in any mount namespace,
    even deleted); once the process is gone, ``exec_path`` (the path it was
    started by) on the host stands in, as in ``in_process``.
    """
    if not any(k.content_symbol for f in families for k in f.libraries):
        return None
    try:
        shown = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
        path = f"/proc/{pid}/exe"
        st = os.stat(path)
    except OSError:
        if exec_path is None or not os.path.isabs(exec_path):
            return None
        path = shown = exec_path
        try:
            st = os.stat(path)
        except OSError:
            return None
    key = (st.st_dev, st.st_ino)
    found = _by_content(path, key, families)
    return None if found is None else LibraryFile(path, shown, found[0], found[1], key)


def _by_content(path: str, key: tuple[int, int], families: list[ProbeFamily]) -> tuple[str, str] | None:
    """(family, kind) of an executable that defines a kind's ``content_symbol``,
    or that names it but was stripped of its symbols without linking the
    kind's library by name: the sensor reports those as unprobeable (not
    silently ignored). Read once per inode."""
    verdict = _verdicts.get(key)
    if verdict is None:
        verdict = ""
        for fam in families:
            for kind in fam.libraries:
                if kind.content_symbol is None or verdict:
                    continue
                try:
                    found = elf.content(path, kind.content_symbol)
                except elf.ElfError as exc:
                    if isinstance(exc.__cause__, OSError):
                        return None  # unreadable now: no verdict to remember
                    continue  # not ELF (a script: its interpreter is the executable)
                stripped_copy = found.named_in_rodata and not any(
                    fam.library_kind(os.path.basename(n)) for n in found.needed
                )
                if found.defines or stripped_copy:
                    verdict = (fam.name, kind.name)
        _verdicts.put(key, verdict)
    return verdict if isinstance(verdict, tuple) else None  # "": remembered as no match


def from_process(pid: int, families: list[ProbeFamily]) -> Iterator[LibraryFile]:
    for path in mapped_paths(pid):
        lib = in_process(pid, path, families)
        if lib is not None:
            yield lib
    exe = executable(pid, families)
    if exe is not None:
        yield exe


def all_pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]
