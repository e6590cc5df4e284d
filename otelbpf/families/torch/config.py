"""The ``torch`` receiver's options: uprobes on PyTorch's operator entry points
(``at::_ops::<op>::call`` in ``libtorch_cpu.so``, bpf/torch.c)."""

from __future__ import annotations

from pydantic import Field, field_validator

from otelbpf.config.fields import SearchPath, unique
from otelbpf.config.receivers.base import ReceiverConfig
from otelbpf.config.units import Duration, RingSize

#: The operators probed unless ``operators`` names others: the ones that carry a model's
#: time (matrix products, convolution, attention, normalisation, softmax, embedding) and the
#: copies that move tensors between devices and types. Names are ``at::_ops`` names: the
#: ATen operator, with ``_<overload>`` when it has one (``aten::softmax.int``: ``softmax_int``).
DEFAULT_OPERATORS: tuple[str, ...] = (
    "matmul",
    "mm",
    "addmm",
    "bmm",
    "convolution",
    "scaled_dot_product_attention",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_cudnn_attention",
    "layer_norm",
    "softmax_int",
    "_softmax",
    "embedding",
    "copy_",
    "to_dtype",
    "to_device",
    "to_dtype_layout",
    "to_other",
    "_to_copy",
)

_DEFAULT_TORCH_SEARCH_PATHS = (
    "/opt/conda/lib/python3*/site-packages/torch/lib/libtorch_cpu.so",
    "/opt/conda/envs/*/lib/python3*/site-packages/torch/lib/libtorch_cpu.so",
    "/usr/local/lib/python3*/dist-packages/torch/lib/libtorch_cpu.so",
    "/usr/local/lib/python3*/site-packages/torch/lib/libtorch_cpu.so",
)


class TorchReceiverConfig(ReceiverConfig):
    """Uprobes on PyTorch operators: one span per call, nested between the Python frames
    and the CUDA calls it makes, and per-operator call counts and durations."""

    #: Shell-style patterns on operator names (``softmax*``, ``_scaled_dot_product_*``).
    operators: list[str] = list(DEFAULT_OPERATORS)
    search_paths: list[SearchPath] = list(_DEFAULT_TORCH_SEARCH_PATHS)
    #: Calls shorter than this make no span (the metrics still count them).
    min_span_duration: Duration = 0
    max_spans_per_second: int = Field(10_000, ge=0, le=10_000_000)
    #: Probed operators open at once on one thread that are tracked (a power of two).
    max_depth: int = Field(16, ge=2, le=64)
    ring_buffer_size: RingSize = 4 << 20

    @field_validator("operators")
    @classmethod
    def _operators(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("name at least one operator pattern (to disable the receiver, drop it from the pipelines)")
        for pattern in value:
            if not pattern or any(c.isspace() for c in pattern):
                raise ValueError(f"operator pattern {pattern!r}: a non-empty name or shell pattern without spaces")
        return unique(value, "operator")

    @field_validator("max_depth")
    @classmethod
    def _max_depth(cls, value: int) -> int:
        if value & (value - 1):
            raise ValueError(f"max_depth must be a power of two, got {value}")
        return value
