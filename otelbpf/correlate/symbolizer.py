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
import logging
import mmap
import os
import struct
import sys
import threading
import time
from array import array
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any, BinaryIO

import cxxfilt
import numpy as np

from otelbpf.base.procfs import Mapping, read_maps

log = logging.getLogger(__name__)


def demangle(name: str) -> str:
    if not name.startswith("_Z"):
        return name
    try:
        demangled: str = cxxfilt.demangle(name)
        return demangled
    except cxxfilt.InvalidName:
        return name


@dataclass(frozen=True)
class NativeFrame:
    """One resolved address: ``function`` is None when no symbol covers it."""

    function: str | None
    module: str  # file basename; "[unknown]" for an address in no file
    offset: int  # offset in the file (the address itself when in no file)
    build_id: str  # hex, "" when the file has none or could not be read
    mapping: Mapping | None

    @property
    def name(self) -> str:
        return self.function if self.function is not None else f"{self.module}+{self.offset:#x}"


_SHT_SYMTAB, _SHT_DYNSYM = 2, 11
_PT_LOAD, _PT_NOTE = 1, 4
_STT_FUNC = 2
_NT_GNU_BUILD_ID = 3


@dataclass(frozen=True)
class _ElfLayout:
    """Struct formats of one ELF class and byte order (what pyelftools' construct did
    field by field, here with ``struct`` for headers and numpy for symbol arrays)."""

    header: str  # e_phoff, e_shoff, e_phentsize, e_phnum, e_shentsize, e_shnum
    header_at: int
    phdr: str  # p_type, p_offset, p_vaddr, p_filesz
    shdr: str  # sh_type, sh_offset, sh_size, sh_link
    sym: np.dtype


def _layout(ident: bytes) -> _ElfLayout:
    if ident[:4] != b"\x7fELF" or ident[4] not in (1, 2) or ident[5] not in (1, 2):
        raise ValueError("not an ELF file")
    e = "<" if ident[5] == 1 else ">"
    if ident[4] == 2:
        sym = np.dtype(
            [
                ("name", e + "u4"),
                ("info", "u1"),
                ("other", "u1"),
                ("shndx", e + "u2"),
                ("value", e + "u8"),
                ("size", e + "u8"),
            ]
        )
        return _ElfLayout(e + "QQ6xHHHH", 0x20, e + "I4xQQ8xQ", e + "4xI8x8xQQI", sym)
    sym = np.dtype(
        [
            ("name", e + "u4"),
            ("value", e + "u4"),
            ("size", e + "u4"),
            ("info", "u1"),
            ("other", "u1"),
            ("shndx", e + "u2"),
        ]
    )
    return _ElfLayout(e + "II6xHHHH", 0x1C, e + "III4xI", e + "4xI4x4xIII", sym)


def _read_at(f: BinaryIO, offset: int, size: int) -> bytes:
    f.seek(offset)
    data = f.read(size)
    if len(data) != size:
        raise ValueError("truncated ELF file")
    return data


def _headers(f: BinaryIO) -> tuple[_ElfLayout, list[tuple[int, ...]], list[tuple[int, ...]]]:
    """The file's layout, program headers and section headers (only the fields used here)."""
    lay = _layout(_read_at(f, 0, 16))
    hsize = struct.calcsize(lay.header)
    phoff, shoff, phentsize, phnum, shentsize, shnum = struct.unpack(lay.header, _read_at(f, lay.header_at, hsize))
    phdrs = [
        struct.unpack_from(lay.phdr, _read_at(f, phoff + i * phentsize, struct.calcsize(lay.phdr)))
        for i in range(phnum)
    ]
    shdrs = [
        struct.unpack_from(lay.shdr, _read_at(f, shoff + i * shentsize, struct.calcsize(lay.shdr)))
        for i in range(shnum if shoff else 0)
    ]
    return lay, phdrs, shdrs


def _build_id(f: BinaryIO, lay: _ElfLayout, phdrs: list[tuple[int, ...]]) -> str:
    """The GNU build id from the PT_NOTE segments, hex; "" when there is none."""
    e = lay.header[0]
    for p_type, p_offset, _vaddr, p_filesz in phdrs:
        if p_type != _PT_NOTE:
            continue
        notes, i = _read_at(f, p_offset, p_filesz), 0
        while i + 12 <= len(notes):
            namesz, descsz, n_type = struct.unpack_from(e + "III", notes, i)
            name_at = i + 12
            desc_at = name_at + (namesz + 3) // 4 * 4
            if n_type == _NT_GNU_BUILD_ID and notes[name_at : name_at + namesz].rstrip(b"\0") == b"GNU":
                return notes[desc_at : desc_at + descsz].hex()
            i = desc_at + (descsz + 3) // 4 * 4
    return ""


#: Names a symbol table reads before it unmaps the pages they were on (see ``_SymbolTable``): under
#: bench/churn.py the pages of names read from the string tables were 5 MiB of the agent's RssFile
#: 5 minutes in (3.1 of them libtorch_cpu.so's), and grew with every new name.
NAME_READS_PER_DROP = 1024


class _SymbolTable:
    """Sorted function symbols of one ELF file, and its load segments.

    Read with numpy, not pyelftools: parsing a symbol at a time through construct took
    ~0.5 s for libpython, on the profiler's thread, for every new binary on the host.
    Names stay in the file until a lookup asks for one: the string tables are read
    through a shared read-only mapping of the file, so only the pages of names looked up
    are ever in memory, and those are clean file pages the kernel can drop (libtorch_cuda's
    211k mangled names are tens of MiB that were held in the agent's heap). Every page a name was
    read from stays mapped, though, and counts in the agent's RSS until the table goes: after
    every ``NAME_READS_PER_DROP`` names the table unmaps them (``MADV_DONTNEED``: they stay in the
    page cache, and a name read again maps its page again)."""

    def __init__(self, path: str) -> None:
        with open(path, "rb") as f:
            lay, phdrs, shdrs = _headers(f)
            self.loads = [(off, vaddr, size) for p_type, off, vaddr, size in phdrs if p_type == _PT_LOAD]
            self.build_id = _build_id(f, lay, phdrs)
            values, sizes, names = [], [], []
            size = os.fstat(f.fileno()).st_size
            for wanted in (_SHT_DYNSYM, _SHT_SYMTAB):  # .dynsym's name wins at a shared address
                sec = next((h for h in shdrs if h[0] == wanted), None)
                if sec is None or not 0 <= sec[3] < len(shdrs):
                    continue
                syms = np.frombuffer(_read_at(f, sec[1], sec[2] - sec[2] % lay.sym.itemsize), dtype=lay.sym)
                _type, str_off, str_size, _link = shdrs[sec[3]]
                keep = syms[
                    ((syms["info"] & 0xF) == _STT_FUNC)
                    & (syms["value"] != 0)
                    & (syms["name"] != 0)
                    & (syms["name"] < str_size)
                ]
                if str_off + str_size > size:
                    raise ValueError("string table past the end of the file")
                values.append(keep["value"].astype(np.uint64))
                sizes.append(keep["size"].astype(np.uint64))
                names.append(keep["name"].astype(np.uint64) + np.uint64(str_off))  # file offsets
            self._file = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) if values and size else None
        if values:
            addrs, first = np.unique(np.concatenate(values), return_index=True)  # first: setdefault order
            self.addrs = _narrow(addrs)
            self._sizes, self._names = _narrow(np.concatenate(sizes)[first]), _narrow(np.concatenate(names)[first])
        else:
            self.addrs = self._sizes = self._names = np.zeros(0, dtype=np.uint64)
        self._reads = 0  # names read through the mapping
        #: what the table holds in the heap (its names stay in the file's pages)
        self.nbytes = self.addrs.nbytes + self._sizes.nbytes + self._names.nbytes
        self._top = int(np.iinfo(self.addrs.dtype).max)  # the highest address its dtype holds

    def vaddr(self, file_offset: int) -> int | None:
        for off, vaddr, size in self.loads:
            if off <= file_offset < off + size:
                return file_offset - off + vaddr
        return None

    def _name(self, i: int) -> str | None:
        if self._file is None:
            return None
        start = int(self._names[i])
        end = self._file.find(b"\0", start)
        name = None if end <= start else self._file[start:end].decode("utf-8", errors="replace")
        self._reads += 1
        if self._reads % NAME_READS_PER_DROP == 0:
            self._file.madvise(mmap.MADV_DONTNEED)
        return name  # None: empty, or unterminated (pyelftools: no name)

    def lookup(self, vaddr: int) -> str | None:
        if vaddr > self._top:
            i = len(self.addrs) - 1  # past every address of a table narrowed to uint32
        else:
            i = int(np.searchsorted(self.addrs, self.addrs.dtype.type(vaddr), side="right")) - 1
        if i < 0:
            return None
        start, size = int(self.addrs[i]), int(self._sizes[i])
        if vaddr == start or vaddr < start + max(size, 1):
            return self._name(i)
        return None


def _narrow(values: np.ndarray) -> np.ndarray:
    """``values`` (uint64) as uint32 when they all fit: sizes and string offsets do in any file
    under 4 GiB, and addresses in any shared library or PIE linked at 0 (a table is then 12
    bytes a function; 16 with 8-byte addresses, 24 with nothing narrowed)."""
    return values.astype(np.uint32) if not len(values) or int(values.max()) < 1 << 32 else values


#: Cache evictions, by cache (``tables``: symbol tables; ``processes``: maps snapshots;
#: ``names``: resolved addresses; ``process_info``, ``process_names``: ProcessInfo's resources
#: and task names), exported as ``otelbpf.cache.evictions`` by whoever holds a
#: Health (see ``Symbolizer``). Module-wide, as the table cache is.
EVICTIONS: Counter[str] = Counter()


class _TableCache:
    """Symbol tables by inode (a replaced file is read again; one library mapped by many
    processes, each read through its own /proc/PID/map_files link, is one entry), then by build
    id and size (a library seen under several inodes is parsed once; the size tells a stripped
    copy, which keeps the build id, from the original).

    LRU, bounded twice: at most ``max_tables`` entries of each kind, and at most ``max_bytes`` of
    table arrays held (one table can be several MiB: libtorch_cuda.so has 211k functions, 12
    bytes each here, and a count alone does not bound what a few such libraries cost). Every
    table dropped from the inode side is counted in ``EVICTIONS["tables"]``."""

    def __init__(self, max_tables: int, max_bytes: int = 32 << 20) -> None:
        self.max_tables = max_tables
        self.max_bytes = max_bytes
        self._by_inode: OrderedDict[tuple[int, int, int], _SymbolTable] = OrderedDict()
        self._by_build_id: OrderedDict[tuple[str, int], _SymbolTable] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._by_inode)

    @property
    def nbytes(self) -> int:
        """Bytes of the distinct tables held (a table is shared by its inode and build id entries)."""
        with self._lock:
            return self._held_bytes()

    def _held_bytes(self) -> int:
        tables = {id(t): t for d in (self._by_inode, self._by_build_id) for t in d.values()}
        return sum(t.nbytes for t in tables.values())

    def get(self, path: str, dev: int, ino: int, mtime: int) -> _SymbolTable:
        """The file's table; raises on failure (failures are not cached: see ``_table``)."""
        inode = (dev, ino, mtime)
        with self._lock:
            table = self._by_inode.get(inode)
            if table is not None:
                self._by_inode.move_to_end(inode)
                return table
        with open(path, "rb") as f:
            lay, phdrs, _ = _headers(f)
            key = (_build_id(f, lay, phdrs), os.fstat(f.fileno()).st_size)
        with self._lock:
            table = self._by_build_id.get(key) if key[0] else None
            if table is not None:
                self._by_build_id.move_to_end(key)
        if table is None:
            table = _SymbolTable(path)
        with self._lock:
            self._put(self._by_inode, inode, table)
            if key[0]:
                self._put(self._by_build_id, key, table)
            self._fit_bytes(table)
        return table

    def _put(self, cache: OrderedDict[Any, _SymbolTable], key: object, table: _SymbolTable) -> None:
        cache[key] = table
        cache.move_to_end(key)
        while len(cache) > self.max_tables:
            cache.popitem(last=False)
            if cache is self._by_inode:
                EVICTIONS["tables"] += 1

    def _fit_bytes(self, newest: _SymbolTable) -> None:
        """Least recently used tables out, from both sides, until what is held fits ``max_bytes``
        (the newest stays, alone if it is larger than the budget: it is being used)."""
        held = self._held_bytes()
        while held > self.max_bytes:
            victim = next((t for t in self._by_inode.values() if t is not newest), None)
            if victim is None:
                victim = next((t for t in self._by_build_id.values() if t is not newest), None)
                if victim is None:
                    return
            for inode in [k for k, t in self._by_inode.items() if t is victim]:
                del self._by_inode[inode]
                EVICTIONS["tables"] += 1
            for key in [k for k, t in self._by_build_id.items() if t is victim]:
                del self._by_build_id[key]
            held -= victim.nbytes

    def clear(self) -> None:
        with self._lock:
            self._by_inode.clear()
            self._by_build_id.clear()


#: The process-wide table cache (the agent's and the profiler's symbolizers share tables).
TABLES = _TableCache(128)


def _table(path: str, dev: int, ino: int, mtime: int) -> _SymbolTable | None:
    """The file's table, or None when it cannot be read now.

    Failures are not cached: a read through /proc/PID/map_files fails once the
    process is gone, and must not hide the symbols from the next lookup."""
    try:
        return TABLES.get(path, dev, ino, mtime)
    except Exception as exc:  # unreadable/corrupt ELF: fall back to module+offset
        log.debug("cannot read symbols of %s: %s", path, exc)
        return None


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


def _read_process(pid: int, addr: int, limit: int) -> bytes | None:
    """Up to ``limit`` bytes at ``addr``, stopping at the first NUL, from /proc/PID/mem."""
    try:
        fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    except OSError:
        return None
    try:
        out = b""
        while len(out) < limit:
            chunk = os.pread(fd, min(4096 - (addr + len(out)) % 4096, limit - len(out)), addr + len(out))
            if not chunk:
                break
            out += chunk
            if b"\0" in chunk:
                break
        return out or None
    except OSError:
        return None
    finally:
        os.close(fd)


def _read_mapped_file(pid: int, snap: _Snapshot, addr: int, limit: int) -> bytes | None:
    m = snap.file_at(addr)
    if m is None:
        return None
    path = m.path.removesuffix(" (deleted)")
    if path != m.path:
        return None  # whatever is at that path now is another file
    for local in (f"/proc/{pid}/root{path}", path):
        try:
            with open(local, "rb") as f:
                f.seek(addr - m.start + m.offset)
                data = f.read(limit)
        except OSError:
            continue
        end = data.find(b"\0")
        return data[:end] if end >= 0 else data
    return None


class _Snapshot:
    """One read of a process's maps: its file mappings sorted by address, held as flat
    arrays (a lookup is a bisection, not a scan of hundreds of mappings), and the symbol tables
    found for its code mappings so far. A new snapshot starts with none: a range may now map
    another file.

    Flat because there are thousands: the agent snapshots every process it sees start, and a
    snapshot outlives its process (names are read after it exits). As ``Mapping`` objects one
    mapping cost ~400 bytes (4096 snapshots of ~70 mappings: ~110 MiB); here it is ~40, paths
    interned (every process maps the same libraries), ``Mapping``s made on lookup."""

    __slots__ = (
        "file_starts",
        "_ends",
        "_offsets",
        "_path_ix",
        "_paths",
        "_exec",
        "_code_ix",
        "starts",
        "taken_ns",
        "tables",
        "_made",
    )

    def __init__(self, maps: list[Mapping], taken_ns: int) -> None:
        files = sorted(maps, key=lambda m: m.start)
        paths: dict[str, int] = {}
        #: every file mapping, for reading constant data (strings in .rodata) from the file
        #: once the process is gone
        self.file_starts = array("Q", [m.start for m in files])
        self._ends = array("Q", [m.end for m in files])
        self._offsets = array("Q", [m.offset for m in files])
        self._path_ix = array("I", [paths.setdefault(m.path, len(paths)) for m in files])
        self._paths = tuple(sys.intern(p) for p in paths)
        self._exec = bytes(m.executable for m in files)
        self._code_ix = array("I", [i for i, m in enumerate(files) if m.executable])
        self.starts = array("Q", [files[i].start for i in self._code_ix])  # code mappings only
        self.taken_ns = taken_ns  # CLOCK_MONOTONIC
        self.tables: dict[int, _SymbolTable] = {}  # by file mapping index
        self._made: dict[int, Mapping] = {}

    def mapping(self, i: int) -> Mapping:
        m = self._made.get(i)
        if m is None:
            m = self._made[i] = Mapping(
                self.file_starts[i], self._ends[i], self._offsets[i], self._paths[self._path_ix[i]], bool(self._exec[i])
            )
        return m

    def find(self, addr: int) -> int | None:
        """The index of the code mapping holding ``addr`` (see ``mapping``), if any."""
        j = bisect.bisect_right(self.starts, addr) - 1
        if j < 0:
            return None
        i = self._code_ix[j]
        return i if addr < self._ends[i] else None

    def file_at(self, addr: int) -> Mapping | None:
        """The file mapping (code or data) holding ``addr``."""
        i = bisect.bisect_right(self.file_starts, addr) - 1
        return self.mapping(i) if i >= 0 and addr < self._ends[i] else None


class Symbolizer:
    """Per-process address resolution with caches for maps and results.

    Both caches are LRU and bounded (``max_processes`` maps snapshots, ``max_names``
    resolved addresses); what they evict is counted in ``EVICTIONS``.

    A snapshot outlives its process (its last events and samples are named after it exits),
    but not by more than ``gone_grace_s``: at most every ``sweep_s``, snapshots of processes
    found gone that long are released with their resolved names. Without it, on a host that
    starts processes all day, the snapshots of exited ones filled the LRU to its bound and
    memory grew for the hour that took."""

    def __init__(
        self, max_processes: int = 4096, max_names: int = 65536, *, gone_grace_s: float = 120.0, sweep_s: float = 10.0
    ) -> None:
        self._max = max_processes
        self._max_names = max_names
        self._maps: OrderedDict[int, _Snapshot] = OrderedDict()  # LRU: bounded on busy hosts
        self._names: OrderedDict[tuple[int, int], str] = OrderedDict()
        self._lock = threading.Lock()
        self._grace_ns = int(gone_grace_s * 1e9)
        self._sweep_ns = int(sweep_s * 1e9)
        self._swept_ns = time.monotonic_ns()
        self._gone_since: dict[int, int] = {}  # pid -> CLOCK_MONOTONIC ns it was first found gone

    def remember(self, pid: int) -> None:
        """Snapshot a process's maps now, while it is alive."""
        taken = time.monotonic_ns()
        maps = read_maps(pid)
        if maps:
            self._store(pid, _Snapshot(maps, taken))

    def _store(self, pid: int, snap: _Snapshot) -> None:
        with self._lock:
            self._maps[pid] = snap
            self._maps.move_to_end(pid)
            self._gone_since.pop(pid, None)
            while len(self._maps) > self._max:
                self._maps.popitem(last=False)
                EVICTIONS["processes"] += 1
        if snap.taken_ns - self._swept_ns >= self._sweep_ns:
            self.release_exited(snap.taken_ns)

    def release_exited(self, now_ns: int) -> None:
        """Release what is known of processes found gone ``gone_grace_s`` ago or more (a pid
        alive again keeps its snapshot: its exec will replace it)."""
        self._swept_ns = now_ns
        with self._lock:
            pids = list(self._maps)
        gone = {pid for pid in pids if not os.path.exists(f"/proc/{pid}")}
        with self._lock:
            self._gone_since = {pid: self._gone_since.get(pid, now_ns) for pid in gone if pid in self._maps}
            expired = {pid for pid, since in self._gone_since.items() if now_ns - since >= self._grace_ns}
            if not expired:
                return
            for pid in expired:
                self._maps.pop(pid, None)
                del self._gone_since[pid]
            for key in [k for k in self._names if k[0] in expired]:
                del self._names[key]

    def forget(self, pid: int, before_ns: int | None = None) -> None:
        """Drop what is known of ``pid`` (only if learnt before ``before_ns``,
        a CLOCK_MONOTONIC time such as an exec event's: a snapshot taken after
        the exec already describes the new program)."""
        with self._lock:
            snap = self._maps.get(pid)
            if before_ns is not None and snap is not None and snap.taken_ns >= before_ns:
                return
            self._maps.pop(pid, None)
            for key in [k for k in self._names if k[0] == pid]:
                del self._names[key]

    def resolve(self, pid: int, addr: int) -> str:
        key = (pid, addr)
        with self._lock:
            hit = self._names.get(key)
            if hit is not None:
                self._names.move_to_end(key)
                return hit
        name = self._resolve(pid, addr)
        with self._lock:
            self._names[key] = name
            while len(self._names) > self._max_names:
                self._names.popitem(last=False)
                EVICTIONS["names"] += 1
        return name

    def _find(self, pid: int, addr: int, fresh_after_ns: int | None) -> tuple[int | None, _Snapshot | None]:
        """The code mapping holding ``addr`` (its index), and the snapshot it is in. Only executable
        mappings count: the addresses resolved here are code, and a snapshot's data mappings
        go stale as they are unmapped and their range reused by code (ld.so.cache, mapped
        while dlopen() runs, is gone once the library it found is loaded, often in the same
        range). An address in none is looked up again in a fresh read of the maps (a library
        loaded since the snapshot), unless the snapshot was taken after ``fresh_after_ns``
        (CLOCK_MONOTONIC): then it already had every library the address could be in."""
        with self._lock:
            snap = self._maps.get(pid)
        m = snap.find(addr) if snap is not None else None
        if m is not None or (snap is not None and fresh_after_ns is not None and snap.taken_ns >= fresh_after_ns):
            return m, snap
        taken = time.monotonic_ns()
        fresh = read_maps(pid)
        if not fresh:
            return None, snap
        snap = _Snapshot(fresh, taken)
        self._store(pid, snap)
        return snap.find(addr), snap

    def _resolve(self, pid: int, addr: int) -> str:
        return self.frame(pid, addr).name

    def read_string(self, pid: int, addr: int, limit: int = 16384) -> str | None:
        """The NUL-terminated string at ``addr`` in ``pid`` (kernel names registered by
        CUDA's static constructors): from the live process, else from the file its maps
        snapshot says was mapped there (constant data reads the same from the file once
        the process is gone). None when neither can be read."""
        raw = _read_process(pid, addr, limit)
        if raw is None:
            with self._lock:
                snap = self._maps.get(pid)
            raw = _read_mapped_file(pid, snap, addr, limit) if snap is not None else None
        if not raw:
            return None
        return raw.split(b"\0", 1)[0].decode("utf-8", errors="replace") or None

    def frame(self, pid: int, addr: int, fresh_after_ns: int | None = None) -> NativeFrame:
        """``addr`` in ``pid`` as function (demangled), module, file offset and build id.
        Not cached per address: profiles resolve many, and the tables are cached.
        ``fresh_after_ns``: see ``_find`` (profiles pass the time their samples were read,
        so addresses in no file cost one read of the maps per process, not one each)."""
        i, snap = self._find(pid, addr, fresh_after_ns)
        if i is None or snap is None:
            return NativeFrame(None, "[unknown]", addr, "", None)
        m = snap.mapping(i)
        file_offset = addr - m.start + m.offset
        path = m.path.removesuffix(" (deleted)")
        table = snap.tables.get(i)
        if table is None:
            table = _mapped_table(pid, m, deleted=path != m.path)
            if table is not None:  # failures are not kept: see _table
                snap.tables[i] = table
        module = os.path.basename(path)
        if table is None:
            return NativeFrame(None, module, file_offset, "", m)
        vaddr = table.vaddr(file_offset)
        sym = table.lookup(vaddr) if vaddr is not None else None
        return NativeFrame(demangle(sym) if sym is not None else None, module, file_offset, table.build_id, m)
