"""Find where to put a uprobe: every version and alias of a symbol, by address.

Libraries export one function under several names (NCCL's ``nccl*`` are weak
aliases of ``pnccl*``) and one name under several versions (libibverbs'
``ibv_*@IBVERBS_1.0`` and ``ibv_*@@IBVERBS_1.1`` are different code). A uprobe
belongs to an *address*: attach once per distinct address, to every version.

A runtime linked statically into an executable (nvcc's default ``-cudart
static``) exports nothing: its functions are only in ``.symtab``, many as local
symbols. ``resolve(..., symtab=True)`` reads them there. Such tables are large
(libtorch_cuda.so: 211k entries), so they are read with numpy from a mapping of
the file, only the requested names are matched, and only the sites are kept.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections import OrderedDict
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import BinaryIO, Generic, TypeVar

import numpy as np
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerDefSection, GNUVerSymSection
from elftools.elf.sections import SymbolTableSection
from elftools.elf.segments import Segment

#: endbr64: CET-enabled code starts every function with it. A uprobe on it is
#: single-stepped (~3.6 µs here); the instruction after it is usually emulated
#: or optimized (~0.2-0.4 µs), and nothing jumps to sym+4, so probes go there
#: (``probe_address``).
ENDBR64 = b"\xf3\x0f\x1e\xfa"
#: Prefixes x86's uprobes refuse an instruction for (arch/x86/kernel/uprobes.c, is_prefix_bad:
#: lock and the es/cs/ss/ds overrides). The refusal comes when the breakpoint would go in, not
#: at the attach: a probe on ``endbr64; lock addl ...`` at sym+4 attaches without an error and
#: never fires (measured on 6.18: 0 hits at sym+4, every call at sym+0).
_REFUSED_PREFIXES = frozenset(b"\xf0\x26\x2e\x36\x3e")
#: Every legacy prefix, which may stand before a refused one (``66 f0 ...``).
_LEGACY_PREFIXES = frozenset(b"\xf0\xf2\xf3\x26\x2e\x36\x3e\x64\x65\x66\x67")
#: Bytes of a function's start read for ``probe_address``: endbr64 and the prefixes after it.
HEAD_BYTES = 12


def probe_address(vaddr: int, head: bytes) -> int:
    """Where to probe the function at ``vaddr`` whose first bytes are ``head``: past its
    endbr64, unless the kernel would refuse the instruction there (then on the endbr64: slower,
    but it fires)."""
    if head[:4] != ENDBR64:
        return vaddr
    for byte in head[4:]:
        if byte in _REFUSED_PREFIXES:
            return vaddr
        if byte not in _LEGACY_PREFIXES:
            break
    return vaddr + 4


#: Elf64_Sym, as .symtab stores it (little-endian x86-64).
_ELF64_SYM = np.dtype(
    [("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"), ("value", "<u8"), ("size", "<u8")]
)
_STT_FUNC = 2
_CHUNK = 8 << 20  # string table bytes scanned for NULs at a time

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LruCache(Generic[K, V]):
    """A bounded mapping that forgets the least recently used entry first.

    Per-inode results (symbol tables, executable verdicts) are cached here: a
    host runs thousands of binaries over its life, and each must be read once,
    not kept forever."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._d: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._d.get(key)
        if value is not None:
            self._d.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._d[key] = value
        self._d.move_to_end(key)
        while len(self._d) > self.size:
            self._d.popitem(last=False)

    def __len__(self) -> int:
        return len(self._d)


@dataclass(frozen=True)
class SymbolSite:
    """One probe site: a function address in a file, and every name it has."""

    names: tuple[str, ...]
    version: str | None
    vaddr: int
    file_offset: int
    probe_vaddr: int  # vaddr, or vaddr + 4 past an endbr64 (probe_address)
    size: int = 0  # the function's length in bytes (st_size), where read: exported_sites

    @property
    def skipped_endbr64(self) -> bool:
        return self.probe_vaddr != self.vaddr


class ElfError(Exception):
    """The file is not an ELF shared object we can read."""


class NoSymbols(ElfError):
    """The file has no symbol table to find probe sites in (a stripped executable):
    permanent for this inode, so not worth retrying."""


@dataclass(frozen=True)
class Content:
    """What an executable says about one function name, for telling what it holds."""

    has_symtab: bool
    defines: bool  # .symtab defines it as a function
    named_in_rodata: bool  # without .symtab: its name is a string in .rodata (a stripped copy still says it)
    needed: tuple[str, ...]  # DT_NEEDED, read only without .symtab


# One row per defined function: (version, vaddr, file offset, its first HEAD_BYTES bytes).
_Row = tuple[str | None, int, int, bytes]

_dynamic_tables: LruCache[tuple[int, int], dict[str, list[_Row]]] = LruCache(64)
_symtab_rows: LruCache[tuple[int, int, tuple[str, ...]], dict[str, list[_Row]]] = LruCache(256)


def file_key(path: str) -> tuple[int, int]:
    """(device, inode): uprobes belong to inodes, so this identifies a library."""
    st = os.stat(path)
    return st.st_dev, st.st_ino


@contextlib.contextmanager
def _reading(path: str) -> Iterator[None]:
    """Turn what reading a bad file raises into an ElfError naming the file."""
    try:
        yield
    except ElfError:
        raise
    except (OSError, ValueError, BufferError) as exc:
        raise ElfError(f"{path}: cannot read ELF symbols: {exc}") from exc
    except Exception as exc:  # pyelftools raises its own exception types on corrupt files
        if type(exc).__module__.startswith("elftools"):
            raise ElfError(f"{path}: malformed ELF: {exc}") from exc
        raise


def _dynamic_functions(path: str, key: tuple[int, int]) -> dict[str, list[_Row]]:
    """name -> rows for defined dynamic functions, cached per inode (a library
    replaced on disk is a new inode; the same file seen through another
    process's /proc/PID/root is the same one)."""
    table = _dynamic_tables.get(key)
    if table is not None:
        return table
    with _reading(path), open(path, "rb") as f:
        elf = ELFFile(f)
        dynsym = elf.get_section_by_name(".dynsym")
        if not isinstance(dynsym, SymbolTableSection):
            raise ElfError(f"{path}: no .dynsym section (not a shared library?)")
        versions = _version_names(elf)
        versym = next((s for s in elf.iter_sections() if isinstance(s, GNUVerSymSection)), None)
        loads = _loads(elf)
        table = {}
        for idx, sym in enumerate(dynsym.iter_symbols()):
            # Not STT_GNU_IFUNC (pyelftools: STT_LOOS): its address is a resolver that runs
            # once at relocation, never the function callers reach.
            if sym["st_info"]["type"] != "STT_FUNC":
                continue
            if sym["st_shndx"] == "SHN_UNDEF" or sym["st_value"] == 0:
                continue
            version = None
            if versym is not None:
                ndx = versym.get_symbol(idx)["ndx"]
                if isinstance(ndx, int):
                    version = versions.get(ndx & 0x7FFF)
            vaddr = sym["st_value"]
            offset = _vaddr_to_offset(loads, vaddr)
            f.seek(offset)
            table.setdefault(sym.name, []).append((version, vaddr, offset, f.read(HEAD_BYTES)))
    _dynamic_tables.put(key, table)
    return table


def _symtab_functions(path: str, key: tuple[int, int], names: tuple[str, ...]) -> dict[str, list[_Row]]:
    """name -> rows for functions of ``names`` defined in .symtab (local ones too),
    cached per inode and name list. NoSymbols when the file has no .symtab."""
    rows = _symtab_rows.get((*key, names))
    if rows is not None:
        return rows
    with _reading(path), open(path, "rb") as f:
        img = _Image(path, f)
        symtab = img.section(".symtab")
        if symtab is None:
            raise NoSymbols(f"{path}: no .symtab (stripped): its functions cannot be found")
        rows = {}
        for name, vaddrs in _match_functions(img, symtab, names).items():
            for vaddr in vaddrs:
                offset = img.vaddr_to_offset(vaddr)
                rows.setdefault(name, []).append((None, vaddr, offset, bytes(img.mm[offset : offset + HEAD_BYTES])))
    _symtab_rows.put((*key, names), rows)
    return rows


_EHDR = np.dtype(
    [
        ("ident", "S16"),
        ("type", "<u2"),
        ("machine", "<u2"),
        ("version", "<u4"),
        ("entry", "<u8"),
        ("phoff", "<u8"),
        ("shoff", "<u8"),
        ("flags", "<u4"),
        ("ehsize", "<u2"),
        ("phentsize", "<u2"),
        ("phnum", "<u2"),
        ("shentsize", "<u2"),
        ("shnum", "<u2"),
        ("shstrndx", "<u2"),
    ]
)
_SHDR = np.dtype(
    [
        ("name", "<u4"),
        ("type", "<u4"),
        ("flags", "<u8"),
        ("addr", "<u8"),
        ("offset", "<u8"),
        ("size", "<u8"),
        ("link", "<u4"),
        ("info", "<u4"),
        ("addralign", "<u8"),
        ("entsize", "<u8"),
    ]
)
_PHDR = np.dtype(
    [
        ("type", "<u4"),
        ("flags", "<u4"),
        ("offset", "<u8"),
        ("vaddr", "<u8"),
        ("paddr", "<u8"),
        ("filesz", "<u8"),
        ("memsz", "<u8"),
        ("align", "<u8"),
    ]
)
_DYN = np.dtype([("tag", "<i8"), ("val", "<u8")])
_SHT_NOBITS, _PT_LOAD, _DT_NEEDED = 8, 1, 1


class _Image:
    """A 64-bit little-endian ELF file's section and segment headers, read from
    a mapping of it. Not pyelftools here: its first look-up by name builds
    every section, parsing a large .gnu.hash entry by entry (0.37 s on a
    library with 211k symbols)."""

    def __init__(self, path: str, f: BinaryIO) -> None:
        self.path = path
        self.mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if os.fstat(f.fileno()).st_size else b""
        if self.mm[:4] != b"\x7fELF" or len(self.mm) < _EHDR.itemsize:
            raise ElfError(f"{path}: malformed ELF: not an ELF file")
        if self.mm[4:6] != b"\x02\x01":
            raise ElfError(f"{path}: only 64-bit little-endian files are read for .symtab")
        eh = np.frombuffer(self.mm, _EHDR, 1, 0)[0]
        self.sections = self._table(int(eh["shoff"]), int(eh["shnum"]), _SHDR, "section headers")
        self.segments = self._table(int(eh["phoff"]), int(eh["phnum"]), _PHDR, "program headers")
        self._names: dict[str, int] = {}
        if len(self.sections) > int(eh["shstrndx"]):
            lo, hi = self.extent(self.sections[int(eh["shstrndx"])])
            for i, sec in enumerate(self.sections):
                self._names.setdefault(self.string(lo, hi, int(sec["name"])), i)

    def _table(self, offset: int, count: int, dtype: np.dtype, what: str) -> np.ndarray:
        if offset + count * dtype.itemsize > len(self.mm):
            raise ElfError(f"{self.path}: malformed ELF: {what} past the end of the file")
        return np.frombuffer(self.mm, dtype, count, offset).copy()

    def section(self, name: str) -> np.void | None:
        i = self._names.get(name)
        return None if i is None else self.sections[i]

    def extent(self, sec: np.void) -> tuple[int, int]:
        """[start, end) of a section's bytes in the file (empty for .bss-like sections)."""
        start = int(sec["offset"])
        end = start if sec["type"] == _SHT_NOBITS else start + int(sec["size"])
        if end > len(self.mm):
            raise ElfError(f"{self.path}: malformed ELF: a section runs past the end of the file")
        return start, end

    def string(self, lo: int, hi: int, offset: int) -> str:
        end = self.mm.find(b"\0", lo + offset, hi)
        return "" if end < 0 else self.mm[lo + offset : end].decode(errors="replace")

    def vaddr_to_offset(self, vaddr: int) -> int:
        for seg in self.segments[self.segments["type"] == _PT_LOAD]:
            start = int(seg["vaddr"])
            if start <= vaddr < start + int(seg["filesz"]):
                return vaddr - start + int(seg["offset"])
        raise ElfError(f"{self.path}: address {vaddr:#x} is in no loadable segment")

    def needed(self) -> tuple[str, ...]:
        """DT_NEEDED: the libraries the file links by name."""
        dynamic = self.section(".dynamic")
        if dynamic is None or int(dynamic["link"]) >= len(self.sections):
            return ()
        lo, hi = self.extent(dynamic)
        entries = np.frombuffer(self.mm, _DYN, (hi - lo) // _DYN.itemsize, lo)
        slo, shi = self.extent(self.sections[int(dynamic["link"])])
        return tuple(self.string(slo, shi, int(v)) for v in entries["val"][entries["tag"] == _DT_NEEDED])


def _match_functions(img: _Image, symtab: np.void, names: tuple[str, ...]) -> dict[str, list[int]]:
    """name -> distinct addresses of the defined functions called ``name`` in ``symtab``.

    The table is viewed in place (numpy over the mapping) and filtered to
    defined functions. Each candidate's name length comes from the string
    table's NUL positions (found a chunk at a time), so a name is compared
    byte by byte only with the few candidates of its length. This handles a
    linker's tail-merged strings (``cudaLaunchKernel`` stored inside
    ``__cudaLaunchKernel``) and never builds the names of the other entries.
    """
    if int(symtab["link"]) >= len(img.sections):
        raise ElfError(f"{img.path}: malformed ELF: .symtab names no string table")
    sym_lo, sym_hi = img.extent(symtab)
    str_lo, str_hi = img.extent(img.sections[int(symtab["link"])])
    syms = np.frombuffer(img.mm, _ELF64_SYM, (sym_hi - sym_lo) // _ELF64_SYM.itemsize, sym_lo)
    defined = ((syms["info"] & 0xF) == _STT_FUNC) & (syms["shndx"] != 0) & (syms["value"] != 0)
    offs = syms["name"][defined].astype(np.int64)  # copies: the views go with this frame
    values = syms["value"][defined]
    del syms, defined
    strs = np.frombuffer(img.mm, np.uint8, str_hi - str_lo, str_lo)
    nuls = np.concatenate(
        [np.flatnonzero(strs[i : i + _CHUNK] == 0) + i for i in range(0, len(strs), _CHUNK)] or [np.zeros(0, np.int64)]
    )
    at = np.searchsorted(nuls, offs)
    inside = at < len(nuls)  # a name with no NUL after it is malformed: no match
    lengths = np.full(len(offs), -1, np.int64)
    lengths[inside] = nuls[at[inside]] - offs[inside]
    found: dict[str, list[int]] = {}
    for name in names:
        word = name.encode()
        idx = np.flatnonzero(lengths == len(word))
        for i, byte in enumerate(word):
            if not len(idx):
                break
            idx = idx[strs[offs[idx] + i] == byte]
        if len(idx):
            found[name] = sorted(set(values[idx].tolist()))
    del strs
    return found


def content(path: str, symbol: str) -> Content:
    """Does ``path`` hold the function ``symbol`` (in .symtab), or, stripped, name it?

    Cheap for the common answer, "no": one search of the string table for the
    name, before any symbol entry is looked at."""
    with _reading(path), open(path, "rb") as f:
        img = _Image(path, f)
        word = symbol.encode() + b"\0"
        symtab = img.section(".symtab")
        if symtab is not None:
            lo, hi = (
                img.extent(img.sections[int(symtab["link"])]) if int(symtab["link"]) < len(img.sections) else (0, 0)
            )
            if img.mm.find(word, lo, hi) < 0:
                return Content(True, False, False, ())
            return Content(True, symbol in _match_functions(img, symtab, (symbol,)), False, ())
        rodata = img.section(".rodata")
        named = rodata is not None and img.mm.find(b"\0" + word, *img.extent(rodata)) >= 0
        return Content(False, False, named, img.needed() if named else ())


def _loads(elf: ELFFile) -> list[Segment]:
    return [s for s in elf.iter_segments() if s["p_type"] == "PT_LOAD"]


def _version_names(elf: ELFFile) -> dict[int, str]:
    verdef = next((s for s in elf.iter_sections() if isinstance(s, GNUVerDefSection)), None)
    if verdef is None:
        return {}
    names = {}
    for entry, aux in verdef.iter_versions():
        first = next(iter(aux), None)
        if first is not None:
            names[entry["vd_ndx"]] = first.name
    return names


_load_segments: LruCache[tuple[int, int], np.ndarray] = LruCache(256)


def file_offset(path: str, vaddr: int) -> int:
    """Where ``vaddr`` of ``path`` lies in the file (what a uprobe is placed by), from its
    PT_LOAD segments, read once per inode: BCC's own look-up opened and parsed the file again
    for every probe, ~3 ms each, most of an attach of 60 uprobe-multi links."""
    key = file_key(path)
    loads = _load_segments.get(key)
    if loads is None:
        with _reading(path), open(path, "rb") as f:
            img = _Image(path, f)
            loads = img.segments[img.segments["type"] == _PT_LOAD]
        _load_segments.put(key, loads)
    for seg in loads:
        start = int(seg["vaddr"])
        if start <= vaddr < start + int(seg["filesz"]):
            return vaddr - start + int(seg["offset"])
    raise ElfError(f"{path}: address {vaddr:#x} is in no loadable segment")


def _vaddr_to_offset(loads: list[Segment], vaddr: int) -> int:
    for seg in loads:
        start: int = seg["p_vaddr"]
        if start <= vaddr < start + seg["p_filesz"]:
            offset: int = vaddr - start + seg["p_offset"]
            return offset
    raise ElfError(f"address {vaddr:#x} is in no loadable segment")


def resolve(path: str, names: list[str], *, symtab: bool = False) -> dict[str, list[SymbolSite]]:
    """Probe sites for each requested name found in ``path``.

    A name absent from the library is simply not in the result (CUDA 11 has no
    ``cudaLaunchKernelExC``); an address reached under several requested
    names is returned once, under the first of them, with all names listed.
    With ``symtab``, the names are looked up in ``.symtab`` instead, which
    holds local functions as well as every exported one (NoSymbols when the
    file has none). pyelftools is not used there: it takes ~4 s over the
    67k exported functions of /usr/bin/node, numpy ~30 ms over its
    110k-entry .symtab.
    """
    key = file_key(path)
    table = _symtab_functions(path, key, tuple(names)) if symtab else _dynamic_functions(path, key)
    by_addr: dict[int, list[str]] = {}
    for name in names:
        for _version, vaddr, _off, _head in table.get(name, ()):
            aliases = by_addr.setdefault(vaddr, [])
            if name not in aliases:  # one name may be exported under two versions at one address
                aliases.append(name)
    result: dict[str, list[SymbolSite]] = {}
    seen: set[int] = set()
    for name in names:
        for version, vaddr, offset, head in table.get(name, ()):
            if vaddr in seen:
                continue
            seen.add(vaddr)
            probe = probe_address(vaddr, head)
            result.setdefault(name, []).append(SymbolSite(tuple(by_addr[vaddr]), version, vaddr, offset, probe))
    return result


def exported_sites(path: str, prefix: str) -> dict[str, list[SymbolSite]]:
    """Probe sites, with their sizes, of the functions ``path`` exports (defined in
    ``.dynsym``) whose names start with ``prefix``: for families that choose what to probe by
    the names a library has (torch operators, ``_ZN2at4_ops``). Read with numpy, names
    compared only on their prefix: pyelftools took ~4 s of CPU over the 74k exported
    symbols of libtorch_cpu.so. Versions are not read."""
    word = prefix.encode()
    out: dict[str, list[SymbolSite]] = {}
    with _reading(path), open(path, "rb") as f:
        img = _Image(path, f)
        dynsym = img.section(".dynsym")
        if dynsym is None:
            raise ElfError(f"{path}: no .dynsym section (not a shared library?)")
        if int(dynsym["link"]) >= len(img.sections):
            raise ElfError(f"{path}: malformed ELF: .dynsym names no string table")
        lo, hi = img.extent(dynsym)
        str_lo, str_hi = img.extent(img.sections[int(dynsym["link"])])
        syms = np.frombuffer(img.mm, _ELF64_SYM, (hi - lo) // _ELF64_SYM.itemsize, lo)
        defined = syms[((syms["info"] & 0xF) == _STT_FUNC) & (syms["shndx"] != 0) & (syms["value"] != 0)]
        rows = zip(defined["name"].tolist(), defined["value"].tolist(), defined["size"].tolist(), strict=True)
        del syms, defined  # views of the mapping: gone before it closes
        for name_off, vaddr, size in rows:
            start = str_lo + name_off
            if start >= str_hi or img.mm[start : start + len(word)] != word:
                continue
            name = img.string(str_lo, str_hi, name_off)
            offset = img.vaddr_to_offset(vaddr)
            probe = probe_address(vaddr, bytes(img.mm[offset : offset + HEAD_BYTES]))
            out.setdefault(name, []).append(SymbolSite((name,), None, vaddr, offset, probe, size))
    return out


def has_any(path: str, names: list[str]) -> bool:
    """True when ``path`` defines at least one of ``names`` (cheap after the first call)."""
    table = _dynamic_functions(path, file_key(path))
    return any(n in table for n in names)
