"""Build gzipped pprof profiles (google/pprof ``profile.proto``, the generated module).

One ``ProfileBuilder`` per process and profile kind: samples are stacks (``Frame``s, leaf
first) with one value per sample type and string labels. Functions, locations, mappings
and strings are deduplicated as the format intends.
"""

from __future__ import annotations

import gzip
from collections.abc import Mapping, Sequence

from otelbpf.correlate.profile_record import CPU_SAMPLE_TYPES, MEMORY_SAMPLE_TYPES, Profile
from otelbpf.correlate.stacks import Frame
from otelbpf.export.proto import profile_pb2

__all__ = ["CPU_SAMPLE_TYPES", "MEMORY_SAMPLE_TYPES", "ProfileBuilder", "encode"]


class ProfileBuilder:
    def __init__(
        self,
        sample_types: Sequence[tuple[str, str]],
        *,
        time_ns: int,
        duration_ns: int,
        period_type: tuple[str, str] | None = None,
        period: int = 0,
        default_sample_type: str = "",
        comments: Sequence[str] = (),
    ) -> None:
        self._p = profile_pb2.Profile()
        self._strings: dict[str, int] = {}
        self._s("")
        for type_, unit in sample_types:
            self._p.sample_type.add(type=self._s(type_), unit=self._s(unit))
        if period_type is not None:
            self._p.period_type.type = self._s(period_type[0])
            self._p.period_type.unit = self._s(period_type[1])
            self._p.period = period
        self._p.time_nanos = time_ns
        self._p.duration_nanos = duration_ns
        if default_sample_type:
            self._p.default_sample_type = self._s(default_sample_type)
        for c in comments:
            self._p.comment.append(self._s(c))
        self._functions: dict[tuple[object, ...], int] = {}
        self._locations: dict[tuple[object, ...], int] = {}
        self._mappings: dict[tuple[object, ...], int] = {}
        self.samples = 0

    def _s(self, text: str) -> int:
        index = self._strings.get(text)
        if index is None:
            index = self._strings[text] = len(self._p.string_table)
            self._p.string_table.append(text)
        return index

    def _mapping(self, f: Frame) -> int:
        start, end, offset = f.mapping
        if not f.path and not end:
            return 0
        key = (f.path, start, end, offset)
        mid = self._mappings.get(key)
        if mid is None:
            mid = self._mappings[key] = len(self._p.mapping) + 1
            self._p.mapping.add(
                id=mid,
                memory_start=start,
                memory_limit=end,
                file_offset=offset,
                filename=self._s(f.path),
                build_id=self._s(f.build_id),
                has_functions=True,
            )
        return mid

    def _function(self, f: Frame) -> int:
        key = (f.function, f.filename, f.start_line)
        fid = self._functions.get(key)
        if fid is None:
            fid = self._functions[key] = len(self._p.function) + 1
            name = self._s(f.function)
            self._p.function.add(
                id=fid, name=name, system_name=name, filename=self._s(f.filename), start_line=f.start_line
            )
        return fid

    def _location(self, f: Frame) -> int:
        mapping = self._mapping(f) if f.kind == "native" else 0
        key = (f.kind, mapping, f.address, f.function, f.filename, f.line, f.start_line)
        lid = self._locations.get(key)
        if lid is None:
            lid = self._locations[key] = len(self._p.location) + 1
            loc = self._p.location.add(id=lid, mapping_id=mapping, address=f.address)
            loc.line.add(function_id=self._function(f), line=f.line)
        return lid

    def add(self, frames: Sequence[Frame], values: Sequence[int], labels: Mapping[str, str | int]) -> None:
        sample = self._p.sample.add(location_id=[self._location(f) for f in frames], value=list(values))
        for key, value in labels.items():
            if isinstance(value, int):
                sample.label.add(key=self._s(key), num=value)
            else:
                sample.label.add(key=self._s(key), str=self._s(value))
        self.samples += 1

    def encode(self) -> bytes:
        """The serialized profile, gzipped (what pprof tools and Pyroscope read)."""
        return gzip.compress(self._p.SerializeToString(), compresslevel=6)


def encode(profile: Profile) -> bytes:
    """A profile from the profiler as gzipped pprof."""
    b = ProfileBuilder(
        profile.sample_types,
        time_ns=profile.start_ns,
        duration_ns=max(profile.end_ns - profile.start_ns, 1),
        period_type=profile.period_type,
        period=profile.period,
        default_sample_type=profile.default_sample_type,
    )
    for sample in profile.samples:
        b.add(sample.frames, sample.values, sample.labels)
    return b.encode()
