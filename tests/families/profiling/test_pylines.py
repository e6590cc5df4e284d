"""Line tables decoded here against each installed interpreter's own ``co_lines()``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from otelbpf.families.profiling.pylines import line_for

PYENV = Path.home() / ".pyenv" / "versions"

DUMP = """
import json, types, argparse, json.decoder, inspect
def walk(co):
    yield co
    for c in co.co_consts:
        if isinstance(c, types.CodeType):
            yield from walk(c)
out = []
for m in (argparse, json.decoder, inspect):
    for co in walk(compile(open(m.__file__).read(), m.__file__, "exec")):
        out.append([co.co_linetable.hex(), co.co_firstlineno, [list(x) for x in co.co_lines()]])
print(json.dumps(out))
"""


@pytest.mark.heavy
@pytest.mark.parametrize("version", ["3.10", "3.11", "3.12", "3.13"])
def test_every_instruction_gets_the_interpreters_line(version):
    found = sorted(PYENV.glob(f"{version}.*/bin/python{version}"))
    if not found:
        pytest.skip(f"CPython {version} is not installed here")
    data = json.loads(subprocess.run([str(found[-1]), "-c", DUMP], check=True, capture_output=True, text=True).stdout)
    ver = tuple(int(x) for x in version.split("."))
    checked = 0
    for table, first, lines in data:
        raw = bytes.fromhex(table)
        for start, end, line in lines:
            for offset in range(start, end, 2):
                assert line_for(raw, first, offset, ver) == line
                checked += 1
    assert checked > 10_000


def test_an_instruction_not_started_has_the_def_line_and_a_short_table_none():
    assert line_for(b"", 7, -2, (3, 11)) == 7
    assert line_for(b"", 7, 40, (3, 11)) is None


def test_a_copy_cut_inside_an_entry_keeps_the_lines_before_it():
    """The kernel copies the first 1 KiB of a line table; once the process is gone that copy
    is all there is, and it may end inside a varint. (It used to raise, losing the round.)"""

    def f(x):
        y = x + 1
        z = y * 2
        return z

    code = f.__code__
    cut = code.co_linetable + bytes([0x80 | (14 << 3), 0xC1])  # long form; its varint says "more", then the end
    for start, _end, line in code.co_lines():
        assert line_for(cut, code.co_firstlineno, start, sys.version_info[:2]) == line
    assert line_for(cut, code.co_firstlineno, len(code.co_code) + 4, sys.version_info[:2]) is None


def test_a_line_no_c_int_holds_ends_the_table():
    """Bytes that are not this code's table (its memory reused before it was read) must not
    give lines pprof cannot encode: the ranges before the impossible line stand."""

    def f(x):
        return x + 1

    code = f.__code__
    garbage = bytes([0x80 | (13 << 3)]) + bytes([0x7F] * 8) + bytes([0x3F])  # one varint, ~2**59 lines on
    bad = code.co_linetable + garbage + code.co_linetable
    ver = sys.version_info[:2]
    for start, _end, line in code.co_lines():
        assert line_for(bad, code.co_firstlineno, start, ver) == line
    after = sum(end - start for start, end, _ in code.co_lines())
    assert line_for(bad, code.co_firstlineno, after, ver) is None
    assert line_for(bad, code.co_firstlineno, after + 4, ver) is None
