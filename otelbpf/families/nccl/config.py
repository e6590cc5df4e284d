"""The ``nccl`` receiver's options: uprobes on NCCL (communicators, collectives, send/recv, groups)."""

from __future__ import annotations

from pydantic import Field

from otelbpf.config.fields import SearchPath
from otelbpf.config.receivers.base import ReceiverConfig
from otelbpf.config.units import PositiveDuration, RingSize

_DEFAULT_NCCL_SEARCH_PATHS = (
    "/usr/lib/x86_64-linux-gnu/libnccl.so*",
    "/usr/lib/aarch64-linux-gnu/libnccl.so*",
    "/usr/lib64/libnccl.so*",
    "/usr/local/cuda*/lib64/libnccl.so*",
    "/opt/conda/lib/libnccl.so*",
    "/opt/conda/envs/*/lib/libnccl.so*",
    "/opt/conda/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so*",
    "/usr/local/lib/python3*/dist-packages/nvidia/nccl/lib/libnccl.so*",
    "/usr/local/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so*",
)


class NcclReceiverConfig(ReceiverConfig):
    """Uprobes on NCCL (``libnccl.so``): communicators, collectives, send/recv, groups; spans,
    metrics and live straggler findings."""

    search_paths: list[SearchPath] = list(_DEFAULT_NCCL_SEARCH_PATHS)
    ring_buffer_size: RingSize = 1 << 20
    #: the adaptive straggler test's floor (correlate/adaptive.py): lateness must also beat the
    #: other ranks' spread and a tenth of the collective's duration, persistently
    straggler_threshold: PositiveDuration = 1_000_000
    completion_timeout: PositiveDuration = 30_000_000_000
    max_spans_per_second: int = Field(20_000, ge=0, le=10_000_000)
