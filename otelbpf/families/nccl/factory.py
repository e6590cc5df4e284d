"""The ``nccl`` receiver's factory.

NCCL communicators and collectives (uprobes, bpf/nccl.c): spans per collective, metrics,
straggler findings.
The probes and the correlator are imported when a config enables the family, not before:
validating a config (``otelbpf validate``) loads every factory and should not pay for BCC."""

from __future__ import annotations

from otelbpf.families.factory import Context, Factory, Receiver
from otelbpf.families.nccl.config import NcclReceiverConfig


def build(name: str, cfg: NcclReceiverConfig, ctx: Context) -> Receiver:
    from otelbpf.families.nccl.correlator import NcclCorrelator
    from otelbpf.families.nccl.probes import nccl_family

    correlator = NcclCorrelator(
        ctx.correlator_settings(),
        straggler_threshold_ns=cfg.straggler_threshold,
        completion_timeout_ns=cfg.completion_timeout,
        max_spans_per_second=ctx.span_rate(cfg.max_spans_per_second),
        on_sampled_out=ctx.sampled_out(name),
        parent_of=ctx.causality.parent,
    )
    return Receiver(name, nccl_family(), correlator, list(cfg.search_paths), cfg.ring_buffer_size)


FACTORY = Factory("nccl", NcclReceiverConfig, ("traces", "metrics"), build)
