"""Hard caps on what a connection's parser may hold, whatever its peer sends.

The agent parses bytes anyone on the network can send to a traced port. Every
thing a parser keeps between syscalls — requests not yet answered, HTTP/2
streams not yet ended, a header block not yet whole, an HPACK table — is
bounded here, per connection and per traced process, so that a hostile or
broken peer costs a bounded amount of memory and the overflow is counted
(a ``problems`` reason), never held.

The defaults are far above what well-behaved peers do (browsers pipeline
nothing, gRPC servers allow 100 concurrent streams by default, header blocks
stay under a few KiB) and bound a hostile connection to a few MiB: see
docs/BENCHMARKS.md, "Hardening", for what one costs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Limits:
    #: Unanswered (pipelined) HTTP/1 requests per connection; later ones are not followed.
    pending_requests: int = 256
    #: Bytes of request heads those pending requests may hold per connection.
    pending_head_bytes: int = 1 << 20
    #: Open HTTP/2 streams per connection; beyond it the oldest is given up (``stream_limit``).
    open_streams: int = 1024
    #: Pending requests and open streams over all of one process's connections.
    held_per_process: int = 16_384
    #: Bytes of one HTTP/2 header block (HEADERS or PUSH_PROMISE and its CONTINUATIONs).
    header_block: int = 64 << 10
    #: Bytes of an HPACK dynamic table: the smaller of this and the peer's SETTINGS_HEADER_TABLE_SIZE.
    hpack_table: int = 64 << 10
    #: Characters of one exported string attribute (a path, a Host, a user agent, a captured header).
    attribute_chars: int = 2048
    #: Bytes of one SSE line kept (a longer line is skipped, its event marked truncated).
    sse_line: int = 64 << 10
    #: Bytes of one SSE event's data kept.
    sse_data: int = 64 << 10
    #: Containers deep a JSON body (an OpenAI-compatible request or response) is read to.
    json_depth: int = 64
    #: Bytes of one JSON body read before it is given up: a prompt of token ids may be long.
    json_document: int = 1 << 20


DEFAULT = Limits()


class Held:
    """What one process's connections hold (pending requests + open streams), against its cap.

    Shared by every connection of a process; only the processing thread touches it.
    """

    __slots__ = ("limit", "n")

    def __init__(self, limit: int = DEFAULT.held_per_process) -> None:
        self.limit = limit
        self.n = 0

    def take(self) -> bool:
        """One more held, if the cap allows."""
        if self.n >= self.limit:
            return False
        self.n += 1
        return True

    def give(self, k: int = 1) -> None:
        self.n -= k
