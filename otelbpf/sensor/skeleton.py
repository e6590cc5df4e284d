"""The program's text with every BPF program's body emptied: its maps, types and names only.

BCC makes a BPF program of every non-static function it compiles and a map of every table
declared; LLVM's optimisation and code generation of the programs' bodies is most of a
compile's seconds (docs/BENCHMARKS.md). When the compiled programs are known already
(``program_cache``), compiling this skeleton instead gives BCC's module with the same maps
(created, with their BTF and their key and value layouts), the same program names and the
same licence in a fraction of the time; the programs themselves are then loaded from what
the earlier compile made.

The scan knows C's lexical layer only (comments, strings, preprocessor lines, braces): a
function definition is a top-level ``{`` whose declaration ends with ``)``. Static functions
(never programs; BCC inlines them) are cut to their declarations, which nothing then calls:
their bodies would cost clang's parse and BCC's rewriting of every map call and probe read
in them (the skeleton of the ``all`` program compiles in 0.6 s this way, 1.4 s with them); a
definition a macro hides is left whole. What the scan gets wrong shows as a skeleton whose
programs or maps differ from the full compile's, which the loader checks
(``program_cache.CachedPrograms.mismatch``) before it trusts any of it.
"""

from __future__ import annotations

import re

_STATIC = re.compile(r"\bstatic\b")
_VOID = re.compile(r"^\s*void\b")


def skeleton(text: str) -> str:
    """``text`` with the body of each non-static top-level function replaced by
    ``{ return 0; }`` (``{ }`` for one declared ``void``), and each static function's by
    ``;`` (a declaration)."""
    out: list[str] = []
    head: list[str] = []  # the current top-level declaration's significant text
    i, n = 0, len(text)
    line_start = True
    while i < n:
        j = _opaque_end(text, i, line_start)
        if j is not None:  # a comment, a preprocessor line or a literal: copied as it is
            if text[i] in "\"'":
                head.append(text[i:j])
                line_start = False
            out.append(text[i:j])
            i = j
            continue
        c = text[i]
        if c == "{":
            j = _block_end(text, i)
            declaration = "".join(head).strip()
            if declaration.endswith(")") and _STATIC.search(declaration):
                out.append(";")
            elif declaration.endswith(")"):
                out.append("{ }" if _VOID.match(declaration) else "{ return 0; }")
            else:
                out.append(text[i:j])
            head = []
            i = j
            line_start = False
            continue
        if c == ";":
            head = []
        else:
            head.append(c)
        out.append(c)
        if c == "\n":
            line_start = True
        elif not c.isspace():
            line_start = False
        i += 1
    return "".join(out)


def _opaque_end(text: str, i: int, line_start: bool) -> int | None:
    """If a comment, a preprocessor line (with its continuations) or a string or character
    literal starts at ``i``, the index just past it; else None. Braces inside are not code."""
    c = text[i]
    if c == "#" and line_start:
        j = i
        while j < len(text) and text[j] != "\n":
            j += 2 if text[j] == "\\" else 1
        return min(j, len(text))
    if text.startswith("//", i):
        j = text.find("\n", i)
        return len(text) if j < 0 else j
    if text.startswith("/*", i):
        j = text.find("*/", i + 2)
        return len(text) if j < 0 else j + 2
    if c in "\"'":
        j = i + 1
        while j < len(text) and text[j] != c and text[j] != "\n":
            j += 2 if text[j] == "\\" else 1
        return min(j + 1, len(text))
    return None


def _block_end(text: str, i: int) -> int:
    """Index just past the ``}`` that closes the ``{`` at ``i``."""
    depth, j, n = 0, i, len(text)
    line_start = False
    while j < n:
        end = _opaque_end(text, j, line_start)
        if end is not None:
            line_start = False
            j = end
            continue
        c = text[j]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return j + 1
        if c == "\n":
            line_start = True
        elif not c.isspace():
            line_start = False
        j += 1
    return n
