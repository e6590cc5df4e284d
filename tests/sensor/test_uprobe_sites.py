"""The rule ``elf.probe_address`` follows, against this kernel: a uprobe past an endbr64 fires
where the instruction there is one x86's uprobes take, and never where it is lock-prefixed
(the kernel refuses it when the breakpoint would go in, after an attach that succeeded), while
the probe on the endbr64 itself fires at every call. A library built here with gcc's CET code:
``plain`` starts ``endbr64; ret``-like, ``bump`` starts ``endbr64; lock addl``."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import pytest

from otelbpf.sensor import elf

pytestmark = pytest.mark.bpf

LIB_C = """
static int counter;
void bump(void) { __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED); }
int plain(int x) { return x * 3 + counter; }
"""

PROGRAM = """
BPF_ARRAY(hits, u64, 4);
static int hit(int slot) {
    u64 *v = hits.lookup(&slot);
    if (v)
        __sync_fetch_and_add(v, 1);
    return 0;
}
int bump_at_site(struct pt_regs *ctx) { return hit(0); }
int bump_past_endbr(struct pt_regs *ctx) { return hit(1); }
int plain_at_site(struct pt_regs *ctx) { return hit(2); }
"""
CALLS = 7


def test_the_probe_site_fires_where_past_the_endbr64_would_not(tmp_path: Path) -> None:
    from bcc import BPF

    (tmp_path / "lib.c").write_text(LIB_C)
    lib = tmp_path / "libsites.so"
    subprocess.run(
        ["gcc", "-O2", "-fPIC", "-shared", "-fcf-protection=full", str(tmp_path / "lib.c"), "-o", str(lib)],
        check=True,
        capture_output=True,
    )
    sites = elf.resolve(str(lib), ["bump", "plain"])
    [bump], [plain] = sites["bump"], sites["plain"]
    assert bump.probe_vaddr == bump.vaddr and plain.probe_vaddr == plain.vaddr + 4  # the rule, read from the file
    bpf = BPF(text=PROGRAM)
    try:
        bpf.attach_uprobe(name=str(lib), addr=bump.probe_vaddr, fn_name="bump_at_site")
        bpf.attach_uprobe(name=str(lib), addr=bump.vaddr + 4, fn_name="bump_past_endbr")  # attaches, no error
        bpf.attach_uprobe(name=str(lib), addr=plain.probe_vaddr, fn_name="plain_at_site")
        loaded = ctypes.CDLL(str(lib))
        for i in range(CALLS):
            loaded.bump()
            loaded.plain(i)
        hits = bpf["hits"]
        got = [hits[hits.Key(i)].value for i in range(3)]
    finally:
        bpf.cleanup()
    assert got == [CALLS, 0, CALLS]
