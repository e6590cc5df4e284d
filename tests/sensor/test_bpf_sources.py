"""Rules the BPF C sources keep for the compile's sake (unit tier: reads text only)."""

from __future__ import annotations

import re
from pathlib import Path

from otelbpf.sensor import program

DIRECT_READ = re.compile(r"\bbpf_probe_read_user(_str)?\s*\(")


def _sources() -> dict[str, str]:
    root = program.bpf_dir()
    return {p.name: p.read_text() for p in root.iterdir() if p.name.endswith((".c", ".h"))}


def test_user_memory_is_read_only_through_the_inlined_wrappers() -> None:
    """BCC resolves the helper in /proc/kallsyms at every direct call site (~60 ms each):
    a direct call anywhere but in common.h's two wrappers brings that cost back."""
    sources = _sources()
    assert "common.h" in sources and len(sources) > 5
    offenders = {
        name: [n for n, line in enumerate(text.splitlines(), 1) if DIRECT_READ.search(line)]
        for name, text in sources.items()
    }
    offenders["common.h"] = offenders["common.h"][2:]  # the two wrappers' own calls
    assert {k: v for k, v in offenders.items() if v} == {}
    assert len(DIRECT_READ.findall(sources["common.h"])) == 2


def test_the_wrappers_are_used() -> None:
    uses = sum(len(re.findall(r"\bread_user(_str)?\(", t)) for t in _sources().values())
    assert uses > 40  # every family reads user memory through them


def test_no_code_prints_map_keys_through_bcc() -> None:
    """The agent's BCC modules are built without the reader/writer JIT (sensor/lean_compile.py):
    BCC's text printers and parsers of keys and values then abort the process."""
    root = Path(__file__).resolve().parents[2] / "otelbpf"
    callers = [
        f"{p.relative_to(root)}:{n}"
        for p in root.rglob("*.py")
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"\.(key|leaf)_(sprintf|scanf)\(", line)
    ]
    assert callers == []
