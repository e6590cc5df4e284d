"""Kernel addresses named from /proc/kallsyms."""

from __future__ import annotations

import os

import pytest

from otelbpf.correlate.kallsyms import KernelSymbols


def test_a_kernel_text_address_is_named():
    if os.geteuid() != 0:
        pytest.skip("/proc/kallsyms shows addresses to root only")
    with open("/proc/kallsyms") as f:
        entries = [line.split() for line in f]
    name, addr = next((e[2], int(e[0], 16)) for e in entries if e[1] in "tT" and e[2] == "schedule")
    syms = KernelSymbols()
    assert syms.lookup(addr) == name
    assert syms.lookup(addr + 1) == name


def test_nothing_below_the_first_symbol(tmp_path):
    table = tmp_path / "kallsyms"
    table.write_text("ffffffff81000000 T _stext\nffffffff81000100 t foo [mod]\nffffffff81000200 d data\n")
    syms = KernelSymbols(str(table))
    assert syms.lookup(0xFFFFFFFF80000000) is None
    assert syms.lookup(0xFFFFFFFF81000010) == "_stext"
    assert syms.lookup(0xFFFFFFFF81000110) == "foo [mod]"
