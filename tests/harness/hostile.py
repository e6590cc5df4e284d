"""Hostile traffic without a kernel: socket records as the sensor delivers them, through the real
``HttpCorrelator``; HTTP/2 frames and HPACK blocks built byte by byte (h2 refuses to send most of
what a hostile peer sends). Used by tests/families/http/test_http_hostile.py, tests/fuzz/ and
bench/fuzz.py."""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field

import numpy as np
from hpack import Encoder

from otelbpf.base.events import SOCK_RECORD_DTYPE, Kind, SockFunc
from otelbpf.correlate.base import CorrelatorSettings
from otelbpf.correlate.causality import Causality
from otelbpf.correlate.clock import MonotonicClock
from otelbpf.correlate.process_info import ProcessInfo
from otelbpf.families.http.correlator import HttpCorrelator
from otelbpf.families.http.protocols.http2 import (
    CONTINUATION,
    DATA,
    FLAG_END_HEADERS,
    FLAG_END_STREAM,
    HEADERS,
    PREFACE,
    SETTINGS,
)

PORT, PEER, PID = 8080, 40000, 4242
#: Bytes per syscall record: the sensor captures at most 8 KiB of one (payload_size's maximum).
MAX_READ = 8192
LOCALHOST = socket.inet_aton("127.0.0.1") + bytes(12)


def frame(ftype: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame."""
    n = len(payload)
    return struct.pack(">BHBBI", n >> 16, n & 0xFFFF, ftype, flags, stream) + payload


def settings(**values: int) -> bytes:
    ids = {"header_table_size": 1, "max_frame_size": 5}
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", ids[k], v) for k, v in values.items()))


def headers_frame(block: bytes, stream: int, *, end_stream: bool = False, end_headers: bool = True) -> bytes:
    flags = (FLAG_END_STREAM if end_stream else 0) | (FLAG_END_HEADERS if end_headers else 0)
    return frame(HEADERS, flags, stream, block)


def continuation(block: bytes, stream: int, *, end_headers: bool = False) -> bytes:
    return frame(CONTINUATION, FLAG_END_HEADERS if end_headers else 0, stream, block)


def data_frame(payload: bytes, stream: int, *, end_stream: bool = False) -> bytes:
    return frame(DATA, FLAG_END_STREAM if end_stream else 0, stream, payload)


def grpc_call(
    enc_client: Encoder,
    enc_server: Encoder,
    stream: int,
    *,
    path: str = "/demo.Echo/Unary",
    status: str = "200",
    grpc_status: str = "0",
    extra: list | None = None,
) -> tuple[bytes, bytes]:
    """(client bytes, server bytes) of one unary gRPC call on ``stream``; any value may be hostile."""
    request = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "svc:50051"),
        ("content-type", "application/grpc"),
        *(extra or []),
    ]
    c2s = headers_frame(enc_client.encode(request), stream) + data_frame(b"\0\0\0\0\x01x", stream, end_stream=True)
    s2c = (
        headers_frame(enc_server.encode([(":status", status), ("content-type", "application/grpc")]), stream)
        + data_frame(b"\0\0\0\0\x01y", stream)
        + headers_frame(enc_server.encode([("grpc-status", grpc_status)]), stream, end_stream=True)
    )
    return c2s, s2c


@dataclass
class Wire:
    """Records of server-side connections (accept, reads of what clients sent, writes of what the
    server sent, close), fed to a real ``HttpCorrelator`` that keeps what it made."""

    spans: list = field(default_factory=list)
    counts: dict = field(default_factory=dict)  # (metric, sorted attributes) -> n
    correlator_options: dict = field(default_factory=dict)
    #: False: spans are counted and let go, as the exporter does (memory measurements).
    keep_spans: bool = True
    #: Records per ring batch: delivered whenever this many are waiting (None: only on ``flush``).
    batch: int | None = None
    spans_made: int = 0
    _rows: list = field(default_factory=list)
    _t: int = 1_000_000_000

    def __post_init__(self) -> None:
        settings = CorrelatorSettings(ProcessInfo(), MonotonicClock(), self._emit)
        self.correlator = HttpCorrelator(
            settings,
            self._count,
            Causality(),
            lambda m, items: None,
            ports=[PORT],
            **{"max_spans_per_second": 10**9, **self.correlator_options},
        )

    def _emit(self, spans: list) -> None:
        self.spans_made += len(spans)
        if self.keep_spans:
            self.spans.extend(spans)

    def _count(self, metric: str, n: int, **attrs) -> None:
        key = (metric, tuple(sorted(attrs.items())))
        self.counts[key] = self.counts.get(key, 0) + n

    def problems(self) -> dict[str, int]:
        return {dict(a)["reason"]: n for (m, a), n in self.counts.items() if m == "otelbpf.http.problems"}

    def count(self, metric: str) -> int:
        return sum(n for (m, _), n in self.counts.items() if m == metric)

    def _add(self, kind: Kind, func: SockFunc, fd: int, ret: int = 0, data: bytes = b"", pid: int = PID) -> None:
        self._rows.append((self._t, kind, func, fd, ret, data, pid))
        self._t += 2000
        if self.batch and len(self._rows) >= self.batch:
            self.flush()

    def accept(self, fd: int, pid: int = PID) -> None:
        self._add(Kind.SOCK_ACCEPT, SockFunc.accept4, fd, ret=3, pid=pid)

    def client_sent(self, fd: int, data: bytes, pid: int = PID) -> None:
        """The server read ``data``: in reads of at most MAX_READ bytes, every byte captured."""
        for i in range(0, len(data), MAX_READ):
            self._add(
                Kind.SOCK_DATA, SockFunc.read, fd, ret=len(data[i : i + MAX_READ]), data=data[i : i + MAX_READ], pid=pid
            )

    def server_sent(self, fd: int, data: bytes, pid: int = PID) -> None:
        for i in range(0, len(data), MAX_READ):
            self._add(
                Kind.SOCK_DATA,
                SockFunc.write,
                fd,
                ret=len(data[i : i + MAX_READ]),
                data=data[i : i + MAX_READ],
                pid=pid,
            )

    def close(self, fd: int, pid: int = PID) -> None:
        self._add(Kind.SOCK_CLOSE, SockFunc.close, fd, pid=pid)

    def flush(self) -> None:
        """Deliver the records added so far as one ring batch."""
        rows, self._rows = self._rows, []
        if not rows:
            return
        arr = np.zeros(len(rows), dtype=SOCK_RECORD_DTYPE)
        arr["data"] = [b""] * len(rows)
        for i, (t, kind, func, fd, ret, data, pid) in enumerate(rows):
            r = arr[i]
            r["ts_ns"], r["duration_ns"], r["pid"], r["tid"], r["fd"], r["ret"] = t, 800, pid, pid, fd, ret
            r["kind"], r["func"], r["cap"] = kind, func, len(data)
            if kind == Kind.SOCK_ACCEPT:
                r["family"], r["port"], r["local_port"], r["addr"] = 2, PEER + fd, PORT, LOCALHOST
            arr["data"][i] = data
        self.correlator.on_ring("sockdata", arr)
        self.correlator.on_tick()

    def exchange(self, fd: int, request: bytes, response: bytes, *, pid: int = PID) -> None:
        """A whole connection: accept, one read, one write, close; delivered."""
        self.accept(fd, pid)
        self.client_sent(fd, request, pid)
        if response:
            self.server_sent(fd, response, pid)
        self.close(fd, pid)
        self.flush()

    def by_path(self) -> dict[str, object]:
        return {s.attributes.get("url.path"): s for s in self.spans}


def h2_connection(calls: list[tuple[bytes, bytes]]) -> tuple[bytes, bytes]:
    """Client and server bytes of an HTTP/2 connection carrying ``calls``."""
    c2s = PREFACE + settings() + b"".join(c for c, _ in calls)
    s2c = settings() + b"".join(s for _, s in calls)
    return c2s, s2c
