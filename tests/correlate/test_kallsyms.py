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


def test_symbols_listed_out_of_order_keep_their_names(tmp_path):
    """/proc/kallsyms lists modules after the kernel, not by address: names follow their address."""
    table = tmp_path / "kallsyms"
    table.write_text(
        "ffffffffc0000100 t mod_b [b]\n"
        "ffffffff81000000 T _stext\n"
        "ffffffffc0000000 t mod_a [a]\n"
        "ffffffff81000300 W weak_one\n"
        "ffffffff81000200 t middle\n"
    )
    syms = KernelSymbols(str(table))
    assert len(syms) == 5
    got = [syms.lookup(a) for a in (0xFFFFFFFF81000001, 0xFFFFFFFF81000201, 0xFFFFFFFF81000301)]
    assert got == ["_stext", "middle", "weak_one"]
    assert syms.lookup(0xFFFFFFFFC0000001) == "mod_a [a]"
    assert syms.lookup(0xFFFFFFFFC0000101) == "mod_b [b]"
