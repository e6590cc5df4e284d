"""Member offsets of the running kernel's structs, read from its BTF.

BCC compiles against whatever kernel headers are installed, which may not be the running
kernel's (here: 6.1 headers on a 6.18 kernel), so a struct offset must never come from them.
``/sys/kernel/btf/vmlinux`` describes the running kernel exactly; this module reads just
enough of that format (linux/btf.h: header, type records, string section) to answer
"at which byte of struct S is member a.b.c".
"""

from __future__ import annotations

import struct
from array import array
from functools import cache

VMLINUX = "/sys/kernel/btf/vmlinux"

_MAGIC = 0xEB9F
_STRUCT, _UNION = 4, 5
# Bytes that follow the 12-byte common header, per kind: fixed part and per-vlen-entry part.
_EXTRA = {
    1: (4, 0),  # INT
    2: (0, 0),  # PTR
    3: (12, 0),  # ARRAY
    4: (0, 12),  # STRUCT
    5: (0, 12),  # UNION
    6: (0, 8),  # ENUM
    7: (0, 0),  # FWD
    8: (0, 0),  # TYPEDEF
    9: (0, 0),  # VOLATILE
    10: (0, 0),  # CONST
    11: (0, 0),  # RESTRICT
    12: (0, 0),  # FUNC
    13: (0, 8),  # FUNC_PROTO
    14: (4, 0),  # VAR
    15: (0, 12),  # DATASEC
    16: (0, 0),  # FLOAT
    17: (4, 0),  # DECL_TAG
    18: (0, 0),  # TYPE_TAG
    19: (0, 12),  # ENUM64
}
_QUALIFIERS = {8, 9, 10, 11, 18}  # typedef, volatile, const, restrict, type tag


class BtfError(Exception):
    """BTF is absent or not in a format this reader knows."""


class Btf:
    """The type records of one BTF blob, indexed by id: four uint32s each (kind, name offset,
    size or type, record position) in one C array, names left in the string section until
    asked for. A vmlinux has ~150k records; as Python tuples, with every struct's name
    decoded, the index took ~27 MiB of the agent's start for the one offset it answers."""

    def __init__(self, data: bytes) -> None:
        magic, _version, _flags, hdr_len = struct.unpack_from("<HBBI", data, 0)
        if magic != _MAGIC:
            raise BtfError(f"not BTF (magic {magic:#x})")
        type_off, type_len, str_off, str_len = struct.unpack_from("<IIII", data, 8)
        self._strings = data[hdr_len + str_off : hdr_len + str_off + str_len]
        self._types = array("I", (0, 0, 0, 0))  # id 0 is void
        self._data = data
        pos, end = hdr_len + type_off, hdr_len + type_off + type_len
        unpack, extra, types = struct.Struct("<III").unpack_from, _EXTRA, self._types
        while pos < end:
            name_off, info, size_or_type = unpack(data, pos)
            kind = (info >> 24) & 0x1F
            if kind not in extra:
                raise BtfError(f"unknown BTF kind {kind}")
            types.extend((kind, name_off, size_or_type, pos))
            fixed, per = extra[kind]
            pos += 12 + fixed + per * (info & 0xFFFF)

    def _struct_id(self, name: str) -> int | None:
        """The first struct named ``name``, as the type ids go."""
        wanted, needle, at = set(), b"\0" + name.encode() + b"\0", -1  # the section starts with a NUL
        while (at := self._strings.find(needle, at + 1)) >= 0:
            wanted.add(at + 1)
        types = self._types
        for type_id in range(1, len(types) // 4):
            if types[4 * type_id] == _STRUCT and types[4 * type_id + 1] in wanted:
                return type_id
        return None

    def _name(self, off: int) -> str:
        end = self._strings.index(b"\0", off)
        return self._strings[off:end].decode()

    def _resolve(self, type_id: int) -> int:
        while self._types[4 * type_id] in _QUALIFIERS:
            type_id = self._types[4 * type_id + 2]
        return type_id

    def _members(self, type_id: int) -> list[tuple[str, int, int]]:
        """(name, type id, byte offset) of a struct or union's members."""
        pos = self._types[4 * type_id + 3]
        info = struct.unpack_from("<I", self._data, pos + 4)[0]
        bitfield_encoding = info >> 31
        out = []
        for i in range(info & 0xFFFF):
            name_off, member_type, offset = struct.unpack_from("<III", self._data, pos + 12 + 12 * i)
            bits = offset & 0xFFFFFF if bitfield_encoding else offset
            out.append((self._name(name_off) if name_off else "", member_type, bits // 8))
        return out

    def _find(self, type_id: int, member: str) -> tuple[int, int] | None:
        """(type id, byte offset) of ``member``, looking through anonymous structs and unions."""
        for name, member_type, offset in self._members(type_id):
            if name == member:
                return member_type, offset
            resolved = self._resolve(member_type)
            if not name and self._types[4 * resolved] in (_STRUCT, _UNION):
                found = self._find(resolved, member)
                if found is not None:
                    return found[0], offset + found[1]
        return None

    def offset(self, struct_name: str, path: str) -> int:
        """Byte offset of ``path`` (``thread.fsbase``) inside ``struct struct_name``."""
        type_id = self._struct_id(struct_name)
        if type_id is None:
            raise BtfError(f"struct {struct_name} is not in the kernel's BTF")
        total = 0
        for part in path.split("."):
            found = self._find(self._resolve(type_id), part)
            if found is None:
                raise BtfError(f"struct {struct_name} has no member {path!r} (stopped at {part!r})")
            type_id, offset = found
            total += offset
        return total


def vmlinux() -> Btf:
    """The running kernel's BTF; raises BtfError naming the fix when it is missing.

    Not cached: parsed, it holds ~8 MiB (the file and its 150k type records' index) for the
    few offsets asked of it; callers cache their answers instead."""
    try:
        with open(VMLINUX, "rb") as f:
            return Btf(f.read())
    except OSError as exc:
        raise BtfError(
            f"cannot read {VMLINUX} ({exc.strerror}): the kernel was built without CONFIG_DEBUG_INFO_BTF"
        ) from None


@cache
def task_fsbase_offset() -> int:
    """Offset of ``task_struct.thread.fsbase`` (x86-64): a thread's TLS base, which is also
    its ``pthread_self()`` in glibc and musl."""
    return vmlinux().offset("task_struct", "thread.fsbase")
