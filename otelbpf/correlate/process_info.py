"""Who a pid is: the OpenTelemetry resource for a watched process.

Read from /proc once, at first sight, because short-lived processes may be
gone by the time their last events are exported.

The command line is the one thing read here that carries secrets routinely
(``--api-key=...``, ``-H 'Authorization: ...'``, ``postgres://user:pass@...``,
``HF_TOKEN=... python``): it is redacted here, where it is read, so that every
consumer of the resource (the exporters, the files and what reads them: ``summary``,
the report, MCP; the live socket and ``top``) has only the redacted one
(``targets.command_line``; the rules are ``base/secrets.py``'s).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING

from opentelemetry.sdk.resources import Resource
from opentelemetry.util.types import AttributeValue

from otelbpf.base.secrets import redact_command_args
from otelbpf.correlate.container import container_attributes
from otelbpf.correlate.symbolizer import EVICTIONS

if TYPE_CHECKING:
    from otelbpf.config import CommandLine


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _parse_kv(text: str) -> dict[str, str]:
    """``k=v,k2=v2`` as in OTEL_RESOURCE_ATTRIBUTES (values may be %-encoded)."""
    from urllib.parse import unquote

    out = {}
    for item in text.split(","):
        if "=" in item:
            k, v = item.split("=", 1)
            if k.strip():
                out[k.strip()] = unquote(v.strip())
    return out


class ProcessInfo:
    """Cache of pid -> Resource, with the agent's resource attributes applied.

    ``service.name`` comes from the configured resource attributes, else the
    target's own ``OTEL_SERVICE_NAME`` (what its SDK would report), else the
    executable name, so eBPF spans land in the same service as SDK spans.

    A resource outlives its process (its last spans, metrics and profiles are exported after
    it exits), but not by more than ``gone_grace_s``: at most every ``sweep_s``, what is held
    for processes found gone that long (resource, read time, task name) is released. The agent
    describes every process it sees start; without it, on a host that starts processes all
    day, the entries of exited ones filled the LRU to ``max_processes`` (~1.2 KiB each).
    """

    def __init__(
        self,
        configured: Mapping[str, AttributeValue] | None = None,
        max_processes: int = 8192,
        *,
        gone_grace_s: float = 120.0,
        sweep_s: float = 10.0,
        command_line: CommandLine = "redacted",
    ) -> None:
        self._configured = dict(configured or {})
        self._command_line = command_line
        self._host = socket.gethostname()
        self._max = max_processes
        self._cache: OrderedDict[int, Resource] = OrderedDict()  # LRU: bounded on busy hosts
        self._taken: dict[int, int] = {}  # pid -> CLOCK_MONOTONIC ns when read
        self._comm: OrderedDict[int, str] = OrderedDict()  # LRU too: noted for every exec and exit seen
        self._lock = threading.Lock()
        self._grace_ns = int(gone_grace_s * 1e9)
        self._sweep_ns = int(sweep_s * 1e9)
        self._swept_ns = time.monotonic_ns()
        self._gone_since: dict[int, int] = {}  # pid -> CLOCK_MONOTONIC ns it was first found gone
        # pid -> the resource of its process, ended (forget() without an exec): what every
        # correlator exports late for that process, until the pid is a live program again.
        self._ended: dict[int, Resource] = {}

    def __len__(self) -> int:
        """Processes anything is held for (resource or task name)."""
        with self._lock:
            return len(self._cache.keys() | self._comm.keys() | self._ended.keys())

    def note_comm(self, pid: int, comm: str) -> None:
        """The kernel's task name, a fallback when /proc/PID is gone."""
        if comm:
            with self._lock:
                self._comm[pid] = comm
                self._comm.move_to_end(pid)
                while len(self._comm) > self._max:
                    self._comm.popitem(last=False)
                    EVICTIONS["process_names"] += 1
        self._maybe_sweep()

    def resource(self, pid: int) -> Resource:
        with self._lock:
            res = self._cache.get(pid)
            if res is None:
                self._taken[pid] = time.monotonic_ns()
                res = self._cache[pid] = self._build(pid)
                while len(self._cache) > self._max:
                    old, _ = self._cache.popitem(last=False)
                    self._taken.pop(old, None)
                    self._comm.pop(old, None)
                    EVICTIONS["process_info"] += 1
            else:
                self._cache.move_to_end(pid)
        self._maybe_sweep()
        return res

    def _maybe_sweep(self) -> None:
        now = time.monotonic_ns()
        if now - self._swept_ns >= self._sweep_ns:
            self.release_exited(now)

    def release_exited(self, now_ns: int) -> None:
        """Release what is held for processes found gone ``gone_grace_s`` ago or more (a pid
        alive again keeps its entries: its exec replaces its resource)."""
        self._swept_ns = now_ns
        with self._lock:
            pids = self._cache.keys() | self._comm.keys() | self._ended.keys()
        gone = {pid for pid in pids if not os.path.exists(f"/proc/{pid}")}
        with self._lock:
            self._gone_since = {pid: self._gone_since.get(pid, now_ns) for pid in gone}
            expired = [pid for pid, since in self._gone_since.items() if now_ns - since >= self._grace_ns]
            for pid in expired:
                self._cache.pop(pid, None)
                self._taken.pop(pid, None)
                self._comm.pop(pid, None)
                self._ended.pop(pid, None)
                del self._gone_since[pid]

    def forget(self, pid: int, before_ns: int | None = None) -> None:
        """Drop the cached resource: after an exec (``before_ns``: the exec event's
        CLOCK_MONOTONIC time; a resource read after it is kept), or when one correlator is done
        with an ended process (no ``before_ns``).

        An ended process's resource is kept aside, not dropped: the correlators share this
        cache, and one that exports its last points after another forgot the process must name
        the same resource. Read again from a gone process, it fell back to the task name
        (``python`` beside the executable's ``python3.11``): two services for one pid. It is
        used while /proc shows no program under the pid; a new process under a reused pid is
        read afresh."""
        with self._lock:
            if before_ns is not None:
                if self._taken.get(pid, 0) >= before_ns:
                    return
                self._ended.pop(pid, None)
                res = self._cache.pop(pid, None)
            else:
                res = self._cache.pop(pid, None)
                if res is not None:
                    self._ended[pid] = res
                    while len(self._ended) > self._max:
                        del self._ended[next(iter(self._ended))]
                        EVICTIONS["process_info"] += 1
            self._taken.pop(pid, None)

    def _build(self, pid: int) -> Resource:
        attrs: dict[str, AttributeValue] = {"host.name": self._host, "process.pid": pid}
        exe = None
        try:
            exe = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
        except OSError:
            pass
        if exe:
            attrs["process.executable.path"] = exe
            attrs["process.executable.name"] = os.path.basename(exe)
        cmdline = _read(f"/proc/{pid}/cmdline")
        if cmdline:
            attrs.update(self._command(cmdline))
        cgroup = _read(f"/proc/{pid}/cgroup")
        if cgroup:
            attrs.update(container_attributes(cgroup.decode(errors="replace")))
        env = self._environ(pid)
        target_attrs = _parse_kv(env.get("OTEL_RESOURCE_ATTRIBUTES", ""))
        attrs.update({k: v for k, v in target_attrs.items() if k not in attrs})
        service: AttributeValue = env.get("OTEL_SERVICE_NAME") or target_attrs.get("service.name")
        if not exe and not cmdline:
            ended = self._ended.get(pid)
            if ended is not None:
                return ended  # see forget()
            attrs["otelbpf.process.exited"] = True  # gone before we could look
            if pid in self._comm:
                attrs["process.executable.name"] = self._comm[pid]
        if not service:
            service = attrs.get("process.executable.name") or f"pid-{pid}"
        attrs["service.name"] = service
        attrs.update(self._configured)
        self._ended.pop(pid, None)  # the pid is another process now
        return Resource(attrs)

    def _command(self, cmdline: bytes) -> dict[str, AttributeValue]:
        """The command line's attributes, as ``targets.command_line`` says: ``redacted`` (secrets
        replaced), ``full`` (as read), or ``command`` (the semantic conventions' choice for
        sensitive command lines: ``process.command``, argv[0], and ``process.args_count``)."""
        args = [a.decode(errors="replace") for a in cmdline.rstrip(b"\0").split(b"\0")]
        if self._command_line == "command":
            return {"process.command": redact_command_args(args[:1])[0], "process.args_count": len(args)}
        if self._command_line == "redacted":
            args = redact_command_args(args)
        return {"process.command_line": " ".join(args), "process.command_args": args}

    @staticmethod
    def _environ(pid: int) -> dict[str, str]:
        raw = _read(f"/proc/{pid}/environ") or b""
        out = {}
        for item in raw.split(b"\0"):
            if item.startswith(b"OTEL_") and b"=" in item:
                k, v = item.split(b"=", 1)
                out[k.decode(errors="replace")] = v.decode(errors="replace")
        return out


def agent_resource(configured: Mapping[str, AttributeValue] | None = None) -> Resource:
    """The agent's own resource, for its otelbpf.* health metrics."""
    from otelbpf import __version__

    attrs: dict[str, AttributeValue] = {
        "service.name": "otelbpf",
        "service.version": __version__,
        "host.name": socket.gethostname(),
        "process.pid": os.getpid(),
    }
    attrs.update({k: v for k, v in (configured or {}).items() if k != "service.name"})
    return Resource(attrs)
