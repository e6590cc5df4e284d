"""``otelbpf top``: a live terminal view of what an agent sees (Rich).

It reads snapshots, never BPF: from a running agent's state socket (live/endpoint.py), or from
an agent it starts in-process (``--pid``). The tables come from live/model.py; this module only
draws them and reads keys:

    s  sort processes (gpu, calls/s, bytes/s, pid)   p  filter by pid (digits, Enter; Esc clears)
    f  freeze / resume                               q  quit

A socket that stops answering (the agent exited or restarted) is said in the header and
tried again each second; with no ``--socket`` the newest agent in the run directory is taken
each time, so a restarted agent is found again.
"""

from __future__ import annotations

import logging
import os
import select
import sys
import termios
import time
import tty
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from otelbpf.base.terminal import clean
from otelbpf.live import endpoint, model

if TYPE_CHECKING:
    from otelbpf.config import Config
    from otelbpf.live.state import JsonObject

SORTS = ("gpu", "calls/s", "bytes/s", "pid")
KEYS = "s sort  p pid filter  f freeze  q quit"
_TEXT_COLUMNS = {"SERVICE", "API", "KERNEL", "ROUTE", "CAUSE", "PROCESS", "SUMMARY", "CLASS", "STRAGGLER"}


def _rate(v: float | None, unit: str = "") -> str:
    if v is None:
        return "-"
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.1f}{suffix}{unit}"
    return f"{v:.1f}{unit}" if v % 1 else f"{v:.0f}{unit}"


def _bytes(v: float | None) -> str:
    if v is None:
        return "-"
    for div, suffix in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if abs(v) >= div:
            return f"{v / div:.1f}{suffix}"
    return f"{v:.0f}B"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def _add_row(table: Table, *cells: str) -> None:
    """One row of ``cells`` as plain text. Services, kernels, routes and findings are named by
    traced processes and their remote clients: as markup, a request to ``/[/]`` would end every
    draw in a MarkupError and ``[link=...]`` would draw a link; a control character in one
    would reach the terminal (``clean``)."""
    table.add_row(*(Text(clean(c)) for c in cells))


class Viewer:
    """Snapshots in, a renderable out; the keys' state (sort, pid filter, freeze)."""

    def __init__(self, source: Callable[[], JsonObject]) -> None:
        self.source = source
        self.sort = SORTS[0]
        self.pid: int | None = None
        self.typing: str | None = None  # digits of a pid filter being typed
        self.frozen = False
        self.error = ""
        self.base: JsonObject | None = None  # an earlier collection: the rates' start
        self.last: JsonObject | None = None
        self.tables: model.Tables | None = None
        self.notes: deque[str] = deque(maxlen=2)

    def refresh(self) -> None:
        if self.frozen:
            return
        try:
            snap = self.source()
        except endpoint.EndpointError as exc:
            self.error = str(exc)
            return
        self.error = ""
        if self.last is not None and snap.get("agent_pid") != self.last.get("agent_pid"):
            self.base = self.last = None  # another agent: its counts start again
        if self.last is not None and snap.get("metrics_time_unix_nano", 0) > self.last.get("metrics_time_unix_nano", 0):
            self.base = self.last
        stamp = snap.get("metrics_time_unix_nano", 0)
        if self.base is not None and self.base.get("metrics_time_unix_nano", 0) >= stamp:
            self.base = None
        self.last = snap
        self.tables = model.build(self.base, snap)

    def key(self, ch: str) -> bool:
        """Handle one key; False to quit."""
        if self.typing is not None:
            if ch.isdigit() and len(self.typing) < 8:
                self.typing += ch
            elif ch in "\r\n":
                self.pid = int(self.typing) if self.typing else None
                self.typing = None
            elif ch in ("\x1b", "c"):
                self.typing, self.pid = None, None
            elif ch in ("\x7f", "\b"):
                self.typing = self.typing[:-1]
            return True
        if ch in ("q", "\x03"):
            return False
        if ch == "s":
            self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]
        elif ch == "p":
            self.typing = ""
        elif ch in ("\x1b", "c"):
            self.pid = None
        elif ch in ("f", " "):
            self.frozen = not self.frozen
        return True

    def _keep(self, pid: int) -> bool:
        return self.pid is None or pid == self.pid

    def render(self) -> Group:
        t = self.tables
        head = Text()
        head.append("otelbpf top", style="bold")
        if self.last:
            head.append(f"  agent pid {clean(str(self.last.get('agent_pid')))}")
        if t and t.metrics_age_s is not None:
            head.append(f"  metrics {t.metrics_age_s:.1f}s old")
        head.append(f"  sort: {self.sort}")
        if self.typing is not None:
            head.append(f"  pid filter: {self.typing}_", style="reverse")
        elif self.pid is not None:
            head.append(f"  pid filter: {self.pid}", style="bold")
        if self.frozen:
            head.append("  FROZEN", style="bold reverse")
        head.append(f"   {KEYS}", style="dim")
        parts: list[Text | Table] = [head]
        if t is not None:
            parts.append(self._agent(t))
        if self.error:
            parts.append(Text(clean(self.error), style="bold red"))  # it names a socket path
        for note in self.notes:
            parts.append(Text(clean(note), style="yellow"))  # a log message's arguments: names, paths
        if t is None:
            parts.append(Text("waiting for the first snapshot..."))
            return Group(*parts)
        tables = [
            self._processes(t),
            self._findings(t),
            self._ranks(t),
            self._apis(t),
            self._kernels(t),
            self._routes(t),
        ]
        return Group(*parts, *[p for p in tables if p is not None])

    @staticmethod
    def _table(title: str, *columns: str) -> Table:
        table = Table(
            title=title,
            title_justify="left",
            title_style="bold",
            box=None,
            padding=(0, 1),
            pad_edge=False,
            header_style="bold reverse",
        )
        for c in columns:
            table.add_column(
                c,
                justify="left" if c in _TEXT_COLUMNS else "right",
                no_wrap=True,
                overflow="ellipsis",
                max_width=64 if c == "SUMMARY" else 48,
            )
        return table

    def _processes(self, t: model.Tables) -> Table:
        rows = [r for r in t.processes if self._keep(r.pid)]
        key = {
            "gpu": lambda r: (not r.gpu, -(r.calls_per_s or 0), r.pid),
            "calls/s": lambda r: (-(r.calls_per_s or 0), r.pid),
            "bytes/s": lambda r: (-sum(r.bytes_per_s.values()), r.pid),
            "pid": lambda r: r.pid,
        }[self.sort]
        table = self._table(
            "processes",
            "PID",
            "SERVICE",
            "GPU",
            "CALLS/s",
            "LAUNCH/s",
            "H2D/s",
            "D2H/s",
            "PAGEABLE/s",
            "PINNED/s",
            "MEM",
            "HIGH",
            "SYNC",
        )
        for r in sorted(rows, key=key)[:12]:
            h = r.host_bytes_per_s
            _add_row(
                table,
                str(r.pid),
                r.service,
                "yes" if r.gpu else "",
                _rate(r.calls_per_s),
                _rate(r.launches_per_s),
                _bytes(r.bytes_per_s.get("H2D")),
                _bytes(r.bytes_per_s.get("D2H")),
                _bytes(sum(v for k, v in h.items() if k.endswith("pageable")) if h else None),
                _bytes(sum(v for k, v in h.items() if k.endswith("pinned")) if h else None),
                _bytes(r.memory_in_use),
                _bytes(r.memory_high_water),
                "-" if r.sync_wait_share is None else f"{r.sync_wait_share:.1%}",
            )
        return table

    def _apis(self, t: model.Tables) -> Table:
        rows = [r for r in t.apis if self._keep(r.pid)]
        rows.sort(key=lambda r: (-(r.calls_per_s or 0), -r.calls, r.api))
        table = self._table(
            "CUDA API (latency: recent spans, ms)", "PID", "API", "CALLS", "CALLS/s", "SPANS", "P50", "P95", "P99"
        )
        for r in rows[:10]:
            _add_row(
                table,
                str(r.pid),
                r.api,
                str(r.calls),
                _rate(r.calls_per_s),
                str(r.spans),
                _ms(r.p50_ms),
                _ms(r.p95_ms),
                _ms(r.p99_ms),
            )
        return table

    def _kernels(self, t: model.Tables) -> Table | None:
        rows = [r for r in t.kernels if self._keep(r.pid)]
        if not rows:
            return None
        table = self._table("kernels by launches", "PID", "KERNEL", "LAUNCHES", "/s")
        for r in rows[:6]:
            _add_row(table, str(r.pid), r.kernel, str(r.launches), _rate(r.launches_per_s))
        return table

    def _ranks(self, t: model.Tables) -> Table | None:
        rows = [r for r in t.ranks if self._keep(r.pid)]
        if not rows:
            return None
        table = self._table(
            "NCCL ranks", "RANK", "SERVICE", "PID", "COLLECTIVES", "/s", "WAIT ms", "LATE", "CLASS", "STRAGGLER"
        )
        for r in rows[:8]:
            _add_row(
                table,
                "?" if r.rank is None else str(r.rank),
                r.service,
                str(r.pid),
                str(r.collectives),
                _rate(r.collectives_per_s),
                _ms(r.wait_mean_ms),
                str(r.straggled),
                r.straggler_class,
                "<- now" if r.current_straggler else "",
            )
        return table

    def _routes(self, t: model.Tables) -> Table | None:
        rows = [r for r in t.routes if self._keep(r.pid)]
        if not rows:
            return None
        rows.sort(key=lambda r: (-r.requests, r.route))
        table = self._table(
            "HTTP/gRPC routes (recent spans)", "PID", "ROUTE", "REQ", "REQ/s", "ERR", "P50 ms", "P95 ms"
        )
        for r in rows[:6]:
            _add_row(
                table, str(r.pid), r.route, str(r.requests), _rate(r.per_s), str(r.errors), _ms(r.p50_ms), _ms(r.p95_ms)
            )
        return table

    def _findings(self, t: model.Tables) -> Table | None:
        rows = [f for f in t.findings if self.pid is None or f"(pid {self.pid})" in f["process"]]
        if not rows:
            return None
        table = self._table("findings", "CAUSE", "PROCESS", "SUMMARY")
        for f in rows[:4]:
            _add_row(table, f["cause"], f["process"], f["summary"])
        return table

    def _agent(self, t: model.Tables) -> Text:
        a = t.agent
        if a is None:
            return Text("agent: no self-telemetry yet", style="dim")
        return Text(
            f"agent: {_rate(a.events_per_s)} events/s ({a.events_received} received), lost {a.lost}, "
            f"dropped {a.dropped}, CPU {'-' if a.cpu_share is None else f'{a.cpu_share:.1%}'}, "
            f"RSS {_bytes(a.rss_bytes)}"
            + ("" if a.http_kept_share is None else f", HTTP requests traced {a.http_kept_share:.1%} (head sampling)")
        )


class _Notes(logging.Handler):
    """The in-process agent's warnings, shown in the view instead of over it."""

    def __init__(self, viewer: Viewer) -> None:
        super().__init__(logging.WARNING)
        self.viewer = viewer

    def emit(self, record: logging.LogRecord) -> None:
        self.viewer.notes.append(f"{record.levelname.lower()}: {record.getMessage()}"[:200])


def socket_source(path: str | None) -> Callable[[], JsonObject]:
    """Snapshots from ``path``, or from the newest agent that answers in the run directory."""
    return (lambda: endpoint.fetch(path)) if path else endpoint.fetch_newest


def run(viewer: Viewer, interval_s: float = 1.0) -> int:
    """Draw until ``q``; keys from the terminal on stdin."""
    console = Console()
    fd = sys.stdin.fileno()
    tty_state = termios.tcgetattr(fd) if os.isatty(fd) else None
    try:
        if tty_state is not None:
            tty.setcbreak(fd)
        with Live(console=console, screen=True, auto_refresh=False) as live:
            next_at = 0.0
            while True:
                now = time.monotonic()
                if now >= next_at:
                    viewer.refresh()
                    next_at = now + interval_s
                live.update(viewer.render(), refresh=True)
                ready, _, _ = select.select([fd], [], [], max(0.0, next_at - time.monotonic()))
                if ready:
                    ch = os.read(fd, 1).decode(errors="replace")
                    if not ch or not viewer.key(ch):
                        return 0
    finally:
        if tty_state is not None:
            termios.tcsetattr(fd, termios.TCSADRAIN, tty_state)
    return 0


def standalone(config: Config, pids: list[int], interval_s: float = 1.0) -> int:
    """``otelbpf top --pid N``: an agent in this process (its exporters as configured), its live
    state drawn directly; the agent's warnings show in the view."""
    from otelbpf.agent import Agent

    missing = [p for p in pids if not os.path.exists(f"/proc/{p}")]
    if missing:
        print(f"otelbpf top: no process with pid {missing[0]}", file=sys.stderr)
        return 2
    agent = Agent(config, pids=pids)
    viewer = Viewer(agent.live.snapshot)
    handler = _Notes(viewer)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    agent.start()
    try:
        return run(viewer, interval_s)
    finally:
        print("otelbpf top: stopping the agent (its probes are released first)", file=sys.stderr)
        agent.stop()
