"""HTTP/1.x from captured socket bytes: request and response messages, paired.

Input is what the sensor saw, one syscall at a time: the first bytes moved
and how many more were moved but not captured (a *gap*). A gap inside a body
is harmless (Content-Length and chunk sizes say how much to skip); a gap
where framing lives (headers, a chunk-size line) loses the message boundary.
Then the stream is *desynchronised*: nothing is guessed, the message is
marked truncated, and parsing resumes only at a syscall whose bytes begin
with an HTTP start line — which is also how a connection that began before
the agent is joined.

Covers: request line, headers, status line, Content-Length and chunked
bodies (with trailers), bodiless responses (HEAD, 1xx, 204, 304), bodies
delimited by close, keep-alive (any number of messages per connection) and
pipelining (responses are paired with requests in order).

Bodies are counted, never kept. A consumer that wants what a body carries
(an SSE stream, a JSON payload) sets ``Message.sink`` when the head is
parsed: the parser then hands it the body's bytes as they were captured,
de-chunked, each chunk's start, and every gap (``BodySink``).

Hostile input: framing numbers follow the RFC 9112 grammar exactly (a chunk
size is hex digits only, at most 15; a Content-Length decimal digits only, at
most 15, repeated values equal; a status three digits; a request target one
of the four forms) and anything else desynchronises the stream with its
reason counted: ``int()`` would accept signs, underscores, blanks and
thousands of digits, and a negative size moved the parse position backwards
forever. What a connection holds is capped (limits.py): requests pipelined
beyond the cap are not followed (their responses are counted, not paired).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from otelbpf.families.http.protocols.limits import DEFAULT, Held, Limits

#: Header blocks larger than this are not HTTP we can follow.
MAX_HEAD = 64 * 1024
_REQUEST_LINE = re.compile(rb"([A-Z][A-Z-]{0,19}) (\S+) HTTP/(1\.[01])\r?\n")
_STATUS_LINE = re.compile(rb"HTTP/(1\.[01]) ([1-9][0-9][0-9])(?: ([^\r\n]*))?\r?\n")
#: The same on a head decoded as latin-1 (byte for character; ASCII classes, as bytes patterns have).
_REQUEST_LINE_TEXT = re.compile(_REQUEST_LINE.pattern.decode(), re.ASCII)
_STATUS_LINE_TEXT = re.compile(_STATUS_LINE.pattern.decode(), re.ASCII)
#: The blank line ending a head (its end; a leading CR would not move it). Starting with a literal
#: LF lets the regex engine skip to each LF instead of trying a match at every byte.
_HEAD_END = re.compile(rb"\n\r?\n")
#: One header line (RFC 9110 token, colon, value without leading blanks), found in C by one
#: findall per head rather than a Python loop over lines. The value's line end (CR) and trailing
#: blanks are cut in Python (_parse_head): a lazy value in the regex costs it a try per byte.
_HEADER_LINE = re.compile(r"^([!#$%&'*+\-.^_`|~0-9A-Za-z]+):[ \t]*(.*)$", re.M)
#: A chunk-size line (RFC 9112 7.1): hex digits, then optional extensions; line end removed.
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,15})[ \t]*(?:;[^\r\n]*)?")
#: A Content-Length value (RFC 9110 8.6): digits, or a list of the same digits repeated.
_CONTENT_LENGTH = re.compile(r"[0-9]{1,15}(?:[ \t]*,[ \t]*[0-9]{1,15})*")
#: Request targets (RFC 9112 3.2): origin-form, absolute-form, then authority-form (CONNECT)
#: and asterisk-form (OPTIONS), visible characters only (bytes above 0x7f let through: many
#: clients send raw UTF-8), at most MAX_TARGET.
MAX_TARGET = 16 * 1024
_TARGET = re.compile(r"(?:/|[A-Za-z][A-Za-z0-9+.-]*://)[!-~\x80-\xff]*")
_AUTHORITY = re.compile(r"[!-~]+:[0-9]{1,5}")
_METHOD_PREFIX = re.compile(rb"[A-Z][A-Z-]{0,19}(?: [^ \r\n]*(?: H(?:T(?:T(?:P(?:/(?:1(?:\.[01]?)?)?)?)?)?)?)?)?\r?$")

#: Stray line ends are allowed between messages.
_LINE_ENDS = b"\r\n"

#: Opaque per-syscall stamp the caller passes with each chunk (time, thread).
Stamp = Any


def looks_like_request(data: bytes) -> bool:
    """Does ``data`` begin with a complete HTTP/1.x request line?"""
    return _REQUEST_LINE.match(data) is not None


def looks_like_response(data: bytes) -> bool:
    """Does ``data`` begin with a complete HTTP/1.x status line?"""
    return _STATUS_LINE.match(data) is not None


@dataclass(slots=True)
class Head:
    """A parsed start line and header block. Header names are lower-case."""

    version: str
    headers: list[tuple[str, str]]
    #: Each header's first value, by name: several are looked up per message (framing, Host, traceparent).
    first: dict[str, str] = field(repr=False, compare=False)
    method: str = ""  # requests
    target: str = ""  # requests
    status: int = 0  # responses
    truncated: bool = False  # the header block was not captured whole

    def get(self, name: str) -> str | None:
        """The first value of header ``name``."""
        return self.first.get(name)


#: The head of a message whose head is not parsed yet (its version is empty); replaced, never changed.
_NO_HEAD = Head("", [], {})


class BodySink(Protocol):
    """What a consumer of a message's body is told, in wire order (HTTP/1 and HTTP/2 alike)."""

    #: False: only ``unit`` and ``gap`` are wanted (the bytes are not copied out for it).
    wants_bytes: bool

    def unit(self, stamp: Stamp) -> None:
        """A transfer unit begins: an HTTP/1 chunk (its size line) or an HTTP/2 DATA frame."""

    def data(self, data: bytes, stamp: Stamp) -> None:
        """Body bytes (de-chunked, unpadded) captured from the syscall ``stamp``."""

    def gap(self, n: int) -> None:
        """``n`` body bytes moved but not captured: what follows does not continue what came before."""


@dataclass(slots=True)
class Message:
    head: Head
    first: Stamp  # chunk that carried the first byte
    last: Stamp | None = None  # chunk that carried the last byte
    size: int = 0  # bytes on the wire, head included
    body_size: int = 0
    complete: bool = False
    problem: str = ""  # why it is incomplete
    tag: Any = None  # the consumer's own (the span opened for it)
    chunks: int = 0  # chunks of a chunked body (the last, empty one not counted)
    sink: BodySink | None = None  # the consumer's, set at its head: told the body's bytes


def _parse_head(block: bytes, is_request: bool, truncated: bool) -> Head | None:
    text = block.decode("latin-1")  # once: the start line is matched on the text too
    m = (_REQUEST_LINE_TEXT if is_request else _STATUS_LINE_TEXT).match(text)
    if not m:
        return None
    rest = text[m.end() :]
    if truncated:
        rest = rest[: rest.rfind("\n") + 1]  # the last line may be cut short
    headers = [
        (name.lower(), (value[:-1] if value[-1:] == "\r" else value).rstrip(" \t"))
        for name, value in _HEADER_LINE.findall(rest)
    ]
    first = dict(reversed(headers))
    if is_request:
        method, target, version = m.groups()
        return Head(version, headers, first, method, target, truncated=truncated)
    return Head(m.group(1), headers, first, status=int(m.group(2)), truncated=truncated)


@dataclass
class _State:
    mode: str = "start"  # start | head | length | chunk_size | chunk_data | chunk_crlf | trailers | close | desync
    buf: bytearray = field(default_factory=bytearray)
    remaining: int = 0


class MessageStream:
    """One direction of an HTTP/1.x connection: a sequence of messages.

    ``feed`` returns the messages completed (or abandoned) by that chunk;
    ``on_head`` is called as soon as a message's head is parsed, before its
    body, so a request can open its span while the server works on it.
    """

    def __init__(
        self,
        is_request: bool,
        *,
        request_method: Callable[[], str | None] = lambda: None,
        on_head: Callable[[Message], None] = lambda m: None,
        synchronized: bool = True,
        problems: dict[str, int] | None = None,
    ) -> None:
        self.is_request = is_request
        self._request_method = request_method  # method of the request this response answers
        self._on_head = on_head
        self._s = _State(mode="start" if synchronized else "desync")
        self._msg: Message | None = None
        self._done: list[Message] = []
        self._stamp: Stamp = None
        self._prev: Stamp = None  # stamp of the previous chunk
        #: Counts of what could not be followed, by reason (``problems``: shared with the other direction).
        self.problems: dict[str, int] = {} if problems is None else problems
        self.upgraded = False

    # -- input ---------------------------------------------------------------

    def feed(self, data: bytes, missing: int, stamp: Stamp) -> list[Message]:
        """``data``: bytes captured from one syscall; ``missing``: bytes moved after them but not captured."""
        if self.upgraded:
            return []
        if self._s.mode == "desync":
            if not self._starts_message(data):
                self._prev = stamp
                return self._take()
            self._stamp = self._prev  # the abandoned message ended before this chunk
            self._abandon("desync")
            self._s = _State()
        self._stamp = stamp
        pos = 0
        while pos < len(data) and self._s.mode != "desync" and not self.upgraded:
            pos = self._step(data, pos)
        if missing:
            self._gap(missing)
        self._prev = stamp
        return self._take()

    def feed_eof(self, stamp: Stamp, error: str = "") -> list[Message]:
        """The peer closed (``error`` empty) or the connection failed."""
        self._stamp = stamp
        m = self._msg
        if m is not None:
            if self._s.mode == "close" and not error:
                self._finish()
            else:
                self._abandon(error or "eof")
        return self._take()

    # -- state machine -----------------------------------------------------------

    def _reading(self) -> Message:
        """The message being read: every mode between its first byte and its end (or desync) has one."""
        msg = self._msg
        assert msg is not None, f"no message in mode {self._s.mode}"
        return msg

    def _starts_message(self, data: bytes) -> bool:
        return looks_like_request(data) if self.is_request else looks_like_response(data)

    def _step(self, data: bytes, pos: int) -> int:
        s = self._s
        mode = s.mode
        if mode == "start":
            if data[pos] in _LINE_ENDS:
                pos = len(data) - len(data[pos:].lstrip(b"\r\n"))  # stray line ends between messages are allowed
                if pos == len(data):
                    return pos
            # Common case: the whole head in this chunk; no copy into the buffer.
            m = _HEAD_END.search(data, pos)
            if m is not None:
                end = m.end()
                self._msg = Message(_NO_HEAD, self._stamp, size=end - pos)
                self._head_done(data[pos:end], truncated=False)
                return end
            self._msg = Message(_NO_HEAD, self._stamp)
            s.mode = mode = "head"
        if mode == "head":
            before = len(s.buf)
            s.buf += data[pos:]
            m = _HEAD_END.search(s.buf, max(0, before - 3))
            if m is None:
                if not self._plausible_start(s.buf):
                    self._msg = None
                    self._desync("bad_start_line")
                    return len(data)
                if len(s.buf) > MAX_HEAD:
                    self._desync("head_too_large")
                    return len(data)
                self._reading().size += len(data) - pos
                return len(data)
            used = m.end() - before
            self._reading().size += used
            self._head_done(bytes(s.buf[: m.end()]), truncated=False)
            s.buf.clear()
            return pos + used
        if mode in ("length", "chunk_data", "close"):
            n = len(data) - pos
            if mode != "close" and s.remaining < n:
                n = s.remaining
            msg = self._reading()
            msg.size += n
            msg.body_size += n
            if msg.sink is not None and n and msg.sink.wants_bytes:
                msg.sink.data(data[pos : pos + n], self._stamp)
            if mode != "close":
                s.remaining -= n
                if s.remaining == 0:
                    if mode == "length":
                        self._finish()
                    else:
                        s.mode = "chunk_crlf"
                        s.remaining = 2
            return pos + n
        if mode == "chunk_crlf":
            n = min(s.remaining, len(data) - pos)
            if data[pos : pos + n] != b"\r\n"[2 - s.remaining : 2 - s.remaining + n]:
                self._desync("bad_chunk")
                return len(data)
            self._reading().size += n
            s.remaining -= n
            if s.remaining == 0:
                s.mode = "chunk_size"
            return pos + n
        if mode in ("chunk_size", "trailers"):
            end = data.find(b"\n", pos)
            if end < 0:
                s.buf += data[pos:]
                self._reading().size += len(data) - pos
                if len(s.buf) > 4096:
                    self._desync("bad_chunk")
                return len(data)
            s.buf += data[pos : end + 1]
            self._reading().size += end + 1 - pos
            line = bytes(s.buf).rstrip(b"\r\n")
            s.buf.clear()
            if mode == "trailers":
                if not line:
                    self._finish()
                return end + 1
            m = _CHUNK_SIZE.fullmatch(line)
            if m is None:
                self._desync("bad_chunk_size")
                return len(data)
            size = int(m.group(1), 16)
            if size == 0:
                s.mode = "trailers"
            else:
                s.mode, s.remaining = "chunk_data", size
                msg = self._reading()
                msg.chunks += 1
                if msg.sink is not None:
                    msg.sink.unit(self._stamp)
            return end + 1
        raise AssertionError(mode)

    def _plausible_start(self, buf: bytearray) -> bool:
        """Can ``buf`` still begin a start line? Decided on the first line as soon as it is whole."""
        end = buf.find(b"\n")
        if end < 0:
            if self.is_request:
                return len(buf) <= 8192 and _METHOD_PREFIX.match(buf) is not None
            return bytes(buf[:5]) == b"HTTP/"[: len(buf)]
        line = bytes(buf[: end + 1])
        return (_REQUEST_LINE if self.is_request else _STATUS_LINE).fullmatch(line) is not None

    def _head_done(self, block: bytes, truncated: bool) -> None:
        head = _parse_head(block, self.is_request, truncated)
        if head is None:
            self._msg = None
            self._desync("bad_start_line")
            return
        if self.is_request and not valid_target(head.method, head.target):
            self._msg = None
            self._desync("bad_request_target")
            return
        msg = self._reading()
        msg.head = head
        if not self.is_request and 100 <= head.status < 200 and head.status != 101:
            # An interim response (100 Continue): the final one follows.
            self._msg = None
            self._s.mode = "start"
            return
        self._on_head(msg)
        if truncated:
            self._desync("headers_truncated")
            return
        mode, remaining = self._body_mode(head)
        if mode == "desync":
            self._desync("bad_content_length")
            return
        self._s.mode, self._s.remaining = mode, remaining
        if mode == "upgraded":
            self.upgraded = True
            self._finish()
        elif self._s.mode == "done":
            self._finish()

    def _body_mode(self, head: Head) -> tuple[str, int]:
        if not self.is_request:
            if head.status == 101:
                return "upgraded", 0
            method = self._request_method()
            if head.status in (204, 304) or method == "HEAD":
                return "done", 0
            if method == "CONNECT" and 200 <= head.status < 300:
                return "upgraded", 0
        first = head.first
        te = first.get("transfer-encoding")
        if te and "chunked" in te.lower():
            return "chunk_size", 0
        cl = first.get("content-length")
        if cl is not None:
            # Every field when some header repeats (one pass, only then), else the one value.
            n = _content_length(
                [v for k, v in head.headers if k == "content-length"] if len(first) != len(head.headers) else [cl]
            )
            if n is None:
                return "desync", 0
            return ("length", n) if n > 0 else ("done", 0)
        if self.is_request:
            return "done", 0
        return "close", 0

    def _body(self, n: int) -> None:
        msg = self._reading()
        msg.size += n
        msg.body_size += n
        if msg.sink is not None and n:
            msg.sink.gap(n)

    def _gap(self, missing: int) -> None:
        s = self._s
        if s.mode in ("length", "chunk_data"):
            n = min(missing, s.remaining)
            self._body(n)
            s.remaining -= n
            missing -= n
            if s.remaining == 0:
                if s.mode == "length":
                    self._finish()
                else:
                    s.mode, s.remaining = "chunk_crlf", 2
            if missing:
                self._desync("gap_in_framing")
        elif s.mode == "close":
            self._body(missing)
        elif s.mode == "head":
            # The head was not captured whole: keep what was, say so, and wait
            # for the next message start.
            self._reading().size += missing
            self._head_done(bytes(s.buf), truncated=True)
            s.buf.clear()
            if self._s.mode != "desync":
                self._desync("headers_truncated")
        elif s.mode != "desync":  # start, chunk-size line, CRLF, trailers: framing was lost
            self._desync("gap_in_framing")

    def _desync(self, reason: str) -> None:
        self.problems[reason] = self.problems.get(reason, 0) + 1
        self._s = _State(mode="desync")
        if self._msg is not None and self._msg.head.version:
            self._msg.problem = reason
        elif self._msg is not None:
            self._msg = None

    def _finish(self) -> None:
        msg = self._reading()
        msg.last = self._stamp
        msg.complete = True
        self._done.append(msg)
        self._msg = None
        s = self._s
        if s.mode != "desync" and not self.upgraded:
            s.mode, s.remaining = "start", 0  # its buffer is empty between messages

    def _abandon(self, reason: str) -> None:
        msg = self._msg
        if msg is not None and msg.head.version:
            msg.last = self._stamp
            msg.problem = msg.problem or reason
            self._done.append(msg)
        self._msg = None

    def _take(self) -> list[Message]:
        done, self._done = self._done, []
        return done


def valid_target(method: str, target: str) -> bool:
    """Is ``target`` a request target RFC 9112 allows for ``method``?"""
    if len(target) > MAX_TARGET:
        return False
    if _TARGET.fullmatch(target):
        return True
    if method == "CONNECT":
        return _AUTHORITY.fullmatch(target) is not None
    return target == "*" and method == "OPTIONS"


def _content_length(values: list[str]) -> int | None:
    """The body length that Content-Length fields say, or None if they are not valid or disagree."""
    if len(values) == 1 and values[0].isdigit() and values[0].isascii() and len(values[0]) <= 15:
        return int(values[0])  # the usual case, without the regex
    lengths: set[int] = set()
    for value in values:
        if not _CONTENT_LENGTH.fullmatch(value):
            return None
        lengths.update(int(v) for v in value.split(","))
    return lengths.pop() if len(lengths) == 1 else None


class _Skipped:
    """A run of pipelined requests not followed (over the cap): their responses are counted, not paired."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 1


@dataclass(slots=True)
class Exchange:
    """A request and the response that answered it (either may be missing)."""

    request: Message | None
    response: Message | None
    error: str = ""
    at: Stamp = None  # chunk (or connection end) that finished it


class Http1Connection:
    """Both directions of one connection, with responses paired to requests in order.

    ``on_request(message)``: a request head was parsed (its span can open).
    ``on_response(request, response)``: a final response head was parsed; ``request`` is the
    one it answers (None if that one is not followed). Either may set the message's ``sink``.
    ``feed`` returns exchanges that are finished: answered, or given up on.
    """

    def __init__(
        self,
        *,
        on_request: Callable[[Message], None] = lambda m: None,
        on_response: Callable[[Message | None, Message], None] = lambda q, r: None,
        synchronized: bool = True,
        limits: Limits = DEFAULT,
        held: Held | None = None,
    ) -> None:
        #: Requests whose head was seen, not yet answered, in order; runs not followed stand in as _Skipped.
        self._pending: deque[Message | _Skipped] = deque()
        self._held_here = 0  # Messages in _pending
        self._held_bytes = 0  # bytes of their heads
        self._limits = limits
        self._held = held if held is not None else Held(limits.held_per_process)
        self._on_request = on_request
        self._on_response = on_response
        #: Counts of what could not be followed in either direction, by reason (read after every chunk).
        self.problems: dict[str, int] = {}
        self.requests = MessageStream(
            True, on_head=self._request_head, synchronized=synchronized, problems=self.problems
        )
        self.responses = MessageStream(
            False,
            request_method=self._answered_method,
            on_head=self._response_head,
            synchronized=synchronized,
            problems=self.problems,
        )
        self._out: list[Exchange] = []

    def _request_head(self, msg: Message) -> None:
        limits = self._limits
        if (
            self._held_here < limits.pending_requests
            and self._held_bytes + msg.size <= limits.pending_head_bytes
            and self._held.take()
        ):
            self._pending.append(msg)
            self._held_here += 1
            self._held_bytes += msg.size
            self._on_request(msg)
            return
        if self._held_here >= limits.pending_requests:
            reason = "pending_limit"
        elif self._held_bytes + msg.size > limits.pending_head_bytes:
            reason = "pending_bytes_limit"
        else:
            reason = "process_limit"
        self.problems[reason] = self.problems.get(reason, 0) + 1
        last = self._pending[-1] if self._pending else None
        if isinstance(last, _Skipped):
            last.n += 1
        else:
            self._pending.append(_Skipped())

    def _response_head(self, msg: Message) -> None:
        first = self._pending[0] if self._pending else None
        self._on_response(first if isinstance(first, Message) else None, msg)

    def _answered_method(self) -> str | None:
        first = self._pending[0] if self._pending else None
        return first.head.method if isinstance(first, Message) else None

    def _pop_pending(self) -> Message | None:
        """The oldest request not answered (None for one not followed)."""
        first = self._pending[0]
        if isinstance(first, _Skipped):
            first.n -= 1
            if not first.n:
                self._pending.popleft()
            return None
        self._pending.popleft()
        self._held_here -= 1
        self._held_bytes -= first.size
        self._held.give()
        return first

    def feed(self, is_request_direction: bool, data: bytes, missing: int, stamp: Stamp) -> list[Exchange]:
        stream = self.requests if is_request_direction else self.responses
        for msg in stream.feed(data, missing, stamp):
            if not is_request_direction:
                self._answer(msg)
        return self._take()

    def _answer(self, response: Message) -> None:
        if self._pending:
            request = self._pop_pending()
            if request is not None:
                self._out.append(Exchange(request, response, response.problem or request.problem, response.last))
        else:
            self._out.append(Exchange(None, response, "response_without_request", response.last))

    def close(self, stamp: Stamp, error: str = "") -> list[Exchange]:
        """End of the connection: answer what can be answered, give up the rest."""
        self.requests.feed_eof(stamp, error)
        for msg in self.responses.feed_eof(stamp, error):
            self._answer(msg)
        while self._pending:
            if isinstance(self._pending[0], _Skipped):
                self._pending.popleft()  # a whole run at once: it may stand for many
            else:
                self._out.append(Exchange(self._pop_pending(), None, error or "no_response", stamp))
        return self._take()

    def _take(self) -> list[Exchange]:
        out, self._out = self._out, []
        return out

    @property
    def upgraded(self) -> bool:
        return self.responses.upgraded
