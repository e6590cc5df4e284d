"""The ``http`` receiver's factory.

HTTP/1.x, HTTP/2 and gRPC from socket syscalls (tracepoints, bpf/sockets.c): server and client
spans, RED metrics.
The probes and the correlator are imported when a config enables the family, not before:
validating a config (``otelbpf validate``) loads every factory and should not pay for BCC."""

from __future__ import annotations

import dataclasses

from otelbpf.families.factory import Context, Factory, Receiver
from otelbpf.families.http.config import HttpReceiverConfig


def build(name: str, cfg: HttpReceiverConfig, ctx: Context) -> Receiver:
    from otelbpf.families.http.correlator import HttpCorrelator
    from otelbpf.families.http.probes import RING, socket_family
    from otelbpf.families.http.sampling import HeadSampler, shift_for

    family = socket_family(
        cfg.ports,
        payload_bytes=cfg.payload_size,
        ring_bytes=cfg.ring_buffer_size,
        lib_users_only=cfg.processes == "gpu",
        handoffs=cfg.handoffs and ctx.traces,
        backlog_bytes=cfg.sampling_backlog,
        min_shift=shift_for(cfg.sampling_probability),
    )
    sampler = HeadSampler(
        lambda m, items: ctx.maps.update(m, items),
        ctx.read_map,
        lambda fn: ctx.maps.with_bpf(fn),
        ctx.counter(name),
        lambda: ctx.health.get("otelbpf.events.dropped", reason="processing_queue_full", ring=RING),
        min_shift=shift_for(cfg.sampling_probability),
        adaptive=cfg.adaptive_sampling,
        backlog_bytes=cfg.sampling_backlog or cfg.ring_buffer_size // 2,
        span_budget=ctx.span_rate(cfg.max_spans_per_second),
    )
    family = dataclasses.replace(family, on_unload=sampler.on_unload)
    correlator = HttpCorrelator(
        ctx.correlator_settings(),
        ctx.counter(name),
        ctx.causality,
        lambda m, items: ctx.maps.update(m, items),
        ports=cfg.ports,
        capture_headers=cfg.capture_headers,
        redact_headers=cfg.redact_headers,
        capture_message_content=cfg.capture_message_content,
        max_spans_per_second=ctx.span_rate(cfg.max_spans_per_second),
        traces=ctx.traces,
        sampler=sampler,
    )
    from otelbpf.families.http.tls import RING as TLS_RING

    ctx.ring_consumers.setdefault(TLS_RING, []).append(correlator.on_tls)  # the tls receiver's plaintext
    return Receiver(name, family, correlator, [], 256 << 10)


FACTORY = Factory("http", HttpReceiverConfig, ("traces", "metrics"), build)
