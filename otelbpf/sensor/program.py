"""Assemble one BPF program from the shared parts and the enabled families.

One compile per agent (BCC takes ~1-2 s each): common.h, the generated
library-name filter, discovery.c, then every family's C file and generated
entry points.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from otelbpf.sensor.family import ProbeFamily


@cache
def bpf_dir() -> Traversable:
    """``bpf/`` of a source checkout (and an editable install), else the copy a wheel
    carries as package data (``otelbpf/bpf/``, put there by setup.py)."""
    checkout = Path(__file__).resolve().parents[2] / "bpf"
    if (checkout / "common.h").is_file():
        return checkout
    return resources.files("otelbpf").joinpath("bpf")


def _bpf_source(name: str) -> str:
    return bpf_dir().joinpath(name).read_text()


def _prefix_test(prefix: str) -> str:
    return " && ".join(f"name[{i}] == {ord(c)}" for i, c in enumerate(prefix))


def library_filter_c(prefixes: list[str]) -> str:
    """``wanted_library(name)``: does a file name start with a watched prefix?

    Byte comparisons rather than string literals keep the program free of
    .rodata, which BCC handles unevenly across versions.
    """
    body = "\n".join(f"    if ({_prefix_test(p)})\n        return 1;" for p in sorted(set(prefixes)))
    return f"static __always_inline int wanted_library(const char *name)\n{{\n{body}\n    return 0;\n}}\n"


def build(
    families: list[ProbeFamily],
    *,
    filter_pids: bool,
    pause_on_load: bool = False,
    events_ring_bytes: int,
    str_ring_bytes: int = 256 * 1024,
    inflight_entries: int = 16384,
) -> tuple[str, list[str]]:
    """Return (C text, cflags) for BCC."""
    page = 4096
    prefixes = [k.open_prefix for f in families for k in f.libraries if k.open_prefix]
    parts = [_bpf_source("common.h"), library_filter_c(prefixes), _bpf_source("discovery.c")]
    cflags = [
        f"-DEVENTS_RING_PAGES={events_ring_bytes // page}",
        f"-DSTR_RING_PAGES={str_ring_bytes // page}",
        f"-DINFLIGHT_ENTRIES={inflight_entries}",
    ]
    if filter_pids:
        cflags.append("-DFILTER_PIDS=1")
    cflags.append(f"-DPAUSE_ON_LOAD={int(pause_on_load)}")  # 1: stop a process at its library open
    if any(k.content_symbol for f in families for k in f.libraries):
        cflags.append("-DEXEC_REPORT=1")  # executables are recognised by content: report execs
    for fam in families:
        if fam.c_file:  # a poller family (gpu: NVML) has no C
            parts.append(_bpf_source(fam.c_file))
        parts.append(fam.generated_c)
        cflags.extend(fam.cflags)
    return "\n".join(parts), cflags
