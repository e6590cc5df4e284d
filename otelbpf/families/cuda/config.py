"""The ``cuda`` receiver's options: uprobes on the CUDA runtime (``cudart``) and driver (``cuda``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from otelbpf.config.fields import SearchPath, unique
from otelbpf.config.receivers.base import ReceiverConfig
from otelbpf.config.units import AutoRingSize, Duration

_DEFAULT_CUDA_SEARCH_PATHS = (
    "/usr/local/cuda*/lib64/libcudart.so*",
    "/usr/lib/x86_64-linux-gnu/libcudart.so*",
    "/opt/conda/lib/libcudart.so*",
    "/opt/conda/envs/*/lib/libcudart.so*",
    "/opt/conda/lib/python3*/site-packages/nvidia/cuda_runtime/lib/libcudart.so*",
    "/usr/local/lib/python3*/dist-packages/nvidia/cuda_runtime/lib/libcudart.so*",
    "/usr/local/lib/python3*/site-packages/nvidia/cuda_runtime/lib/libcudart.so*",
    # CUDA 13 wheels (PyTorch cu130 loads its runtime from nvidia/cu13/lib)
    "/opt/conda/lib/python3*/site-packages/nvidia/cu1[3-9]/lib/libcudart.so*",
    "/usr/local/lib/python3*/dist-packages/nvidia/cu1[3-9]/lib/libcudart.so*",
    "/usr/local/lib/python3*/site-packages/nvidia/cu1[3-9]/lib/libcudart.so*",
    "/usr/lib/x86_64-linux-gnu/libcuda.so*",
    "/usr/lib/aarch64-linux-gnu/libcuda.so*",
    "/usr/lib64/libcuda.so*",
    "/usr/local/nvidia/lib64/libcuda.so*",
)


#: ``ring_buffer_size: auto``: the shared ``events`` ring. CUDA calls put an event on it each
#: (copies, syncs, stream events, allocations) but launches are only counted in the kernel,
#: unless ``launch_sample_every`` asks for events: then one launch in 15 or more (an event per
#: launch at hundreds of thousands a second) gets the larger ring. Every byte of a ring is
#: resident (docs/BENCHMARKS.md: what each size held under load).
AUTO_RING_BYTES = 4 << 20
AUTO_RING_BYTES_LAUNCH_EVENTS = 16 << 20
AUTO_LAUNCH_EVENTS_BELOW = 16


class CudaReceiverConfig(ReceiverConfig):
    """Uprobes on the CUDA runtime (``cudart``) and driver (``cuda``) libraries."""

    libraries: list[Literal["cudart", "cuda"]] = ["cudart", "cuda"]
    search_paths: list[SearchPath] = list(_DEFAULT_CUDA_SEARCH_PATHS)
    launch_sample_every: int = Field(0, ge=0, le=1 << 30)
    launch_errors: bool = False
    min_span_duration: Duration = 0
    ring_buffer_size: AutoRingSize = "auto"
    top_kernels: int = Field(20, ge=0, le=1000)
    max_spans_per_second: int = Field(20_000, ge=0, le=10_000_000)
    symbol_names: int = Field(65536, ge=1024, le=1 << 22)
    symbol_tables: int = Field(128, ge=8, le=4096)

    @field_validator("libraries")
    @classmethod
    def _libraries(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("name at least one of cudart, cuda (to disable the receiver, drop it from the pipelines)")
        return unique(value, "library")

    def events_ring_bytes(self, traces: bool) -> int:
        """The ``events`` ring this receiver asks for: its ``ring_buffer_size``, or for ``auto``
        the larger ring when (with a traces pipeline) launches become events often."""
        if self.ring_buffer_size != "auto":
            return self.ring_buffer_size
        frequent = traces and 0 < self.launch_sample_every < AUTO_LAUNCH_EVENTS_BELOW
        return AUTO_RING_BYTES_LAUNCH_EVENTS if frequent else AUTO_RING_BYTES
