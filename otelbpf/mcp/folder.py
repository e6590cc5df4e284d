"""An output folder (``otelbpf run``'s file exporter) as the MCP tools see it.

The spans, metrics and profiles are read with the analyze/ readers (``summary._read``,
``summary.load_metrics``), once per change of the folder: the loaded ``Data`` is kept until a
file is added, removed, grows or is replaced. A folder the agent is still writing is fine: a
last line with no newline yet is one being written, skipped and reported (``partial``), not
an error. A folder larger than ``max_bytes`` is refused rather than read into memory.

Only regular files directly in the folder and in its ``profiles/`` are served, each opened
relative to its folder without following a link (``safe_files.ReadDir``): the server often runs
as root (the agent's output is root's), and whoever can write in the folder could otherwise
link ``traces.jsonl`` or a profile to a root-only file and have it read and answered from. A
link under a telemetry file's name is an error naming it; a linked profile is not listed.
"""

from __future__ import annotations

import os
import stat
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from otelbpf.analyze.summary import Latest, ProcKey, _attrs, _proc_key, _read, load_metrics
from otelbpf.base.safe_files import ReadDir

#: A JSON object as read from OTLP-JSON or the live state, and as the tools answer: its values are
#: whatever JSON holds (attribute values are str, int, float, bool or lists of them).
JsonObject = dict[str, Any]

#: Largest attribute text kept per span: answers stay small, and a hostile URL stays short.
MAX_TEXT = 256


class FolderError(Exception):
    """The folder cannot be read; the message says which file and why."""


@dataclass(slots=True)
class Span:
    """One exported span, with the ids an answer cites."""

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: int
    scope: str
    start: int
    end: int
    error: bool
    attrs: JsonObject
    proc: ProcKey

    @property
    def duration_ms(self) -> float:
        return (self.end - self.start) / 1e6


@dataclass
class Data:
    """Everything one read of the folder found."""

    spans: list[Span] = field(default_factory=list)
    by_id: dict[tuple[str, str], Span] = field(default_factory=dict)
    by_trace: dict[str, list[Span]] = field(default_factory=lambda: defaultdict(list))
    children: dict[tuple[str, str], list[Span]] = field(default_factory=lambda: defaultdict(list))
    procs: dict[ProcKey, JsonObject] = field(default_factory=dict)  # resource attributes
    metrics: Latest = field(default_factory=dict)  # summary.load_metrics: each series' last point
    partial: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)


def _short(value: object) -> object:
    if isinstance(value, str) and len(value) > MAX_TEXT:
        return value[:MAX_TEXT] + "..."
    if isinstance(value, list):
        return [_short(v) for v in value[:32]]
    return value


def _telemetry_names(d: ReadDir) -> list[str]:
    """The OTLP-JSON files' names in the folder, rotated ones included."""
    return d.names(lambda n: n.endswith(".jsonl") and n.startswith(("traces", "metrics")))


class Folder:
    """One output folder, read on demand and cached until it changes (thread-safe)."""

    def __init__(self, path: str, max_bytes: int = 1 << 30) -> None:
        self.path = os.path.realpath(path)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._signature: tuple[tuple[str, int, int, int], ...] = ()
        self._data: Data | None = None

    def telemetry_files(self) -> list[str]:
        with ReadDir(self.path) as d:
            return [os.path.join(self.path, n) for n in _telemetry_names(d)]

    def profiles_dir(self) -> str:
        return os.path.join(self.path, "profiles")

    def profile_files(self) -> list[str]:
        """The pprof files' names (not paths): what ``flamegraph_top`` accepts. Regular files
        only: a link there is not listed, nor read."""
        try:
            with ReadDir(self.path) as d, d.subdir("profiles") as p:
                return [n for n in p.names(lambda n: n.endswith(".pb.gz")) if stat.S_ISREG(p.lstat(n).st_mode)]
        except OSError:  # no profiles/ (or a link there): no profiles
            return []

    def read_profile(self, name: str, limit: int) -> bytes:
        """Up to ``limit`` bytes of ``profiles/name``, never through a link. Raises OSError."""
        with ReadDir(self.path) as d, d.subdir("profiles") as p, p.open_binary(name) as f:
            return f.read(limit)

    def _stat(self) -> tuple[tuple[str, int, int, int], ...]:
        """(path, inode, size, mtime) of each telemetry file (a link's own): what changes when
        one is written or rotated."""
        out = []
        with ReadDir(self.path) as d:
            for name in _telemetry_names(d):
                try:
                    st = d.lstat(name)
                except OSError:
                    continue  # rotated away between the listing and the stat: the next read sees it
                out.append((os.path.join(self.path, name), st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(out)

    def load(self) -> Data:
        """The folder's telemetry, read again only when a file changed. Raises FolderError."""
        if not os.path.isdir(self.path):
            raise FolderError(f"{self.path} is not a directory (run the agent with the file exporter first)")
        with self._lock:
            signature = self._stat()
            if self._data is not None and signature == self._signature:
                return self._data
            size = sum(s[2] for s in signature)
            if size > self.max_bytes:
                raise FolderError(
                    f"{self.path} holds {size / 2**20:.0f} MiB of telemetry, more than the "
                    f"{self.max_bytes / 2**20:.0f} MiB this server reads (--max-bytes)"
                )
            for attempt in range(2):
                try:
                    data = self._read()
                    break
                except FileNotFoundError as exc:
                    if attempt:  # rotated away between the listing and the open: list again once
                        raise FolderError(f"{exc.filename or self.path}: {exc.strerror}") from None
                    signature = self._stat()
                except ValueError as exc:
                    raise FolderError(str(exc)) from None
                except OSError as exc:
                    raise FolderError(f"{exc.filename or self.path}: {exc.strerror}") from None
            self._data, self._signature = data, signature
            return data

    def _read(self) -> Data:
        data = Data(files=[os.path.basename(p) for p in self.telemetry_files()])
        data.metrics = load_metrics(self.path, data.procs, data.partial)

        def add(req: JsonObject) -> None:
            for rs in req.get("resourceSpans", []):
                res = _attrs(rs.get("resource", {}).get("attributes"))
                proc = _proc_key(res)
                data.procs.setdefault(proc, res)
                for ss in rs.get("scopeSpans", []):
                    scope = ss.get("scope", {}).get("name", "")
                    for sp in ss.get("spans", []):
                        span = Span(
                            sp.get("traceId", ""),
                            sp.get("spanId", ""),
                            sp.get("parentSpanId", ""),
                            sp["name"],
                            int(sp.get("kind", 0)),
                            scope,
                            int(sp["startTimeUnixNano"]),
                            int(sp["endTimeUnixNano"]),
                            sp.get("status", {}).get("code") in (2, "STATUS_CODE_ERROR"),
                            {k: _short(v) for k, v in _attrs(sp.get("attributes")).items()},
                            proc,
                        )
                        data.spans.append(span)
                        data.by_id[(span.trace_id, span.span_id)] = span
                        data.by_trace[span.trace_id].append(span)
                        if span.parent_id:
                            data.children[(span.trace_id, span.parent_id)].append(span)

        _read(self.path, "traces", add, data.partial)
        return data
