"""Read NCCL collective spans back from OTLP-JSON, as columns.

The straggler report reads every rank's spans, hundreds of thousands of them: msgspec
decodes only the fields the report uses (the rest of each line is skipped in C), files are
read in parallel processes, and the result is numpy columns, one row per collective span.

Accepted input: the file exporter's ``traces*.jsonl`` (one ExportTraceServiceRequest per
line, the Collector file exporter's format), any other ``*.jsonl`` of such lines, and
``*.json`` files holding one request each (an OTLP-JSON export). Metrics and profile files
in the same directories are skipped by name.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import msgspec
import numpy as np

from otelbpf.base.safe_files import ReadDir

#: Span names of the collectives (families/nccl/correlator.py names a span after its NCCL function).
COLLECTIVE_SPANS = ("ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclBroadcast", "ncclReduce")
_OP_INDEX = {name: i for i, name in enumerate(COLLECTIVE_SPANS)}
#: status column: the call failed (span status error), or the process ended during it.
OK, FAILED, EXITED = 0, 1, 2


class ReadError(Exception):
    """A file could not be read as OTLP-JSON; the message names it and the line."""


class _Value(msgspec.Struct, gc=False):
    stringValue: str | None = None
    intValue: str | int | None = None
    doubleValue: float | None = None
    boolValue: bool | None = None


class _KeyValue(msgspec.Struct, gc=False):
    key: str
    value: msgspec.Raw = msgspec.Raw(b"{}")  # decoded only for the keys the report reads


class _Status(msgspec.Struct, gc=False):
    code: int | str = 0


class _Span(msgspec.Struct, gc=False):
    name: str = ""
    startTimeUnixNano: str | int = 0
    endTimeUnixNano: str | int = 0
    attributes: list[_KeyValue] = []
    status: _Status = msgspec.field(default_factory=_Status)


class _ScopeSpans(msgspec.Struct, gc=False):
    spans: list[_Span] = []


class _Resource(msgspec.Struct, gc=False):
    attributes: list[_KeyValue] = []


class _ResourceSpans(msgspec.Struct, gc=False):
    resource: _Resource = msgspec.field(default_factory=_Resource)
    scopeSpans: list[_ScopeSpans] = []


class _Request(msgspec.Struct, gc=False):
    resourceSpans: list[_ResourceSpans] = []


#: Span attributes the report reads; the others are skipped undecoded.
_SPAN_KEYS = frozenset(
    {
        "nccl.comm.id",
        "nccl.seq",
        "nccl.rank",
        "nccl.nranks",
        "nccl.enqueue.duration",
        "nccl.phase.duration",
        "nccl.phase.gpu_wait",
        "nccl.completion",
        "otelbpf.incomplete",
    }
)
_RESOURCE_KEYS = frozenset({"host.name", "process.pid", "service.name"})
#: One row per collective span.
_ROW = np.dtype(
    [
        ("host", np.int32),
        ("pid", np.int64),
        ("rank", np.int32),
        ("nranks", np.int32),
        ("comm", np.uint64),
        ("seq", np.int64),
        ("op", np.int8),
        ("start", np.int64),
        ("end", np.int64),
        ("enqueue", np.float64),
        ("phase", np.float64),
        ("gpu_wait", np.float64),
        ("observed", np.bool_),
        ("status", np.int8),
    ]
)


@dataclass
class Collectives:
    """One row per collective span. Times: ``start``/``end`` wall-clock ns as exported (the
    span's host clock); ``enqueue``, ``phase``, ``gpu_wait`` seconds (NaN: not known).
    ``host`` indexes ``hosts``; ``services`` names each (host index, pid)."""

    host: np.ndarray
    pid: np.ndarray
    rank: np.ndarray
    nranks: np.ndarray
    comm: np.ndarray
    seq: np.ndarray
    op: np.ndarray
    start: np.ndarray
    end: np.ndarray
    enqueue: np.ndarray
    phase: np.ndarray
    gpu_wait: np.ndarray
    observed: np.ndarray
    status: np.ndarray
    hosts: list[str] = field(default_factory=list)
    services: dict[tuple[int, int], str] = field(default_factory=dict)
    files: int = 0

    def __len__(self) -> int:
        return len(self.seq)


def otlp_files(paths: Sequence[str]) -> list[str]:
    """The trace files under each path (a file is taken as given, its link resolved: the
    operator named it). In a folder, only regular files are read, never through a link: it is
    read as root (``otelbpf stragglers``, ``mcp``), and whoever can write in it could link a
    ``.jsonl`` there to a root-only file (``safe_files.ReadDir``); a link is a ReadError."""
    out: list[str] = []
    for path in paths:
        if os.path.isfile(path):
            out.append(os.path.realpath(path))
            continue
        if not os.path.isdir(path):
            raise ReadError(f"{path}: no such file or directory")
        with ReadDir(path) as d:
            for base in d.names(_trace_file):
                kind = stat.S_IFMT(d.lstat(base).st_mode)
                if kind != stat.S_IFREG:
                    why = "a symbolic link" if kind == stat.S_IFLNK else "not a regular file"
                    raise ReadError(f"{os.path.join(path, base)} is {why}: refusing to read it")
                out.append(os.path.join(path, base))
    return out


def _trace_file(name: str) -> bool:
    return name.endswith((".json", ".jsonl")) and not name.startswith((".", "metrics", "profiles"))


def _no_follow(path: str, flags: int) -> int:
    """``open``'s opener: the file itself never through a link (listed regular, swapped since)."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK)


_VALUE = msgspec.json.Decoder(_Value)
_NAN = float("nan")


def _attrs(items: list[_KeyValue], wanted: frozenset[str]) -> dict[str, _Value]:
    return {kv.key: _VALUE.decode(kv.value) for kv in items if kv.key in wanted}


def _int(v: _Value | None, default: int = -1) -> int:
    return default if v is None or v.intValue is None else int(v.intValue)


def _float(v: _Value | None) -> float:
    if v is None:
        return _NAN
    if v.doubleValue is not None:
        return v.doubleValue
    return float(v.intValue) if v.intValue is not None else _NAN


def _requests(path: str) -> Iterator[_Request]:
    decoder = msgspec.json.Decoder(_Request)
    with open(path, "rb", opener=_no_follow) as f:
        if path.endswith(".json"):
            try:
                yield decoder.decode(f.read())
            except msgspec.DecodeError as exc:
                raise ReadError(f"{path}: not an OTLP-JSON trace request: {exc}") from None
            return
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield decoder.decode(line)
            except msgspec.DecodeError as exc:
                raise ReadError(f"{path}:{n}: not an OTLP-JSON trace request: {exc}") from None


def _read_one(path: str) -> tuple[np.ndarray, list[str], dict[tuple[int, int], str]]:
    rows: list[tuple[object, ...]] = []
    hosts: dict[str, int] = {}
    services: dict[tuple[int, int], str] = {}
    for req in _requests(path):
        for rs in req.resourceSpans:
            res = _attrs(rs.resource.attributes, _RESOURCE_KEYS)
            name = res.get("host.name")
            host = hosts.setdefault(name.stringValue if name and name.stringValue else "?", len(hosts))
            pid = _int(res.get("process.pid"), 0)
            service = res.get("service.name")
            services[(host, pid)] = service.stringValue if service and service.stringValue else f"pid {pid}"
            for ss in rs.scopeSpans:
                for sp in ss.spans:
                    op = _OP_INDEX.get(sp.name)
                    if op is None:
                        continue
                    a = _attrs(sp.attributes, _SPAN_KEYS)
                    comm, seq = a.get("nccl.comm.id"), a.get("nccl.seq")
                    if comm is None or seq is None or not comm.stringValue:
                        continue  # a communicator created before the agent: not comparable
                    completion = a.get("nccl.completion")
                    done = completion.stringValue if completion is not None else None
                    if "otelbpf.incomplete" in a or done == "process_exited":
                        status = EXITED
                    elif sp.status.code in (2, "STATUS_CODE_ERROR"):
                        status = FAILED
                    else:
                        status = OK
                    rows.append(
                        (
                            host,
                            pid,
                            _int(a.get("nccl.rank")),
                            _int(a.get("nccl.nranks")),
                            int(comm.stringValue, 16),
                            _int(seq),
                            op,
                            int(sp.startTimeUnixNano),
                            int(sp.endTimeUnixNano),
                            _float(a.get("nccl.enqueue.duration")),
                            _float(a.get("nccl.phase.duration")),
                            _float(a.get("nccl.phase.gpu_wait")),
                            done == "observed",
                            status,
                        )
                    )
    return np.array(rows, dtype=_ROW), list(hosts), services


def read(paths: Sequence[str], workers: int | None = None) -> Collectives:
    """Every collective span in the OTLP-JSON under ``paths`` (files read in parallel)."""
    files = otlp_files(paths)
    if not files:
        raise ReadError(f"no OTLP-JSON trace files (*.jsonl, *.json) in {', '.join(paths)}")
    workers = min(len(files), workers or os.cpu_count() or 1)
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            parts = list(pool.map(_read_one, files))
    else:
        parts = [_read_one(f) for f in files]
    hosts: dict[str, int] = {}
    services: dict[tuple[int, int], str] = {}
    tables = []
    for table, part_hosts, part_services in parts:
        remap = np.array([hosts.setdefault(h, len(hosts)) for h in part_hosts] or [0], dtype=np.int32)
        if len(table):
            table["host"] = remap[table["host"]]
        tables.append(table)
        for (h, pid), service in part_services.items():
            services[(int(remap[h]), pid)] = service
    rows = np.concatenate(tables) if tables else np.zeros(0, dtype=_ROW)
    return Collectives(
        **{name: np.ascontiguousarray(rows[name]) for name in _ROW.names or ()},
        hosts=list(hosts),
        services=services,
        files=len(files),
    )
