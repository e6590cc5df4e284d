"""The BTF reader: member offsets from a blob built here record by record (linux/btf.h), and
from the running kernel's own BTF."""

from __future__ import annotations

import os
import struct

import pytest

from otelbpf.sensor import btf

INT, STRUCT, UNION, TYPEDEF, CONST = 1, 4, 5, 8, 10


class Blob:
    """A BTF blob: type records appended in id order (from 1), names interned in the string
    section, which starts with the empty name as the format requires."""

    def __init__(self) -> None:
        self.types = b""
        self.strings = b"\0"

    def name(self, text: str) -> int:
        if not text:
            return 0
        at = self.strings.find(b"\0" + text.encode() + b"\0")
        if at >= 0:
            return at + 1
        self.strings += text.encode() + b"\0"
        return len(self.strings) - len(text) - 1

    def add(self, kind: int, name: str, size_or_type: int, extra: bytes = b"", vlen: int = 0, flag: int = 0) -> None:
        info = (flag << 31) | (kind << 24) | vlen
        self.types += struct.pack("<III", self.name(name), info, size_or_type) + extra

    def composite(self, kind: int, name: str, size: int, members: list[tuple[str, int, int]], flag: int = 0) -> None:
        """A struct or union; members are (name, type id, offset field as written)."""
        extra = b"".join(struct.pack("<III", self.name(n), t, off) for n, t, off in members)
        self.add(kind, name, size, extra, vlen=len(members), flag=flag)

    def bytes(self) -> bytes:
        header = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(self.types), len(self.types), len(self.strings))
        return header + self.types + self.strings


def kernel_like() -> bytes:
    b = Blob()
    b.add(INT, "int", 4, struct.pack("<I", 32))  # 1
    b.composite(STRUCT, "thread_struct", 24, [("sp", 1, 0), ("fsbase", 1, 64)])  # 2
    b.composite(UNION, "", 24, [("nested", 2, 0)])  # 3: anonymous
    b.add(TYPEDEF, "thread_t", 2)  # 4
    b.add(CONST, "", 4)  # 5: const thread_t
    b.composite(STRUCT, "task_struct_ext", 8, [("thread", 1, 0)])  # 6: a name that starts the same
    # 7: bit offsets; "flags" a bitfield in a kind_flag struct (size in the top 8 bits)
    b.composite(STRUCT, "task_struct", 64, [("pad", 1, 0), ("", 3, 64), ("thread", 5, 256)])
    b.composite(STRUCT, "packed", 8, [("flags", 1, (3 << 24) | 40), ("after", 1, 48)], flag=1)  # 8
    return b.bytes()


def test_offsets_through_typedefs_qualifiers_and_anonymous_members():
    parsed = btf.Btf(kernel_like())
    assert parsed.offset("task_struct", "thread.fsbase") == 32 + 8
    assert parsed.offset("task_struct", "nested.fsbase") == 8 + 8  # through the anonymous union
    assert parsed.offset("task_struct_ext", "thread") == 0
    assert parsed.offset("packed", "after") == 6  # kind_flag: the offset's low 24 bits
    assert parsed.offset("packed", "flags") == 5


def test_a_name_is_matched_whole_and_what_is_missing_is_said():
    parsed = btf.Btf(kernel_like())
    with pytest.raises(btf.BtfError, match="struct task is not"):
        parsed.offset("task", "thread")
    with pytest.raises(btf.BtfError, match="no member 'thread.gsbase'"):
        parsed.offset("task_struct", "thread.gsbase")
    with pytest.raises(btf.BtfError, match="struct thread_t is not"):
        parsed.offset("thread_t", "fsbase")  # a typedef is not a struct


def test_bad_magic_and_an_unknown_kind_are_errors():
    with pytest.raises(btf.BtfError, match="not BTF"):
        btf.Btf(b"\0" * 32)
    b = Blob()
    b.add(31, "odd", 0)
    with pytest.raises(btf.BtfError, match="unknown BTF kind 31"):
        btf.Btf(b.bytes())


def test_the_running_kernels_task_struct():
    """x86-64: ``thread`` is task_struct's last member but for the arch-specific tail, and
    ``fsbase`` a u64 inside it."""
    if not os.path.exists(btf.VMLINUX):
        if os.environ.get("CI") == "true":  # CI's kernel has BTF: Python stacks depend on it
            pytest.fail(f"no {btf.VMLINUX} on this machine")
        pytest.skip("this kernel has no BTF")
    offset = btf.task_fsbase_offset()
    parsed = btf.vmlinux()
    assert offset == parsed.offset("task_struct", "thread.fsbase") > parsed.offset("task_struct", "thread") > 0
    assert offset % 8 == 0
    assert parsed.offset("task_struct", "pid") < parsed.offset("task_struct", "thread")
