"""Outside-world text made safe to print on a terminal (issue 31).

Process names, ``OTEL_SERVICE_NAME``, command lines, HTTP paths, kernel names and file paths
come from whoever runs a traced process or sends it a request, and ``otelbpf`` prints them to
root's terminal. A control character among them is a command to that terminal: ``ESC]0;...BEL``
retitles the window, ``ESC[2J`` clears the screen, ``\\r`` overwrites the line printed so far,
and a bidi override (U+202E) shows the rest of the line reversed. So every such character is
printed as a visible escape instead, the way Python's ``repr`` writes it: ESC as ``\\x1b``,
DEL as ``\\x7f``, a C1 control as ``\\x9b``, a bidi override as ``\\u202e``. The rest of the text
is kept as it is, so what the operator reads is what was there, with nothing hidden or acted on.

``clean`` is for one value; ``cleaned`` wraps a stream (the CLI's stdout and stderr for
``summary``, ``diagnose``, ``stragglers``, ``doctor`` and ``report``) so that the code printing
needs no change; ``log_to_stderr`` is ``logging.basicConfig`` with records cleaned the same way.
"""

from __future__ import annotations

import io
import logging
import os
import re
from typing import TextIO

#: C0 controls, DEL, C1 controls, and the bidi embeddings, overrides and isolates (the
#: "Trojan Source" characters): everything a terminal acts on or displays out of order.
_ONE_VALUE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
#: The same but newline and tab.
_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def clean(text: str, *, lines: bool = False) -> str:
    """``text`` with every control character written as a visible escape (``\\x1b``).

    One value (a table cell, a log message) keeps nothing: a newline in it would forge a line
    or a row. ``lines=True`` keeps newlines and tabs, for output whose lines the program
    made (a stream's writes, a traceback)."""
    return (_LINES if lines else _ONE_VALUE).sub(_escape, text)


class _CleanStream(io.TextIOBase, TextIO):  # both, as io.StringIO is: a TextIO to the code it is handed
    """A text stream that writes everything through ``clean(..., lines=True)`` to another.

    Unbuffered: each write goes on at once, so its order against direct writes to the same
    stream (a child process's, a flush before a fork) is kept. Escapes are per character, so
    a sequence split across two writes is caught in both halves."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(clean(text, lines=True))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()


def cleaned(stream: TextIO) -> TextIO:
    """``stream`` with every control character but newline and tab written as a visible escape."""
    return _CleanStream(stream)


class CleanFormatter(logging.Formatter):
    """A log record's line with its control characters escaped: the arguments of a message
    carry process names, paths and HTTP paths. The line itself is one line (a newline in an
    argument would forge another record); a traceback keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return clean(super().formatMessage(record))

    def formatException(self, ei: logging._SysExcInfoType) -> str:
        return clean(super().formatException(ei), lines=True)

    def formatStack(self, stack_info: str) -> str:
        return clean(super().formatStack(stack_info), lines=True)


def log_to_stderr(level: str | int, fmt: str) -> None:
    """``logging.basicConfig(level=level, format=fmt)`` on stderr, through ``CleanFormatter``.

    Configured first, it is also what a library's own ``basicConfig`` finds in place (the MCP
    SDK's is then a no-op), so its records are cleaned too."""
    handler = logging.StreamHandler()
    handler.setFormatter(CleanFormatter(fmt))
    logging.basicConfig(level=level, handlers=[handler])


def has_controlling_terminal() -> bool:
    """Whether this process has a controlling terminal: started from a login or an ssh session
    (even in the background, under nohup), not as a service (a DaemonSet, a systemd unit).
    Where it has one, the processes around it are likely a shell's jobs."""
    try:
        os.close(os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY | os.O_CLOEXEC))
    except OSError:
        return False
    return True
