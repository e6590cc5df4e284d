"""Call trees for the report's flame graphs: stacks merged into a tree of totals, read from
the profiling receiver's pprof files, and written as the nested ``{name, value, children}``
objects that d3-flame-graph draws (``value`` is a frame's total, its children included).
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass, field
from typing import TypedDict

from otelbpf.export.proto import profile_pb2

#: Frames narrower than this share of a graph's total are left out of the page (unreadable
#: anyway, and they would make it large); their parent keeps their value.
MIN_FRAME_SHARE = 0.002
MAX_DEPTH = 128


class FlameNode(TypedDict):
    """A frame as d3-flame-graph reads it."""

    name: str
    value: int
    children: list[FlameNode]


@dataclass
class Node:
    name: str
    value: int = 0
    children: dict[str, Node] = field(default_factory=dict)

    def add(self, frames: list[str], value: int) -> None:
        """``frames`` root first."""
        self.value += value
        node = self
        for f in frames[:MAX_DEPTH]:
            node = node.children.setdefault(f, Node(f))
            node.value += value

    def to_json(self, min_share: float = MIN_FRAME_SHARE) -> FlameNode:
        """The tree as d3-flame-graph reads it, children below ``min_share`` of the root left out."""
        floor = self.value * min_share

        def walk(node: Node) -> FlameNode:
            kids = [walk(c) for c in sorted(node.children.values(), key=lambda n: -n.value) if c.value >= floor]
            return {"name": node.name, "value": node.value, "children": kids}

        return walk(self)


def read_profile(path: str, prefer: str | None = None) -> tuple[str, list[tuple[list[str], int]]]:
    """(sample type, [(frames root first, value)]) of one pprof file: the values of the type
    named ``prefer`` (e.g. ``alloc_space``) if it has one, else of ``cpu`` (a CPU profile's
    time), else of the profile's default sample type, else of its first."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    prof = profile_pb2.Profile()
    prof.ParseFromString(data)
    strings = list(prof.string_table)
    names = [strings[t.type] for t in prof.sample_type]
    types = [f"{strings[t.type]}/{strings[t.unit]}" for t in prof.sample_type]
    default = strings[prof.default_sample_type] if prof.default_sample_type else None
    index = next((names.index(n) for n in (prefer, "cpu", default) if n and n in names), 0)
    functions = {fn.id: strings[fn.name] for fn in prof.function}
    locations: dict[int, list[str]] = {}
    for loc in prof.location:
        # lines are innermost first within one location (inlined calls)
        locations[loc.id] = [functions.get(line.function_id, "?") for line in loc.line] or [f"0x{loc.address:x}"]
    samples = []
    for s in prof.sample:
        if index >= len(s.value):
            continue
        frames: list[str] = []
        for lid in s.location_id:  # leaf first
            frames.extend(locations.get(lid, ["?"]))
        samples.append((frames[::-1], int(s.value[index])))
    return (types[index] if types else "samples/count"), samples
