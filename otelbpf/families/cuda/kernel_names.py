"""Kernel handle -> kernel name, for one process, from what its CUDA calls revealed.

A launch names its kernel by a handle whose meaning depends on the CUDA version
and API: a host stub address (CUDA <= 12 runtime, or 13 without a driver), a
``cudaKernel_t``/``CUkernel`` the driver allocated (CUDA 13 ``<<<>>>`` launches,
PyTorch), or a ``CUfunction``. What tells them apart, best first:

1. ``__cudaRegisterFunction(.., hostFun, .., deviceName, ..)``: host stub ->
   mangled device name (the lambda kernel's real name, not its host wrapper's);
2. ``__cudaGetKernel``/``cudaGetKernel`` return: handle -> host stub;
   ``cuKernelGetFunction``: CUfunction -> CUkernel (followed like a chain);
3. ``cuModuleGetFunction``/``cuLibraryGetKernel``: handle -> name (driver);
4. the handle is a host stub in a file: its ELF symbol;
5. attached late (registration long past): the first launch's return address (or
   its caller's: nvcc's -O0 host code launches through a shared helper), inside
   nvcc's ``__device_stub__<mangled>`` when the binary has symbols;
6. last resort: the launch site as ``object+offset``, else the host stub's own
   ``object+offset (build id …)``; a bare address only when the process was never seen
   mapping anything (gone before its first library open was handled).

Names are read and demangled once per handle, when a launch needs them.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

from otelbpf.correlate.symbolizer import Symbolizer, demangle

log = logging.getLogger(__name__)

_STUB = re.compile(r"^__device_stub__([^(]+)\(")

#: ``cuda.kernel.name_source`` values, best first.
SOURCES = ("registration", "driver", "symbol", "device_stub", "launch_site", "unresolved")
#: Sources no later fact can better: resolved once per handle. Not "symbol": a registration
#: that arrives after the first lookup (facts still on the ring while a metrics export names
#: the launch map's kernels) names a lambda kernel that its host stub's symbol does not.
_FINAL = frozenset(SOURCES[:2])


@dataclass
class KernelNames:
    """What one process told about its kernels (fed by the CUDA correlator)."""

    registered: dict[int, int] = field(default_factory=dict)  # host stub -> address of its device name
    aliases: dict[int, int] = field(default_factory=dict)  # handle -> host stub / CUkernel
    driver: dict[int, str] = field(default_factory=dict)  # handle -> name (driver API)
    #: (function id, handle) -> (return address, the caller's return address or 0)
    sites: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    #: (function id, handle) -> (name, source, facts seen when resolved)
    _cache: dict[tuple[int, int], tuple[str, str, int]] = field(default_factory=dict)
    _facts: int = 0  # bumps when a fact arrives: cached fallbacks are recomputed

    def learn(self) -> None:
        self._facts += 1

    @property
    def facts(self) -> int:
        """Bumps whenever a fact arrives: names resolved before may resolve better now."""
        return self._facts

    def resolve(self, sym: Symbolizer, pid: int, func: int, fn: int) -> tuple[str, str]:
        """(name, source) of the kernel launched through API ``func`` with handle ``fn``."""
        key = (func, fn)
        hit = self._cache.get(key)
        if hit is not None and (hit[1] in _FINAL or hit[2] == self._facts):
            return hit[0], hit[1]
        name, source = self._resolve(sym, pid, func, fn)
        self._cache[key] = (name, source, self._facts)
        return name, source

    def _resolve(self, sym: Symbolizer, pid: int, func: int, fn: int) -> tuple[str, str]:
        handle = fn
        for _ in range(4):  # CUfunction -> CUkernel -> host stub
            name = self.driver.get(handle)
            if name:
                return demangle(name), "driver"
            ptr = self.registered.get(handle)
            if ptr:
                name = sym.read_string(pid, ptr)
                if name:
                    return demangle(name), "registration"
                # Once per handle (the answer is cached): a registration seen but unreadable
                # tells apart from one never seen, which the launch attributes cannot.
                log.info("pid %d: the name kernel %#x registered at %#x could not be read", pid, handle, ptr)
            nxt = self.aliases.get(handle)
            if nxt is None:
                break
            handle = nxt
        frame = sym.frame(pid, handle)
        if frame.function is not None:
            return frame.function, "symbol"
        site = self.sites.get((func, fn))
        if site:
            frames = [sym.frame(pid, addr) for addr in site if addr]
            for frame in frames:
                stub = _STUB.match(frame.function or "")
                if stub:
                    inner = stub.group(1)
                    return (demangle("_" + inner) if inner.startswith("Z") else inner), "device_stub"
            if frames and frames[0].mapping is not None:
                first = frames[0]
                where = f"{first.module}+{first.offset:#x}"
                # The caller's caller, when it is in the same object (frame pointers kept):
                # tells apart kernels launched through one shared helper.
                if len(frames) > 1 and frames[1].mapping is not None and frames[1].module == first.module:
                    where += f" from +{frames[1].offset:#x}"
                if first.build_id:
                    where += f" (build id {first.build_id[:16]})"
                return f"[launched at {where}]", "launch_site"
        if frame.mapping is not None:
            # A registration unread, in a stripped object, never launched where a site was
            # seen: where its host stub is, which names the kernel uniquely and stably.
            where = f"{frame.module}+{frame.offset:#x}"
            if frame.build_id:
                where += f" (build id {frame.build_id[:16]})"
            return f"[kernel {where}]", "unresolved"
        return f"[unresolved kernel {fn:#x}]", "unresolved"
