"""Operator selection by name pattern and the sites the torch family probes: the mangled
``at::_ops::<op>::call`` names, the ``ret`` instructions of a body, and the whole path on a
small C++ library built here with the same namespaces (g++), so no torch is needed."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from otelbpf.families.torch.probes import (
    ENTRY_PROGRAM,
    EXIT_PROGRAM,
    SiteCache,
    operator_of,
    operator_sites,
    return_sites,
    select_operators,
    torch_family,
)
from otelbpf.sensor import elf

MM = "_ZN2at4_ops2mm4callERKNS_6TensorES4_"
SOFTMAX_INT = "_ZN2at4_ops11softmax_int4callERKNS_6TensorElSt8optionalIN3c1010ScalarTypeEE"
SOFTMAX_OUT = "_ZN2at4_ops15softmax_int_out4callERKNS_6TensorElSt8optionalIN3c1010ScalarTypeEERS2_"
MM_REDISPATCH = "_ZN2at4_ops2mm10redispatchEN3c1014DispatchKeySetERKNS_6TensorES6_"


def test_operator_of_reads_the_name_between_the_namespaces_and_call():
    assert operator_of(MM) == "mm"
    assert operator_of(SOFTMAX_INT) == "softmax_int"
    assert operator_of(MM_REDISPATCH) is None  # internal hop, never probed
    assert operator_of("_ZN2at6native2mmERKNS_6TensorES3_") is None
    assert operator_of("_ZN2at4_ops99mm") is None  # a length past the end of the name
    assert operator_of("ncclAllReduce") is None


def test_patterns_select_operators_by_shell_pattern():
    names = [MM, SOFTMAX_INT, SOFTMAX_OUT, MM_REDISPATCH, "malloc"]
    assert select_operators(names, ["mm"]) == {"mm": MM}
    assert select_operators(names, ["softmax*"]) == {"softmax_int": SOFTMAX_INT, "softmax_int_out": SOFTMAX_OUT}
    assert select_operators(names, ["softmax_int", "m?"]) == {"mm": MM, "softmax_int": SOFTMAX_INT}
    assert select_operators(names, ["Mm"]) == {}  # case-sensitive, like the names


def test_return_sites_decode_instructions_not_bytes():
    code = bytes.fromhex(
        "55"  # push rbp
        "4889e5"  # mov rbp, rsp
        "b8c3000000"  # mov eax, 0xc3: a 0xc3 byte that is no ret
        "85c0"  # test eax, eax
        "7402"  # je +2
        "5d"  # pop rbp
        "c3"  # ret            (offset 14)
        "31c0"  # xor eax, eax
        "5d"  # pop rbp
        "f3c3"  # repz ret       (offset 18)
    )
    assert return_sites(code, 0x1000) == (0x1000 + 14, 0x1000 + 18)


SOURCE = r"""
namespace at {
struct Tensor { long v; };
namespace _ops {
struct mm { static Tensor call(const Tensor &a, const Tensor &b); static Tensor redispatch(int, const Tensor &a); };
struct softmax_int { static Tensor call(const Tensor &a, long dim); };
struct embedding { static Tensor call(const Tensor &a); };
__attribute__((noinline)) Tensor mm::call(const Tensor &a, const Tensor &b) {
    if (a.v < 0) return Tensor{b.v};
    return Tensor{a.v * b.v};
}
Tensor mm::redispatch(int, const Tensor &a) { return a; }
__attribute__((noinline)) Tensor softmax_int::call(const Tensor &a, long dim) { return Tensor{a.v + dim}; }
Tensor embedding::call(const Tensor &a) { return a; }
}  // namespace _ops
}  // namespace at
"""


@pytest.fixture(scope="module")
def ops_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("ops")
    (tmp / "ops.cc").write_text(SOURCE)
    lib = tmp / "libtorch_cpu.so"
    subprocess.run(["g++", "-O2", "-shared", "-fPIC", "-o", str(lib), str(tmp / "ops.cc")], check=True)
    return lib


def test_sites_of_the_selected_operators(ops_library: Path):
    sites = {s.operator: s for s in operator_sites(str(ops_library), ["mm", "softmax*"])}
    assert set(sites) == {"mm", "softmax_int"}  # not embedding, not the redispatch
    exported = elf.exported_sites(str(ops_library), "_ZN2at4_ops")
    assert {operator_of(n) for n in exported} == {"mm", "softmax_int", "embedding", None}  # None: redispatch
    mangled = next(n for n in exported if operator_of(n) == "mm")
    (site,) = exported[mangled]
    (named,) = elf.resolve(str(ops_library), [mangled])[mangled]  # the same site as by name
    assert (site.vaddr, site.probe_vaddr, site.file_offset) == (named.vaddr, named.probe_vaddr, named.file_offset)
    assert sites["mm"].entry == site.probe_vaddr
    assert sites["mm"].exits and all(site.vaddr < e < site.vaddr + site.size for e in sites["mm"].exits)
    with open(ops_library, "rb") as f:
        for addr in sites["mm"].exits:
            f.seek(site.file_offset + addr - site.vaddr)
            assert f.read(1) in (b"\xc3", b"\xf3")


def test_family_probes_an_entry_and_every_return(ops_library: Path):
    cache = SiteCache(["mm"])
    probes = cache.probes(str(ops_library))
    (site,) = cache.sites(str(ops_library))
    assert [(p.vaddr, p.program) for p in probes] == [(site.entry, ENTRY_PROGRAM)] + [
        (e, EXIT_PROGRAM) for e in site.exits
    ]
    assert not any(p.ret for p in probes)  # no uretprobe: C++ exceptions must unwind
    fam = torch_family(["mm"], max_depth=8)
    assert fam.library_kind("libtorch_cpu.so") is not None and fam.library_kind("libtorch_cuda.so") is None
    assert "-DTORCH_DEPTH=8" in fam.cflags
    with pytest.raises(ValueError, match="power of two"):
        torch_family(["mm"], max_depth=12)
