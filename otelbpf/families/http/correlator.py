"""Socket records -> HTTP/1.x, HTTP/2 and gRPC server and client spans, and RED metrics.

Records from the ``sockdata`` ring are processed in the order things happened
on the wire: bytes written count from the write's entry, bytes read from the
read's return, so a client's request always precedes the server's reading of
it even when the two syscalls finished on different CPUs in the other order.

Per connection the protocol is inferred from its first client-to-server
bytes (the HTTP/2 preface, an HTTP/1.x request line; TLS and anything else
are counted, not parsed). When a request's head is parsed its span context is
fixed at once, so that what happens while it is served can point to it:
- a server span adopts the W3C ``traceparent`` it received, else the client
  span at the other end of the same connection on this host (links.py), and
  opens an interval on its thread (causality.py) that makes client spans and
  CUDA spans of that thread its children;
- a client span takes as parent the server span open on its thread.
Spans are emitted when the exchange ends.

Streamed responses (chunked or ``text/event-stream`` HTTP/1, HTTP/2 and gRPC
DATA frames) are timed as they stream (streaming.py): time to first byte,
chunk and event, counts, and the gaps between chunks and between events (a
histogram per process). OpenAI-compatible completions (genai.py) add the
GenAI semantic conventions: model, token usage, and on the server side the
``gen_ai.server.*`` histograms (time to first token, time per output token,
request duration).

Never exported: ``authorization``, ``proxy-authorization``, ``cookie``,
``set-cookie`` and the configured ``redact_headers``; bodies (prompts and
completions only with ``capture_message_content``, clipped); query strings;
userinfo in a target or Host and path parameter values (redact.py). Only
headers named in ``capture_headers`` become attributes.

Hostile traffic: every value taken from the bytes is checked before use
(``:status`` three digits, ``grpc-status`` 0-16, a gRPC ``:path`` exactly
``/service/method``); what fails is left out of the span and counted, and one
exchange that still fails is counted and skipped without losing the others of
its batch or connection. Metric series are bounded: methods outside the
standard set are ``_OTHER``, and a process's distinct gRPC routes beyond
``max_routes`` share one ``_OTHER`` series (``otelbpf.http.routes_folded``).
"""

from __future__ import annotations

import errno
import logging
import random
import re
import traceback
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from opentelemetry.sdk.metrics.export import HistogramDataPoint, Metric
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import INVALID_SPAN_CONTEXT, SpanContext, SpanKind, TraceFlags
from opentelemetry.util.types import AttributeValue

from otelbpf.base.events import SOCK_EGRESS, SOCKF_H2_DECIDED, SOCKF_LISTENER_UNKNOWN, SOCKF_SERVING_SHED, Kind
from otelbpf.correlate import metrics as m
from otelbpf.correlate.base import CorrelatorBase, CorrelatorSettings
from otelbpf.correlate.causality import Causality, Interval
from otelbpf.correlate.spans import make_span, new_context, scope
from otelbpf.families.http import genai, grpc_genai
from otelbpf.families.http.links import ClientRequest, PeerLinks
from otelbpf.families.http.netaddr import address_from_raw
from otelbpf.families.http.probes import RING, SHIFT_BIT, SHIFT_MASK
from otelbpf.families.http.protocols.http1 import (
    Exchange,
    Http1Connection,
    Message,
    looks_like_request,
    looks_like_response,
    valid_target,
)
from otelbpf.families.http.protocols.http2 import H2Connection, Stream, looks_like_preface
from otelbpf.families.http.protocols.limits import DEFAULT, Held, Limits
from otelbpf.families.http.redact import quiet_payload_loggers, split_target, strip_userinfo
from otelbpf.families.http.sampling import (
    GRPC_SERVER_ERRORS,
    STREAM_DECISIONS,
    STREAM_KEPT,
    STREAM_PARENT,
    STREAM_PROBABILITY,
    H2Delta,
    HeadSampler,
    RedDelta,
    add_counted,
    h2_keep,
    h2_series,
    last_stamp,
    red_series,
    sampled_context,
)
from otelbpf.families.http.sockets import Conn, Connections
from otelbpf.families.http.streaming import Gaps, ResponseWatch
from otelbpf.families.http.tls import RING as TLS_RING
from otelbpf.families.http.tls import TlsConns

log = logging.getLogger(__name__)

SCOPE = scope("otelbpf.http")
#: Headers never exported, whatever the configuration says.
ALWAYS_REDACTED = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie"})
#: Problems of following the bytes, not of the exchange: marked on the span, not failed.
PARSE_PROBLEMS = frozenset(
    {
        "desync",
        "headers_truncated",
        "gap_in_framing",
        "bad_chunk",
        "head_too_large",
        "bad_start_line",
        "bad_chunk_size",
        "bad_content_length",
        "bad_request_target",
        "stream_limit",
        "process_limit",
    }
)
#: Methods that name their own metric series (OpenTelemetry's list); any other is ``_OTHER``.
KNOWN_METHODS = frozenset({"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE", "QUERY"})
#: Distinct gRPC routes (service, method) with a series of their own, per process; the rest share ``_OTHER``.
MAX_ROUTES = 256
#: Distinct GenAI model names with series of their own, per process; the rest share ``_OTHER``.
MAX_MODELS = 64
OTHER = "_OTHER"
_STATUS = re.compile(r"[1-9][0-9][0-9]")
_GRPC_STATUS = re.compile(r"[0-9]{1,2}")
_GRPC_PATH = re.compile(r"/([^/]+)/([^/]+)")
#: Spans made within one batch that are handed to the exporter before the batch ends.
_HAND_OFF = 4096
#: Chunks a server may send before the client's first bytes decide the protocol (HTTP/2 SETTINGS).
_PENDING_CHUNKS = 16
_EGRESS = np.array(sorted(int(f) for f in SOCK_EGRESS), dtype=np.uint8)
#: The same as plain ints, for the membership test per data record.
_EGRESS_FUNCS = frozenset(_EGRESS.tolist())
_getrandbits = random.Random().getrandbits
#: Enum members read once: each read through the class costs a descriptor call, per span.
_SERVER, _CLIENT = SpanKind.SERVER, SpanKind.CLIENT
#: Record kinds as plain ints: compared once or more per record.
_DATA, _CONNECT, _ACCEPT, _LOCAL, _UNKNOWN, _CLOSE, _COUNTED = (
    int(k)
    for k in (
        Kind.SOCK_DATA,
        Kind.SOCK_CONNECT,
        Kind.SOCK_ACCEPT,
        Kind.SOCK_LOCAL,
        Kind.SOCK_UNKNOWN,
        Kind.SOCK_CLOSE,
        Kind.SOCK_COUNTED,
    )
)
#: The record fields _record reads, in the order of its row tuples (the payload follows).
_FIELDS = (
    "ts_ns",
    "duration_ns",
    "pid",
    "tid",
    "fd",
    "ret",
    "kind",
    "func",
    "cap",
    "flags",
    "family",
    "port",
    "local_port",
)

#: A record's _FIELDS (ints) and its payload, as _record unpacks them.
_Row = tuple[int, int, int, int, int, int, int, int, int, int, int, int, int, bytes]


def _joined(batches: list[np.ndarray]) -> np.ndarray | None:
    """One array of a tick's batches of a ring (None for none)."""
    if not batches:
        return None
    return batches[0] if len(batches) == 1 else np.concatenate(batches)


def _tls_id(row: _Row) -> int:
    """A TLS record's connection id (bpf/tls.c: in the socket layout's port and local_port)."""
    return row[11] | row[12] << 16


#: (entry ns, exit ns, thread id) of the syscall that carried a chunk.
Stamp = tuple[int, int, int]
#: An exchange's span attributes, by semantic-convention name: each name's own value type (str, int,
#: bool, list[str]), and the metrics read some back as labels (rpc.service, error.type, ...).
SpanAttrs = dict[str, Any]
#: A metric series' labels: (name, value) pairs.
Labels = tuple[tuple[str, AttributeValue], ...]


@dataclass(slots=True)
class _Open:
    """A request whose span context is fixed, waiting for its exchange to end."""

    context: SpanContext
    parent: SpanContext | None
    start_ns: int  # monotonic
    tid: int
    interval: Interval | None = None  # server: the thread's causality interval
    link: ClientRequest | None = None  # client: registered for the server at the other end
    parent_from: str = ""  # traceparent | peer | thread
    genai: genai.RequestFacts | None = None  # an OpenAI-compatible request's body facts
    watch: ResponseWatch | None = None  # how its response streamed
    shift: int = 0  # kept by the kernel's head sampling with probability 2^-shift
    #: HTTP/2 stream sampling (user space): the decision (STREAM_* in sampling.py), counted when the
    #: stream ends; a shed stream (``shed``) feeds the metrics and builds no span.
    decision: int = -1
    shed: bool = False
    #: A server stream's: what its thread serves while it is open (_Serving), ended with it.
    serving: _Serving | None = None


@dataclass(slots=True)
class _Serving:
    """A server stream a thread read, and its sampling: the fate of the HTTP/2 client streams the
    thread makes while it is open, as the kernel passes it on to the thread's HTTP/1 calls
    (bpf/h2_frames.h ``h2_serve``): the last kept one while it is open, else the last one read."""

    start_ns: int
    kept: bool
    shift: int
    end_ns: int | None = None


#: A shed stream's context: never exported, never a parent.
_SHED = INVALID_SPAN_CONTEXT


@dataclass
class _Proc:
    resource: Resource
    start_ns: int
    exited: bool = False  # forgotten after its next export
    # (metric, labels) -> the series' histogram: durations, and gaps between chunks or events
    durations: dict[tuple[str, Labels], m.HistogramState] = field(default_factory=dict)
    gaps: dict[tuple[str, Labels], Gaps] = field(default_factory=dict)
    routes: set[tuple[str, str]] = field(default_factory=set)  # gRPC (service, method) pairs with their own series
    models: set[str] = field(default_factory=set)  # GenAI model names with their own series


def parse_traceparent(value: str | None) -> SpanContext | None:
    """A W3C trace context ``traceparent`` header, or None if absent or invalid."""
    if not value:
        return None
    parts = value.strip().split("-")
    if len(parts) < 4 or len(parts[0]) != 2 or parts[0] == "ff" or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3][:2], 16)
    except ValueError:
        return None
    if not trace_id or not span_id:
        return None
    return SpanContext(trace_id=trace_id, span_id=span_id, is_remote=True, trace_flags=TraceFlags(flags & 1))


def _first_values(headers: list[tuple[str, str]]) -> dict[str, str]:
    """Each header's first value, by name."""
    return dict(reversed(headers))


_STATUS_CLASSES = {status: f"{status // 100}xx" for status in range(100, 600)}


def status_class(status: int) -> str:
    return _STATUS_CLASSES.get(status, "other")


class HttpCorrelator(CorrelatorBase[_Proc]):
    scope = SCOPE

    def __init__(
        self,
        settings: CorrelatorSettings,
        count: Callable[..., None],
        causality: Causality,
        update_map: Callable[[str, list[tuple[int, int]]], None],
        *,
        ports: list[int],
        capture_headers: Sequence[str] = (),
        redact_headers: Sequence[str] = (),
        max_spans_per_second: int = 20_000,
        traces: bool = True,
        limits: Limits = DEFAULT,
        max_routes: int = MAX_ROUTES,
        max_models: int = MAX_MODELS,
        capture_message_content: bool = False,
        sampler: HeadSampler | None = None,
    ) -> None:
        """``limits``: what one connection and one process may hold (protocols/limits.py);
        ``max_routes``, ``max_models``: gRPC routes and GenAI models with their own metric series per
        process; ``capture_message_content``: export OpenAI-compatible prompts and completions
        (clipped to ``limits.attribute_chars``), never done otherwise."""
        quiet_payload_loggers()
        super().__init__(settings, max_spans_per_second=max_spans_per_second)
        self._count = count  # (metric name, value, **attributes): the agent's own otelbpf.* counters
        self._causality = causality
        self._conns = Connections(ports, update_map)
        # the tls receiver's plaintext (tls.py)
        self._tls = TlsConns(self._conns.get, self._conns.describe, wanted=self._conns.wanted)
        self._links = PeerLinks()
        redacted = ALWAYS_REDACTED | {h.lower() for h in redact_headers}
        self._capture = [h.lower() for h in capture_headers if h.lower() not in redacted]
        self._traces = traces
        self._limits = limits
        self._max_routes = max_routes
        self._max_models = max_models
        self._content_cap = limits.attribute_chars if capture_message_content else 0
        self._held: dict[int, Held] = {}  # by pid: pending requests and open streams of its connections
        self._spans: list[ReadableSpan] = []
        # (pid, metric, labels) -> seconds, this batch
        self._durations: dict[tuple[int, str, Labels], list[float]] = defaultdict(list)
        self._series: dict[Labels, Labels] = {}  # labels in insertion order -> sorted (the series key)
        self._sampled_out = 0
        self._sampler = sampler  # the kernel's HTTP/1 head sampling (sampling.py)
        #: HTTP/2 streams are sampled here, at the sampler's shift (spans only; metrics count all)
        self._sample_streams = sampler is not None and traces
        self._serving: dict[tuple[int, int], _Serving] = {}  # by (pid, tid): the last read (_Serving)
        self._serving_kept: dict[tuple[int, int], _Serving] = {}  # by (pid, tid): the last kept one
        #: This drain tick's batches of each ring, parsed together at its end (on_tick).
        self._pending_socks: list[np.ndarray] = []
        self._pending_tls: list[np.ndarray] = []
        self._stream_decisions = [0] * len(STREAM_DECISIONS)  # this batch's, handed to the sampler

    # -- input ------------------------------------------------------------------

    def on_strings(self, arr: np.ndarray) -> None:
        pass

    def on_events(self, arr: np.ndarray) -> None:
        """Process exits end that process's connections (the tick's socket records are parsed
        by then: CutCorrelator)."""
        exits = arr[arr["kind"] == Kind.PROC_EXIT]
        if len(exits) and self._tls.waiting:
            with self._lock:
                self._tls_rows(self._tls.release())
        for pid in np.unique(exits["pid"]).tolist() if len(exits) else ():
            with self._lock:
                for conn in self._conns.forget_process(pid) + self._tls.forget_process(pid):
                    self._guarded(self._end, conn, None, "process_exited")
                self._held.pop(pid, None)
                self._causality.forget_process(pid)
                for key in [k for k in self._serving if k[0] == pid]:
                    del self._serving[key]
                for key in [k for k in self._serving_kept if k[0] == pid]:
                    del self._serving_kept[key]
                self._flush_durations()
                if pid in self._procs:
                    self._procs[pid].exited = True
            self._flush_spans()

    def on_ring(self, name: str, arr: np.ndarray) -> None:
        """A batch of socket records: parsed when the drain tick ends (``on_tick``), merged by time
        with the tick's TLS plaintext."""
        with self._lock:
            self._pending_socks.append(arr)

    def on_tls(self, arr: np.ndarray) -> None:
        """The tls receiver's plaintext records (tls.py): parsed as socket records are, on
        connections of their own, when the drain tick ends (``on_tick``)."""
        with self._lock:
            self._pending_tls.append(arr)

    def on_tick(self) -> None:
        """The drain tick is complete (sensor.py ``TICK``: every socket and plaintext record written
        before its mark is in): its batches of both rings are parsed as one, in time order. Apart,
        the ring processed first had its records parsed before the other's older ones: a plain
        request's HTTPS call parsed before the request was open (no parent), an HTTPS request's
        plain call likewise."""
        with self._lock:
            socks, tls = self._pending_socks, self._pending_tls
            self._pending_socks, self._pending_tls = [], []
        if not (socks or tls):
            return
        try:
            self._process(_joined(socks), _joined(tls))
        except Exception as exc:  # one record's failure is caught inside: this is the whole tick's
            self._failed("tick", exc)
            for ring, batches in ((RING, socks), (TLS_RING, tls)):
                if batches:  # as the agent counts a batch its correlator failed on
                    self._count("otelbpf.events.dropped", sum(map(len, batches)), reason="processing_error", ring=ring)

    def _process(self, sock: np.ndarray | None, tls: np.ndarray | None) -> None:
        """Socket records and TLS plaintext records, merged: each ring's ingress records at their
        call's end (the bytes were there then), the rest at its start."""
        n_sock = len(sock) if sock is not None else 0
        whens = []
        rows: list[_Row] = []
        if sock is not None:
            kind = sock["kind"]
            is_data = kind == Kind.SOCK_DATA
            ingress = (is_data & ~np.isin(sock["func"], _EGRESS)) | (kind == Kind.SOCK_ACCEPT)
            whens.append(sock["ts_ns"] + np.where(ingress, sock["duration_ns"], 0))
            # One tuple per record, built in C: a record's fields are then unpacked at once, not looked up one by one.
            rows = list(zip(*(sock[f].tolist() for f in _FIELDS), sock["data"].tolist()))  # payload: the bytes
            addrs = sock["addr"]
            unknown = kind == Kind.SOCK_UNKNOWN
        ssl: list[int] = []
        if tls is not None:
            ingress = (tls["kind"] == Kind.SOCK_DATA) & ~np.isin(tls["func"], _EGRESS)
            whens.append(tls["ts_ns"] + np.where(ingress, tls["duration_ns"], 0))
            rows += list(zip(*(tls[f].tolist() for f in _FIELDS), tls["data"].tolist()))
            ssl = [int.from_bytes(a.tobytes()[:8], "little") for a in tls["addr"]]
        order = np.argsort(np.concatenate(whens), kind="stable")  # ties: the socket record first
        with self._lock:
            if sock is not None and unknown.any():
                self._conns.prepare(list(zip(sock["pid"][unknown].tolist(), sock["fd"][unknown].tolist())))
            self._tls.batch += 1
            # plaintext an earlier tick held for a socket record: parsed after this tick's (tls.py)
            late = self._tls.release()
            record, tls_wait, tls_record = self._record, self._tls.wait, self._tls_record
            for i in order.tolist():
                row = rows[i]
                try:  # inline, not _guarded: once per record
                    if i < n_sock:
                        record(row, addrs, i)
                    else:
                        item = (row, ssl[i - n_sock])
                        if not tls_wait(row[2], row[4], item, row[0], _tls_id(row)):
                            tls_record(*item)
                except Exception as exc:
                    self._failed("record" if i < n_sock else "tls_record", exc)
                if len(self._spans) >= _HAND_OFF:
                    # A record can finish hundreds of streams (evicted by a flood): hand spans over
                    # within the batch rather than hold a whole ring's worth (the queue never blocks).
                    spans, self._spans = self._spans, []
                    self._send(spans)
            self._tls_rows(late)
            self._conns.flush()
            self._end_tls(self._tls.sweep())
            self._flush_durations()
        if self._sampler is not None and sock is not None and is_data.any():
            # the last data record's stamp (sockets.c: bytes written up to it, in its addr field)
            self._sampler.processed(last_stamp(sock["addr"][is_data]))
            self._sampler.tick()
        self._flush_spans()

    def _tls_rows(self, items: list[tuple[_Row, int]], wait: bool = False) -> None:
        """TLS records with their SSL pointers; ``wait``: those of a connection neither path knows
        yet are held for the next batch (tls.py)."""
        for row, ssl in items:
            try:
                if not (wait and self._tls.wait(row[2], row[4], (row, ssl), row[0], _tls_id(row))):
                    self._tls_record(row, ssl)
            except Exception as exc:
                self._failed("tls_record", exc)

    def _tls_record(self, row: _Row, ssl: int) -> None:
        ts, dur, pid, tid, fd, ret, kind, func, cap, _flags, _family, _port, _local, payload = row
        if kind != _DATA or self._tls.unwanted(pid, fd):
            return
        conn, ended = self._tls.conn(pid, fd, ssl, ts, _tls_id(row))
        self._end_tls(ended)
        if conn is None:
            return
        stamp = (ts, ts + dur, tid)
        egress = func in _EGRESS_FUNCS
        if conn.role is None and ret > 0:  # no socket record nor /proc said (tls.py): the bytes decide
            if looks_like_preface(payload):
                conn.role = "client" if egress else "server"
            elif egress and payload[3:4] == b"\x04" and len(conn.pending) < _PENDING_CHUNKS:
                # an h2 server's SETTINGS frame, written before it read the preface: kept for it
                conn.pending.append((egress, payload, ret - cap, stamp))
                return
        if ret <= 0:
            if ret < 0 or (not egress and conn.role != "server"):  # as a socket EOF (_record)
                self._peer_gone(conn, stamp, ret)
            return
        self._feed(conn, egress, payload, ret - cap, stamp)

    def _end_tls(self, conns: list[Conn]) -> None:
        for conn in conns:
            self._guarded(self._end, conn, None, "")

    def _guarded(self, fn: Callable[..., object], *args: object) -> None:
        """``fn(*args)``; an exception is counted and logged by type and place only (its message may
        quote the traffic), and the caller goes on with the rest of its batch or connection."""
        try:
            fn(*args)
        except Exception as exc:
            self._failed(fn.__name__, exc)

    def _failed(self, what: str, exc: Exception) -> None:
        """Counted, and logged by type and place only: an exception's message may quote the traffic."""
        where = traceback.extract_tb(exc.__traceback__)[-1]
        log.error("http: %s failed: %s at %s:%d", what, type(exc).__name__, where.filename, where.lineno)
        self._count("otelbpf.http.problems", 1, reason="processing_error")

    def _record(self, row: _Row, addrs: np.ndarray, i: int) -> None:
        """``row``: the record's _FIELDS and payload; ``addrs[i]``: its address, read only by control records."""
        ts, dur, pid, tid, fd, ret, kind, func, cap, flags, family, port, local_port, payload = row
        stamp = (ts, ts + dur, tid)
        if kind == _DATA:
            conn = self._conns.get(pid, fd)
            if conn is None:
                if self._conns.rejected(pid, fd):
                    return
                conn = self._conns.joined(pid, fd)
            conn.shift = (flags >> SHIFT_BIT) & SHIFT_MASK  # sockets.c SOCKF_SHIFT_BIT
            conn.serving_shed = bool(flags & SOCKF_SERVING_SHED)
            egress = func in _EGRESS_FUNCS
            if ret <= 0:
                if ret < 0 or (not egress and conn.role != "server"):
                    # A server reading EOF may still answer what it read (a half-closed client):
                    # its own close() ends the connection.
                    self._peer_gone(conn, stamp, ret)
                return
            # a walked server's record: the connection's kernel sequence, for the streams it decided
            self._feed(conn, egress, payload, ret - cap, stamp, flags | (port | local_port << 16) << 32)
        elif kind == _CONNECT:
            self._replace(pid, fd, stamp)
            self._conns.connected(pid, fd, family, port, addrs[i].tobytes())
        elif kind == _ACCEPT:
            self._replace(pid, fd, stamp)
            known = not flags & SOCKF_LISTENER_UNKNOWN
            self._conns.accepted(pid, fd, ret, family, port, addrs[i].tobytes(), local_port, known, ts)
        elif kind == _LOCAL:
            conn = self._conns.get(pid, fd)
            if conn is not None and conn.role == "client":
                conn.local = address_from_raw(family, port, addrs[i].tobytes()) or conn.local
        elif kind == _UNKNOWN:
            if self._conns.get(pid, fd) is None:
                self._conns.unknown(pid, fd, ts)
        elif kind == _CLOSE:
            self._tls.socket_closed(pid, fd, ts, self._conns.get(pid, fd))
            conn = self._conns.closed(pid, fd)
            if conn is not None:
                self._end(conn, stamp, "")
        elif kind == _COUNTED:
            conn = self._conns.get(pid, fd)
            if conn is not None:
                self._counted(conn, ts)

    def _counted(self, conn: Conn, ts: int) -> None:
        """The kernel counts this HTTP/2 connection's streams from here on (bpf/h2_frames.h): its
        streams in flight are dropped without being counted (the kernel counts their ends), the
        threads and peers they were open on are closed, and its later bytes are not parsed."""
        if isinstance(conn.session, H2Connection):
            for stream in conn.session.abandon():
                opened = stream.tag
                if isinstance(opened, _Open):
                    if opened.serving is not None:  # its span is gone: its thread serves it no more
                        opened.serving.end_ns = max(ts, opened.start_ns)
                    if opened.interval is not None:
                        self._causality.close(conn.pid, opened.tid, opened.interval, max(ts, opened.start_ns))
                    if opened.link is not None:
                        self._links.end(opened.link, max(ts, opened.start_ns))
            self._report_problems(conn)
        conn.session = None
        conn.protocol = "counted"
        conn.pending.clear()
        self._count("otelbpf.http.h2.counted_connections", 1)

    def _replace(self, pid: int, fd: int, stamp: Stamp) -> None:
        """A new connection on an fd number whose close was not seen."""
        old = self._conns.closed(pid, fd)
        if old is not None:
            self._end(old, stamp, "")

    def _peer_gone(self, conn: Conn, stamp: Stamp, ret: int) -> None:
        if conn.ended:
            return
        error = "" if ret == 0 else _errno_name(-ret)
        if error:
            self._count("otelbpf.http.problems", 1, reason=error)
        self._end(conn, stamp, error)
        conn.ended = True

    def _end(self, conn: Conn, stamp: Stamp | None, error: str) -> None:
        """The connection is over: finish or abandon what is open on it."""
        if conn.session is None or conn.ended:
            return
        at = stamp or conn.last_stamp
        for result in conn.session.close(at, error):
            self._guarded(self._finished, conn, result)
        self._report_problems(conn)

    # -- protocol ---------------------------------------------------------------

    def _feed(self, conn: Conn, egress: bool, payload: bytes, missing: int, stamp: Stamp, flags: int = 0) -> None:
        """``flags``: the socket record's (SOCKF_*; above bit 32, the connection's kernel sequence a
        SOCKF_H2_DECIDED record carries), which an HTTP/2 stream whose request HEADERS begin in it
        keeps: the kernel decided it there, at the shift they carry, and the next record may say
        another shift."""
        if conn.ended:
            return
        if conn.midstream and conn.last_stamp == (0, 0, 0):
            # Counted at its first bytes: an fd seen before its connect() may be taken for an old
            # connection and then replaced by the new one before any data, which is no join.
            self._count("otelbpf.http.problems", 1, reason="joined_midstream")
        conn.last_stamp = stamp
        if conn.protocol is None and not self._infer(conn, egress, payload, missing, stamp):
            return
        if conn.protocol not in ("http1", "http2"):
            # counted: a record that raced the kernel's switch to counting (another thread's call
            # on the same connection): its streams' ends are neither the kernel's nor parsed here
            self._count("otelbpf.http.unparsed_bytes", len(payload) + missing, protocol=conn.protocol)
            return
        c2s = egress == (conn.role == "client")
        if conn.protocol == "http2":
            results = conn.session.feed(c2s, payload, missing, stamp, flags)
        else:
            results = conn.session.feed(c2s, payload, missing, stamp)
        for result in results:
            try:
                self._finished(conn, result)
            except Exception as exc:
                self._failed("exchange", exc)
        if conn.session.problems:  # the usual case has none
            self._report_problems(conn)

    def _infer(self, conn: Conn, egress: bool, payload: bytes, missing: int, stamp: Stamp) -> bool:
        """Decide the connection's protocol; True when this chunk should now be parsed."""
        if conn.role is None:  # joined, role unknown: the bytes say which side this is
            if looks_like_request(payload):
                conn.role = "client" if egress else "server"
            elif looks_like_response(payload):
                conn.role = "server" if egress else "client"
            else:
                self._count("otelbpf.http.unparsed_bytes", len(payload) + missing, protocol="joined_midstream")
                return False
        c2s = egress == (conn.role == "client")
        if conn.midstream:
            # Only HTTP/1.x can be joined: it restarts at every message. HTTP/2's
            # frame boundaries and header table cannot be recovered mid-stream; but a connection
            # whose first bytes seen are its preface was not joined midway, only its accept()
            # missed (a server blocked in accept() when the agent started): followed whole, with
            # the server's SETTINGS written before it (held until the preface says).
            if c2s and looks_like_preface(payload):
                conn.midstream = False
            elif (c2s and looks_like_request(payload)) or (not c2s and looks_like_response(payload)):
                conn.pending.clear()
                self._start(conn, "http1", synchronized=False)
                return True
            elif not c2s and payload[3:4] == b"\x04" and not conn.pending_done and len(conn.pending) < _PENDING_CHUNKS:
                conn.pending.append((egress, payload, missing, stamp))
                return False
            else:
                conn.pending_done = True  # any other bytes: the held ones were not the start
                conn.pending.clear()
                self._count("otelbpf.http.unparsed_bytes", len(payload) + missing, protocol="joined_midstream")
                return False
        if not c2s:
            if len(conn.pending) < _PENDING_CHUNKS:
                conn.pending.append((egress, payload, missing, stamp))
            return False
        if looks_like_preface(payload):
            protocol = "http2"
        elif looks_like_request(payload):
            protocol = "http1"
        elif payload[:2] == b"\x16\x03":
            protocol = "tls"
        else:
            protocol = "unknown"
        self._start(conn, protocol, synchronized=True)
        pending, conn.pending = conn.pending, []
        for args in pending:
            self._feed(conn, *args)
        return True

    def _start(self, conn: Conn, protocol: str, *, synchronized: bool) -> None:
        conn.protocol = protocol
        self._count("otelbpf.http.connections", 1, protocol=protocol)
        held = self._held.get(conn.pid)
        if held is None and protocol in ("http1", "http2"):
            held = self._held[conn.pid] = Held(self._limits.held_per_process)
        if protocol == "http1":
            conn.session = Http1Connection(
                on_request=lambda msg: self._request_http1(conn, msg),
                on_response=self._response_http1,
                synchronized=synchronized,
                limits=self._limits,
                held=held,
            )
        elif protocol == "http2":
            conn.session = H2Connection(
                on_request=lambda stream: self._request_http2(conn, stream),
                on_response=self._response_http2,
                on_streaming=self._streaming_http2,
                limits=self._limits,
                held=held,
            )

    def _report_problems(self, conn: Conn) -> None:
        for reason, n in conn.session.problems.items():
            new = n - conn.reported.get(reason, 0)
            if new:
                self._count("otelbpf.http.problems", new, reason=reason)
                conn.reported[reason] = n

    # -- requests open ----------------------------------------------------------

    def _request_http1(self, conn: Conn, msg: Message) -> None:
        opened = msg.tag = self._open(conn, msg.first, msg.head.first.get("traceparent"), 0)
        msg.sink = opened.genai = self._genai_request(msg.head.method, msg.head.target)

    def _request_http2(self, conn: Conn, stream: Stream) -> None:
        if self._sample_streams:
            opened = stream.tag = self._sampled_open(conn, stream)
        else:
            opened = stream.tag = self._open(conn, stream.first, stream.header("traceparent"), stream.id)
        method = stream.header(":method")
        if method == "POST":  # gRPC calls are too: the path decides
            stream.request_sink = opened.genai = self._genai_request(method, stream.header(":path") or "")

    def _genai_request(self, method: str, target: str) -> genai.RequestFacts | None:
        """The body reader of an OpenAI-compatible completion request, None for any other request."""
        if method != "POST":  # the common case, decided first
            return None
        found = genai.classify(method, target.partition("?")[0])
        if found is None:
            grpc = grpc_genai.classify(target)  # a generation stream (grpc_genai.py)
            return grpc_genai.GrpcRequestFacts(*grpc) if grpc is not None else None
        name, api, path_model, path_stream = found
        return genai.RequestFacts(
            name, content_cap=self._content_cap, limits=self._limits, api=api, path_model=path_model,
            path_stream=path_stream,
        )  # fmt: skip

    def _response_http1(self, request: Message | None, response: Message) -> None:
        """A response head: watch its body if it streams, or if it answers a GenAI request."""
        opened = request.tag if request is not None else None
        if opened is None:
            return
        first = response.head.first
        content_type = first.get("content-type")
        sse = content_type is not None and content_type.startswith("text/event-stream")
        if sse or opened.genai is not None or "chunked" in first.get("transfer-encoding", "").lower():
            response.sink = opened.watch = self._watch(opened, sse)

    def _response_http2(self, stream: Stream) -> None:
        """Response HEADERS (not trailers-only): an SSE body, or a GenAI request's, is read from the start."""
        opened = stream.tag
        if opened is not None:
            sse = (stream.header("content-type", "response") or "").startswith("text/event-stream")
            if sse or opened.genai is not None:
                stream.response_sink = opened.watch = self._watch(opened, sse)

    def _streaming_http2(self, stream: Stream) -> None:
        """A second DATA frame (gRPC server streaming, say): its frames are timed from the first."""
        opened = stream.tag
        if opened is not None:
            stream.response_sink = opened.watch = self._watch(opened, False)

    def _watch(self, opened: _Open, sse: bool) -> ResponseWatch:
        if isinstance(opened.genai, grpc_genai.GrpcRequestFacts):
            grpc = grpc_genai.GrpcResponseFacts(opened.genai.api, bool(opened.genai.stream))
            return ResponseWatch(sse=False, genai=grpc, limits=self._limits)
        facts = (
            genai.ResponseFacts(content_cap=self._content_cap, limits=self._limits, api=opened.genai.api)
            if opened.genai is not None
            else None
        )
        return ResponseWatch(sse=sse, genai=facts, limits=self._limits)

    def _sampled_open(self, conn: Conn, stream: Stream) -> _Open:
        """An HTTP/2 stream's request, sampled (sampling.py): a server stream is kept with
        probability 2^-shift, as the kernel decided it when it walks the connection (its threads
        then serve that decision: their HTTP/1 and CUDA calls share the stream's fate), else drawn
        here. The kernel decided it in the record that carried its HEADERS' frame header, at that
        record's shift (``stream.mark``: a block may end in a later record, at another shift). A
        client stream takes the fate of the server stream its thread serves (the last kept one it
        read while that is open, else the last one it read, if open: as the kernel passes it on
        to the thread's HTTP/1 calls), or of an HTTP/1 request the kernel shed (its flag says so),
        else draws as a server stream does. A shed stream feeds the metrics only: no span
        context, no thread interval, no peer link."""
        enter, exit_, tid = stream.first
        server = conn.role == "server"
        start = exit_ if server else enter
        serving = None if server else self._served(conn.pid, tid, start)
        if serving is not None:
            kept, shift, decision = serving.kept, serving.shift, STREAM_KEPT if serving.kept else STREAM_PARENT
        elif not server and conn.serving_shed:
            kept, shift, decision = False, 0, STREAM_PARENT
        elif server and stream.mark & SOCKF_H2_DECIDED:
            # decided in the kernel, whose threads serve it (sockets.c, h2_frames.h): alike here
            shift = (stream.mark >> SHIFT_BIT) & SHIFT_MASK
            kept = h2_keep(stream.mark >> 32, stream.id, shift)  # the record's connection sequence
            decision = STREAM_KEPT if kept else STREAM_PROBABILITY
        else:
            assert self._sampler is not None  # _sample_streams
            shift = self._sampler.shift
            kept = not shift or not _getrandbits(shift)
            decision = STREAM_KEPT if kept else STREAM_PROBABILITY
        if kept:
            opened = self._open(conn, stream.first, stream.header("traceparent"), stream.id, shift)
            if decision == STREAM_KEPT and server and stream.mark & SOCKF_H2_DECIDED and opened.serving is not None:
                self._serving_kept[(conn.pid, tid)] = opened.serving  # as the kernel's thread keeps it
        else:
            opened = _Open(_SHED, None, start, tid, shed=True)
            if server:
                opened.serving = self._serving[(conn.pid, tid)] = _Serving(start, False, shift)
        opened.decision = decision
        return opened

    def _served(self, pid: int, tid: int, at: int) -> _Serving | None:
        """The server stream thread ``tid`` serves at ``at``: the last kept one it read, while open
        (a shed one read beside it does not shed its calls), else the last one it read, if open."""
        for serving in (self._serving_kept.get((pid, tid)), self._serving.get((pid, tid))):
            if serving is not None and serving.start_ns <= at and (serving.end_ns is None or at <= serving.end_ns):
                return serving
        return None

    def _open(
        self, conn: Conn, first: Stamp, traceparent: str | None, stream_id: int, shift: int | None = None
    ) -> _Open:
        """``shift``: the request's sampling (kept with probability 2^-shift), if not the kernel's."""
        enter, exit_, tid = first
        if shift is None:
            shift = conn.shift
        if conn.role == "server":
            start = exit_
            parent, source = parse_traceparent(traceparent) if traceparent else None, "traceparent"
            if parent is None and conn.local and conn.remote:
                parent, source = self._links.find(conn.remote, conn.local[1], stream_id, start), "peer"
            ctx = new_context(parent.trace_id if parent else None)
            if shift:
                ctx = sampled_context(ctx, shift, parent is None)
            interval = self._causality.open(conn.pid, tid, start, ctx)
            opened = _Open(ctx, parent, start, tid, interval=interval, parent_from=source if parent else "")
            opened.shift = shift
            if self._sample_streams:
                opened.serving = self._serving[(conn.pid, tid)] = _Serving(start, True, shift)
            return opened
        start = enter
        parent = self._causality.parent(conn.pid, tid, start)
        ctx = new_context(parent.trace_id if parent else None)
        if shift:
            ctx = sampled_context(ctx, shift, parent is None)
        link = (
            self._links.add(conn.local, conn.remote[1], stream_id, start, ctx) if conn.local and conn.remote else None
        )
        return _Open(ctx, parent, start, tid, link=link, parent_from="thread" if parent else "", shift=shift)

    # -- exchanges done -----------------------------------------------------------

    def _finished(self, conn: Conn, result: Exchange | Stream) -> None:
        if isinstance(result, Exchange):
            self._finished_http1(conn, result)
        else:
            self._finished_http2(conn, result)

    def _finished_http1(self, conn: Conn, ex: Exchange) -> None:
        req, resp = ex.request, ex.response
        if req is None or req.tag is None:
            return
        head = req.head
        path, authority = split_target(head.target)
        attrs: dict[str, object] = {
            "http.request.method": head.method,
            "url.path": self._clip(path),
            "network.protocol.name": "http",
            "network.protocol.version": head.version,
            "http.request.body.size": req.body_size,
            "http.request.size": req.size,
        }
        self._host_attrs(conn, attrs, authority or head.first.get("host"))
        ua = head.first.get("user-agent")
        if ua:
            attrs["user_agent.original"] = self._clip(ua)
        if self._capture:
            self._header_attrs(attrs, "request", head.headers)
        if head.truncated:
            attrs["otelbpf.http.headers_truncated"] = True
        status = 0
        if resp is not None:
            status = resp.head.status
            attrs["http.response.status_code"] = status
            attrs["http.response.body.size"] = resp.body_size
            attrs["http.response.size"] = resp.size
            if self._capture:
                self._header_attrs(attrs, "response", resp.head.headers)
        end = ex.at or (resp.last if resp else None) or req.last or req.first
        self._emit_exchange(
            conn,
            req.tag,
            end,
            head.method,
            status,
            None,
            ex.error,
            None,
            attrs,
            resp.first if resp is not None else None,
        )

    def _finished_http2(self, conn: Conn, s: Stream) -> None:
        if s.tag is None:
            return
        if s.tag.decision >= 0:
            self._stream_decisions[s.tag.decision] += 1
        # a shed stream builds no span: only what its metrics read (a GenAI one's read the ends too)
        lean = s.tag.shed and s.tag.genai is None
        attrs: dict[str, object] = {"network.protocol.version": "2"}
        if not lean:
            attrs["network.protocol.name"] = "http"
            attrs["http.request.body.size"] = s.request_bytes
            attrs["http.response.body.size"] = s.response_bytes
            attrs["otelbpf.http2.stream_id"] = s.id
        request = _first_values(s.request_headers)  # several lookups each: one scan, not one per name
        response = _first_values(s.response_headers)
        method = self._clip(request.get(":method") or "")
        target = request.get(":path") or ""
        if target and not valid_target(method, target):
            self._problem("bad_path")
            target = ""
        path, authority = split_target(target)
        if method:
            attrs["http.request.method"] = method
        if path:
            attrs["url.path"] = self._clip(path)
        if not lean:
            self._host_attrs(conn, attrs, authority or request.get(":authority"))
            ua = request.get("user-agent")
            if ua:
                attrs["user_agent.original"] = self._clip(ua)
            if self._capture:
                self._header_attrs(attrs, "request", s.request_headers)
                self._header_attrs(attrs, "response", s.response_headers)
        status = 0
        if response.get(":status"):
            if _STATUS.fullmatch(response[":status"]):
                status = int(response[":status"])
                attrs["http.response.status_code"] = status
            else:
                self._problem("bad_status")
        if s.headers_lost:
            attrs["otelbpf.http2.headers_lost"] = True
        if s.reset_code is not None:
            attrs["otelbpf.http2.rst_stream_code"] = s.reset_code
        grpc = None
        if target and (request.get("content-type") or "").startswith("application/grpc"):
            route = _GRPC_PATH.fullmatch(path)
            if route is None:
                self._problem("bad_grpc_path")
            else:
                grpc = self._grpc_status(s)
                attrs.update(
                    {
                        "rpc.system": "grpc",
                        "rpc.service": self._clip(route.group(1)),
                        "rpc.method": self._clip(route.group(2)),
                        "http.route": attrs["url.path"],
                    }
                )
                if grpc is not None:
                    attrs["rpc.grpc.status_code"] = grpc
        problem = "" if s.complete else s.problem
        message = s.grpc_message
        self._emit_exchange(
            conn,
            s.tag,
            s.last or s.first,
            method,
            status,
            grpc,
            problem,
            self._clip(message) if message else message,
            attrs,
            s.response_first,
        )

    def _grpc_status(self, s: Stream) -> int | None:
        """grpc-status if it is one of gRPC's codes (0-16); None, counted, if it is something else."""
        for where in ("trailers", "response"):
            value = s.header("grpc-status", where)
            if value is not None:
                if _GRPC_STATUS.fullmatch(value) and int(value) <= 16:
                    return int(value)
                self._problem("bad_grpc_status")
                return None
        return None

    def _problem(self, reason: str) -> None:
        self._count("otelbpf.http.problems", 1, reason=reason)

    def _clip(self, value: str) -> str:
        """A string attribute of at most ``limits.attribute_chars`` characters (clipping counted)."""
        if len(value) <= self._limits.attribute_chars:
            return value
        self._problem("value_truncated")
        return value[: self._limits.attribute_chars]

    def _host_attrs(self, conn: Conn, attrs: SpanAttrs, host: str | None) -> None:
        """server.*, client.* and network.peer.* from the connection and the Host (:authority) header:
        the same for every request of a connection but for a change of Host, so derived once."""
        source = (host, conn.role, conn.local, conn.remote)
        cached = conn.ends_attrs
        if cached is None or cached[0] != source:
            cached = conn.ends_attrs = (source, self._ends_attrs(conn, host))
        attrs.update(cached[1])

    def _ends_attrs(self, conn: Conn, host: str | None) -> dict[str, object]:
        attrs: dict[str, object] = {}
        name = self._clip(strip_userinfo(host or ""))
        if name.startswith("["):
            name = name[1 : name.find("]")] if "]" in name else ""
        elif name.rpartition(":")[2].isdigit():
            name = name.rpartition(":")[0]
        if name:
            attrs["server.address"] = name
        if conn.role == "server":
            if conn.local:
                attrs["server.port"] = conn.local[1]
            if conn.remote:
                attrs["client.address"], attrs["client.port"] = conn.remote
        elif conn.remote:
            attrs.setdefault("server.address", conn.remote[0])
            attrs["server.port"] = conn.remote[1]
        if conn.remote:
            attrs["network.peer.address"], attrs["network.peer.port"] = conn.remote
        if conn.tls:
            attrs["url.scheme"] = "https"
        return attrs

    def _header_attrs(self, attrs: SpanAttrs, where: str, headers: list[tuple[str, str]]) -> None:
        for name in self._capture:
            values = [self._clip(v) for k, v in headers if k == name]
            if values:
                attrs[f"http.{where}.header.{name}"] = values

    def _emit_exchange(
        self,
        conn: Conn,
        opened: _Open,
        end: Stamp,
        method: str,
        status: int,
        grpc: int | None,
        problem: str,
        grpc_message: str | None,
        attrs: SpanAttrs,
        first_byte: Stamp | None,
    ) -> None:
        server = conn.role == "server"
        start_ns = opened.start_ns
        end_ns = end[1] if end[1] > start_ns else start_ns
        if opened.serving is not None:
            opened.serving.end_ns = end_ns  # its thread is done with it
        if opened.interval is not None:
            self._causality.close(conn.pid, opened.tid, opened.interval, end_ns)
            if opened.interval.concurrent:
                attrs["otelbpf.thread.concurrent_requests"] = True
        if opened.link is not None:
            self._links.end(opened.link, end_ns)
        attrs["thread.id"] = opened.tid
        attrs["process.pid"] = conn.pid
        if opened.parent_from:
            attrs["otelbpf.parent.source"] = opened.parent_from
        if opened.shift:
            attrs["otelbpf.http.sampling.adjusted_count"] = 1 << opened.shift
        message = ""
        if problem in PARSE_PROBLEMS:
            attrs["otelbpf.http.incomplete"] = problem  # what we could not follow, not a failure of the exchange
        elif problem:
            attrs["error.type"] = message = problem
        if grpc is not None and (grpc in GRPC_SERVER_ERRORS if server else grpc != 0):
            attrs.setdefault("error.type", str(grpc))
            message = message or grpc_message or f"gRPC status {grpc}"
        elif grpc is None and status >= (500 if server else 400):
            attrs.setdefault("error.type", str(status))
            message = message or f"HTTP {status}"
        self._record_metrics(conn, server, method, status, grpc, attrs, (end_ns - start_ns) / 1e9)
        if opened.watch is not None:
            self._streamed(conn, server, opened.watch, attrs, start_ns, first_byte)
        if opened.genai is not None:
            self._genai(conn, server, opened.genai, opened.watch, attrs, start_ns, end_ns)
        if not self._traces or opened.shed:
            return
        if not self._budget.take(1):  # decided before the span is built: building is most of its cost
            self._sampled_out += 1
            return
        name = f"{attrs['rpc.service']}/{attrs['rpc.method']}" if "rpc.service" in attrs else (method or "HTTP")
        wall_start = self._clock.to_wall(start_ns)
        self._spans.append(
            make_span(
                name,
                resource=self._proc(conn.pid).resource,
                scope=SCOPE,
                start_ns=wall_start,
                end_ns=wall_start + (end_ns - start_ns),
                attributes=attrs,
                error=message or None,
                parent=opened.parent,
                kind=_SERVER if server else _CLIENT,
                context=opened.context,
            )
        )

    def _record_metrics(
        self, conn: Conn, server: bool, method: str, status: int, grpc: int | None, attrs: SpanAttrs, seconds: float
    ) -> None:
        # The labels as (name, value) pairs in the order they are named here: the series' cache key.
        key: Labels
        if grpc is not None or attrs.get("rpc.system") == "grpc":
            service, rpc_method = self._route(conn.pid, attrs["rpc.service"], attrs["rpc.method"])
            key = ("rpc.system", "grpc"), ("rpc.service", service), ("rpc.method", rpc_method)
            if grpc is not None:
                key += (("rpc.grpc.status_code", grpc),)
            metric = "rpc.server.duration" if server else "rpc.client.duration"
        else:
            key = (
                ("http.request.method", method if method in KNOWN_METHODS else OTHER),
                ("network.protocol.version", attrs["network.protocol.version"]),
            )
            if status:
                key += (("http.response.status_code", status), ("http.response.status_class", status_class(status)))
            else:
                key += (("http.response.status_class", "none"),)
            metric = "http.server.request.duration" if server else "http.client.request.duration"
        if "error.type" in attrs:
            key += (("error.type", attrs["error.type"]),)
        series = self._series.get(key)
        if series is None:  # one sort per distinct label set, not per request
            series = self._series[key] = tuple(sorted(key))
            if len(self._series) > 100_000:
                self._series.clear()
        self._durations[(conn.pid, metric, series)].append(seconds)

    def _streamed(
        self, conn: Conn, server: bool, w: ResponseWatch, attrs: SpanAttrs, start_ns: int, first_byte: Stamp | None
    ) -> None:
        """Span attributes and gap histograms of a watched response."""
        w.done()
        for reason, n in w.problems.items():
            self._count("otelbpf.http.problems", n, reason=reason)
        units, events = w.units, w.events
        if units.n < 2 and w.sse is None:
            return  # one chunk (or none) is no stream
        if first_byte is not None:
            attrs["otelbpf.http.response.time_to_first_byte"] = max(first_byte[1] - start_ns, 0) / 1e9
        version = attrs["network.protocol.version"]
        metric = "otelbpf.http.server.response.gap" if server else "otelbpf.http.client.response.gap"
        if units.n:
            attrs["otelbpf.http.response.chunks"] = units.n
            attrs["otelbpf.http.response.time_to_first_chunk"] = max(units.first_ns - start_ns, 0) / 1e9
            if units.gaps is not None:
                attrs["otelbpf.http.response.chunk_gap.max"] = units.gaps.max
                self._add_gaps(conn.pid, metric, version, "data_frame" if version == "2" else "chunk", units.gaps)
        if w.sse is not None:
            attrs["otelbpf.http.response.events"] = events.n
            if events.n:
                attrs["otelbpf.http.response.time_to_first_event"] = max(events.first_ns - start_ns, 0) / 1e9
            if events.gaps is not None:
                attrs["otelbpf.http.response.event_gap.max"] = events.gaps.max
                self._add_gaps(conn.pid, metric, version, "event", events.gaps)

    def _add_gaps(self, pid: int, metric: str, version: str, unit: str, gaps: Gaps) -> None:
        key = (metric, (("network.protocol.version", version), ("otelbpf.stream.unit", unit)))
        total = self._proc(pid).gaps.get(key)
        if total is None:
            total = self._proc(pid).gaps[key] = Gaps()
        total.merge(gaps)

    def _genai(
        self,
        conn: Conn,
        server: bool,
        request: genai.RequestFacts,
        watch: ResponseWatch | None,
        attrs: SpanAttrs,
        start_ns: int,
        end_ns: int,
    ) -> None:
        """GenAI attributes, and on a server the gen_ai.server.* histograms."""
        response = watch.genai if watch is not None else None
        if request.problem:
            self._problem(f"genai_{request.problem}")
        attrs.update(genai.attributes(request, response, self._clip))
        key: Labels = (
            ("gen_ai.operation.name", request.operation),
            ("gen_ai.provider.name", request.provider),
        )
        if not server:
            self._genai_client(conn.pid, key, response, attrs, start_ns, end_ns)
            return
        for name in ("gen_ai.request.model", "gen_ai.response.model"):
            if name in attrs:
                key += ((name, self._model(conn.pid, attrs[name])),)
        if "server.port" in attrs:
            key += (("server.port", attrs["server.port"]),)
        error = attrs.get("error.type")
        self._durations[
            (conn.pid, "gen_ai.server.request.duration", key + ((("error.type", error),) if error else ()))
        ].append((end_ns - start_ns) / 1e9)
        if error or response is None or response.first_token_ns is None:
            return  # time to first token and per output token: successful streamed responses only
        self._durations[(conn.pid, "gen_ai.server.time_to_first_token", key)].append(
            max(response.first_token_ns - start_ns, 0) / 1e9
        )
        tokens = response.output_tokens if response.output_tokens is not None else response.token_events
        if tokens > 1:
            self._durations[(conn.pid, "gen_ai.server.time_per_output_token", key)].append(
                max(end_ns - response.first_token_ns, 0) / 1e9 / (tokens - 1)
            )

    def _genai_client(
        self, pid: int, key: Labels, response: genai.ResponseFacts | None, attrs: SpanAttrs, start_ns: int, end_ns: int
    ) -> None:
        """The gen_ai.client.* histograms of a request this process made (genai.CLIENT_METRICS)."""
        for name in ("gen_ai.request.model", "gen_ai.response.model"):
            if name in attrs:
                key += ((name, self._model(pid, attrs[name])),)
        for name in ("server.address", "server.port"):
            if name in attrs:
                key += ((name, attrs[name]),)
        error = attrs.get("error.type")
        self._durations[
            (pid, "gen_ai.client.operation.duration", key + ((("error.type", error),) if error else ()))
        ].append((end_ns - start_ns) / 1e9)
        if error or response is None:
            return
        for kind, n in (("input", response.input_tokens), ("output", response.output_tokens)):
            if n is not None:
                self._durations[(pid, "gen_ai.client.token.usage", key + (("gen_ai.token.type", kind),))].append(n)
        if response.first_token_ns is not None:
            self._durations[(pid, "gen_ai.client.operation.time_to_first_chunk", key)].append(
                max(response.first_token_ns - start_ns, 0) / 1e9
            )

    def _model(self, pid: int, model: str) -> str:
        """The model's own label while the process has fewer than ``max_models``, else ``_OTHER``."""
        models = self._proc(pid).models
        if model in models:
            return model
        if len(models) < self._max_models:
            models.add(model)
            return model
        self._count("otelbpf.http.models_folded", 1)
        return OTHER

    def _route(self, pid: int, service: str, method: str) -> tuple[str, str]:
        """The route's own labels while the process has fewer than ``max_routes``, else ``_OTHER``."""
        routes = self._proc(pid).routes
        route = (service, method)
        if route in routes:
            return route
        if len(routes) < self._max_routes:
            routes.add(route)
            return route
        self._count("otelbpf.http.routes_folded", 1)
        return OTHER, OTHER

    def _flush_durations(self) -> None:
        """Histograms take whole arrays: one numpy call per series and batch, not per request.
        The batch's HTTP/2 sampling decisions go to the sampler with them."""
        if self._sampler is not None and any(self._stream_decisions):
            self._sampler.streams_decided(self._stream_decisions)
            self._stream_decisions = [0] * len(STREAM_DECISIONS)
        for (pid, metric, labels), values in self._durations.items():
            durations = self._proc(pid).durations
            hist = durations.get((metric, labels))
            if hist is None:
                hist = durations[(metric, labels)] = m.HistogramState(_BOUNDS.get(metric, m.DURATION_BOUNDS))
            hist.add(np.asarray(values))
        self._durations.clear()

    def _add_shed(self) -> None:
        """Requests the kernel's head sampling shed, counted there: into the same series as spans'."""
        if self._sampler is None:
            return
        self._sampler.tick(count_only=True)
        counted: list[tuple[int, str, Labels, RedDelta | H2Delta]] = [
            (d.pid, *red_series(d, KNOWN_METHODS, OTHER), d) for d in self._sampler.red_deltas(m.DURATION_BOUNDS)
        ]
        counted += [(d.pid, *h2_series(d, KNOWN_METHODS, OTHER), d) for d in self._sampler.h2_deltas(m.DURATION_BOUNDS)]
        for pid, metric, series, d in counted:
            durations = self._proc(pid).durations
            hist = durations.get((metric, series))
            if hist is None:
                hist = durations[(metric, series)] = m.HistogramState(m.DURATION_BOUNDS)
            add_counted(hist, d)

    def _new_process(self, pid: int, resource: Resource, start_ns: int) -> _Proc:
        return _Proc(resource, start_ns)

    def _flush_spans(self) -> None:
        with self._lock:
            spans, self._spans = self._spans, []
            sampled_out, self._sampled_out = self._sampled_out, 0
        if sampled_out:
            self._count("otelbpf.spans.sampled_out", sampled_out)
            if self._sampler is not None:
                self._sampler.over_budget(sampled_out)
        self._send(spans)

    # -- metrics ----------------------------------------------------------------

    def collect(self) -> list[tuple[Resource, list[Metric]]]:
        if self._tls.waiting:  # plaintext that waited for a socket record that never came (tls.py)
            with self._lock:
                self._tls.batch += 1
                self._tls_rows(self._tls.release())
                self._end_tls(self._tls.sweep())
                self._flush_durations()
            self._flush_spans()
        now = self._clock.now_wall()
        out = []
        with self._lock:
            self._add_shed()
            for pid, p in list(self._procs.items()):
                if p.exited:
                    del self._procs[pid]  # this export carries its final counts
                by_metric: dict[str, list[HistogramDataPoint]] = defaultdict(list)
                for (metric, labels), hist in sorted(p.durations.items(), key=lambda kv: kv[0]):
                    by_metric[metric].append(hist.point(dict(labels), p.start_ns, now))
                for (metric, labels), gaps in sorted(p.gaps.items(), key=lambda kv: kv[0]):
                    by_metric[metric].append(gaps.point(dict(labels), p.start_ns, now))
                built = [
                    m.histogram(name, _UNITS.get(name, "s"), _DESCRIPTIONS[name], points)
                    for name, points in sorted(by_metric.items())
                ]
                metrics = [x for x in built if x is not None]
                if metrics:
                    out.append((p.resource, metrics))
        return out


_DESCRIPTIONS = {
    "http.server.request.duration": "Duration of HTTP server requests, request read to response written",
    "http.client.request.duration": "Duration of HTTP client requests, request written to response read",
    "rpc.server.duration": "Duration of gRPC calls served, request read to the end of the response stream",
    "rpc.client.duration": "Duration of gRPC calls made, request written to the end of the response stream",
    "otelbpf.http.server.response.gap": "Time between consecutive chunks, DATA frames or SSE events of responses sent",
    "otelbpf.http.client.response.gap": "Time between consecutive chunks, DATA frames or SSE events of responses read",
    "gen_ai.server.request.duration": "OpenAI-compatible completions served, request read to the last response byte",
    "gen_ai.server.time_to_first_token": (
        "Request read to the first SSE event with output, for successful streamed responses"
    ),
    "gen_ai.server.time_per_output_token": (
        "After the first output event, time per further output token, for successful streamed responses"
    ),
}
#: The GenAI semantic conventions' bucket boundaries; other histograms use metrics.DURATION_BOUNDS.
_BOUNDS = {
    "gen_ai.server.request.duration": (
        0.01,
        0.02,
        0.04,
        0.08,
        0.16,
        0.32,
        0.64,
        1.28,
        2.56,
        5.12,
        10.24,
        20.48,
        40.96,
        81.92,
    ),
    "gen_ai.server.time_to_first_token": (
        0.001,
        0.005,
        0.01,
        0.02,
        0.04,
        0.06,
        0.08,
        0.1,
        0.25,
        0.5,
        0.75,
        1.0,
        2.5,
        5.0,
        7.5,
        10.0,
    ),
    "gen_ai.server.time_per_output_token": (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5),
}

_DESCRIPTIONS.update({name: description for name, (_unit, description, _b) in genai.CLIENT_METRICS.items()})
_BOUNDS.update({name: bounds for name, (_unit, _d, bounds) in genai.CLIENT_METRICS.items()})
_UNITS = {name: unit for name, (unit, _d, _b) in genai.CLIENT_METRICS.items()}


def _errno_name(code: int) -> str:
    if code == errno.ECONNRESET:
        return "connection_reset"
    if code == errno.EPIPE:
        return "broken_pipe"
    return errno.errorcode.get(code, f"errno_{code}").lower()
