"""A profile as every profile exporter takes it: encoded once (gzipped pprof), whatever the number
of exporters, with the stacks kept for encoders other than pprof (OTLP) and the process's
resource; and the protocol those exporters follow. The exporters (``profile_export.py``'s files,
``pyroscope.py``, ``otlp_profiles.py``) import this, and ``profile_export.py`` chooses among them:
no exporter imports the module that chooses it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Protocol

from otelbpf.correlate.profile_record import Profile, ProfileMeta
from otelbpf.export import pprof


@dataclass(frozen=True)
class ProfileRecord(ProfileMeta):
    pprof: bytes  # gzipped profile.proto
    profile: Profile | None = None  # the stacks themselves, for encoders other than pprof (OTLP)
    resource: Mapping[str, object] = field(default_factory=dict)  # the process's, as its spans carry it


def encoded(profile: Profile, resource: Mapping[str, object] | None = None) -> ProfileRecord:
    """The profiler's profile as exporters send it: encoded once, whatever the number of exporters."""
    meta = {f.name: getattr(profile, f.name) for f in fields(ProfileMeta)}
    return ProfileRecord(**meta, pprof=pprof.encode(profile), profile=profile, resource=resource or {})


class ProfileExporter(Protocol):
    def export(self, records: Sequence[ProfileRecord]) -> None:
        """Take the records (never block for long); failures are counted, not raised."""

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Send what is queued within ``timeout_s``, then stop."""
