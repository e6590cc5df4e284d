"""The signals a pipeline carries: the OTLP signals, and profiles (pprof files, Pyroscope)."""

from __future__ import annotations

from typing import Literal, TypeAlias

#: What OTLP exporters send.
Signal: TypeAlias = Literal["traces", "metrics"]
SIGNALS: tuple[Signal, ...] = ("traces", "metrics")
#: Every pipeline a config may define: the OTLP signals, and profiles (pprof: files, Pyroscope).
PipelineSignal: TypeAlias = Literal["traces", "metrics", "profiles"]
PIPELINE_SIGNALS: tuple[PipelineSignal, ...] = ("traces", "metrics", "profiles")
