"""Find where to put a uprobe: every version and alias of a symbol, by address.

Libraries export one function under several names (NCCL's ``nccl*`` are weak
aliases of ``pnccl*``) and one name under several versions (libibverbs'
``ibv_*@IBVERBS_1.0`` and ``ibv_*@@IBVERBS_1.1`` are different code). A uprobe
belongs to an *address*: attach once per distinct address, to every version.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerSymSection, GNUVerDefSection

#: endbr64: CET-enabled code starts every function with it. A uprobe on it is
#: single-stepped (~3.6 µs here); the instruction after it is usually emulated
#: or optimized (~0.2-0.4 µs), and nothing jumps to sym+4, so probes go there.
ENDBR64 = b"\xf3\x0f\x1e\xfa"


@dataclass(frozen=True)
class SymbolSite:
    """One probe site: a function address in a file, and every name it has."""

    names: tuple[str, ...]
    version: str | None
    vaddr: int
    file_offset: int
    probe_vaddr: int  # vaddr, or vaddr + 4 past an endbr64

    @property
    def skipped_endbr64(self) -> bool:
        return self.probe_vaddr != self.vaddr


class ElfError(Exception):
    """The file is not an ELF shared object we can read."""


def file_key(path: str) -> tuple[int, int]:
    """(device, inode): uprobes belong to inodes, so this identifies a library."""
    st = os.stat(path)
    return st.st_dev, st.st_ino


@functools.lru_cache(maxsize=64)
def _function_symbols(path: str, key: tuple[int, int]) -> dict[str, list[tuple[str | None, int, int, bytes]]]:
    """name -> [(version, vaddr, file offset, first 4 bytes)] for defined dynamic functions.

    Cached per (path, inode): a library replaced on disk gets a new entry.
    """
    del key  # part of the cache key only
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            dynsym = elf.get_section_by_name(".dynsym")
            if dynsym is None:
                raise ElfError(f"{path}: no .dynsym section (not a shared library?)")
            versions = _version_names(elf)
            versym = next((s for s in elf.iter_sections() if isinstance(s, GNUVerSymSection)), None)
            loads = [s for s in elf.iter_segments() if s["p_type"] == "PT_LOAD"]
            out: dict[str, list[tuple[str | None, int, int, bytes]]] = {}
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
                head = f.read(4)
                out.setdefault(sym.name, []).append((version, vaddr, offset, head))
            return out
    except (OSError, ValueError) as exc:
        raise ElfError(f"{path}: cannot read ELF symbols: {exc}") from exc
    except Exception as exc:  # pyelftools raises its own exception types on corrupt files
        if type(exc).__module__.startswith("elftools"):
            raise ElfError(f"{path}: malformed ELF: {exc}") from exc
        raise


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


def _vaddr_to_offset(loads: list, vaddr: int) -> int:
    for seg in loads:
        start = seg["p_vaddr"]
        if start <= vaddr < start + seg["p_filesz"]:
            return vaddr - start + seg["p_offset"]
    raise ElfError(f"address {vaddr:#x} is in no loadable segment")


def resolve(path: str, names: list[str]) -> dict[str, list[SymbolSite]]:
    """Probe sites for each requested name found in ``path``.

    A name absent from the library is simply not in the result (CUDA 11 has no
    ``cudaLaunchKernelExC``); an address reached under several requested
    names is returned once, under the first of them, with all names listed.
    """
    table = _function_symbols(path, file_key(path))
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
            probe = vaddr + 4 if head == ENDBR64 else vaddr
            result.setdefault(name, []).append(
                SymbolSite(tuple(by_addr[vaddr]), version, vaddr, offset, probe)
            )
    return result


def has_any(path: str, names: list[str]) -> bool:
    """True when ``path`` defines at least one of ``names`` (cheap after the first call)."""
    table = _function_symbols(path, file_key(path))
    return any(n in table for n in names)
