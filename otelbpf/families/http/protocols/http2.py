"""HTTP/2 (cleartext, as gRPC uses it in clusters) from captured socket bytes.

Per connection: the client preface, frames in each direction, HPACK with a
dynamic table per direction (the ``hpack`` library's decoder, fed every
header block — HEADERS, CONTINUATION and PUSH_PROMISE — in order, because
each block may change the table the next one refers to), and streams from
their request HEADERS to the END_STREAM the server sends (or a RST_STREAM).

Cost: ``hpack``'s pure-Python decoder takes ~2 µs per header, ~19 µs for a
gRPC request's 8 indexed fields on a slow VM, three blocks per call at
each traced end; a client repeats the same bytes call after call. So the bytes of a
block that leave the table unchanged are decoded once per table state and
remembered (``_Direction.decode``); bytes that change it always go through
the decoder. Frames are cut straight out of each chunk.

What cannot be decoded is marked, never guessed:
- a gap (bytes moved but not captured) inside a DATA payload is skipped; a
  gap over a frame header loses frame boundaries for the rest of that
  direction (HTTP/2 has no marker to resynchronise on);
- a header block that was not captured whole, or that fails to decode,
  leaves that direction's HPACK table unknown: later header blocks could
  decode into wrong names, so none are decoded; streams are still timed and
  marked ``headers_lost``;
- a connection joined after its preface is not decoded at all.

What a connection holds is capped (limits.py), whatever the peer says: open
streams (beyond the cap the oldest is given up, ``stream_limit``), the bytes
of a header block being assembled (a CONTINUATION flood loses the block and
the direction's table, ``header_block_too_large``), the payload kept of one
frame, and the HPACK table (the smaller of the peer's
SETTINGS_HEADER_TABLE_SIZE and our cap: a larger table update fails to
decode and is counted).
"""

from __future__ import annotations

import functools
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from hpack import Decoder
from hpack.exceptions import HPACKError

from otelbpf.families.http.protocols.http1 import BodySink
from otelbpf.families.http.protocols.limits import DEFAULT, Held, Limits

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
FLAG_END_STREAM = 0x1
FLAG_END_HEADERS = 0x4
FLAG_PADDED = 0x8
FLAG_PRIORITY = 0x20
SETTINGS_HEADER_TABLE_SIZE = 1
SETTINGS_MAX_FRAME_SIZE = 5
#: Largest frame payload HTTP/2 allows (SETTINGS_MAX_FRAME_SIZE's maximum).
MAX_FRAME = (1 << 24) - 1
#: A frame header: length (24 bits, as 8 + 16), type, flags, reserved bit + stream id.
_FRAME_HEADER = struct.Struct(">BHBBI")
_SETTING = struct.Struct(">HI")
#: Per defined frame type (indexed by type), what the protocol requires of its header:
#: 1 on a stream, 0 on the connection (stream 0), None either; and its fixed length, or None.
_ON_STREAM = (1, 1, 1, 1, 0, 1, 0, 0, None, 1)
_FIXED_LENGTH = (None, None, 5, 4, None, None, 8, None, 4, None)
#: Frame types whose payload the parser keeps (DATA payloads are only counted).
_KEPT = frozenset({HEADERS, CONTINUATION, PUSH_PROMISE, RST_STREAM, SETTINGS})
#: Decoded header block segments remembered per direction (see ``_Direction.decode``).
_CACHED_BLOCKS = 64
#: ... of at most this many bytes each.
_CACHED_SEGMENT = 1024
#: HPACK indexed header fields whose index fits their first byte (1..126).
_INDEXED_RUN = re.compile(rb"[\x80-\xfe]*")

Stamp = Any
Headers = list[tuple[str, str]]


def looks_like_preface(data: bytes) -> bool:
    """Do these first bytes of a connection begin the HTTP/2 client preface?"""
    n = min(len(data), len(PREFACE))
    return n >= 4 and data[:n] == PREFACE[:n]


@dataclass(slots=True)
class Frame:
    type: int
    flags: int
    stream_id: int
    length: int
    stamp: Stamp  # chunk that carried the frame header
    payload: bytes = b""  # kept types only (and DATA its stream wants): up to the first gap
    lost: bool = False  # part of a kept payload was not captured
    end_stamp: Stamp = None  # chunk that carried the last payload byte
    keep: bool = False  # its payload is kept
    #: A whole DATA frame's chunk, its payload at ``at``: cut out only if a sink wants it.
    src: bytes | None = None
    at: int = 0
    mark: int = 0  # the caller's mark of the chunk that carried the frame header (FrameReader.mark)


class FrameReader:
    """Frames of one direction, across syscall boundaries and gaps.

    Whole frames inside one chunk (the common case: a sender writes whole
    frames, a reader gets what was written) are cut straight out of it; only
    a frame split across chunks goes through the carry-over buffers.

    Frames are handed to ``on_frame`` as they end (``deliver_to``), so what an
    earlier frame of the same chunk changed (a stream its HEADERS opened) is seen
    by the next. A whole DATA frame refers to its chunk (nothing copied); a DATA
    frame split across chunks keeps its payload only if ``wants_data(stream_id)``
    says so at its start.
    """

    def __init__(self, expect_preface: bool, keep_limit: int = DEFAULT.header_block) -> None:
        self._out: list[Frame] = []
        self._emit: Callable[[Frame], None] = self._out.append
        self._wants_data: Callable[[int], bool] = lambda stream_id: False
        self._preface_left = len(PREFACE) if expect_preface else 0
        #: Kept frames longer than this keep no payload (marked lost): a peer may announce 16 MiB frames.
        self._keep_limit = keep_limit
        self._first = True  # each endpoint's first frame is SETTINGS
        #: SETTINGS_MAX_FRAME_SIZE the receiving side advertised (16384 until it says otherwise).
        self.max_length = 16384
        self._hdr = bytearray()  # a frame header split across chunks
        self._frame: Frame | None = None  # a frame whose payload continues in the next chunk
        self._left = 0  # its payload bytes still to come
        self._buf = bytearray()  # its payload so far (kept types)
        #: Why this direction can no longer be read ("" while it can).
        self.broken = ""
        #: The caller's mark of the chunk being fed, given to each frame whose header it completes:
        #: what the chunk's record said (the kernel's sampling of the streams it begins).
        self.mark = 0

    def deliver_to(self, on_frame: Callable[[Frame], None], wants_data: Callable[[int], bool]) -> None:
        """Hand each frame to ``on_frame`` as it ends (``feed`` then returns none), and keep the
        payload of the DATA frames whose stream ``wants_data``."""
        self._emit, self._wants_data = on_frame, wants_data

    @property
    def mid_frame(self) -> bool:
        """A frame (or its header, or the preface) has begun and not ended."""
        return bool(self._hdr) or self._frame is not None or 0 < self._preface_left < len(PREFACE)

    def feed(self, data: bytes, missing: int, stamp: Stamp) -> list[Frame]:
        """Frames that ended in this chunk, in order (none when they go to ``on_frame``)."""
        pos, end = 0, len(data)
        if self._preface_left:
            pos = self._preface(data)
        while pos < end and not self.broken:
            if self._frame is not None:
                pos = self._continue(self._frame, data, pos, stamp)
            elif self._hdr or end - pos < 9:
                pos = self._split_header(data, pos, stamp)
            else:
                pos = self._whole_frames(data, pos, stamp)
        if missing and not self.broken:
            self._gap(missing, stamp)
        out = self._out[:]  # the list _emit appends to stays the same one
        self._out.clear()
        return out

    def _whole_frames(self, data: bytes, pos: int, stamp: Stamp) -> int:
        """Frames that lie whole in ``data`` from ``pos``, cut straight out of it; where they end
        (a frame that runs past the chunk is begun, to be continued)."""
        end = len(data)
        start, append = self._start, self._emit
        while end - pos >= 9:
            frame = start(data, pos, stamp)
            pos += 9
            if frame is None:
                break
            length = frame.length
            if length > end - pos:
                self._begin(frame)
                break
            if frame.keep:
                if length <= self._keep_limit:
                    frame.payload = bytes(data[pos : pos + length])
                else:
                    frame.lost = True
            elif frame.type == DATA:
                frame.src, frame.at = data, pos
            append(frame)
            pos += length
        return pos

    def _preface(self, data: bytes) -> int:
        """Check the client preface (or the part of it in this chunk); where frames begin."""
        n = min(self._preface_left, len(data))
        offset = len(PREFACE) - self._preface_left
        if data[:n] != PREFACE[offset : offset + n]:
            self.broken = "bad_preface"
        self._preface_left -= n
        return n

    def _start(self, header: bytes | bytearray, at: int, stamp: Stamp) -> Frame | None:
        """The frame whose 9-byte header is at ``header[at:]``, or None (and broken) if no valid HTTP/2
        frame starts there."""
        hi, lo, ftype, flags, stream_id = _FRAME_HEADER.unpack_from(header, at)
        length = hi << 16 | lo
        stream_id &= 0x7FFFFFFF
        # Frames HTTP/2 defines must sit on the right kind of stream and have the right size;
        # bytes that break that are not HTTP/2 (or were misframed).
        if length > self.max_length:
            self.broken = "invalid_frame"
            return None
        if ftype < 10:
            on_stream, fixed = _ON_STREAM[ftype], _FIXED_LENGTH[ftype]
            if (
                (on_stream is not None and on_stream != bool(stream_id))
                or (fixed is not None and length != fixed)
                or (ftype == SETTINGS and length % 6)
            ):
                self.broken = "invalid_frame"
                return None
        if self._first:
            if ftype != SETTINGS or flags & 0x1:
                self.broken = "invalid_frame"
                return None
            self._first = False
        return Frame(ftype, flags, stream_id, length, stamp, b"", False, stamp, ftype in _KEPT, mark=self.mark)

    def _begin(self, frame: Frame) -> None:
        """A frame whose payload runs into later chunks: carried over (a DATA frame's only if wanted)."""
        if frame.type == DATA and self._wants_data(frame.stream_id):
            frame.keep = True
        self._frame, self._left, self._buf = frame, frame.length, bytearray()

    def _split_header(self, data: bytes, pos: int, stamp: Stamp) -> int:
        """Gather a frame header that runs across chunks; start its frame once whole."""
        n = min(9 - len(self._hdr), len(data) - pos)
        self._hdr += data[pos : pos + n]
        if len(self._hdr) == 9:
            frame = self._start(self._hdr, 0, stamp)
            self._hdr.clear()
            if frame is not None:
                self._begin(frame)
                if not frame.length:
                    self._emit(self._end_frame(frame, stamp))
        return pos + n

    def _continue(self, frame: Frame, data: bytes, pos: int, stamp: Stamp) -> int:
        """More of the payload of ``frame``, the one begun in an earlier chunk."""
        n = min(self._left, len(data) - pos)
        if frame.keep:
            if frame.length > self._keep_limit:
                frame.lost = True
            elif not frame.lost:  # the payload kept ends at its first gap
                self._buf += data[pos : pos + n]
        self._left -= n
        if self._left == 0:
            self._emit(self._end_frame(frame, stamp))
        return pos + n

    def _end_frame(self, frame: Frame, stamp: Stamp) -> Frame:
        """``frame`` (the one carried over) ends: it takes the payload kept, and none is carried over."""
        frame.payload = bytes(self._buf)
        frame.end_stamp = stamp
        self._frame = None
        self._buf = bytearray()
        return frame

    def _gap(self, missing: int, stamp: Stamp) -> None:
        frame = self._frame
        if frame is None or self._preface_left:
            self.broken = "gap_in_framing"
            return
        n = min(missing, self._left)
        self._left -= n
        if frame.keep:
            frame.lost = True
        if self._left == 0:
            self._emit(self._end_frame(frame, stamp))
        if missing > n:
            self.broken = "gap_in_framing"


#: ``Stream.header``'s ``where``: the field it reads.
_HEADER_LISTS = {"request": "request_headers", "response": "response_headers", "trailers": "trailers"}


@dataclass(slots=True)
class Stream:
    """One request/response exchange on an HTTP/2 connection."""

    id: int
    first: Stamp  # chunk with the request HEADERS
    request_headers: list[tuple[str, str]] = field(default_factory=list)
    response_headers: list[tuple[str, str]] = field(default_factory=list)
    trailers: list[tuple[str, str]] = field(default_factory=list)
    request_ended: Stamp = None  # client's END_STREAM
    response_first: Stamp = None
    last: Stamp = None  # server's END_STREAM, RST_STREAM, or the connection's end
    request_bytes: int = 0  # DATA payload bytes
    response_bytes: int = 0
    reset_code: int | None = None
    complete: bool = False
    headers_lost: bool = False  # some header block of the stream could not be decoded
    problem: str = ""
    #: The mark of the chunk that carried its request HEADERS' frame header (H2Connection.feed):
    #: where the kernel decided the stream, which a block spanning two chunks must not move.
    mark: int = 0
    tag: Any = None  # the consumer's own (the span opened for it)
    response_frames: int = 0  # DATA frames with a payload, server to client
    first_data: Stamp = None  # chunk with the first of them
    #: The consumer's, set when the request's (response's) HEADERS are decoded: told that body's bytes.
    request_sink: BodySink | None = None
    response_sink: BodySink | None = None

    def header(self, name: str, where: str = "request") -> str | None:
        headers: Headers = getattr(self, _HEADER_LISTS[where])
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
    """One direction's frames and HPACK decoding state."""

    def __init__(self, client_to_server: bool, limits: Limits = DEFAULT) -> None:
        self.reader = FrameReader(expect_preface=client_to_server, keep_limit=limits.header_block)
        self.decoder = Decoder()
        self.decoder.max_header_list_size = limits.header_block
        self._table_cap = limits.hpack_table
        self.hpack_lost = ""  # why this direction's table is unknown
        self.block: list[Frame] = []  # header block being assembled (HEADERS/PUSH_PROMISE + CONTINUATIONs)
        self.block_bytes = 0  # its length on the wire so far
        #: Header block segments decoded since the dynamic table last changed, by their bytes.
        self._decoded: dict[bytes, Headers] = {}
        #: The table's size limit, length and newest entry (by identity): see _table_changed.
        self._table_seen: tuple[int, int, tuple[bytes, bytes] | None] = (self.decoder.header_table.maxsize, 0, None)

    def decode(self, block: bytes) -> Headers:
        """The block's headers. Its leading run of one-byte indexed fields (the pseudo-headers and
        headers a client repeats every call, which leave the table as it is) is decoded apart from
        the rest (say a ``traceparent`` literal, new every call), so that the run is remembered on
        its own; a table size update after such a run is not split off (the decoder must see it
        out of place, and fail)."""
        run = _INDEXED_RUN.match(block)
        assert run is not None  # a starred pattern matches every block, if only the empty run
        split = run.end()
        if 0 < split < len(block) and block[split] & 0xE0 != 0x20:
            return self._decode_segment(block[:split]) + self._decode_segment(block[split:])
        return self._decode_segment(block)

    def _decode_segment(self, segment: bytes) -> Headers:
        """Headers of whole representations, through the HPACK decoder unless these very bytes were
        decoded against the same table before.

        The decoder's output depends only on the bytes and the table, and bytes that leave the
        table as it was (indexed fields, literals not indexed) decode alike the next time; so they
        are remembered until the table (or the size it may have) changes. Bytes that change the
        table are never skipped.
        """
        headers = self._decoded.get(segment)
        if headers is not None:
            return list(headers)
        headers = [(str(k), str(v)) for k, v in self.decoder.decode(segment, raw=False)]
        if self._table_changed():
            self._decoded.clear()
        elif len(segment) <= _CACHED_SEGMENT:  # what clients repeat is short; a long one would pin memory
            if len(self._decoded) >= _CACHED_BLOCKS:
                self._decoded.clear()
            self._decoded[segment] = headers
        return list(headers)

    def allow_table_size(self, size: int) -> None:
        """SETTINGS_HEADER_TABLE_SIZE from the receiving side: the decoder checks the table against it,
        or against our own cap if that is smaller (a peer may allow 4 GiB)."""
        self.decoder.max_allowed_table_size = min(size, self._table_cap)
        self._decoded.clear()  # a block remembered may now fail that check

    def _table_changed(self) -> bool:
        """Has the dynamic table changed since the last call? Every change moves its size limit,
        its length or its newest entry: the decoder inserts a new tuple object each time, equal in
        value to the one before or not, so the entry is compared by identity (and kept alive here,
        so that its identity is not reused)."""
        table = self.decoder.header_table
        entries = table.dynamic_entries
        seen = (table.maxsize, len(entries), entries[0] if entries else None)
        size, length, newest = self._table_seen
        self._table_seen = seen
        return seen[0] != size or seen[1] != length or seen[2] is not newest


class H2Connection:
    """Both directions of one HTTP/2 connection.

    ``on_request(stream)`` is called when a request's HEADERS are decoded, ``on_response(stream)``
    when its response's first HEADERS are, ``on_streaming(stream)`` at its response's second DATA
    frame if no response sink is set by then (any may set the stream's body sinks; one set at the
    second frame is told of the first frame's start too); ``feed`` returns streams that finished.
    """

    def __init__(
        self,
        *,
        on_request: Callable[[Stream], None] = lambda s: None,
        on_response: Callable[[Stream], None] = lambda s: None,
        on_streaming: Callable[[Stream], None] = lambda s: None,
        limits: Limits = DEFAULT,
        held: Held | None = None,
    ) -> None:
        self._dirs = {c2s: _Direction(c2s, limits) for c2s in (True, False)}
        for c2s, d in self._dirs.items():
            d.reader.deliver_to(functools.partial(self._frame, c2s, d), functools.partial(self._wants_data, c2s))
        self._on_response = on_response
        self._on_streaming = on_streaming
        self._limits = limits
        self._held = held if held is not None else Held(limits.held_per_process)
        #: Open streams, oldest first (the order evictions follow).
        self._streams: dict[int, Stream] = {}
        self._on_request = on_request
        self._out: list[Stream] = []
        #: Counts of what could not be followed, by reason.
        self.problems: dict[str, int] = {}

    def _problem(self, reason: str) -> None:
        self.problems[reason] = self.problems.get(reason, 0) + 1

    def feed(self, client_to_server: bool, data: bytes, missing: int, stamp: Stamp, mark: int = 0) -> list[Stream]:
        """``mark``: the caller's word on this chunk, which a stream whose request HEADERS begin in it
        keeps (``Stream.mark``)."""
        d = self._dirs[client_to_server]
        if d.reader.broken:
            return []
        d.reader.mark = mark
        d.reader.feed(data, missing, stamp)  # each frame goes to _frame as it ends
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

    def abandon(self) -> list[Stream]:
        """The kernel counts this connection's streams from here on (bpf/h2_frames.h): the open
        ones are given up, not finished (their ends are the kernel's to count), and no more bytes
        are parsed (the HPACK state is gone with the records the kernel no longer sends)."""
        streams = list(self._streams.values())
        self._held.give(len(streams))
        self._streams.clear()
        for d in self._dirs.values():
            d.reader.broken = d.reader.broken or "counted_in_kernel"
        return streams

    @property
    def broken(self) -> str:
        return self._dirs[True].reader.broken or self._dirs[False].reader.broken

    # -- frames ------------------------------------------------------------

    def _frame(self, c2s: bool, d: _Direction, f: Frame) -> None:
        ftype = f.type
        if d.block and ftype != CONTINUATION:
            self._problem("interrupted_header_block")
            self._lose_hpack(d, "interrupted_header_block")
            d.block = []
        if ftype == DATA:
            self._data(c2s, f)
        elif ftype in (HEADERS, PUSH_PROMISE, CONTINUATION):
            if ftype == CONTINUATION and not d.block:
                self._lose_hpack(d, "orphan_continuation")
                return
            before = d.block_bytes if ftype == CONTINUATION else 0
            d.block_bytes = before + f.length
            if d.block_bytes > self._limits.header_block:
                # A CONTINUATION flood: only the block's first frame is kept, to time its stream.
                if before <= self._limits.header_block:
                    self._problem("header_block_too_large")
                    d.hpack_lost = d.hpack_lost or "header_block_too_large"
                if not d.block:
                    d.block.append(f)
                del d.block[1:]
                if f.flags & FLAG_END_HEADERS:
                    first, d.block = d.block[0], []
                    if first.type == HEADERS:
                        self._headers(c2s, first, None, f.end_stamp)
                return
            if not f.flags & FLAG_END_HEADERS:
                d.block.append(f)
            elif d.block:
                frames, d.block = d.block + [f], []
                self._header_block(c2s, d, frames)
            else:
                self._header_block(c2s, d, [f])
        elif ftype == RST_STREAM:
            stream = self._streams.get(f.stream_id)
            if stream is not None:
                stream.reset_code = int.from_bytes(f.payload[:4], "big") if len(f.payload) >= 4 else None
                stream.problem = "reset"
                stream.last = f.end_stamp
                self._finish(stream)
        elif ftype == SETTINGS and not f.flags & 0x1 and not f.lost:
            self._settings(c2s, f.payload)

    def _wants_data(self, c2s: bool, stream_id: int) -> bool:
        stream = self._streams.get(stream_id)
        sink = None if stream is None else stream.request_sink if c2s else stream.response_sink
        return sink is not None and sink.wants_bytes

    def _data(self, c2s: bool, f: Frame) -> None:
        stream = self._streams.get(f.stream_id)
        if stream is None:
            return
        if c2s:
            stream.request_bytes += f.length
            sink = stream.request_sink
        else:
            stream.response_first = stream.response_first or f.stamp
            stream.response_bytes += f.length
            sink = stream.response_sink
            if f.length:
                stream.response_frames += 1
                if stream.response_frames == 1:
                    stream.first_data = f.stamp
                elif stream.response_frames == 2 and sink is None:  # a unary response is never watched
                    self._on_streaming(stream)
                    sink = stream.response_sink
                    if sink is not None:
                        sink.unit(stream.first_data)
        if sink is not None and f.length:
            sink.unit(f.stamp)
            if sink.wants_bytes and (f.keep or f.src is not None):
                self._deliver(sink, f)
        if f.flags & FLAG_END_STREAM:
            self._end_stream(c2s, stream, f.end_stamp)

    def _deliver(self, sink: BodySink, f: Frame) -> None:
        """A DATA frame's content (its padding removed) to ``sink``: the bytes captured, then what was not."""
        p, start, size = f.payload if f.src is None else f.src[f.at : f.at + f.length], 0, f.length
        if f.flags & FLAG_PADDED:
            if not p:
                sink.gap(size)
                return
            start, size = 1, size - 1 - p[0]
            if size < 0:
                self._problem("bad_padding")
                return
        data = p[start : start + size]
        if data:
            sink.data(data, f.end_stamp)
        if len(data) < size:
            sink.gap(size - len(data))

    def _settings(self, c2s: bool, payload: bytes) -> None:
        """What the sender's SETTINGS say about the other direction: its table size and frame size limits."""
        other = self._dirs[not c2s]
        for ident, value in _SETTING.iter_unpack(payload):
            if ident == SETTINGS_HEADER_TABLE_SIZE:
                # The sender's decoder accepts a table this large: it bounds the other direction's encoder.
                other.allow_table_size(value)
            elif ident == SETTINGS_MAX_FRAME_SIZE and 16384 <= value <= MAX_FRAME:
                other.reader.max_length = value

    def _header_block(self, c2s: bool, d: _Direction, frames: list[Frame]) -> None:
        """A whole header block: HEADERS or PUSH_PROMISE, then any CONTINUATIONs."""
        first = frames[0]
        if len(frames) == 1:
            block, lost = _fragment(first), first.lost
        else:
            block = b"".join([_fragment(first)] + [f.payload for f in frames[1:]])
            lost = any(f.lost for f in frames)
        if lost:
            self._lose_hpack(d, "header_block_not_captured")
        headers: Headers | None = None
        if not d.hpack_lost:
            try:
                headers = d.decode(block)
            except (HPACKError, UnicodeDecodeError, ValueError, IndexError) as exc:
                self._lose_hpack(d, f"hpack_error:{type(exc).__name__}")
        if first.type == PUSH_PROMISE:
            return  # decoded only to keep the table in step; pushes are not followed
        self._headers(c2s, first, headers, frames[-1].end_stamp)

    def _headers(self, c2s: bool, f: Frame, headers: list[tuple[str, str]] | None, end: Stamp) -> None:
        stream = self._streams.get(f.stream_id)
        if c2s:
            if stream is None:
                stream = self._open_stream(f)
                if stream is None:
                    return
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
                    self._on_response(stream)
            else:
                stream.trailers = headers
            stream.response_first = stream.response_first or f.stamp
        if stream is not None and f.flags & FLAG_END_STREAM:
            self._end_stream(c2s, stream, end)

    def _open_stream(self, f: Frame) -> Stream | None:
        """A new stream, within the caps: beyond this connection's, its oldest stream is given up;
        beyond the process's, the oldest here if there is one, else the new stream is not followed."""
        if len(self._streams) >= self._limits.open_streams:
            self._evict("stream_limit", f.stamp)
        if not self._held.take():
            if not self._streams:
                self._problem("process_limit")
                return None
            self._evict("process_limit", f.stamp)
            self._held.take()
        stream = self._streams[f.stream_id] = Stream(f.stream_id, first=f.stamp, mark=f.mark)
        return stream

    def _evict(self, reason: str, stamp: Stamp) -> None:
        self._problem(reason)
        oldest = self._streams[next(iter(self._streams))]
        oldest.problem, oldest.last = reason, stamp
        self._finish(oldest)

    def _end_stream(self, c2s: bool, stream: Stream, stamp: Stamp) -> None:
        if c2s:
            stream.request_ended = stamp
            return
        stream.last = stamp
        stream.complete = True
        self._finish(stream)

    def _finish(self, stream: Stream) -> None:
        if self._streams.pop(stream.id, None) is not None:
            self._held.give()
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
