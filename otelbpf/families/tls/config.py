"""The ``tls`` receiver's options: uprobes on OpenSSL's read and write functions (bpf/tls.c)."""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator

from otelbpf.config.fields import SearchPath, unique
from otelbpf.config.receivers.base import Need, ReceiverConfig
from otelbpf.config.units import RingSize, Size, format_size

#: Where the system's libssl usually is; copies elsewhere (a wheel's, a container's) are
#: found when a process opens or maps them.
DEFAULT_SEARCH_PATHS = (
    "/usr/lib/x86_64-linux-gnu/libssl.so.*",
    "/usr/lib/aarch64-linux-gnu/libssl.so.*",
    "/usr/lib64/libssl.so.*",
    "/usr/lib/libssl.so.*",
)


class TlsReceiverConfig(ReceiverConfig):
    """Uprobes on OpenSSL (``SSL_read``/``SSL_write`` and their ``_ex`` forms): the plaintext of
    TLS connections, parsed by the http receiver as its socket payloads are."""

    #: host mode: ``gpu`` the processes the http receiver traces by default (those that load a
    #: library another receiver probes, libssl included once this receiver is on, and their
    #: children); ``all`` every process. --pid and run -- trace their targets either way.
    processes: Literal["gpu", "all"] = "gpu"
    #: Plaintext bytes copied per call (the start of each record: what the parsers need).
    payload_size: Size = 4 << 10
    ring_buffer_size: RingSize = 8 << 20
    search_paths: list[SearchPath] = list(DEFAULT_SEARCH_PATHS)
    #: SSL objects whose fd is remembered (an LRU of (process, SSL)).
    max_connections: int = 65536
    #: Plaintext records waiting for the agent (ring plus processing queue) past which new HTTP/1
    #: requests over TLS are shed whatever the draw, before the ring can fill; 0: half the ring.
    #: The probability and its adaptation are the http receiver's (one for plain and TLS).
    sampling_backlog: Size = 0

    @field_validator("payload_size")
    @classmethod
    def _payload(cls, value: int) -> int:
        if value & (value - 1) or not 64 <= value <= 8192:
            raise ValueError(f"payload_size must be a power of two from 64B to 8KiB, got {format_size(value)}")
        return value

    @field_validator("max_connections")
    @classmethod
    def _conns(cls, value: int) -> int:
        if not 1024 <= value <= 1 << 20:
            raise ValueError(f"max_connections must be from 1024 to 1048576, got {value}")
        return value

    @field_validator("search_paths")
    @classmethod
    def _paths(cls, value: list[str]) -> list[str]:
        return unique(value, "search path")

    def needs(self) -> list[Need]:
        why = "the tls receiver's plaintext is parsed by the http receiver: add http to a pipeline"
        return [Need(receiver="http", option="processes", why=why)]
