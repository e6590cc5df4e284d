"""Which running agent ``otelbpf top`` (and ``mcp --live``) should read.

With no ``--socket`` the viewer used to take the newest socket in the run directory at every
refresh: with three agents running it jumped to whichever had started last, mid-look. Now the
running agents (those whose socket answers) are listed first: with one (or none yet) the
newest is followed as before, so a restarted agent is found again; with several the user picks
one, by ``--agent PID`` or when asked on a terminal, and the view stays on it."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from otelbpf.base.losses import explain
from otelbpf.live import endpoint

if TYPE_CHECKING:  # the snapshot's type only (live/state.py imports OpenTelemetry)
    from otelbpf.live.state import JsonObject


@dataclass(frozen=True)
class RunningAgent:
    pid: int
    socket: str
    processes: int  # processes in its last metrics collection
    age_s: float  # since its socket was made


def running(directory: str | None = None) -> list[RunningAgent]:
    """The agents whose socket in the run directory answers, newest first."""
    found = []
    for path in endpoint.sockets(directory):
        try:
            snap = endpoint.fetch(path, timeout_s=2.0)
            age = time.time() - os.stat(path).st_mtime
        except (endpoint.EndpointError, OSError):
            continue  # a stale socket (an agent killed with -9) or one that just went
        found.append(RunningAgent(int(snap.get("agent_pid", 0)), path, len(snap.get("processes", [])), age))
    return found


def choose(socket: str | None, agent: int | None, answer: TextIO, out: TextIO) -> str | None:
    """The socket to read: ``socket`` as given; ``agent``'s; "" for "the newest, followed"
    (one agent, or none yet); else the one picked on ``answer`` (a terminal) from the list
    written to ``out``. None when no choice can be made (said on ``out``): several agents and
    no terminal to ask on, or an answer that names none of them."""
    if socket:
        return socket
    if agent is not None:
        return os.path.join(endpoint.run_dir(), f"agent-{agent}.sock")
    agents = running()
    if len(agents) <= 1:
        return ""
    out.write(f"{len(agents)} agents are running ({endpoint.run_dir()}):\n")
    for a in agents:
        out.write(f"  {a.pid:>8}  up {_age(a.age_s):>8}  {a.processes:>5} processes\n")
    if not answer.isatty():
        out.write(f"say which: otelbpf top --agent PID (e.g. --agent {agents[0].pid})\n")
        return None
    out.write(f"which one (pid, Enter for the newest, {agents[0].pid})? ")
    out.flush()
    reply = answer.readline().strip()
    if not reply:
        return agents[0].socket
    for a in agents:
        if reply == str(a.pid):
            return a.socket
    out.write(f"{reply!r} is none of them\n")
    return None


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def check_live(out: TextIO, max_age_s: float | None = None) -> int:
    """``otelbpf doctor --live``: 0 when an agent in the run directory answers with a snapshot
    (and, with ``max_age_s``, its last metrics collection is no older), else 1 with the reason.
    A probe for a container runtime: the socket exists only once the agent has compiled and
    attached (readiness), and answers while it runs; a metrics loop that stopped collecting
    shows as an old collection (liveness)."""
    try:
        snap = endpoint.fetch_newest()
    except endpoint.EndpointError as exc:
        out.write(f"otelbpf doctor --live: {exc}\n")
        return 1
    collected, now = snap.get("metrics_time_unix_nano") or 0, snap.get("time_unix_nano") or 0
    age = (now - collected) / 1e9 if collected else None
    last = f"last metrics collection {age:.0f}s ago" if age is not None else "no metrics collection yet"
    out.write(f"agent pid {snap.get('agent_pid')} answers: {len(snap.get('processes', []))} processes, {last}\n")
    if max_age_s is not None and age is not None and age > max_age_s:
        out.write(f"otelbpf doctor --live: the last metrics collection is over {max_age_s:g}s old\n")
        return 1
    return 0


#: The agent's counters of what it could not keep, by ``reason`` (base/losses.py explains them).
_LOSS_METRICS = ("otelbpf.events.lost", "otelbpf.events.dropped")


def losses(snap: JsonObject) -> dict[str, int]:
    """What a running agent lost so far, by reason (non-zero), from its snapshot's own metrics."""
    lost: dict[str, int] = {}
    for proc in snap.get("processes", []):
        if proc.get("resource", {}).get("service.name") != "otelbpf":
            continue
        for metric in proc.get("metrics", []):
            if metric.get("name") in _LOSS_METRICS:
                for point in metric.get("points", []):
                    reason = str(point.get("attributes", {}).get("reason", "unknown"))
                    if value := int(point.get("value") or 0):
                        lost[reason] = lost.get(reason, 0) + value
    return lost


def running_report(out: TextIO) -> None:
    """``otelbpf doctor``'s lines on the agents running here: each one's losses, explained
    (what ``otelbpf run``'s status line and ``otelbpf summary`` say), or that none lost anything."""
    for a in running():
        try:
            snap = endpoint.fetch(a.socket, timeout_s=2.0)
        except endpoint.EndpointError:
            continue
        lost = losses(snap)
        if not lost:
            out.write(f"{'OK':<8} {'running agent':<15} pid {a.pid}, up {_age(a.age_s)}: nothing lost\n")
        for reason, count in sorted(lost.items(), key=lambda kv: -kv[1]):
            out.write(f"{'LOSSES':<8} {'running agent':<15} pid {a.pid} lost {count:,}: {explain(reason)}\n")
