"""Read pprof files back with a real pprof consumer: `go tool pprof -raw` (Debian golang-go).

``read(path)`` runs it and parses what it prints: samples (values, leaf-first frames,
labels) with each location as (function, file, line).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

_LOCATION = re.compile(r"^\s*(\d+): (0x[0-9a-f]+)(?: M=\d+)? (.*) (\S*):(-?\d+) s=(-?\d+)(?:\((.*)\))?\s*$")
_LINE_MORE = re.compile(r"^\s+(.*) (\S*):(-?\d+) s=(-?\d+)(?:\((.*)\))?\s*$")
_SAMPLE = re.compile(r"^\s*([\d ]+):((?: \d+)*)\s*$")
_LABEL = re.compile(r"(\S+):\[([^\]]*)\]")


@dataclass(frozen=True)
class Loc:
    function: str
    file: str
    line: int


@dataclass
class Sample:
    values: list[int]
    frames: list[Loc]  # leaf first
    labels: dict[str, str]

    def functions(self) -> list[str]:
        return [f.function for f in self.frames]


@dataclass
class RawProfile:
    sample_types: list[str]  # "type/unit"
    samples: list[Sample]

    def total(self, index: int = 0) -> int:
        return sum(s.values[index] for s in self.samples)


def go() -> str:
    path = shutil.which("go")
    if path is None:
        raise AssertionError("`go` is not installed: scripts/setup.sh --test installs Debian's golang-go")
    return path


def read(path: Path | str) -> RawProfile:
    out = subprocess.run([go(), "tool", "pprof", "-raw", str(path)], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise AssertionError(f"go tool pprof -raw {path} failed:\n{out.stderr}")
    return parse_raw(out.stdout)


def parse_raw(text: str) -> RawProfile:
    lines = text.splitlines()
    section = ""
    types: list[str] = []
    raw_samples: list[tuple[list[int], list[int], dict[str, str]]] = []
    locations: dict[int, list[Loc]] = {}
    current: list[Loc] | None = None
    for line in lines:
        if line in ("Samples:", "Locations", "Mappings"):
            section = line
            continue
        if section == "Samples:":
            if not types:
                types = [t.removesuffix("[dflt]") for t in line.split()]
                continue
            m = _SAMPLE.match(line)
            if m and "[" not in line:
                raw_samples.append(([int(v) for v in m.group(1).split()], [int(i) for i in m.group(2).split()], {}))
            elif raw_samples:
                raw_samples[-1][2].update(_LABEL.findall(line))
        elif section == "Locations":
            m = _LOCATION.match(line)
            if m:
                current = locations[int(m.group(1))] = [_loc(m.group(3), m.group(7), m.group(4), m.group(5))]
                continue
            m = _LINE_MORE.match(line)
            if m and current is not None:  # an inlined frame of the same location
                current.append(_loc(m.group(1), m.group(5), m.group(2), m.group(3)))
    samples = [
        Sample(values, [loc for i in ids for loc in locations[i]], labels) for values, ids, labels in raw_samples
    ]
    return RawProfile(types, samples)


def _loc(name: str, system: str | None, file: str, line: str) -> Loc:
    return Loc(name.strip() or (system or ""), file, int(line))


def read_all(directory: Path) -> dict[Path, RawProfile]:
    """Every pprof file under ``directory``, each read back by go tool pprof."""
    files = sorted(directory.rglob("*.pb.gz"))
    return {f: read(f) for f in files}
