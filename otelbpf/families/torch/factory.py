"""The ``torch`` receiver's factory.

PyTorch operators (uprobes on at::_ops::<op>::call, bpf/torch.c): a span per call, call
counts and durations.
The probes and the correlator are imported when a config enables the family, not before:
validating a config (``otelbpf validate``) loads every factory and should not pay for BCC."""

from __future__ import annotations

from otelbpf.families.factory import Context, Factory, Receiver
from otelbpf.families.torch.config import TorchReceiverConfig


def build(name: str, cfg: TorchReceiverConfig, ctx: Context) -> Receiver:
    from otelbpf.families.torch.correlator import TorchCorrelator
    from otelbpf.families.torch.probes import torch_family

    correlator = TorchCorrelator(
        ctx.correlator_settings(),
        ctx.symbolizer,
        ctx.causality,
        min_span_ns=cfg.min_span_duration,
        max_spans_per_second=ctx.span_rate(cfg.max_spans_per_second),
        on_sampled_out=ctx.sampled_out(name),
    )
    family = torch_family(cfg.operators, max_depth=cfg.max_depth)
    return Receiver(name, family, correlator, list(cfg.search_paths), cfg.ring_buffer_size)


FACTORY = Factory("torch", TorchReceiverConfig, ("traces", "metrics"), build)
