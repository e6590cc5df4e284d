"""Load a program the way a warm agent start does: from the program cache.

A cache directory is filled by a first ``program.load`` (a compile, then unloaded); the
second load of the same text is a ``CachedBPF`` (the skeleton compiled, the programs
loaded from the entry). Tests run their checks against both loads to show that the cached
programs behave as the compiled ones.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from typing import Any

from otelbpf.sensor import program
from otelbpf.sensor.family import ProbeFamily
from otelbpf.sensor.program_cache import ProgramCache


def load(text: str, cflags: Sequence[str], families: Sequence[ProbeFamily], *, cached: bool) -> Any:
    """``program.load`` compiling (``cached=False``) or from a freshly filled cache."""
    if not cached:
        return program.load(text, cflags, families)
    with tempfile.TemporaryDirectory(prefix="otelbpf-cache-") as directory:
        cache = ProgramCache(directory, 4)
        first = program.load(text, cflags, families, cache)
        assert not getattr(first, "from_cache", False)
        first.cleanup()
        bpf = program.load(text, cflags, families, cache)
    assert getattr(bpf, "from_cache", False), "the second load did not come from the cache"
    return bpf
