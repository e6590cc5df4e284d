"""The ``cuda`` receiver's factory.

CUDA runtime and driver API calls (uprobes, bpf/cuda.c): spans and metrics.
The probes and the correlator are imported when a config enables the family, not before:
validating a config (``otelbpf validate``) loads every factory and should not pay for BCC."""

from __future__ import annotations

from otelbpf.families.cuda.config import CudaReceiverConfig
from otelbpf.families.factory import Context, Factory, Receiver


def build(name: str, cfg: CudaReceiverConfig, ctx: Context) -> Receiver:
    from otelbpf.families.cuda.correlator import CudaCorrelator
    from otelbpf.families.cuda.probes import cuda_family

    family = cuda_family(
        cfg.libraries,
        launch_sample_every=cfg.launch_sample_every if ctx.traces else 0,
        launch_errors=cfg.launch_errors,
    )
    correlator = CudaCorrelator(
        ctx.correlator_settings(),
        ctx.symbolizer,
        ctx.read_map,
        ctx.forget_keys,
        min_span_ns=cfg.min_span_duration,
        top_kernels=cfg.top_kernels,
        launch_sample_every=cfg.launch_sample_every,
        max_spans_per_second=ctx.span_rate(cfg.max_spans_per_second),
        on_sampled_out=ctx.sampled_out(name),
        parent_of=ctx.causality.parent,
        in_flight=ctx.causality.in_flight,
        handed=ctx.causality.handed,
        on_handoffs=ctx.causality.woken,
        sync=lambda: ctx.sync(),
    )
    return Receiver(name, family, correlator, list(cfg.search_paths), cfg.events_ring_bytes(ctx.traces))


FACTORY = Factory("cuda", CudaReceiverConfig, ("traces", "metrics"), build)
