"""The ``sched`` receiver's factory.

Why threads are off the CPU (sched tracepoints, bpf/sched.c): off-CPU time, run-queue
latency, off_cpu spans.
The probes and the correlator are imported when a config enables the family, not before:
validating a config (``otelbpf validate``) loads every factory and should not pay for BCC."""

from __future__ import annotations

from otelbpf.families.factory import Context, Factory, Receiver
from otelbpf.families.sched.config import SchedReceiverConfig


def build(name: str, cfg: SchedReceiverConfig, ctx: Context) -> Receiver:
    from otelbpf.families.sched.correlator import SchedCorrelator
    from otelbpf.families.sched.probes import sched_family

    correlator = SchedCorrelator(
        ctx.correlator_settings(),
        ctx.read_map,
        ctx.forget_keys,
        lambda fn: ctx.maps.with_bpf(fn),
        ctx.counter(name),
        traces=ctx.traces,
        max_spans_per_second=ctx.span_rate(cfg.max_spans_per_second),
    )
    family = sched_family(
        span_threshold_ns=cfg.span_threshold,
        ring_bytes=cfg.ring_buffer_size,
        aggregate_window_ns=cfg.aggregate_window,
        aggregate_min_ns=cfg.aggregate_min,
        thread_entries=cfg.max_threads,
        off_entries=cfg.max_series,
        runq_entries=cfg.max_runqueue_series,
        stack_entries=cfg.stack_map_entries,
        on_unload=correlator.on_unload,
    )
    return Receiver(name, family, correlator, [], cfg.ring_buffer_size)


FACTORY = Factory("sched", SchedReceiverConfig, ("traces", "metrics"), build)
