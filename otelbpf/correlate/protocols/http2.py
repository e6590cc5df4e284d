"""HTTP/2 (cleartext, as gRPC uses it in clusters) from captured socket bytes.

Per connection: the client preface, frames in each direction, HPACK with a
dynamic table per direction (the ``hpack`` library's decoder, fed every
header block — HEADERS, CONTINUATION and PUSH_PROMISE — in order, because
each block may change the table the next one refers to), and streams from
their request HEADERS to the END_STREAM the server sends (or a RST_STREAM).

What cannot be decoded is marked, never guessed:
- a gap (bytes moved but not captured) inside a DATA payload is skipped; a
  gap over a frame header loses frame boundaries for the rest of that
  direction (HTTP/2 has no marker to resynchronise on);
- a header block that was not captured whole, or that fails to decode,
  leaves that direction's HPACK table unknown: later header blocks could
  decode into wrong names, so none are decoded; streams are still timed and
  marked ``headers_lost``;
- a connection joined after its preface is not decoded at all.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from hpack import Decoder
from hpack.exceptions import HPACKError

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
FLAG_END_STREAM = 0x1
FLAG_END_HEADERS = 0x4
FLAG_PADDED = 0x8
FLAG_PRIORITY = 0x20
SETTINGS_HEADER_TABLE_SIZE = 1
SETTINGS_MAX_FRAME_SIZE = 5
#: Frame types whose length the protocol fixes.
_FIXED_LENGTH = {PRIORITY: 5, RST_STREAM: 4, PING: 8, WINDOW_UPDATE: 4}
#: Frame types whose payload the parser keeps (DATA payloads are only counted).
_KEPT = frozenset({HEADERS, CONTINUATION, PUSH_PROMISE, RST_STREAM, SETTINGS})
#: Largest frame payload HTTP/2 allows (SETTINGS_MAX_FRAME_SIZE's maximum).
MAX_FRAME = (1 << 24) - 1

Stamp = Any


def looks_like_preface(data: bytes) -> bool:
    """Do these first bytes of a connection begin the HTTP/2 client preface?"""
    n = min(len(data), len(PREFACE))
    return n >= 4 and data[:n] == PREFACE[:n]


@dataclass
class Frame:
    type: int
    flags: int
    stream_id: int
    length: int
    stamp: Stamp              # chunk that carried the frame header
    payload: bytes = b""      # kept types only
    lost: bool = False        # part of a kept payload was not captured
    end_stamp: Stamp = None   # chunk that carried the last payload byte


class FrameReader:
    """Frames of one direction, across syscall boundaries and gaps."""

    def __init__(self, expect_preface: bool) -> None:
        self._preface_left = len(PREFACE) if expect_preface else 0
        self._first = True  # each endpoint's first frame is SETTINGS
        #: SETTINGS_MAX_FRAME_SIZE the receiving side advertised (16384 until it says otherwise).
        self.max_length = 16384
        self._hdr = bytearray()
        self._frame: Frame | None = None
        self._left = 0
        self._buf = bytearray()
        #: Why this direction can no longer be read ("" while it can).
        self.broken = ""

    @property
    def mid_frame(self) -> bool:
        """A frame (or its header, or the preface) has begun and not ended."""
        return bool(self._hdr) or self._frame is not None or 0 < self._preface_left < len(PREFACE)

    def feed(self, data: bytes, missing: int, stamp: Stamp) -> list[Frame]:
        out: list[Frame] = []
        pos = 0
        while pos < len(data) and not self.broken:
            if self._preface_left:
                n = min(self._preface_left, len(data) - pos)
                offset = len(PREFACE) - self._preface_left
                if data[pos : pos + n] != PREFACE[offset : offset + n]:
                    self.broken = "bad_preface"
                    break
                self._preface_left -= n
                pos += n
                continue
            if self._frame is None:
                n = min(9 - len(self._hdr), len(data) - pos)
                self._hdr += data[pos : pos + n]
                pos += n
                if len(self._hdr) < 9:
                    break
                self._start_frame(stamp)
                if self.broken:
                    break
                if self._left == 0:
                    out.append(self._end_frame(stamp))
                continue
            n = min(self._left, len(data) - pos)
            if self._frame.type in _KEPT:
                self._buf += data[pos : pos + n]
            self._left -= n
            pos += n
            if self._left == 0:
                out.append(self._end_frame(stamp))
        if missing and not self.broken:
            self._gap(missing, stamp, out)
        return out

    def _start_frame(self, stamp: Stamp) -> None:
        length = int.from_bytes(self._hdr[:3], "big")
        ftype, flags = self._hdr[3], self._hdr[4]
        stream_id = struct.unpack(">I", bytes(self._hdr[5:9]))[0] & 0x7FFFFFFF
        self._hdr.clear()
        # Frames HTTP/2 defines must sit on the right kind of stream; bytes
        # that break that are not HTTP/2 (or were misframed).
        on_stream = ftype in (DATA, HEADERS, PRIORITY, RST_STREAM, PUSH_PROMISE, CONTINUATION)
        on_conn = ftype in (SETTINGS, PING, GOAWAY)
        fixed = _FIXED_LENGTH.get(ftype)
        if (
            (on_stream and stream_id == 0)
            or (on_conn and stream_id != 0)
            or length > self.max_length
            or (fixed is not None and length != fixed)
            or (ftype == SETTINGS and length % 6)
            or (self._first and (ftype != SETTINGS or flags & 0x1))
        ):
            self.broken = "invalid_frame"
            return
        self._first = False
        self._frame = Frame(ftype, flags, stream_id, length, stamp)
        self._left = length
        self._buf = bytearray()

    def _end_frame(self, stamp: Stamp) -> Frame:
        frame = self._frame
        frame.payload = bytes(self._buf)
        frame.end_stamp = stamp
        self._frame = None
        self._buf = bytearray()
        return frame

    def _gap(self, missing: int, stamp: Stamp, out: list[Frame]) -> None:
        if self._frame is None or self._preface_left:
            self.broken = "gap_in_framing"
            return
        n = min(missing, self._left)
        self._left -= n
        if self._frame.type in _KEPT:
            self._frame.lost = True
        if self._left == 0:
            out.append(self._end_frame(stamp))
        if missing > n:
            self.broken = "gap_in_framing"


@dataclass
class Stream:
    """One request/response exchange on an HTTP/2 connection."""

    id: int
    first: Stamp                         # chunk with the request HEADERS
    request_headers: list[tuple[str, str]] = field(default_factory=list)
    response_headers: list[tuple[str, str]] = field(default_factory=list)
    trailers: list[tuple[str, str]] = field(default_factory=list)
    request_ended: Stamp = None          # client's END_STREAM
    response_first: Stamp = None
    last: Stamp = None                   # server's END_STREAM, RST_STREAM, or the connection's end
    request_bytes: int = 0               # DATA payload bytes
    response_bytes: int = 0
    reset_code: int | None = None
    complete: bool = False
    headers_lost: bool = False           # some header block of the stream could not be decoded
    problem: str = ""
    tag: Any = None                      # the consumer's own (the span opened for it)

    def header(self, name: str, where: str = "request") -> str | None:
        headers = {"request": self.request_headers, "response": self.response_headers, "trailers": self.trailers}[where]
        for k, v in headers:
            if k == name:
                return v
        return None

    @property
    def grpc_status(self) -> int | None:
        """grpc-status from the trailers (or a trailers-only response)."""
        for where in ("trailers", "response"):
            value = self.header("grpc-status", where)
            if value is not None:
                try:
                    return int(value)
                except ValueError:
                    return None
        return None

    @property
    def grpc_message(self) -> str | None:
        for where in ("trailers", "response"):
            value = self.header("grpc-message", where)
            if value is not None:
                return unquote(value)
        return None


class _Direction:
    def __init__(self, client_to_server: bool) -> None:
        self.reader = FrameReader(expect_preface=client_to_server)
        self.decoder = Decoder()
        self.hpack_lost = ""   # why this direction's table is unknown
        self.block: list[Frame] = []  # header block being assembled (HEADERS/PUSH_PROMISE + CONTINUATIONs)


class H2Connection:
    """Both directions of one HTTP/2 connection.

    ``on_request(stream)`` is called when a request's HEADERS are decoded;
    ``feed`` returns streams that finished.
    """

    def __init__(self, *, on_request: Callable[[Stream], None] = lambda s: None) -> None:
        self._dirs = {True: _Direction(True), False: _Direction(False)}
        self._streams: dict[int, Stream] = {}
        self._on_request = on_request
        self._out: list[Stream] = []
        #: Counts of what could not be followed, by reason.
        self.problems: dict[str, int] = {}

    def _problem(self, reason: str) -> None:
        self.problems[reason] = self.problems.get(reason, 0) + 1

    def feed(self, client_to_server: bool, data: bytes, missing: int, stamp: Stamp) -> list[Stream]:
        d = self._dirs[client_to_server]
        if d.reader.broken:
            return []
        for frame in d.reader.feed(data, missing, stamp):
            self._frame(client_to_server, d, frame)
        if d.reader.broken:
            self._problem(d.reader.broken)
        return self._take()

    def close(self, stamp: Stamp, error: str = "") -> list[Stream]:
        for c2s in (True, False):
            if self._dirs[c2s].reader.mid_frame and not self._dirs[c2s].reader.broken:
                self._problem("truncated_frame")
        for stream in list(self._streams.values()):
            stream.last = stamp
            stream.problem = stream.problem or error or "connection_closed"
            self._finish(stream)
        return self._take()

    @property
    def broken(self) -> str:
        return self._dirs[True].reader.broken or self._dirs[False].reader.broken

    # -- frames ------------------------------------------------------------

    def _frame(self, c2s: bool, d: _Direction, f: Frame) -> None:
        if d.block and f.type != CONTINUATION:
            self._problem("interrupted_header_block")
            self._lose_hpack(d, "interrupted_header_block")
            d.block = []
        if f.type in (HEADERS, PUSH_PROMISE, CONTINUATION):
            if f.type == CONTINUATION and not d.block:
                self._lose_hpack(d, "orphan_continuation")
                return
            d.block.append(f)
            if f.flags & FLAG_END_HEADERS:
                self._header_block(c2s, d)
            return
        if f.type == DATA:
            stream = self._streams.get(f.stream_id)
            if stream is None:
                return
            if c2s:
                stream.request_bytes += f.length
            else:
                stream.response_first = stream.response_first or f.stamp
                stream.response_bytes += f.length
            if f.flags & FLAG_END_STREAM:
                self._end_stream(c2s, stream, f.end_stamp)
        elif f.type == RST_STREAM:
            stream = self._streams.get(f.stream_id)
            if stream is not None:
                stream.reset_code = int.from_bytes(f.payload[:4], "big") if len(f.payload) >= 4 else None
                stream.problem = "reset"
                stream.last = f.end_stamp
                self._finish(stream)
        elif f.type == SETTINGS and not f.flags & 0x1 and not f.lost:
            for i in range(0, len(f.payload) - 5, 6):
                ident, value = struct.unpack(">HI", f.payload[i : i + 6])
                if ident == SETTINGS_HEADER_TABLE_SIZE:
                    # The sender's decoder accepts a table this large: it bounds the other direction's encoder.
                    self._dirs[not c2s].decoder.max_allowed_table_size = value
                elif ident == SETTINGS_MAX_FRAME_SIZE and 16384 <= value <= MAX_FRAME:
                    self._dirs[not c2s].reader.max_length = value

    def _header_block(self, c2s: bool, d: _Direction) -> None:
        frames, d.block = d.block, []
        first = frames[0]
        block = bytearray()
        lost = any(f.lost for f in frames)
        for i, f in enumerate(frames):
            block += _fragment(f) if i == 0 else f.payload
        if lost:
            self._lose_hpack(d, "header_block_not_captured")
        headers: list[tuple[str, str]] | None = None
        if not d.hpack_lost:
            try:
                headers = [(str(k), str(v)) for k, v in d.decoder.decode(bytes(block), raw=False)]
            except (HPACKError, UnicodeDecodeError, ValueError, IndexError) as exc:
                self._lose_hpack(d, f"hpack_error:{type(exc).__name__}")
        if first.type == PUSH_PROMISE:
            return  # decoded only to keep the table in step; pushes are not followed
        self._headers(c2s, first, headers, frames[-1].end_stamp)

    def _headers(self, c2s: bool, f: Frame, headers: list[tuple[str, str]] | None, end: Stamp) -> None:
        stream = self._streams.get(f.stream_id)
        if c2s:
            if stream is None:
                stream = self._streams[f.stream_id] = Stream(f.stream_id, first=f.stamp)
                stream.request_headers = headers or []
                stream.headers_lost = headers is None
                self._on_request(stream)
            elif headers:
                stream.trailers.extend(headers)  # client trailers: not used for spans
        elif stream is not None:
            if headers is None:
                stream.headers_lost = True
            elif not stream.response_headers and not stream.response_first:
                stream.response_headers = headers
                if f.flags & FLAG_END_STREAM:
                    stream.trailers = [h for h in headers if h[0].startswith("grpc-")]
            else:
                stream.trailers = headers
            stream.response_first = stream.response_first or f.stamp
        if stream is not None and f.flags & FLAG_END_STREAM:
            self._end_stream(c2s, stream, end)

    def _end_stream(self, c2s: bool, stream: Stream, stamp: Stamp) -> None:
        if c2s:
            stream.request_ended = stamp
            return
        stream.last = stamp
        stream.complete = True
        self._finish(stream)

    def _finish(self, stream: Stream) -> None:
        self._streams.pop(stream.id, None)
        self._out.append(stream)

    def _lose_hpack(self, d: _Direction, reason: str) -> None:
        if not d.hpack_lost:
            d.hpack_lost = reason
            self._problem(reason.split(":")[0])

    def _take(self) -> list[Stream]:
        out, self._out = self._out, []
        return out


def _fragment(f: Frame) -> bytes:
    """The header block fragment of a HEADERS or PUSH_PROMISE frame (padding and priority removed)."""
    p = f.payload
    start, pad = 0, 0
    if f.flags & FLAG_PADDED and p:
        pad = p[0]
        start = 1
    if f.type == HEADERS and f.flags & FLAG_PRIORITY:
        start += 5
    elif f.type == PUSH_PROMISE:
        start += 4
    end = len(p) - pad if pad <= len(p) - start else start
    return p[start:end]
