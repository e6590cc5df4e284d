"""The status line ``otelbpf run`` prints every few seconds on a terminal: the "it works" signal.

In host mode the agent otherwise prints its start-up lines and nothing until it exits; a user
cannot tell a quiet host from a broken agent, and learns of losses only at the end, as a bare
count. Every ``every_s`` seconds the line gives the processes the agent holds state for, the
libraries probed, events per second and losses; the first time a kind of loss appears it is
explained once, with the option that fixes it (``base/losses.py``). Written only when stderr is
a terminal, in host or ``--pid`` mode (or ``OTELBPF_STATUS=on``): a service's journal gets the
agent's own metrics instead."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TextIO

from otelbpf.base.losses import explain


@dataclass(frozen=True)
class Sample:
    """The agent's counters at one moment (cumulative counts since it started)."""

    processes: int
    libraries: int
    probes: int
    events: int
    #: reason -> records lost in the kernel, or dropped in user space, so far
    lost: Mapping[str, int] = field(default_factory=dict)
    at: float = field(default_factory=time.monotonic)


def wanted(stream: TextIO, env: Mapping[str, str] = os.environ, *, command: bool = False) -> bool:
    """Whether to print the status line: ``OTELBPF_STATUS`` (on/off) decides, else a terminal
    in host or ``--pid`` mode. Not by default under ``run -- COMMAND``: the command's own
    output is on that terminal, and the run ends with the same counts and causes anyway."""
    setting = env.get("OTELBPF_STATUS", "").strip().lower()
    if setting in ("on", "1", "true", "yes"):
        return True
    if setting in ("off", "0", "false", "no") or command:
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or unusual stream
        return False


class StatusLine:
    """Writes ``format_line`` every ``every_s`` seconds (the first after ``first_s``), and each
    new kind of loss once, explained."""

    def __init__(self, out: TextIO, every_s: float = 5.0, first_s: float = 2.0) -> None:
        self._out = out
        self._every_s = every_s
        self._next = time.monotonic() + first_s
        self._last: Sample | None = None
        self._explained: set[str] = set()

    def tick(self, sample: Callable[[], Sample]) -> None:
        """Called often (the agent's main loop, every 0.2 s): writes when a line is due."""
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self._every_s
        current = sample()
        lines = [format_line(self._last, current)]
        for reason, count in sorted(current.lost.items()):
            if count and reason not in self._explained:
                self._explained.add(reason)
                lines.append(f"otelbpf: lost {count:,} records: {explain(reason)}")
        self._last = current
        self._out.write("".join(f"{line}\n" for line in lines))
        self._out.flush()


def format_line(previous: Sample | None, current: Sample) -> str:
    """``otelbpf: 3 processes, 2 libraries (48 probes), 1,204 events/s, lost 0`` (rates over
    the time since ``previous``; events so far when there is none yet)."""
    if previous is None:
        events = f"{current.events:,} events so far"
    else:
        elapsed = max(current.at - previous.at, 1e-3)
        events = f"{(current.events - previous.events) / elapsed:,.0f} events/s"
    lost = sum(current.lost.values())
    losses = f"lost {lost:,}"
    if lost:
        top = sorted(((n, r) for r, n in current.lost.items() if n), reverse=True)
        losses += " (" + ", ".join(f"{r} {n:,}" for n, r in top) + ")"
    return (
        f"otelbpf: {current.processes:,} processes seen, {current.libraries:,} libraries "
        f"({current.probes:,} probes), {events}, {losses}"
    )
