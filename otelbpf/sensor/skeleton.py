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
(``program_cache.CachedPrograms.matches``) before it trusts any of it.
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
        c = text[i]
        if c == "#" and line_start:  # a preprocessor line, with its continuations
            j = i
            while j < n and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j])
            i = j
            continue
        if text.startswith("//", i) or text.startswith("/*", i):
            j = _comment_end(text, i)
            out.append(text[i:j])
            i = j
            continue
        if c in "\"'":
            j = _literal_end(text, i)
            out.append(text[i:j])
            head.append(text[i:j])
            i = j
            line_start = False
            continue
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


def _comment_end(text: str, i: int) -> int:
    if text.startswith("//", i):
        j = text.find("\n", i)
        return len(text) if j < 0 else j
    j = text.find("*/", i + 2)
    return len(text) if j < 0 else j + 2


def _literal_end(text: str, i: int) -> int:
    quote, j = text[i], i + 1
    while j < len(text) and text[j] != quote and text[j] != "\n":
        j += 2 if text[j] == "\\" else 1
    return min(j + 1, len(text))


def _block_end(text: str, i: int) -> int:
    """Index just past the ``}`` that closes the ``{`` at ``i`` (comments, strings and
    preprocessor lines inside skipped)."""
    depth, j, n = 0, i, len(text)
    line_start = False
    while j < n:
        c = text[j]
        if c == "#" and line_start:
            while j < n and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            continue
        if text.startswith("//", j) or text.startswith("/*", j):
            j = _comment_end(text, j)
            continue
        if c in "\"'":
            j = _literal_end(text, j)
            line_start = False
            continue
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
