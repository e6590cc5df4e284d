"""A small reader of the BPF C sources' constants and record structs, for parity tests.

It reads exactly what ``bpf/`` writes for the kernel/user-space contract: ``#define NAME
<integer>`` lines (decimal or hex, with an optional trailing comment) and ``struct NAME { ...
};`` declarations whose fields are BPF's fixed-width integers or ``char`` arrays. Fields are
laid out as the C compiler does on x86-64 and arm64: each aligned to its element size, the
struct padded to its widest member. Anything else (macros with bodies, function-like macros,
other types) is left alone rather than guessed at: a struct using an unknown type raises.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Element size in bytes and numpy kind ('u' unsigned, 'i' signed, 'S' bytes) of each C type.
C_TYPES: dict[str, tuple[int, str]] = {
    "u8": (1, "u"),
    "u16": (2, "u"),
    "u32": (4, "u"),
    "u64": (8, "u"),
    "s8": (1, "i"),
    "s16": (2, "i"),
    "s32": (4, "i"),
    "s64": (8, "i"),
    "char": (1, "S"),
}

_DEFINE = re.compile(
    r"^[ \t]*#define[ \t]+([A-Z_][A-Z0-9_]*)[ \t]+(0[xX][0-9a-fA-F]+|\d+)[uUlL]*[ \t]*"
    r"(?:/\*(.*?)(?:\*/|$)|//(.*))?[ \t]*$",
    re.MULTILINE,
)
_STRUCT = re.compile(r"\bstruct[ \t]+([a-z_][a-z0-9_]*)[ \t\n]*\{(.*?)\}[ \t\n]*;", re.DOTALL)
_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.DOTALL)
_DECLARATOR = re.compile(r"^([a-z_][a-z0-9_]*)(?:\[([A-Za-z0-9_]+)\])?$")


@dataclass(frozen=True)
class Define:
    """``#define name value``; ``internal``: its comment starts with "internal" (C-only)."""

    name: str
    value: int
    internal: bool


@dataclass(frozen=True)
class Field:
    """One struct member: ``count`` elements of ``ctype`` (``count`` None: an array sized by a
    macro this reader does not know, such as a variable-length payload)."""

    name: str
    ctype: str
    count: int | None
    offset: int

    @property
    def element_size(self) -> int:
        return C_TYPES[self.ctype][0]

    @property
    def size(self) -> int | None:
        return None if self.count is None else self.element_size * self.count


@dataclass(frozen=True)
class Struct:
    name: str
    fields: tuple[Field, ...]
    size: int | None  # None when a member's size is unknown


def defines(text: str) -> dict[str, Define]:
    """Every integer ``#define`` of ``text``; a name defined twice raises (C would warn)."""
    found: dict[str, Define] = {}
    for m in _DEFINE.finditer(text):
        name, literal = m.group(1), m.group(2)
        comment = (m.group(3) or m.group(4) or "").strip()
        if name in found:
            raise ValueError(f"#define {name} appears twice")
        found[name] = Define(name, int(literal, 0), comment.lower().startswith("internal"))
    return found


def struct(text: str, name: str, known: dict[str, Define] | None = None) -> Struct:
    """The declaration ``struct name { ... };`` of ``text``, laid out; array sizes may be
    integers or names defined in ``text`` or ``known``."""
    for m in _STRUCT.finditer(text):
        if m.group(1) == name:
            sizes = {d.name: d.value for d in (known or {}).values()} | {
                d.name: d.value for d in defines(text).values()
            }
            return _layout(name, _COMMENT.sub(" ", m.group(2)), sizes)
    raise ValueError(f"no struct {name} declared")


def _layout(name: str, body: str, sizes: dict[str, int]) -> Struct:
    fields: list[Field] = []
    offset, widest = 0, 1
    for decl in filter(None, (d.strip() for d in body.split(";"))):
        ctype, _, rest = decl.partition(" ")
        if ctype not in C_TYPES:
            raise ValueError(f"struct {name}: unknown type in {decl!r}")
        element = C_TYPES[ctype][0]
        widest = max(widest, element)
        for declarator in (d.strip() for d in rest.split(",")):
            m = _DECLARATOR.match(declarator)
            if m is None:
                raise ValueError(f"struct {name}: cannot read {declarator!r}")
            if offset is None:
                raise ValueError(f"struct {name}: {m.group(1)} follows a member of unknown size")
            offset = -(-offset // element) * element
            bound = m.group(2)
            count = 1 if bound is None else int(bound) if bound.isdigit() else sizes.get(bound)
            fields.append(Field(m.group(1), ctype, count, offset))
            offset = None if count is None else offset + element * count
    size = None if offset is None else -(-offset // widest) * widest
    return Struct(name, tuple(fields), size)
