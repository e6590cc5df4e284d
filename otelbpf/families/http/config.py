"""The ``http`` receiver's options: syscall tracepoints on sockets (HTTP/1.x, HTTP/2, gRPC)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from otelbpf.config.fields import HEADER_NAME, unique
from otelbpf.config.receivers.base import ReceiverConfig
from otelbpf.config.units import RingSize, Size, format_size

#: Ports a config may list (1,024 compile in ~1 s).
MAX_PORTS = 1024


class HttpReceiverConfig(ReceiverConfig):
    """Syscall tracepoints on sockets: HTTP/1.x, HTTP/2 and gRPC spans and RED metrics."""

    #: host mode: ``gpu`` traces the processes that load a library another receiver probes
    #: (CUDA, NCCL, ibverbs) and their children; ``all`` every process. --pid and run --
    #: trace their targets either way.
    processes: Literal["gpu", "all"] = "gpu"
    #: At most ``MAX_PORTS``: each is one comparison in the generated BPF C, and BCC's clang
    #: crashed (a segfault) on 20,000.
    ports: list[Annotated[int, Field(ge=1, le=65535)]] = []
    payload_size: Size = 4 << 10
    ring_buffer_size: RingSize = 16 << 20
    capture_headers: list[str] = []
    redact_headers: list[str] = []
    #: Export OpenAI-compatible prompts and completions (gen_ai.input.messages / gen_ai.output.messages,
    #: clipped). Off: bodies never leave the agent, only the model and token counts read from them.
    capture_message_content: bool = False
    max_spans_per_second: int = Field(20_000, ge=0, le=10_000_000)
    #: HTTP/1 requests whose spans are built, decided in the kernel at each request's first
    #: bytes (the rest never reach the ring; RED metrics count every request either way), and
    #: HTTP/2 streams, decided in user space (every stream parsed and counted). Rounded down to a
    #: power of two (1, 0.5, 0.25, ...): the most that is ever kept.
    sampling_probability: float = Field(1.0, gt=0.0, le=1.0)
    #: Halve the probability on pressure (requests shed for the backlog, records lost or
    #: dropped, spans over max_spans_per_second); double it back when calm.
    adaptive_sampling: bool = True
    #: Bytes of socket records waiting for the agent (in the ring and its processing queue)
    #: past which new HTTP/1 requests are shed whatever the draw; 0: half the ring.
    sampling_backlog: Size = 0
    #: Follow work handed to another thread of the process (a thread pool) by wake-ups: a
    #: sched_wakeup tracepoint keeps who last woke each thread of a traced process.
    handoffs: bool = True

    @field_validator("ports", mode="before")
    @classmethod
    def _few_ports(cls, value: object) -> object:
        """Before each port is checked (and the repeats looked for, in quadratic time)."""
        if isinstance(value, list) and len(value) > MAX_PORTS:
            raise ValueError(f"at most {MAX_PORTS} ports (one comparison each in the kernel), got {len(value)}")
        return value

    @field_validator("ports")
    @classmethod
    def _ports(cls, value: list[int]) -> list[int]:
        return unique(value, "port")

    @field_validator("payload_size")
    @classmethod
    def _payload(cls, value: int) -> int:
        if value & (value - 1) or not 64 <= value <= 8192:
            raise ValueError(f"payload_size must be a power of two from 64B to 8KiB, got {format_size(value)}")
        return value

    @field_validator("capture_headers", "redact_headers")
    @classmethod
    def _header_names(cls, value: list[str]) -> list[str]:
        bad = [h for h in value if not HEADER_NAME.fullmatch(h)]
        if bad:
            raise ValueError(f"not HTTP header names: {', '.join(map(repr, bad))}")
        return [h.lower() for h in value]
