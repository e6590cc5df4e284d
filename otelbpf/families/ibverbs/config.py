"""The ``ibverbs`` receiver's options: uprobes on libibverbs and on the RDMA provider's data path."""

from __future__ import annotations

from pydantic import Field

from otelbpf.config.fields import SearchPath
from otelbpf.config.receivers.base import ReceiverConfig
from otelbpf.config.units import PositiveDuration, RingSize

_DEFAULT_IBVERBS_SEARCH_PATHS = (
    "/usr/lib/x86_64-linux-gnu/libibverbs.so*",
    "/usr/lib/aarch64-linux-gnu/libibverbs.so*",
    "/usr/lib64/libibverbs.so*",
    "/usr/lib/libibverbs.so*",
    "/opt/conda/lib/libibverbs.so*",
    "/opt/conda/envs/*/lib/libibverbs.so*",
)


class IbverbsReceiverConfig(ReceiverConfig):
    """Uprobes on libibverbs (queue pairs, memory regions) and on the RDMA provider's post and
    poll functions found in each opened device context (the data path)."""

    search_paths: list[SearchPath] = list(_DEFAULT_IBVERBS_SEARCH_PATHS)
    data_path: bool = True
    slow_completion: PositiveDuration = 1_000_000
    max_queue_pairs: int = Field(16384, ge=64, le=1 << 20)
    ring_buffer_size: RingSize = 1 << 20
    max_spans_per_second: int = Field(20_000, ge=0, le=10_000_000)
