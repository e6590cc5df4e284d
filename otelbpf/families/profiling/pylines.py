"""Instruction offset -> source line, from a CPython code object's ``co_linetable``.

The kernel copies each sampled code object's line table (bpf/profile.c); this decodes it
the way ``PyCode_Addr2Line`` does:

- 3.10 (PEP 626, ``Objects/lnotab_notes.txt``): (start delta, line delta) byte pairs; a
  line delta of -128 means the range has no line.
- 3.11+ (PEP 657 location table, ``Objects/locations.md``): entries that start with a byte
  whose high bit is set; bits 3-6 are the code, bits 0-2 the length in code units minus
  one. Codes 0-9 short form (same line), 10-12 one-line forms (line delta = code - 10),
  13 no column (signed varint line delta), 14 long form (signed varint line delta and three
  varints), 15 no location.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterator

CODE_UNIT = 2  # bytes per instruction (_Py_CODEUNIT)
_INT_MAX = 2**31 - 1  # line numbers are C ints
_UINT_MAX = 2**32 - 1


def _varint(table: bytes, i: int) -> tuple[int, int]:
    """Unsigned 6-bit-chunk varint as CPython writes it (low chunk first, bit 6 = more)."""
    b = table[i]
    value, shift = b & 63, 6
    i += 1
    while b & 64:
        b = table[i]
        value |= (b & 63) << shift
        shift += 6
        i += 1
    return value, i


def _svarint(table: bytes, i: int) -> tuple[int, int]:
    value, i = _varint(table, i)
    return (-(value >> 1) if value & 1 else value >> 1), i


def line_ranges_311(table: bytes, firstlineno: int) -> Iterator[tuple[int, int, int | None]]:
    """(start byte, end byte, line or None) for a 3.11+ location table, in order. A copy
    cut inside an entry ends before it."""
    line, addr, i = firstlineno, 0, 0
    try:
        while i < len(table):
            first = table[i]
            i += 1
            code, length = (first >> 3) & 15, ((first & 7) + 1) * CODE_UNIT
            if code == 15:
                current: int | None = None
            elif code == 14:
                delta, i = _svarint(table, i)
                for _ in range(3):  # end line delta, column + 1, end column + 1
                    _, i = _varint(table, i)
                line += delta
                current = line
            elif code == 13:
                delta, i = _svarint(table, i)
                line += delta
                current = line
            elif code >= 10:
                line += code - 10
                current = line
                i += 2  # column, end column
            else:
                current = line
                i += 1  # column bits
            yield addr, addr + length, current
            addr += length
    except IndexError:  # a varint runs past the copy's end
        return


def line_ranges_310(table: bytes, firstlineno: int) -> Iterator[tuple[int, int, int | None]]:
    """(start byte, end byte, line or None) for a 3.10 line table, in order."""
    line, addr = firstlineno, 0
    for i in range(0, len(table) - 1, 2):
        sdelta, ldelta = table[i], table[i + 1]
        ldelta = ldelta - 256 if ldelta > 127 else ldelta
        if ldelta != -128:
            line += ldelta
        if sdelta:
            yield addr, addr + sdelta, None if ldelta == -128 else line
        addr += sdelta


class LineIndex:
    """A code object's line table decoded once, looked up by bisection: profiles ask for
    many offsets of the same functions every interval. Decoding stops at a line no C
    ``int`` holds: bytes that are not this code's table (a code object freed and its
    memory reused before a long table was read) name no line beyond that point.

    Held as two C arrays (8 bytes a range, ``_NO_LINE`` for a range without a line): the
    profiler keeps one per code object it has named, thousands on a busy host, and lists of
    Python ints took ~5x that (issue 14)."""

    _NO_LINE = -1  # line numbers are never negative

    def __init__(self, table: bytes, firstlineno: int, version: tuple[int, int]) -> None:
        self.firstlineno = firstlineno
        self._ends = array("I")
        self._lines = array("i")
        ranges = line_ranges_310(table, firstlineno) if version < (3, 11) else line_ranges_311(table, firstlineno)
        for _start, end, line in ranges:  # contiguous from offset 0
            if line is not None and not 0 <= line <= _INT_MAX:
                break
            if end > _UINT_MAX:
                break  # no code object is 4 GiB long: not this code's table
            self._ends.append(end)
            self._lines.append(self._NO_LINE if line is None else line)

    def line(self, offset: int) -> int | None:
        """The line of the instruction at byte ``offset``; None where the table says none,
        or when it (possibly a truncated copy) does not reach the offset."""
        if offset < 0:
            return self.firstlineno  # not started yet: its def line
        i = bisect.bisect_right(self._ends, offset)
        if i >= len(self._ends):
            return None
        line = self._lines[i]
        return None if line == self._NO_LINE else line


def line_for(table: bytes, firstlineno: int, offset: int, version: tuple[int, int]) -> int | None:
    """The line of the instruction at byte ``offset`` (see ``LineIndex.line``)."""
    return LineIndex(table, firstlineno, version).line(offset)
