"""The ``gpu`` receiver's factory.

The GPU's own account through NVML, no probes and no C file: hw.gpu.* metrics.
The probes and the correlator are imported when a config enables the family, not before:
validating a config (``otelbpf validate``) loads every factory and should not pay for BCC."""

from __future__ import annotations

from otelbpf.families.factory import Context, Factory, Receiver
from otelbpf.families.gpu.config import GpuReceiverConfig


def build(name: str, cfg: GpuReceiverConfig, ctx: Context) -> Receiver:
    from otelbpf.config import to_seconds
    from otelbpf.families.gpu.correlator import GpuCorrelator
    from otelbpf.families.gpu.nvml import NvmlSampler, nvml_family

    correlator = GpuCorrelator(ctx.process_info, ctx.health)
    sampler = NvmlSampler(
        correlator.on_sample,
        ctx.health,
        interval_s=to_seconds(cfg.interval),
        per_process=cfg.per_process,
        max_processes=cfg.max_processes,
        xid_events=cfg.xid_events,
    )
    return Receiver(name, nvml_family(sampler), correlator, [], 64 << 10)


FACTORY = Factory("gpu", GpuReceiverConfig, ("metrics",), build)
