"""The ``profiling`` receiver's options: CPU samples and CUDA memory by stack (the profiles pipeline)."""

from __future__ import annotations

from pydantic import Field, field_validator

from otelbpf.config.receivers.base import Need, ReceiverConfig
from otelbpf.config.units import PositiveDuration, Size


class ProfilingReceiverConfig(ReceiverConfig):
    """CPU samples (perf cpu-clock) and CUDA memory by stack, Python frames merged with native."""

    sample_rate: int = Field(99, ge=1, le=1000)
    interval: PositiveDuration = 10_000_000_000
    python: bool = True
    max_python_frames: int = 64
    cuda_memory: bool = True
    #: With ``cuda_memory``: one kernel launch in this many (per process and kernel: the first,
    #: then every Nth) takes the launching code's merged stack and counts this many launches
    #: on it, the kernel on top (the ``cuda_calls`` profile's ``cuda_launches``). A stack per
    #: launch would cost each launch ~0.6-1.6 us. 0: launches take no stack.
    launch_stack_every: int = Field(64, ge=0, le=1 << 20)
    stack_map_entries: int = Field(16384, ge=1024, le=1 << 20)
    sample_map_entries: int = Field(16384, ge=1024, le=1 << 20)
    code_map_entries: int = Field(16384, ge=1024, le=1 << 20)
    live_allocations: int = Field(262144, ge=1024, le=1 << 24)
    symbol_tables: int = Field(128, ge=8, le=4096)
    symbol_table_bytes: Size = Field(32 << 20, ge=1 << 20, le=4 << 30)
    cached_stacks: int = Field(16384, ge=256, le=1 << 20)
    cached_python_stacks: int = Field(16384, ge=256, le=1 << 20)
    cached_resolved_stacks: int = Field(16384, ge=256, le=1 << 20)
    cached_frames: int = Field(16384, ge=1024, le=1 << 22)
    cached_code_objects: int = Field(8192, ge=256, le=1 << 20)

    @field_validator("max_python_frames")
    @classmethod
    def _frames(cls, value: int) -> int:
        if value not in (16, 32, 64, 128):
            raise ValueError(f"max_python_frames must be 16, 32, 64 or 128, got {value}")
        return value

    def needs(self) -> list[Need]:
        if not self.cuda_memory:
            return []
        why = (
            "CUDA memory profiles need the cuda receiver's probes: add the cuda receiver to a pipeline, "
            "or set cuda_memory: false"
        )
        return [Need(receiver="cuda", option="cuda_memory", why=why)]
