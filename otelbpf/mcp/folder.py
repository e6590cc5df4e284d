"""An output folder (``otelbpf run``'s file exporter) as the MCP tools see it.

The spans, metrics and profiles are read with the analyze/ readers (``summary._read``,
``summary.load_metrics``), once per change of the folder: the loaded ``Data`` is kept until a
file is added, removed, grows or is replaced. A folder the agent is still writing is fine: a
last line with no newline yet is one being written, skipped and reported (``partial``), not
an error. A folder larger than ``max_bytes`` is refused rather than read into memory.
"""

from __future__ import annotations

import glob
import os
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from otelbpf.analyze.summary import Latest, ProcKey, _attrs, _proc_key, _read, load_metrics

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


class Folder:
    """One output folder, read on demand and cached until it changes (thread-safe)."""

    def __init__(self, path: str, max_bytes: int = 1 << 30) -> None:
        self.path = os.path.realpath(path)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._signature: tuple[tuple[str, int, int, int], ...] = ()
        self._data: Data | None = None

    def telemetry_files(self) -> list[str]:
        return sorted(
            glob.glob(os.path.join(self.path, "traces*.jsonl")) + glob.glob(os.path.join(self.path, "metrics*.jsonl"))
        )

    def profiles_dir(self) -> str:
        return os.path.join(self.path, "profiles")

    def profile_files(self) -> list[str]:
        """The pprof files' names (not paths): what ``flamegraph_top`` accepts."""
        return sorted(os.path.basename(p) for p in glob.glob(os.path.join(self.profiles_dir(), "*.pb.gz")))

    def _stat(self) -> tuple[tuple[str, int, int, int], ...]:
        """(path, inode, size, mtime) of each telemetry file: what changes when one is written or rotated."""
        out = []
        for path in self.telemetry_files():
            try:
                st = os.stat(path)
            except OSError:
                continue  # rotated away between the listing and the stat: the next read sees it
            out.append((path, st.st_ino, st.st_size, st.st_mtime_ns))
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
