"""bpf/common.h is the one source of truth for event kinds, flags and record layouts:
otelbpf/base/events.py (and the constants correlators mirror from a family's C file) must
say the same thing. No root, no BCC: the C sources are read by harness/c_header.py.

Each check returns the differences it found, so the tests below can show on mutated copies
of the sources that a difference is caught, not only that today's sources agree."""

from __future__ import annotations

import enum
import re
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from harness.c_header import C_TYPES, Define, Struct, defines, struct
from otelbpf.base import events
from otelbpf.families.profiling import probes
from otelbpf.families.profiling import profiler as profiles

BPF = Path(__file__).resolve().parents[2] / "bpf"

#: Prefixes of the shared spaces: every such constant lives in common.h.
SHARED_PREFIXES = ("EV_", "SEV_", "EVF_")


def read_sources() -> tuple[str, dict[str, str]]:
    """common.h and every family's C file (name -> text)."""
    return (BPF / "common.h").read_text(), {p.name: p.read_text() for p in sorted(BPF.glob("*.c"))}


def python_mirror() -> dict[str, int]:
    """What events.py says, keyed by the C name it mirrors."""

    def members(prefix: str, enum_type: type[enum.IntEnum], upper: bool = False) -> dict[str, int]:
        return {prefix + (m.name.upper() if upper else m.name): int(m) for m in enum_type}

    flags = {f"EVF_{name[5:]}": value for name, value in vars(events).items() if name.startswith("FLAG_")}
    sockf = {name: value for name, value in vars(events).items() if name.startswith("SOCKF_")}
    return (
        members("EV_", events.Kind)
        | members("SEV_", events.StrKind)
        | members("STAT_", events.Stat)
        | members("SF_", events.SockFunc, upper=True)
        | flags
        | sockf
        | {"SOCK_HEADER_BYTES": events.SOCK_HEADER_BYTES}
    )


def c_contract(common: str, families: dict[str, str]) -> dict[str, Define]:
    """The C side of what python_mirror() names: common.h's kinds, flags and stat slots, and
    the sockets family's record constants."""
    shared = {n: d for n, d in defines(common).items() if n.startswith((*SHARED_PREFIXES, "STAT_"))}
    shared.pop("STAT_MAX", None)  # a count, checked on its own
    sockets = {
        n: d
        for n, d in defines(families["sockets.c"]).items()
        if n.startswith(("SF_", "SOCKF_")) or n == "SOCK_HEADER_BYTES"
    }
    return shared | sockets


def constant_problems(common: str, families: dict[str, str]) -> list[str]:
    problems = []
    for file, text in families.items():
        for name in defines(text):
            if name.startswith(SHARED_PREFIXES):
                problems.append(f"{name} is defined in {file}: every event kind and flag belongs in common.h")
    c_side, py_side = c_contract(common, families), python_mirror()
    for name, d in sorted(c_side.items()):
        if d.internal:
            if name in py_side:
                problems.append(f"{name} is internal to C (its comment says so) but events.py names it")
        elif name not in py_side:
            problems.append(f"{name} = {d.value} has no mirror in otelbpf/base/events.py")
        elif py_side[name] != d.value:
            problems.append(f"{name} = {d.value} in C but {py_side[name]} in otelbpf/base/events.py")
    for name in sorted(py_side.keys() - c_side.keys()):
        problems.append(f"events.py mirrors {name} = {py_side[name]}, which bpf/ does not define")
    stat_max = defines(common).get("STAT_MAX")
    if stat_max is None or stat_max.value != len(events.Stat):
        problems.append(f"STAT_MAX is {stat_max and stat_max.value}, events.Stat has {len(events.Stat)} slots")
    for prefix in ("EV_", "SEV_"):
        seen: dict[int, str] = {}
        for name, d in c_side.items():
            if name.startswith(prefix):
                if d.value in seen:
                    problems.append(f"{name} and {seen[d.value]} share the value {d.value}")
                seen[d.value] = name
    bits = 0
    for name, d in c_side.items():
        if name.startswith("EVF_"):
            if d.value & (d.value - 1) or d.value & bits:
                problems.append(f"{name} = {d.value:#x} is not a bit of its own in event.flags")
            bits |= d.value
    return problems


def layout_problems(c: Struct, dtype: np.dtype) -> list[str]:
    """Every C member must be a numpy field of the same name, offset, size and kind (a
    ``pad`` member's kind is free; a ``u8`` array is raw bytes, 'V'); the dtype may add
    nothing else, except the payload that follows a member of unknown length."""
    problems = []
    fields = dict(dtype.fields or {})
    for f in c.fields:
        where = f"struct {c.name}.{f.name}"
        if f.name not in fields:
            problems.append(f"{where} (offset {f.offset}) is missing from the dtype")
            continue
        ftype, offset = fields.pop(f.name)[:2]
        if offset != f.offset:
            problems.append(f"{where} is at offset {f.offset} in C, {offset} in the dtype")
        if f.size is None:
            continue  # a payload: its length is each record's own
        kind = C_TYPES[f.ctype][1] if f.count == 1 else ("S" if f.ctype == "char" else "V")
        if ftype.itemsize != f.size:
            problems.append(f"{where} is {f.size} bytes in C, {ftype.itemsize} in the dtype")
        elif f.name != "pad" and ftype.kind != kind:
            problems.append(
                f"{where} is a {f.ctype}{'' if f.count == 1 else f'[{f.count}]'} in C, {ftype.str} in the dtype"
            )
    for name in fields:
        problems.append(f"the dtype's field {name} is not a member of struct {c.name}")
    if c.size is not None and c.size != dtype.itemsize:
        problems.append(f"struct {c.name} is {c.size} bytes in C, {dtype.itemsize} in the dtype")
    return problems


def struct_problems(common: str, families: dict[str, str]) -> list[str]:
    known = defines(common)
    return (
        layout_problems(struct(common, "event"), events.EVENT_DTYPE)
        + layout_problems(struct(common, "strevent"), events.STREVENT_DTYPE)
        + layout_problems(struct(families["sockets.c"], "sock_rec", known), events.SOCK_RECORD_DTYPE)
    )


def mirrored_by_name(text: str, module: ModuleType) -> list[str]:
    """A correlator's copies of its family's C constants (same names) hold the C values."""
    c_side = defines(text)
    return [
        f"{module.__name__}.{name} = {value}, but {c_side[name].value} in bpf/"
        for name, value in vars(module).items()
        if name in c_side and value != c_side[name].value
    ]


# -------------------------------------------------------------------------------------------
# Today's sources agree.
# -------------------------------------------------------------------------------------------


def test_kinds_and_flags_match_common_h() -> None:
    common, families = read_sources()
    assert constant_problems(common, families) == []


def test_record_layouts_match_the_dtypes() -> None:
    common, families = read_sources()
    assert struct_problems(common, families) == []


def test_profile_constants_match_profile_c() -> None:
    _, families = read_sources()
    names = [n for module in (probes, profiles) for n in vars(module) if n in defines(families["profile.c"])]
    assert {"PY_PENDING", "PYF_ENTRY", "STACKF_TRUNCATED"} <= set(names), "the mirror this test reads moved"
    assert mirrored_by_name(families["profile.c"], probes) == []
    assert mirrored_by_name(families["profile.c"], profiles) == []


# -------------------------------------------------------------------------------------------
# A difference is caught: the same checks on mutated copies of the sources.
# -------------------------------------------------------------------------------------------


def mutate(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"{old!r} should appear once"
    return text.replace(old, new)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("#define EV_CUDA_SYNC 14", "#define EV_CUDA_SYNC 24", "EV_CUDA_SYNC = 24 in C but 14"),
        ("#define SEV_IBV_CONTEXT 30", "#define SEV_IBV_CONTEXT 31", "SEV_IBV_CONTEXT = 31 in C but 30"),
        ("#define EVF_DRIVER 4 ", "#define EVF_DRIVER 16 ", "EVF_DRIVER = 16 in C but 4"),
        ("#define STAT_SOCK_LOST 4", "#define STAT_SOCK_LOST 9", "STAT_SOCK_LOST = 9 in C but 4"),
        (
            "#define EV_SOCK_UNKNOWN 44\n",
            "#define EV_SOCK_UNKNOWN 44\n#define EV_SOCK_NEW 46\n",
            "EV_SOCK_NEW = 46 has no mirror",
        ),
        ("#define EV_SOCK_LOCAL 45 ", "#define EV_SOCK_LOCAL 44 ", "EV_SOCK_LOCAL and EV_SOCK_UNKNOWN share"),
        ("#define EVF_IBV_POSTED 0x100 ", "#define EVF_IBV_POSTED 0x104 ", "EVF_IBV_POSTED = 0x104 is not a bit"),
        ("#define EVF_OUT_PTR 8 ", "#define EVF_OUT_PTR 1 ", "EVF_OUT_PTR = 0x1 is not a bit"),
    ],
)
def test_a_changed_constant_in_common_h_is_caught(old: str, new: str, expected: str) -> None:
    common, families = read_sources()
    problems = constant_problems(mutate(common, old, new), families)
    assert any(expected in p for p in problems), problems


def test_a_stat_max_that_is_not_the_slot_count_is_caught() -> None:
    common, families = read_sources()
    line = re.search(r"^#define STAT_MAX (\d+)", common, re.MULTILINE)
    assert line is not None
    more = int(line.group(1)) + 1
    problems = constant_problems(mutate(common, line.group(0), f"#define STAT_MAX {more}"), families)
    assert any(f"STAT_MAX is {more}" in p for p in problems), problems


def test_a_kind_defined_in_a_family_file_is_caught() -> None:
    common, families = read_sources()
    line = re.search(r"^#define EV_SOCK_LOCAL .*\n", common, re.MULTILINE)
    assert line is not None
    families["sockets.c"] = line.group(0) + families["sockets.c"]
    problems = constant_problems(common.replace(line.group(0), ""), families)
    assert "EV_SOCK_LOCAL is defined in sockets.c: every event kind and flag belongs in common.h" in problems
    assert "events.py mirrors EV_SOCK_LOCAL = 45, which bpf/ does not define" in problems


def test_a_changed_sockets_constant_is_caught() -> None:
    common, families = read_sources()
    families["sockets.c"] = mutate(families["sockets.c"], "#define SF_ACCEPT4 11", "#define SF_ACCEPT4 14")
    assert "SF_ACCEPT4 = 14 in C but 11 in otelbpf/base/events.py" in constant_problems(common, families)


def test_an_internal_constant_needs_no_mirror_but_a_public_one_does() -> None:
    common, families = read_sources()
    assert defines(common)["EV_CUDA_GET_HANDLE"].internal
    public = mutate(common, "/* internal (cuda.c): __cudaGetKernel", "/* __cudaGetKernel")
    assert "EV_CUDA_GET_HANDLE = 101 has no mirror in otelbpf/base/events.py" in constant_problems(public, families)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (
            "    u16 flags;        /* EVF_* */",
            "    u32 flags;        /* EVF_* */",
            "struct event.flags is 4 bytes in C",
        ),
        (
            "    u8  kind;         /* EV_* */\n    u8  func;",
            "    u8  func;\n    u8  kind;         /* EV_* */",
            "struct event.kind is at offset 25 in C, 24",
        ),
        ("    u8  exec; ", "    u8  execd; ", "struct strevent.execd (offset 6) is missing"),
        ("    char s[240];", "    char s[248];", "struct strevent is 264 bytes in C, 256"),
        ("    s32 ret;          /* return value", "    u32 ret;          /* return value", "struct event.ret is a u32"),
    ],
)
def test_a_changed_struct_in_common_h_is_caught(old: str, new: str, expected: str) -> None:
    common, families = read_sources()
    problems = struct_problems(mutate(common, old, new), families)
    assert any(expected in p for p in problems), problems


def test_a_changed_sock_rec_is_caught() -> None:
    common, families = read_sources()
    families["sockets.c"] = mutate(families["sockets.c"], "    u16 local_port;", "    u32 local_port;")
    problems = struct_problems(common, families)
    assert any("struct sock_rec.local_port is 4 bytes in C, 2" in p for p in problems), problems
    assert any("struct sock_rec.data is at offset 66 in C, 64" in p for p in problems), problems


def test_a_changed_profile_constant_is_caught() -> None:
    _, families = read_sources()
    text = mutate(families["profile.c"], "#define PYF_SHIM 2 ", "#define PYF_SHIM 4 ")
    assert mirrored_by_name(text, profiles) == ["otelbpf.families.profiling.profiler.PYF_SHIM = 2, but 4 in bpf/"]


# -------------------------------------------------------------------------------------------
# The reader itself.
# -------------------------------------------------------------------------------------------


def test_the_reader_lays_out_structs_as_the_compiler_does() -> None:
    text = """
    #define N 3
    struct s {
        u8 a;        /* then 7 bytes of padding */
        u64 b, c;
        u16 d[N];
        char e[5];   // then 3
    };"""
    s = struct(text, "s")
    assert [(f.name, f.offset, f.size) for f in s.fields] == [
        ("a", 0, 1),
        ("b", 8, 8),
        ("c", 16, 8),
        ("d", 24, 6),
        ("e", 30, 5),
    ]
    assert s.size == 40


def test_the_reader_reads_literals_and_internal_marks_and_refuses_the_unknown() -> None:
    text = "#define A 0x10  /* internal: x */\n#define B 7ULL // b\n#define C (A << 1)\n#define D 2\n"
    assert defines(text) == {"A": Define("A", 16, True), "B": Define("B", 7, False), "D": Define("D", 2, False)}
    with pytest.raises(ValueError, match="appears twice"):
        defines("#define A 1\n#define A 2\n")
    with pytest.raises(ValueError, match="unknown type"):
        struct("struct t { struct s inner; };", "t")
    with pytest.raises(ValueError, match="no struct u"):
        struct("struct t { u8 a; };", "u")
