"""Server-sent events (``text/event-stream``) from a response body's captured bytes.

The body arrives as the sensor saw it: pieces of at most one syscall's
capture, then gaps (bytes moved, not captured). Events are cut at blank
lines as the WHATWG event-stream grammar says (``data:`` lines joined by
``\\n``, ``event:`` names the type, ``:`` lines are comments); lines end in
LF or CRLF (a lone CR, which the grammar also allows, is not followed: no
server seen sends it).

Bounded whatever the server sends: a line longer than ``max_line`` is not
kept (the event is still counted, marked ``truncated``), an event keeps at
most ``max_data`` bytes of data. A gap loses the line it falls in: the event
under way is dropped and parsing resumes after the next blank line, so no
event is ever made of bytes from both sides of a gap. What was lost is
counted in ``problems``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from otelbpf.families.http.protocols.limits import DEFAULT

#: Opaque per-syscall stamp of the piece that ended an event.
Stamp = Any

#: Characters of an ``event:`` type kept.
MAX_TYPE = 64


@dataclass(slots=True)
class Event:
    """One dispatched event: its data (the ``data:`` lines joined), type, and when it ended."""

    data: bytes
    type: str
    stamp: Stamp
    truncated: bool = False  # a line or the data was longer than kept


class EventStream:
    """One response body's events. ``feed`` returns the events its piece completed."""

    __slots__ = (
        "_line",
        "_data",
        "_lines",
        "_type",
        "_truncated",
        "_skip_line",
        "_resync",
        "_max_line",
        "_max_data",
        "problems",
    )

    def __init__(self, *, max_line: int = DEFAULT.sse_line, max_data: int = DEFAULT.sse_data) -> None:
        self._max_line = max_line
        self._max_data = max_data
        self._line = bytearray()  # a line begun in an earlier piece
        self._data = bytearray()  # the event's data so far
        self._lines = 0  # data lines in the event so far
        self._type = ""
        self._truncated = False
        self._skip_line = False  # the line under way is too long: skipped to its end
        self._resync = False  # after a gap: skipping to the next blank line
        #: What could not be followed, by reason.
        self.problems: dict[str, int] = {}

    def feed(self, data: bytes, stamp: Stamp) -> list[Event]:
        out: list[Event] = []
        pos, end = 0, len(data)
        while pos < end:
            nl = data.find(b"\n", pos)
            if nl < 0:
                self._partial(data, pos)
                break
            if self._line or self._skip_line:
                self._partial(data[:nl], pos)
                line = bytes(self._line)
                self._line.clear()
                skipped, self._skip_line = self._skip_line, False
                if skipped:
                    self._truncated = True
                    pos = nl + 1
                    if not self._resync:
                        continue
                    line = b"x"  # not blank: a skipped line never ends a resync
            elif nl - pos > self._max_line:
                self._too_long(data[pos : pos + 5])
                self._truncated = True
                pos = nl + 1
                continue
            else:
                line = data[pos:nl]
            pos = nl + 1
            if line[-1:] == b"\r":
                line = line[:-1]
            if self._resync:
                if not line:
                    self._resync = False
                continue
            if not line:
                event = self._dispatch(stamp)
                if event is not None:
                    out.append(event)
            else:
                self._field(line)
        return out

    def gap(self, n: int) -> None:
        """``n`` bytes not captured: the event under way is lost; resume after the next blank line."""
        if self._resync:
            return
        if self._lines or self._line or self._type or self._skip_line:
            self._problem("event_lost_in_gap")
        self._reset()
        self._resync = True

    def _partial(self, data: bytes, pos: int) -> None:
        """A line's bytes that continue in the next piece (or end it, ``data`` cut at its LF)."""
        if self._skip_line:
            return
        if len(self._line) + len(data) - pos > self._max_line:
            self._too_long(bytes(self._line[:5]) + data[pos : pos + 5])
            self._line.clear()
            self._skip_line = True
            return
        self._line += data[pos:]

    def _too_long(self, start: bytes) -> None:
        """A line over ``max_line`` is skipped; a data line still makes its event one (with its data cut)."""
        self._problem("line_too_long")
        if not self._resync and (start[:5] == b"data:" or start == b"data"):
            self._data_line(b"")

    def _field(self, line: bytes) -> None:
        colon = line.find(b":")
        if colon == 0:
            return  # a comment
        name, value = (line, b"") if colon < 0 else (line[:colon], line[colon + 1 :])
        if value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data_line(value)
        elif name == b"event":
            self._type = value[:MAX_TYPE].decode("utf-8", "replace")

    def _data_line(self, value: bytes) -> None:
        """A data line's value joins the event's data (after a LF if it is not the first), within ``max_data``."""
        if self._lines:
            value = b"\n" + value
        self._lines += 1
        room = self._max_data - len(self._data)
        if len(value) > room:
            self._truncated = True
            value = value[: max(room, 0)]
        self._data += value

    def _dispatch(self, stamp: Stamp) -> Event | None:
        """A blank line: the event ends (an event without data lines is none, as the grammar says)."""
        event = None
        if self._lines:
            event = Event(bytes(self._data), self._type or "message", stamp, self._truncated)
        self._reset()
        return event

    def _reset(self) -> None:
        self._data.clear()
        self._line.clear()
        self._lines = 0
        self._type = ""
        self._truncated = False
        self._skip_line = False

    def _problem(self, reason: str) -> None:
        self.problems[reason] = self.problems.get(reason, 0) + 1
