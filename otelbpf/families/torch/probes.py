"""The torch probe family: PyTorch operators at their public entry points.

Every ATen operator overload has a C++ entry point ``at::_ops::<op>::call`` in
``libtorch_cpu.so`` (CUDA builds too): ``torch.mm`` reaches ``at::_ops::mm::call``, a
composite operator reaches its parts' ``call`` (``matmul`` -> ``mm``), and the dispatcher's
internal hops use ``redispatch``, which is never probed. ``<op>`` is the operator's name
with ``_<overload>`` appended when it has one (``aten::softmax.int`` -> ``softmax_int``).
Operators are chosen by shell-style patterns on that name (``config`` ``operators``),
matched against the mangled names the library exports: ``at::_ops::<op>::call`` always
mangles to ``_ZN2at4_ops<len><op>4callE...``, whatever the arguments.

No uretprobe: a C++ exception thrown through a function whose return address a uretprobe
replaced cannot be unwound (the unwinder finds no frame information for the kernel's
trampoline) and the program dies in ``std::terminate``; an operator raising a Python
``RuntimeError`` (a shape mismatch) is ordinary. So each operator gets a uprobe at its entry
and one at every ``ret`` instruction of its body (found with capstone); bpf/torch.c pairs
them by stack pointer, and frames an exception unwound are dropped and counted.
"""

from __future__ import annotations

import fnmatch
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import capstone

from otelbpf.families.torch.config import DEFAULT_OPERATORS
from otelbpf.sensor import elf
from otelbpf.sensor.family import LibraryKind, ProbeAt, ProbeFamily

ENTRY_PROGRAM = "uprobe_torch_enter"
EXIT_PROGRAM = "uprobe_torch_exit"

_OPS_PREFIX = "_ZN2at4_ops"
_OPS_CALL = re.compile(_OPS_PREFIX + r"([0-9]+)")
_LIBRARY = re.compile(r"^libtorch_cpu\.so(\.[0-9]+)*$")


def operator_of(mangled: str) -> str | None:
    """The operator name of an ``at::_ops::<op>::call`` symbol, else None."""
    m = _OPS_CALL.match(mangled)
    if m is None:
        return None
    end = m.end() + int(m.group(1))
    if len(mangled) < end or not mangled.startswith("4callE", end):
        return None
    return mangled[m.end() : end]


def select_operators(names: Sequence[str], patterns: Sequence[str]) -> dict[str, str]:
    """operator -> mangled symbol, for every ``at::_ops::<op>::call`` among ``names``
    whose operator matches one of ``patterns`` (shell-style, case-sensitive)."""
    out = {}
    for name in names:
        op = operator_of(name)
        if op is not None and any(fnmatch.fnmatchcase(op, p) for p in patterns):
            out[op] = name
    return out


@dataclass(frozen=True)
class OperatorSite:
    """Where one operator is probed: its entry, and every ``ret`` of its body."""

    operator: str
    entry: int  # ELF address (past an endbr64)
    exits: tuple[int, ...]


def return_sites(code: bytes, vaddr: int) -> tuple[int, ...]:
    """Addresses of the ``ret`` instructions in a function's code (``vaddr`` its start)."""
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    md.skipdata = True  # padding or data between blocks: step over it, keep decoding
    return tuple(
        addr
        for addr, _size, mnemonic, _ops in md.disasm_lite(code, vaddr)
        if mnemonic in ("ret", "repz ret", "rep ret")
    )


def operator_sites(path: str, patterns: Sequence[str]) -> list[OperatorSite]:
    """The probe sites of the operators of ``path`` that ``patterns`` select; an operator
    whose code has no ``ret`` (it only tail-calls) is left out: its end cannot be seen."""
    sites = elf.exported_sites(path, _OPS_PREFIX)
    out = []
    with open(path, "rb") as f:
        for op, symbol in select_operators(list(sites), patterns).items():
            for site in sites[symbol]:
                if site.size <= 0:
                    continue
                f.seek(site.file_offset)
                exits = return_sites(f.read(site.size), site.vaddr)
                if exits:
                    out.append(OperatorSite(op, site.probe_vaddr, exits))
    return sorted(out, key=lambda s: s.operator)


class SiteCache:
    """Operator sites per library file (inode), so a library seen again through another
    process is not disassembled again; the sensor calls it from its discovery thread."""

    def __init__(self, patterns: Sequence[str]) -> None:
        self.patterns = tuple(patterns)
        self._sites: elf.LruCache[tuple[int, int], list[OperatorSite]] = elf.LruCache(16)
        self._lock = threading.Lock()

    def sites(self, path: str) -> list[OperatorSite]:
        key = elf.file_key(path)
        with self._lock:
            found = self._sites.get(key)
        if found is None:
            found = operator_sites(path, self.patterns)
            with self._lock:
                self._sites.put(key, found)
        return found

    def probes(self, path: str) -> list[ProbeAt]:
        out = []
        for site in self.sites(path):
            out.append(ProbeAt(site.entry, ENTRY_PROGRAM, site.operator))
            out.extend(ProbeAt(addr, EXIT_PROGRAM, site.operator) for addr in site.exits)
        return out


def torch_family(operators: Sequence[str] = DEFAULT_OPERATORS, max_depth: int = 16) -> ProbeFamily:
    """The torch family: operator entry and ``ret`` uprobes on ``libtorch_cpu.so``.
    ``max_depth``: nested probed operators tracked per thread (a power of two)."""
    if max_depth & (max_depth - 1) or not 2 <= max_depth <= 64:
        raise ValueError(f"max_depth must be a power of two from 2 to 64, got {max_depth}")
    cache = SiteCache(operators)
    return ProbeFamily(
        name="torch",
        c_file="torch.c",
        libraries=(LibraryKind("torch", _LIBRARY, "libtorch_cpu.so", (), find_probes=cache.probes),),
        cflags=(f"-DTORCH_DEPTH={int(max_depth)}",),
    )
