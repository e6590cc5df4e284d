"""Address -> function name, for kernel launch pointers and profile stacks.

``cudaLaunchKernel``'s first argument is the address of the kernel's host
stub, a function in the program or one of its libraries; its ELF symbol is
the kernel's (mangled) name. Resolution: /proc/PID/maps -> file + offset ->
symbol table (full .symtab when present, else .dynsym) -> C++ demangling.
Unresolvable addresses become ``module+0xoffset``, never dropped.

Symbol tables are cached by GNU build id (one table for a library however
many paths, containers or inodes it has); ``frame()`` gives profiles the
module, file offset and build id along with the name.
"""

from __future__ import annotations

import bisect
import functools
import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import cxxfilt
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    offset: int
    path: str
    executable: bool = True


def demangle(name: str) -> str:
    if not name.startswith("_Z"):
        return name
    try:
        return cxxfilt.demangle(name)
    except cxxfilt.InvalidName:
        return name


@dataclass(frozen=True)
class NativeFrame:
    """One resolved address: ``function`` is None when no symbol covers it."""

    function: str | None
    module: str         # file basename; "[unknown]" for an address in no file
    offset: int         # offset in the file (the address itself when in no file)
    build_id: str       # hex, "" when the file has none or could not be read
    mapping: Mapping | None

    @property
    def name(self) -> str:
        return self.function if self.function is not None else f"{self.module}+{self.offset:#x}"


def _build_id(elf: ELFFile) -> str:
    for segment in elf.iter_segments():
        if segment["p_type"] != "PT_NOTE":
            continue
        for note in segment.iter_notes():
            if note["n_type"] == "NT_GNU_BUILD_ID":
                return str(note["n_desc"])
    return ""


class _SymbolTable:
    """Sorted function symbols of one ELF file, and its load segments."""

    def __init__(self, path: str) -> None:
        self.build_id = ""
        self.addrs: list[int] = []
        self.entries: list[tuple[int, str]] = []  # (size, name), parallel to addrs
        self.loads: list[tuple[int, int, int]] = []  # (p_offset, p_vaddr, p_filesz)
        with open(path, "rb") as f:
            elf = ELFFile(f)
            self.loads = [
                (s["p_offset"], s["p_vaddr"], s["p_filesz"]) for s in elf.iter_segments() if s["p_type"] == "PT_LOAD"
            ]
            self.build_id = _build_id(elf)
            syms: dict[int, tuple[int, str]] = {}
            for name in (".dynsym", ".symtab"):
                sec = elf.get_section_by_name(name)
                if not isinstance(sec, SymbolTableSection):
                    continue
                for sym in sec.iter_symbols():
                    if sym["st_info"]["type"] == "STT_FUNC" and sym["st_value"] and sym.name:
                        syms.setdefault(sym["st_value"], (sym["st_size"], sym.name))
        for addr in sorted(syms):
            self.addrs.append(addr)
            self.entries.append(syms[addr])

    def vaddr(self, file_offset: int) -> int | None:
        for off, vaddr, size in self.loads:
            if off <= file_offset < off + size:
                return file_offset - off + vaddr
        return None

    def lookup(self, vaddr: int) -> str | None:
        i = bisect.bisect_right(self.addrs, vaddr) - 1
        if i < 0:
            return None
        size, name = self.entries[i]
        start = self.addrs[i]
        if vaddr == start or vaddr < start + max(size, 1):
            return name
        return None


_BY_BUILD_ID: OrderedDict[tuple[str, int], _SymbolTable] = OrderedDict()
_BY_BUILD_ID_MAX = 256
_by_build_id_lock = threading.Lock()


def _table(path: str, dev: int, ino: int, mtime: int) -> _SymbolTable | None:
    """The file's table, or None when it cannot be read now.

    Failures are not cached: a read through /proc/PID/map_files fails once the
    process is gone, and must not hide the symbols from the next lookup."""
    try:
        return _load_table(path, dev, ino, mtime)
    except Exception as exc:  # unreadable/corrupt ELF: fall back to module+offset
        log.debug("cannot read symbols of %s: %s", path, exc)
        return None


@functools.lru_cache(maxsize=1024)
def _load_table(path: str, dev: int, ino: int, mtime: int) -> _SymbolTable:
    """The file's table: by inode first (a replaced file is read again), then by build id
    and size, so a library seen under several paths or inodes is parsed once (the size
    tells a stripped copy, which keeps the build id, from the original). Raises on
    failure (lru_cache keeps no exceptions)."""
    del dev, ino, mtime  # cache key
    with open(path, "rb") as f:
        key = (_build_id(ELFFile(f)), os.fstat(f.fileno()).st_size)
    with _by_build_id_lock:
        cached = _BY_BUILD_ID.get(key) if key[0] else None
        if cached is not None:
            _BY_BUILD_ID.move_to_end(key)
            return cached
    table = _SymbolTable(path)
    if key[0]:
        with _by_build_id_lock:
            _BY_BUILD_ID[key] = table
            while len(_BY_BUILD_ID) > _BY_BUILD_ID_MAX:
                _BY_BUILD_ID.popitem(last=False)
    return table


def _mapped_table(pid: int, m: Mapping, deleted: bool) -> _SymbolTable | None:
    """The symbols of the file mapped at ``m``, or None when it cannot be read.

    While the process lives, /proc/PID/map_files opens the mapped inode itself: right
    even for a file deleted or replaced since (an upgrade renames a new file over the
    old) after the maps were read. A file the maps said was deleted is never read by
    its path: whatever is there now has other code at the same offsets.
    """
    candidates = [f"/proc/{pid}/map_files/{m.start:x}-{m.end:x}"]
    if not deleted:
        candidates += [f"/proc/{pid}/root{m.path}", m.path]  # the process's mount namespace first
    for local in candidates:
        try:
            st = os.stat(local)
        except OSError:
            continue
        table = _table(local, st.st_dev, st.st_ino, int(st.st_mtime))
        if table is not None:
            return table  # else: gone between stat and open, or unreadable; try the next
    return None


def read_maps(pid: int) -> list[Mapping]:
    out = []
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) < 6 or not parts[5].startswith("/"):
                    continue
                lo, hi = parts[0].split("-")
                out.append(Mapping(int(lo, 16), int(hi, 16), int(parts[2], 16), parts[5].rstrip("\n"), "x" in parts[1]))
    except OSError:
        pass
    return out


class Symbolizer:
    """Per-process address resolution with caches for maps and results."""

    def __init__(self, max_processes: int = 4096) -> None:
        self._max = max_processes
        self._maps: OrderedDict[int, list[Mapping]] = OrderedDict()  # LRU: bounded on busy hosts
        self._taken: dict[int, int] = {}  # pid -> CLOCK_MONOTONIC ns of the snapshot
        self._names: dict[tuple[int, int], str] = {}
        self._lock = threading.Lock()

    def remember(self, pid: int) -> None:
        """Snapshot a process's maps now, while it is alive."""
        taken = time.monotonic_ns()
        maps = read_maps(pid)
        if maps:
            with self._lock:
                self._maps[pid] = maps
                self._maps.move_to_end(pid)
                self._taken[pid] = taken
                while len(self._maps) > self._max:
                    old, _ = self._maps.popitem(last=False)
                    self._taken.pop(old, None)

    def forget(self, pid: int, before_ns: int | None = None) -> None:
        """Drop what is known of ``pid`` (only if learnt before ``before_ns``,
        a CLOCK_MONOTONIC time such as an exec event's: a snapshot taken after
        the exec already describes the new program)."""
        with self._lock:
            if before_ns is not None and self._taken.get(pid, 0) >= before_ns:
                return
            self._maps.pop(pid, None)
            self._taken.pop(pid, None)
            for key in [k for k in self._names if k[0] == pid]:
                del self._names[key]

    def resolve(self, pid: int, addr: int) -> str:
        key = (pid, addr)
        with self._lock:
            hit = self._names.get(key)
        if hit is not None:
            return hit
        name = self._resolve(pid, addr)
        with self._lock:
            self._names[key] = name
        return name

    def _find(self, pid: int, addr: int) -> Mapping | None:
        """The code mapping holding ``addr``. Only executable mappings count: the addresses
        resolved here are code, and a snapshot's data mappings go stale as they are unmapped
        and their range reused by code (ld.so.cache, mapped while dlopen() runs, is gone
        once the library it found is loaded, often in the same range)."""
        maps = self._maps.get(pid)
        for attempt in range(2):
            if maps:
                for m in maps:
                    if m.executable and m.start <= addr < m.end:
                        return m
            if attempt == 0:  # new library since the snapshot: look again
                fresh = read_maps(pid)
                if not fresh:
                    return None
                with self._lock:
                    self._maps[pid] = maps = fresh
                    self._taken[pid] = time.monotonic_ns()
        return None

    def _resolve(self, pid: int, addr: int) -> str:
        return self.frame(pid, addr).name

    def frame(self, pid: int, addr: int) -> NativeFrame:
        """``addr`` in ``pid`` as function (demangled), module, file offset and build id.
        Not cached per address: profiles resolve many, and the tables are cached."""
        m = self._find(pid, addr)
        if m is None:
            return NativeFrame(None, "[unknown]", addr, "", None)
        file_offset = addr - m.start + m.offset
        path = m.path.removesuffix(" (deleted)")
        table = _mapped_table(pid, m, deleted=path != m.path)
        module = os.path.basename(path)
        if table is None:
            return NativeFrame(None, module, file_offset, "", m)
        vaddr = table.vaddr(file_offset)
        sym = table.lookup(vaddr) if vaddr is not None else None
        return NativeFrame(demangle(sym) if sym is not None else None, module, file_offset, table.build_id, m)
