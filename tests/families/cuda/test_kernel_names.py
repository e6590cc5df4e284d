"""Kernel handle -> name (families/cuda/kernel_names.py), resolved against this very process: a
libc function stands for a kernel's host stub (named by its ELF symbol) and a string in our
memory for the device name a registration points to."""

from __future__ import annotations

import ctypes
import os

from otelbpf.base.procfs import Mapping
from otelbpf.correlate.symbolizer import NativeFrame, Symbolizer
from otelbpf.families.cuda.kernel_names import KernelNames

LAUNCH = 1  # any function id: names are per (function, handle)


def test_a_registration_learnt_after_a_symbol_lookup_names_the_kernel() -> None:
    """A metrics export names the launch map's kernels as soon as they are counted, in the
    kernel, while the registrations are still on the ring: the symbol found then must not
    stick (it did: every later span of the program was named by symbol, its lambda kernel
    by its host wrapper's name)."""
    libc = ctypes.CDLL(None)
    stub = ctypes.cast(libc.getpid, ctypes.c_void_p).value
    assert stub is not None
    device_name = ctypes.create_string_buffer(b"_Z5plainPf")
    names, sym, pid = KernelNames(), Symbolizer(), os.getpid()

    name, source = names.resolve(sym, pid, LAUNCH, stub)
    assert source == "symbol" and "getpid" in name

    names.registered[stub] = ctypes.addressof(device_name)
    names.learn()
    assert names.resolve(sym, pid, LAUNCH, stub) == ("plain(float*)", "registration")
    names.registered.clear()
    names.learn()
    assert names.resolve(sym, pid, LAUNCH, stub) == ("plain(float*)", "registration")  # final


class _StrippedProcess:
    """A symbolizer's view of a process gone, whose maps were read while it lived: the
    registration's name cannot be read, its stripped library has no symbols."""

    def read_string(self, pid: int, addr: int) -> None:
        return None

    def frame(self, pid: int, addr: int) -> NativeFrame:
        mapping = Mapping(0x7F0000000000, 0x7F0000010000, 0, "/opt/image/lib/libstripk.so")
        return NativeFrame(None, "libstripk.so", addr - 0x7F0000000000, "2f9a3c1d8e7b6a5c4d3e", mapping)


def test_a_registration_that_cannot_be_read_names_the_kernel_by_object_and_offset() -> None:
    """Never a bare address when the object the host stub lives in is known (issue 36)."""
    names = KernelNames()
    names.registered[0x7F0000001380] = 0x7F0000008000
    names.learn()
    assert names.resolve(_StrippedProcess(), 1, LAUNCH, 0x7F0000001380) == (  # type: ignore[arg-type]
        "[kernel libstripk.so+0x1380 (build id 2f9a3c1d8e7b6a5c)]",
        "unresolved",
    )
