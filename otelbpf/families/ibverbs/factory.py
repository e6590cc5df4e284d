"""The ``ibverbs`` receiver's factory.

RDMA queue pairs and their data path (uprobes, bpf/ibverbs.c): per-QP metrics, lifecycle and
slow-completion spans.
The probes and the correlator are imported when a config enables the family, not before:
validating a config (``otelbpf validate``) loads every factory and should not pay for BCC."""

from __future__ import annotations

from otelbpf.families.factory import Context, Factory, Receiver
from otelbpf.families.ibverbs.config import IbverbsReceiverConfig


def build(name: str, cfg: IbverbsReceiverConfig, ctx: Context) -> Receiver:
    from otelbpf.families.ibverbs.correlator import IbverbsCorrelator
    from otelbpf.families.ibverbs.probes import ibverbs_family

    family = ibverbs_family(
        slow_completion_ns=cfg.slow_completion,
        qp_entries=cfg.max_queue_pairs,
        health=ctx.health,
        data_path=cfg.data_path,
    )
    correlator = IbverbsCorrelator(
        ctx.correlator_settings(),
        ctx.read_map,
        ctx.forget_keys,
        traces=ctx.traces,
        max_spans_per_second=ctx.span_rate(cfg.max_spans_per_second),
        on_sampled_out=ctx.sampled_out(name),
        sync=lambda: ctx.sync(),
    )
    return Receiver(name, family, correlator, list(cfg.search_paths), cfg.ring_buffer_size)


FACTORY = Factory("ibverbs", IbverbsReceiverConfig, ("traces", "metrics"), build)
