"""The ``targets`` and ``service`` sections: which processes are watched, and the pipelines
that wire receivers through processors to exporters per signal, with the agent's own rhythm."""

from __future__ import annotations

from typing import Annotated, Literal, TypeAlias

from pydantic import Field, ValidationInfo, field_validator

from otelbpf.base.terminal import has_controlling_terminal
from otelbpf.config.fields import FilePath, Section, http_url, unique
from otelbpf.config.units import PositiveDuration, RingSize, Size

#: What of a watched process's command line its resource carries (``correlate/process_info.py``).
CommandLine: TypeAlias = Literal["redacted", "full", "command"]


class TargetsConfig(Section):
    """Which processes are watched: all, or only ``pids`` and their descendants; and what of
    their command lines leaves the agent: ``redacted`` (secrets replaced, ``base/secrets.py``),
    ``full`` (as the process has it), or ``command`` (``process.command`` and
    ``process.args_count`` only, the semantic conventions' choice where arguments are
    sensitive)."""

    pids: list[Annotated[int, Field(gt=0, le=1 << 22)]] = []  # PID_MAX_LIMIT
    command_line: CommandLine = "redacted"

    @field_validator("pids")
    @classmethod
    def _pids(cls, value: list[int]) -> list[int]:
        return unique(value, "pid")


class PipelineConfig(Section):
    """Which receivers feed one signal, through which processors (in order), to which exporters."""

    receivers: list[str]
    processors: list[str] = []
    exporters: list[str]

    @field_validator("receivers", "exporters")
    @classmethod
    def _not_empty(cls, value: list[str], info: ValidationInfo) -> list[str]:
        kind = str(info.field_name)
        if not value:
            raise ValueError(f"a pipeline needs at least one of its {kind}")
        return unique(value, kind.removesuffix("s"))

    @field_validator("processors")
    @classmethod
    def _processors(cls, value: list[str]) -> list[str]:
        return unique(value, "processor")


class PipelinesConfig(Section):
    traces: PipelineConfig | None = None
    metrics: PipelineConfig | None = None
    profiles: PipelineConfig | None = None


class SelfProfilingConfig(Section):
    """The agent profiling its own CPU into Pyroscope with pyroscope-io, as ``otelbpf-agent``
    (``otelbpf/export/self_profiling.py``). Off by default: a sampler thread reads the agent's
    stacks ``sample_rate`` times a second and pushes every 10 s. ``endpoint`` (a Pyroscope
    base URL) defaults to the profiles pipeline's pyroscope exporter's, credentials included."""

    enabled: bool = False
    endpoint: str | None = None
    sample_rate: int = Field(100, ge=1, le=1000)  # Hz

    @field_validator("endpoint")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return http_url(value, "http://localhost:4040")


class TelemetryConfig(Section):
    """The agent's own rhythm: metric export period, ring-buffer drain period, log level; and
    whether it profiles itself."""

    metrics_interval: PositiveDuration = 10_000_000_000
    drain_interval: PositiveDuration = 50_000_000
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    #: Records drained from the rings and not yet processed, at most (bytes): a processing
    #: thread held up (a slow export, a starved CPU) costs this much memory, then drops, counted
    #: (``otelbpf.events.dropped{reason=processing_queue_full}``).
    processing_queue_size: Size = Field(16 << 20, ge=1 << 20, le=1 << 30)
    #: The kernel's ring for names (library opens, execs, process names): a host starting many
    #: processes at once can fill it, counted as ``otelbpf.events.lost{reason=string_ring_full}``.
    string_ring_size: RingSize = 256 << 10
    self_profiling: SelfProfilingConfig = SelfProfilingConfig()


class FindingsConfig(Section):
    """The diagnosis run live in the agent (live/findings.py): ``otelbpf.finding`` spans linked
    to their evidence, and ``otelbpf.finding.cost``/``share`` gauges, at the metrics rhythm."""

    enabled: bool = True
    #: A finding still present is sent again as a span at most this often (its gauges go
    #: out at every metrics export).
    repeat_interval: PositiveDuration = 60_000_000_000


class ProgramCacheConfig(Section):
    """Compiled BPF programs kept for the next start (``sensor/program_cache.py``): a start
    whose program text, kernel and BCC are those of an earlier one loads that compile's
    programs instead of compiling (seconds less). ``directory`` is created owner-only and is
    not used if anyone but the agent's user can write in it; ``""`` turns the cache off.
    The ``max_entries`` most recently used programs are kept (each ~0.1-0.5 MB)."""

    directory: FilePath = "/var/cache/otelbpf"
    max_entries: int = Field(8, ge=1, le=1000)

    @field_validator("directory")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if value and not value.startswith("/"):
            raise ValueError(f'{value!r} is relative: the cache directory is an absolute path (or "" for none)')
        return value


class HostPauseConfig(Section):
    """Host mode (no ``--pid``, no command): a process that opens a CUDA, NCCL, ibverbs (or
    torch) library from a path not yet attached in its cgroup is stopped (SIGSTOP from the
    BPF program) at that open until the probes are in (~0.5 s for a new library file, a few
    ms for one already attached), so its first calls, kernel registrations and communicators
    are seen; at most ``max_pause``, after which it is resumed unprobed and counted
    (``otelbpf.pauses{outcome=timeout}``). A guard process resumes every stopped process if
    the agent dies (``sensor/pause_guard.py``). ``otelbpf run --`` always pauses.

    ``auto`` (the default) pauses only where the agent has no controlling terminal, as a
    DaemonSet or a service runs it. An agent started from a terminal is on a machine where
    people run jobs from interactive shells, and a job-control shell that sees its foreground
    job stopped takes the terminal back: the job, resumed, runs on in the background, where
    Ctrl-C no longer reaches it and a read from the terminal stops it again."""

    enabled: bool | Literal["auto"] = "auto"

    def on(self) -> bool:
        """Whether host mode pauses here: ``enabled``, with ``auto`` resolved (see above)."""
        return not has_controlling_terminal() if self.enabled == "auto" else self.enabled

    max_pause: PositiveDuration = Field(5_000_000_000, le=60_000_000_000)


class ServiceConfig(Section):
    pipelines: PipelinesConfig
    telemetry: TelemetryConfig = TelemetryConfig()
    findings: FindingsConfig = FindingsConfig()
    program_cache: ProgramCacheConfig = ProgramCacheConfig()
    host_pause: HostPauseConfig = HostPauseConfig()
