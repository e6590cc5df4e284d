"""The signals a pipeline carries: the OTLP signals, and profiles (pprof files, Pyroscope)."""

from __future__ import annotations

from typing import Literal, TypeAlias

Signal: TypeAlias = Literal["traces", "metrics"]
SIGNALS: tuple[Signal, ...] = ("traces", "metrics")
#: Every pipeline a config may define: the OTLP signals, and profiles (pprof: files, Pyroscope).
PIPELINE_SIGNALS: tuple[str, ...] = (*SIGNALS, "profiles")
