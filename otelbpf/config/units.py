"""Durations and sizes as the config writes them, and the bounds the kernel and runtime put on them.

Durations are ``"250ms"``, ``"1.5s"``, ``"1m30s"`` (units ns, us, ms, s, m, h) or a plain number
of seconds, at most 24h, stored as int nanoseconds (``parse_duration``, ``to_seconds``); sizes
are ``"64KiB"``, ``"4MiB"``, ``"1GiB"`` or a plain number of bytes, stored as int bytes
(``parse_size``). Ints keep loaded configs exact and comparable; the ``format_*`` functions
spell them back for messages."""

from __future__ import annotations

import math
import mmap
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator, Field

_DURATION_UNITS_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_NUMBER = re.compile(r"\d+(?:\.\d*)?|\.\d+")


#: The longest duration any option takes. Timers are ``threading.Event.wait`` calls, which
#: raise OverflowError past ``threading.TIMEOUT_MAX``; an hour-long interval is already an
#: agent that exports nothing for an hour.
MAX_DURATION_NS = 24 * _DURATION_UNITS_NS["h"]


def parse_duration(value: object) -> int:
    """A duration in int nanoseconds from ``"250ms"``, ``"1m30s"`` or a number of seconds,
    at most ``MAX_DURATION_NS`` (24h)."""
    hint = "write a number of seconds or a number with a unit: ns, us, ms, s, m, h (e.g. 250ms, 1.5s, 1m30s)"
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"invalid duration {value!r}: {hint}")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"invalid duration {value!r}: must not be negative")
        seconds = float(value)
    else:
        text = value.strip()
        parts = list(_DURATION_PART.finditer(text))
        if _NUMBER.fullmatch(text):
            seconds = float(text)
        elif not text or "".join(p.group(0) for p in parts) != text:
            raise ValueError(f"invalid duration {value!r}: {hint}")
        else:
            seconds = sum(float(p.group(1)) * _DURATION_UNITS_NS[p.group(2)] for p in parts) / 1e9
    if not math.isfinite(seconds) or seconds * 1e9 > MAX_DURATION_NS:
        raise ValueError(f"duration {value!r} is too long: at most {format_duration(MAX_DURATION_NS)}")
    return round(seconds * 1_000_000_000)


def format_duration(ns: int) -> str:
    """The shortest exact spelling of ``ns`` in the largest whole unit (``1500000`` -> ``1500us``)."""
    for unit in ("h", "m", "s", "ms", "us"):
        if ns and ns % _DURATION_UNITS_NS[unit] == 0:
            return f"{ns // _DURATION_UNITS_NS[unit]}{unit}"
    return f"{ns}ns"


def to_seconds(ns: int) -> float:
    """A stored duration as float seconds, the unit the OpenTelemetry SDK takes."""
    return ns / 1_000_000_000


_SIZE_UNITS = {"b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}
_SIZE = re.compile(r"(\d+)\s*([A-Za-z]*)")


def parse_size(value: object) -> int:
    """A size in int bytes from ``"64KiB"``, ``"4MiB"``, ``"1GiB"`` or a number of bytes."""
    hint = "write a number of bytes or a whole number with a unit: B, KiB, MiB, GiB (e.g. 4MiB)"
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"invalid size {value!r}: {hint}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"invalid size {value!r}: must not be negative")
        return value
    match = _SIZE.fullmatch(value.strip())
    unit = match.group(2).lower() if match else ""
    if match is None or (unit and unit not in _SIZE_UNITS):
        raise ValueError(f"invalid size {value!r}: {hint}")
    return int(match.group(1)) * _SIZE_UNITS.get(unit, 1)


def format_size(size: int) -> str:
    """The largest whole binary unit for ``size`` bytes (``4194304`` -> ``4MiB``)."""
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if size and size % unit == 0:
            return f"{size // unit}{name}"
    return f"{size}B"


Duration = Annotated[int, BeforeValidator(parse_duration)]
PositiveDuration = Annotated[int, BeforeValidator(parse_duration), Field(gt=0)]
Size = Annotated[int, BeforeValidator(parse_size)]


#: The largest BPF ring buffer accepted. The kernel takes a power of two up to 2 GiB
#: (``max_entries`` is a u32), all of it kernel memory that is never swapped, plus the
#: same again mapped twice into the agent; a quarter of that is already generous.
MAX_RING_BYTES = 1 << 30


def _power_of_two_ring(value: int) -> int:
    if value < mmap.PAGESIZE or value & (value - 1) or value > MAX_RING_BYTES:
        raise ValueError(
            f"the BPF ring buffer size must be a power of two from the page size "
            f"({format_size(mmap.PAGESIZE)}) to {format_size(MAX_RING_BYTES)}, got {format_size(value)}"
        )
    return value


#: A BPF ring buffer's size: what the kernel accepts.
RingSize = Annotated[int, BeforeValidator(parse_size), AfterValidator(_power_of_two_ring)]


def _auto_or_ring(value: object) -> int | str:
    if isinstance(value, str) and value.strip() == "auto":
        return "auto"
    try:
        return _power_of_two_ring(parse_size(value))
    except ValueError as exc:
        raise ValueError(f"{exc} (or auto)") from None


#: A ring size, or ``auto``: the receiver picks it from its other options (one error either way).
AutoRingSize = Annotated[Literal["auto"] | int, BeforeValidator(_auto_or_ring)]
