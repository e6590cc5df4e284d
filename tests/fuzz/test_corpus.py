"""Every crash or hang fuzzing ever found, replayed: tests/fuzz/corpus/<target>/<case> holds the
input (as bench/fuzz.py copied it from libFuzzer, or as written for an issue's row), and each
must now finish within 2 s without breaking the target's invariants."""

from __future__ import annotations

from pathlib import Path

import pytest

from fuzz.targets import TARGETS
from fuzz.test_fuzz import bounded

CORPUS = Path(__file__).parent / "corpus"
CASES = sorted(p for p in CORPUS.glob("*/*") if p.is_file())


def test_the_corpus_is_there():
    """An empty or misplaced corpus would pass every case by having none."""
    assert {p.parent.name for p in CASES} == set(TARGETS)


@pytest.mark.parametrize("case", CASES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_case(case: Path):
    bounded(TARGETS[case.parent.name], case.read_bytes())
