"""Probe-site resolution on real ELF files: the system libc, NVIDIA's libcudart from the
wheel, the built stand-in libcudart, and small libraries built here with gcc.

Every address is checked against what binutils (readelf, objdump) say about the same file,
so the tests do not trust pyelftools to check itself.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.agent import FAKE_CUDART, real_cudart
from otelbpf.sensor import elf

pytestmark = pytest.mark.usefixtures("built")

LIBC = Path("/lib/x86_64-linux-gnu/libc.so.6")


def dynsym(path: Path) -> list[tuple[int, str, str, str | None, bool]]:
    """(address, type, name, version, is default version) of defined dynamic symbols, per readelf."""
    out = subprocess.run(["readelf", "-W", "--dyn-syms", str(path)], check=True, capture_output=True, text=True)
    rows = []
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) < 8 or not parts[0].rstrip(":").isdigit() or parts[6] == "UND":
            continue
        name, default, version = re.match(r"([^@]+)(?:(@@?)(.*))?", parts[7]).groups()
        rows.append((int(parts[1], 16), parts[3], name, version, default == "@@"))
    return rows


def instruction_bytes(path: Path, vaddr: int, n: int = 4) -> bytes:
    """The first ``n`` bytes of code at ``vaddr``, as objdump disassembles them."""
    out = subprocess.run(
        ["objdump", "-d", f"--start-address={vaddr:#x}", f"--stop-address={vaddr + n:#x}", str(path)],
        check=True,
        capture_output=True,
        text=True,
    )
    code = bytearray()
    for line in out.stdout.splitlines():
        m = re.match(r"\s*[0-9a-f]+:\t((?:[0-9a-f]{2} )+)", line)
        if m:
            code += bytes.fromhex(m.group(1))
    return bytes(code[:n])


def file_bytes(path: Path, offset: int, n: int = 4) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(n)


def test_versioned_symbol_gives_one_site_per_version_in_the_real_libc() -> None:
    sites = elf.resolve(str(LIBC), ["realpath"])["realpath"]
    expected = {(addr, version) for addr, kind, name, version, _d in dynsym(LIBC) if name == "realpath"}
    assert {(s.vaddr, s.version) for s in sites} == expected
    assert {v for _a, v in expected} == {"GLIBC_2.3", "GLIBC_2.2.5"}
    for site in sites:
        assert site.names == ("realpath",)
        assert file_bytes(LIBC, site.file_offset) == instruction_bytes(LIBC, site.vaddr)


def test_one_name_under_two_versions_at_one_address_is_one_site_named_once() -> None:
    """libc exports sem_getvalue@GLIBC_2.2.5 and sem_getvalue@@GLIBC_2.34 at the same address."""
    rows = [(addr, version) for addr, kind, name, version, _d in dynsym(LIBC) if name == "sem_getvalue"]
    assert len(rows) == 2 and len({a for a, _v in rows}) == 1
    sites = elf.resolve(str(LIBC), ["sem_getvalue"])["sem_getvalue"]
    assert len(sites) == 1
    assert sites[0].vaddr == rows[0][0]
    assert sites[0].names == ("sem_getvalue",)


def test_aliases_in_the_real_libc_are_one_site_with_every_name() -> None:
    by_name = {name: addr for addr, kind, name, _v, _d in dynsym(LIBC) if name in ("pwrite", "pwrite64")}
    assert by_name["pwrite"] == by_name["pwrite64"]
    sites = elf.resolve(str(LIBC), ["pwrite64", "pwrite"])
    assert list(sites) == ["pwrite64"]  # reported under the first name asked for
    [site] = sites["pwrite64"]
    assert site.vaddr == by_name["pwrite"]
    assert site.names == ("pwrite64", "pwrite")


def test_ifunc_resolvers_are_not_probe_sites() -> None:
    """memcpy@@GLIBC_2.14 is an IFUNC: its address is the resolver, run once at relocation,
    never the copy itself. Only the plain function memcpy@GLIBC_2.2.5 is a site."""
    rows = {(addr, kind, version) for addr, kind, name, version, _d in dynsym(LIBC) if name == "memcpy"}
    ifunc = {addr for addr, kind, _v in rows if kind == "IFUNC"}
    plain = {(addr, version) for addr, kind, version in rows if kind == "FUNC"}
    assert ifunc and plain
    sites = elf.resolve(str(LIBC), ["memcpy"])["memcpy"]
    assert {(s.vaddr, s.version) for s in sites} == plain


def test_absent_names_are_left_out_and_has_any_agrees() -> None:
    assert elf.resolve(str(LIBC), ["no_such_function_otelbpf", "getppid"]).keys() == {"getppid"}
    assert elf.has_any(str(LIBC), ["no_such_function_otelbpf", "getppid"])
    assert not elf.has_any(str(LIBC), ["no_such_function_otelbpf"])


def test_real_libcudart_sites_match_readelf_and_objdump() -> None:
    lib = real_cudart()
    names = ["cudaLaunchKernel", "cudaLaunchKernel_ptsz", "cudaMalloc", "cudaMemcpyAsync", "cudaStreamSynchronize"]
    sites = elf.resolve(str(lib), names)
    table = {name: (addr, version) for addr, kind, name, version, _d in dynsym(lib) if kind == "FUNC"}
    assert sites.keys() == set(names)
    for name in names:
        [site] = sites[name]
        assert (site.vaddr, site.version) == table[name]
        assert site.version == "libcudart.so.12"
        head = file_bytes(lib, site.file_offset)
        assert head == instruction_bytes(lib, site.vaddr)
        # NVIDIA's build is not CET-enabled: probes stay on the symbol.
        assert head != elf.ENDBR64
        assert site.probe_vaddr == site.vaddr and not site.skipped_endbr64


def test_stand_in_libcudart_probes_after_endbr64() -> None:
    names = ["cudaLaunchKernel", "cudaMalloc", "cudaFree", "cudaMemcpy", "cudaDeviceSynchronize"]
    sites = elf.resolve(str(FAKE_CUDART), names)
    table = {name: addr for addr, kind, name, _v, _d in dynsym(FAKE_CUDART) if kind == "FUNC"}
    for name in names:
        [site] = sites[name]
        assert site.vaddr == table[name]
        assert instruction_bytes(FAKE_CUDART, site.vaddr) == elf.ENDBR64 == file_bytes(FAKE_CUDART, site.file_offset)
        assert site.probe_vaddr == site.vaddr + 4 and site.skipped_endbr64


TINY_C = """
void f(void) {}
void g(void) __attribute__((alias("f")));
int h(int x) { return x * 3; }
static int hidden(int x) { return x + 1; }
int (*keep)(int) = hidden;
static int counter;
void bump(void) { __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED); } /* endbr64; lock addl */
int bumped(void) { return counter; }
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CET-built .so whose code is loaded 2 MiB above its file offset, with an alias."""
    d = tmp_path_factory.mktemp("tiny")
    (d / "tiny.c").write_text(TINY_C)
    out = d / "libtiny.so"
    subprocess.run(
        [
            "gcc",
            "-O2",
            "-fPIC",
            "-shared",
            "-fcf-protection=full",
            "-Wl,-Ttext-segment=0x200000",
            str(d / "tiny.c"),
            "-o",
            str(out),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return out


def test_alias_built_with_gcc_is_one_site_with_both_names(tiny: Path) -> None:
    addrs = {name: addr for addr, kind, name, _v, _d in dynsym(tiny) if kind == "FUNC"}
    assert addrs["f"] == addrs["g"]
    assert "hidden" not in addrs
    sites = elf.resolve(str(tiny), ["g", "f", "h", "hidden"])
    assert sites.keys() == {"g", "h"}
    [alias] = sites["g"]
    assert alias.names == ("g", "f") and alias.vaddr == addrs["f"] and alias.version is None
    [h] = sites["h"]
    assert h.names == ("h",)


def test_file_offsets_follow_the_load_segments(tiny: Path) -> None:
    sites = elf.resolve(str(tiny), ["f", "h"])
    for [site] in sites.values():
        assert site.vaddr >= 0x200000 > site.file_offset  # code loaded well above its place in the file
        assert file_bytes(tiny, site.file_offset) == instruction_bytes(tiny, site.vaddr) == elf.ENDBR64
        assert site.probe_vaddr == site.vaddr + 4


def test_a_lock_prefixed_instruction_after_endbr64_is_probed_on_the_endbr64(tiny: Path) -> None:
    """x86's uprobes refuse a lock-prefixed instruction, silently, when the breakpoint would go
    in (tests/sensor/test_uprobe_sites.py shows it on this kernel): ``bump`` is probed at sym+0."""
    [site] = elf.resolve(str(tiny), ["bump"])["bump"]
    assert instruction_bytes(tiny, site.vaddr) == elf.ENDBR64
    assert file_bytes(tiny, site.file_offset + 4)[:1] == b"\xf0"  # lock
    assert site.probe_vaddr == site.vaddr and not site.skipped_endbr64


@pytest.mark.parametrize(
    ("after", "skipped"),
    [
        (b"\x55\x48\x89\xe5", True),  # push %rbp
        (b"\x48\x83\xec\x08", True),  # sub $8,%rsp (REX is no legacy prefix)
        (b"\xf0\x83\x05\x00", False),  # lock addl
        (b"\x66\xf0\x0f\xb1", False),  # operand size, then lock: cmpxchg
        (b"\x64\x48\x8b\x04", True),  # %fs: (the stack protector's canary load)
        (b"\x2e\x0f\x1f\x84", False),  # %cs: (a long nop's form)
        (b"", True),  # the file ended after the endbr64: nothing refused there
    ],
)
def test_probe_address_skips_endbr64_unless_the_kernel_refuses_what_follows(after: bytes, skipped: bool) -> None:
    assert elf.probe_address(0x1000, elf.ENDBR64 + after) == (0x1004 if skipped else 0x1000)
    assert elf.probe_address(0x1000, b"\x55" + after) == 0x1000  # no endbr64: the function's start


def test_a_library_replaced_on_disk_is_read_again(tiny: Path, tmp_path: Path) -> None:
    lib = tmp_path / "libswap.so"
    shutil.copy(tiny, lib)
    assert elf.resolve(str(lib), ["h"]).keys() == {"h"}
    shutil.copy(LIBC, tmp_path / "libswap.tmp")
    (tmp_path / "libswap.tmp").replace(lib)  # a new inode, as a package upgrade leaves it
    assert elf.resolve(str(lib), ["h"]) == {}
    assert elf.resolve(str(lib), ["getppid"]).keys() == {"getppid"}


def test_non_elf_file_is_an_elf_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "libcudart.so.12"
    path.write_text("this is a linker script, not a library\n")
    with pytest.raises(elf.ElfError, match=re.escape(str(path)) + r": malformed ELF: Magic number does not match"):
        elf.resolve(str(path), ["cudaMalloc"])
    with pytest.raises(elf.ElfError, match=re.escape(str(path))):
        elf.has_any(str(path), ["cudaMalloc"])


@pytest.mark.parametrize("keep", [30, 2000, "half"])
def test_truncated_elf_is_an_elf_error_naming_the_file(tmp_path: Path, keep: int | str) -> None:
    data = FAKE_CUDART.read_bytes()
    cut = data[: len(data) // 2 if keep == "half" else keep]
    path = tmp_path / "libcudart.so.12"
    path.write_bytes(cut)
    with pytest.raises(elf.ElfError) as error:
        elf.resolve(str(path), ["cudaMalloc"])
    assert str(error.value).startswith(f"{path}: malformed ELF: ")


def test_elf_without_dynamic_symbols_is_an_elf_error(tmp_path: Path) -> None:
    obj = tmp_path / "f.o"
    (tmp_path / "f.c").write_text("int f(void) { return 1; }\n")
    subprocess.run(["gcc", "-c", str(tmp_path / "f.c"), "-o", str(obj)], check=True)
    with pytest.raises(elf.ElfError, match=re.escape(f"{obj}: no .dynsym section (not a shared library?)")):
        elf.resolve(str(obj), ["f"])


def test_missing_file_raises_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        elf.resolve(str(tmp_path / "absent.so"), ["f"])


# -- .symtab: a CUDA runtime linked statically into an nvcc program ---------------------

STATIC_NAMES = [
    "cudaLaunchKernel",
    "cudaLaunchKernel_ptsz",
    "cudaMalloc",
    "cudaFree",
    "cudaMemcpy",
    "cudaDeviceSynchronize",
    "__cudaRegisterFunction",
    "__cudaGetKernel",
    "__cudaLaunchKernel",
]


def nm_functions(path: Path) -> dict[str, tuple[set[int], str]]:
    """name -> (addresses, nm type letters) of code symbols, per binutils' nm."""
    out = subprocess.run(["nm", "--defined-only", str(path)], check=True, capture_output=True, text=True)
    rows: dict[str, tuple[set[int], str]] = {}
    for line in out.stdout.splitlines():
        addr, letter, name = line.split(maxsplit=2)
        if letter in "tT":
            addrs, letters = rows.setdefault(name, (set(), ""))
            addrs.add(int(addr, 16))
            rows[name] = (addrs, letters + letter)
    return rows


def test_static_runtime_is_invisible_to_dynsym(nvcc_programs: dict[str, Path]) -> None:
    program = nvcc_programs["static"]
    assert not [r for r in dynsym(program) if r[2].startswith(("cuda", "__cuda"))]
    assert elf.resolve(str(program), STATIC_NAMES) == {}


def test_symtab_sites_of_a_static_runtime_match_nm_and_objdump(nvcc_programs: dict[str, Path]) -> None:
    program = nvcc_programs["static"]
    table = nm_functions(program)
    sites = elf.resolve(str(program), STATIC_NAMES, symtab=True)
    assert sites.keys() == set(STATIC_NAMES)
    for name in STATIC_NAMES:
        addrs, _letters = table[name]
        assert {s.vaddr for s in sites[name]} == addrs, name
        for site in sites[name]:
            assert site.names == (name,) and site.version is None
            head = file_bytes(program, site.file_offset)
            assert head == instruction_bytes(program, site.vaddr)
            assert site.probe_vaddr == (site.vaddr + 4 if head == elf.ENDBR64 else site.vaddr)
    # The runtime's entry points are local symbols: what .dynsym-only resolution never saw.
    assert {"cudaLaunchKernel", "cudaMalloc", "__cudaRegisterFunction"} <= {
        n for n in STATIC_NAMES if table[n][1] == "t"
    }


def test_symtab_names_stored_inside_longer_names_are_found(nvcc_programs: dict[str, Path]) -> None:
    """ld stores "cudaLaunchKernel" as the tail of "__cudaLaunchKernel" in .strtab: a search
    for the name between two NULs would miss it."""
    program = nvcc_programs["static"]
    strtab = subprocess.run(
        ["readelf", "-W", "-p", ".strtab", str(program)], check=True, capture_output=True, text=True
    ).stdout
    strings = {line.split("]", 1)[1].strip() for line in strtab.splitlines() if "]" in line}
    assert "__cudaLaunchKernel" in strings and "cudaLaunchKernel" not in strings
    [site] = elf.resolve(str(program), ["cudaLaunchKernel"], symtab=True)["cudaLaunchKernel"]
    assert {site.vaddr} == nm_functions(program)["cudaLaunchKernel"][0]


def test_symtab_and_dynsym_aliases_are_one_site(tiny: Path) -> None:
    """.symtab repeats the exported functions: each address is still one site, with every name."""
    sites = elf.resolve(str(tiny), ["g", "f", "h", "hidden"], symtab=True)
    addrs = {name: addr for addr, kind, name, _v, _d in dynsym(tiny) if kind == "FUNC"}
    [alias] = sites["g"]
    assert alias.names == ("g", "f") and alias.vaddr == addrs["f"]
    [hidden] = sites["hidden"]  # a static function: only .symtab has it
    assert hidden.vaddr == nm_functions(tiny)["hidden"][0].pop()


def test_content_tells_a_static_runtime_from_a_shared_one_and_a_stripped_copy(nvcc_programs: dict[str, Path]) -> None:
    static = elf.content(str(nvcc_programs["static"]), "cudaLaunchKernel")
    assert static.has_symtab and static.defines
    shared = elf.content(str(nvcc_programs["shared"]), "cudaLaunchKernel")
    assert shared.has_symtab and not shared.defines  # cudaLaunchKernel is an undefined import there
    gone = elf.content(str(nvcc_programs["stripped"]), "cudaLaunchKernel")
    assert not gone.has_symtab and not gone.defines
    assert gone.named_in_rodata and "libc.so.6" in gone.needed
    assert not any(n.startswith("libcudart") for n in gone.needed)
    assert elf.content(str(LIBC), "cudaLaunchKernel") == elf.Content(False, False, False, ())


def test_stripped_static_runtime_has_no_symbols_and_says_so(nvcc_programs: dict[str, Path]) -> None:
    program = nvcc_programs["stripped"]
    with pytest.raises(elf.NoSymbols, match=re.escape(f"{program}: no .symtab (stripped)")):
        elf.resolve(str(program), STATIC_NAMES, symtab=True)


def test_truncated_static_program_is_an_elf_error(nvcc_programs: dict[str, Path], tmp_path: Path) -> None:
    data = nvcc_programs["static"].read_bytes()
    path = tmp_path / "truncated"
    path.write_bytes(data[: len(data) - 4096])  # section headers (at the end) cut off
    with pytest.raises(elf.ElfError, match=re.escape(str(path))):
        elf.resolve(str(path), STATIC_NAMES, symtab=True)
    with pytest.raises(elf.ElfError, match=re.escape(str(path))):
        elf.content(str(path), "cudaLaunchKernel")


def test_lru_cache_forgets_the_least_recently_used() -> None:
    cache: elf.LruCache[str, int] = elf.LruCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # now "b" is the oldest
    cache.put("c", 3)
    assert (cache.get("a"), cache.get("b"), cache.get("c"), len(cache)) == (1, None, 3, 2)
