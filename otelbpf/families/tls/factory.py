"""The ``tls`` receiver's factory.

OpenSSL's plaintext (uprobes on SSL_read/SSL_write and their _ex forms, bpf/tls.c), parsed by
the http receiver: HTTPS, HTTP/2 and gRPC over TLS as spans and metrics.
The probes and the correlator are imported when a config enables the family, not before."""

from __future__ import annotations

import dataclasses

from otelbpf.families.factory import Context, Factory, Receiver
from otelbpf.families.tls.config import TlsReceiverConfig


def build(name: str, cfg: TlsReceiverConfig, ctx: Context) -> Receiver:
    from otelbpf.families.tls.correlator import TlsCorrelator
    from otelbpf.families.tls.probes import RING, Rejected, tls_family

    rejected = Rejected()
    family = tls_family(
        payload_bytes=cfg.payload_size,
        ring_bytes=cfg.ring_buffer_size,
        max_connections=cfg.max_connections,
        lib_users_only=cfg.processes == "gpu",
        rejected=rejected,
        backlog_bytes=cfg.sampling_backlog,
    )
    correlator = TlsCorrelator(
        lambda: ctx.ring_consumers.get(RING, ()),
        ctx.counter(name),
        ctx.read_map,
        rejected,
        lambda m, items: ctx.maps.update(m, items),
    )
    family = dataclasses.replace(family, on_unload=correlator.on_unload)
    return Receiver(name, family, correlator, list(cfg.search_paths), cfg.ring_buffer_size)


FACTORY = Factory("tls", TlsReceiverConfig, ("traces", "metrics"), build)
