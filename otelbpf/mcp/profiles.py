"""The heaviest functions of one pprof profile (what ``flamegraph_top`` answers).

The file is the pprof the agent wrote (export/pprof.py, ``profile.proto``), read with the
same generated module. Each function gets its self value (samples where it is the leaf)
and its total (samples whose stack holds it, counted once per sample even when recursive),
and cites the samples that weigh most in it, by index in the file's ``sample`` list.
"""

from __future__ import annotations

import zlib
from collections import defaultdict

from google.protobuf.message import DecodeError

from otelbpf.export.proto import profile_pb2
from otelbpf.mcp.folder import JsonObject

#: Refuse a profile that inflates past this (a gzip bomb, or not the agent's file).
MAX_PROFILE_BYTES = 64 << 20
CITED_SAMPLES = 3


class ProfileError(Exception):
    """The file is not a readable pprof profile, or the sample type is unknown."""


def _decode(raw: bytes) -> profile_pb2.Profile:
    try:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS) if raw[:2] == b"\x1f\x8b" else None
        body = d.decompress(raw, MAX_PROFILE_BYTES + 1) if d else raw
    except zlib.error as exc:
        raise ProfileError(f"not gzip: {exc}") from None
    if len(body) > MAX_PROFILE_BYTES:
        raise ProfileError(f"inflates past {MAX_PROFILE_BYTES >> 20} MiB")
    p = profile_pb2.Profile()
    try:
        p.ParseFromString(body)
    except DecodeError as exc:
        raise ProfileError(f"not a pprof profile: {exc}") from None
    return p


def top_functions(raw: bytes, n: int, sample_type: str | None = None) -> JsonObject:
    """The ``n`` functions with the largest total value, with their self value and cited samples."""
    p = _decode(raw)
    strings = p.string_table
    types = [strings[t.type] for t in p.sample_type]
    if not types:
        raise ProfileError("the profile has no sample type")
    if sample_type is None:
        default = strings[p.default_sample_type] if p.default_sample_type else ""
        index = types.index(default) if default in types else len(types) - 1
    elif sample_type in types:
        index = types.index(sample_type)
    else:
        raise ProfileError(f"no sample type {sample_type!r}; this profile has {', '.join(types)}")
    names = {f.id: strings[f.name] or f"[function {f.id}]" for f in p.function}
    loc_funcs = {
        loc.id: [names.get(line.function_id, "?") for line in loc.line] or [f"[0x{loc.address:x}]"]
        for loc in p.location
    }
    total_of: dict[str, int] = defaultdict(int)
    self_of: dict[str, int] = defaultdict(int)
    cited: dict[str, list[tuple[int, int]]] = defaultdict(list)
    grand = 0
    for i, s in enumerate(p.sample):
        value = s.value[index] if index < len(s.value) else 0
        if not value:
            continue
        grand += value
        frames = [f for lid in s.location_id for f in loc_funcs.get(lid, ["?"])]
        if frames:
            self_of[frames[0]] += value  # leaf first (pprof order)
        for fn in set(frames):
            total_of[fn] += value
            cited[fn].append((value, i))
    ranked = sorted(total_of, key=lambda fn: (-total_of[fn], fn))[:n]
    return {
        "sample_type": types[index],
        "unit": strings[p.sample_type[index].unit],
        "samples": len(p.sample),
        "total": grand,
        "functions": [
            {
                "function": fn,
                "total": total_of[fn],
                "self": self_of.get(fn, 0),
                "total_share": round(total_of[fn] / grand, 4) if grand else 0.0,
                "samples": [i for _v, i in sorted(cited[fn], key=lambda x: (-x[0], x[1]))[:CITED_SAMPLES]],
            }
            for fn in ranked
        ],
    }
