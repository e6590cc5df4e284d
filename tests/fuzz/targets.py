"""Fuzz targets: one function per parser or encoder, taking any bytes.

Each raises (AssertionError for a broken invariant, anything else for a crash) only on a bug; it
returns on every input a hostile peer (or, for ``config``, a config file) could send. Run briefly
by tests/fuzz/test_fuzz.py (hypothesis) and tests/fuzz/test_atheris.py (atheris, ~2 s each), at
length by bench/fuzz.py (atheris, coverage-guided), and on every kept crash or hang by
tests/fuzz/test_corpus.py. The time bound per input is the runner's (hypothesis
``deadline``, libFuzzer ``-timeout``): a parse position that moves backwards shows as a hang.

Invariants checked besides "no exception": positions and sizes never negative, and what a
connection holds stays under its caps (protocols/limits.py).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import struct
import tempfile
from collections.abc import Callable, Iterator

from hpack import Encoder
from hpack.exceptions import HPACKError
from opentelemetry.sdk.resources import Resource

from harness.hostile import Wire, grpc_call, h2_connection
from otelbpf.config import ConfigError
from otelbpf.correlate.spans import make_span, scope
from otelbpf.export.otlp_json import INT64_MAX, INT64_MIN, encode_spans_json
from otelbpf.export.otlp_proto import encode_spans_proto
from otelbpf.families.http import genai
from otelbpf.families.http.protocols import http1, http2, sse
from otelbpf.families.http.protocols.limits import DEFAULT
from otelbpf.families.http.streaming import ResponseWatch
from otelbpf.families.registry import load_config

Chunk = tuple[bool, bytes, int]


def chunks(data: bytes) -> Iterator[Chunk]:
    """Syscalls out of fuzz bytes: a header byte (bit 0: client to server; bit 7: a gap of bits 1-6
    times 7 bytes follows the chunk), a length byte, then that many payload bytes."""
    i = 0
    while i < len(data):
        h = data[i]
        n = data[i + 1] if i + 1 < len(data) else 0
        payload = data[i + 2 : i + 2 + n]
        i += 2 + n
        yield bool(h & 1), payload, ((h >> 1) & 0x3F) * 7 if h & 0x80 else 0


def encode_chunks(parts: list[Chunk]) -> bytes:
    """The inverse of ``chunks`` (for seeds): payloads longer than 255 bytes are split."""
    out = bytearray()
    for c2s, payload, gap in parts:
        pieces = [payload[i : i + 255] for i in range(0, len(payload), 255)] or [b""]
        for k, piece in enumerate(pieces):
            g = gap // 7 if k == len(pieces) - 1 and gap else 0
            out += bytes([(1 if c2s else 0) | (0x80 | (min(g, 63) << 1) if g else 0), len(piece)]) + piece
    return bytes(out)


def _check_http1_stream(s: http1.MessageStream) -> None:
    assert s._s.remaining >= 0, s._s
    assert len(s._s.buf) <= http1.MAX_HEAD + 256, len(s._s.buf)
    if s._msg is not None:
        assert s._msg.size >= 0 and s._msg.body_size >= 0, s._msg


class CheckingSink:
    """A body sink that checks what a parser tells it, and passes it on to the SSE/GenAI readers."""

    wants_bytes = True

    def __init__(self) -> None:
        self.watch = ResponseWatch(sse=True, genai=genai.ResponseFacts())

    def unit(self, stamp: object) -> None:
        self.watch.unit((0, stamp if isinstance(stamp, int) else 0, 0))

    def data(self, data: bytes, stamp: object) -> None:
        assert isinstance(data, bytes) and data, data
        self.watch.data(data, (0, stamp if isinstance(stamp, int) else 0, 0))

    def gap(self, n: int) -> None:
        assert n > 0, n
        self.watch.gap(n)


def _sink_request(msg: http1.Message) -> None:
    msg.sink = CheckingSink()


def _sink_response(request: http1.Message | None, response: http1.Message) -> None:
    response.sink = CheckingSink()


def http1_target(data: bytes) -> None:
    conn = http1.Http1Connection(on_request=_sink_request, on_response=_sink_response)
    done = []
    for i, (c2s, payload, gap) in enumerate(chunks(data)):
        done += conn.feed(c2s, payload, gap, i)
        _check_http1_stream(conn.requests)
        _check_http1_stream(conn.responses)
        assert len(conn._pending) <= 2 * DEFAULT.pending_requests + 1
    done += conn.close(-1)
    for ex in done:
        for msg in (ex.request, ex.response):
            if msg is not None:
                assert msg.size >= 0 and msg.body_size >= 0, msg
                assert 100 <= msg.head.status <= 999 or msg.head.status == 0


def http2_target(data: bytes) -> None:
    """Frames after a valid preface and SETTINGS (else nearly every input stops at the preface)."""

    def sinks(stream: http2.Stream) -> None:
        stream.request_sink = CheckingSink()

    def response_sink(stream: http2.Stream) -> None:
        stream.response_sink = CheckingSink()

    conn = http2.H2Connection(on_request=sinks, on_response=response_sink)
    conn.feed(True, http2.PREFACE + b"\0\0\0\x04\0\0\0\0\0", 0, 0)
    conn.feed(False, b"\0\0\0\x04\0\0\0\0\0", 0, 0)
    for i, (c2s, payload, gap) in enumerate(chunks(data)):
        conn.feed(c2s, payload, gap, i)
        assert len(conn._streams) <= DEFAULT.open_streams
        for d in conn._dirs.values():
            assert d.reader._left >= 0
            assert d.decoder.header_table.maxsize <= DEFAULT.hpack_table
            assert sum(f.length for f in d.block) <= DEFAULT.header_block
    conn.close(-1)


def hpack_target(data: bytes) -> None:
    """Header blocks (split at the first byte's value) through one direction's decoder, as a header
    block reaches it, SETTINGS_HEADER_TABLE_SIZE raised to 4 GiB first (as a peer may)."""
    d = http2._Direction(True)
    d.allow_table_size(1 << 32)
    cut = data[0] if data else 0
    for block in (data[1 : 1 + cut], data[1 + cut :]):
        try:
            first = d.decode(block)
        except (HPACKError, UnicodeDecodeError, ValueError, IndexError):
            return  # what _header_block catches: the direction's table is then lost
        assert d.decoder.header_table.maxsize <= DEFAULT.hpack_table
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in first)


def sse_target(data: bytes) -> None:
    """A response body's pieces and gaps through the SSE framing, small bounds so fuzzing reaches them."""
    stream = sse.EventStream(max_line=64, max_data=128)
    for i, (_, payload, gap) in enumerate(chunks(data)):
        for event in stream.feed(payload, i):
            assert len(event.data) <= 128 and event.stamp == i, event
        if gap:
            stream.gap(gap)
        assert len(stream._line) <= 64 and len(stream._data) <= 128


def genai_target(data: bytes) -> None:
    """Client-to-server pieces as a completion request's JSON body, the others alternately as SSE event
    data and as a JSON response body, gaps included; the span attributes made must be exportable."""
    request = genai.RequestFacts("chat", content_cap=32)
    response = genai.ResponseFacts(content_cap=32)
    for i, (c2s, payload, gap) in enumerate(chunks(data)):
        if c2s:
            request.data(payload, i)
            if gap:
                request.gap(gap)
        elif i % 2:
            response.event(payload, i)
        else:
            response.data(payload)
            if gap:
                response.gap()
    response.body_done()
    for tokens in (response.input_tokens, response.output_tokens):
        assert tokens is None or (type(tokens) is int and 0 <= tokens < genai.MAX_TOKENS)
    attrs = genai.attributes(request, response, lambda v: v[: DEFAULT.attribute_chars])
    span = make_span("fuzz", resource=_RESOURCE, scope=_SCOPE, start_ns=1, end_ns=2, attributes=attrs)
    encode_spans_proto([span]).SerializeToString()
    json.loads(encode_spans_json([span]))


_WIRE: list[Wire] = []


def _wire() -> Wire:
    """One correlator for every input (building one reads /proc); emptied of what the last made."""
    if not _WIRE:
        _WIRE.append(Wire())
    w = _WIRE[0]
    w.spans.clear()
    w.counts.clear()
    return w


def grpc_target(data: bytes) -> None:
    """A gRPC call whose header values are the fuzz bytes (NUL-separated: :path, :status,
    grpc-status, :authority, a metadata value), then the rest as raw frames, through the real
    correlator; every span it makes must encode."""
    fields = data.split(b"\0", 5)
    values = [f.decode("latin-1") for f in fields[:5]] + [""] * (5 - min(5, len(fields)))
    tail = fields[5] if len(fields) > 5 else b""
    ec, es = Encoder(), Encoder()
    c, s = grpc_call(
        ec,
        es,
        1,
        path=values[0] or "/",
        status=values[1] or "200",
        grpc_status=values[2] or "0",
        extra=[(":authority", values[3]), ("x-meta", values[4])],
    )
    c2s, s2c = h2_connection([(c, s)])
    w = _wire()
    w.accept(10)
    w.client_sent(10, c2s + tail)
    w.server_sent(10, s2c + tail)
    w.close(10)
    w.flush()
    assert "processing_error" not in w.problems(), w.problems()
    if w.spans:
        encode_spans_proto(w.spans).SerializeToString()
        json.loads(encode_spans_json(w.spans))


_RESOURCE = Resource({"service.name": "fuzz"})
_SCOPE = scope("fuzz")


def _values(data: bytes) -> Iterator[object]:
    """Attribute values out of fuzz bytes: a tag byte, then a length byte and that many bytes."""
    i = 0
    while i + 1 < len(data):
        tag, n = data[i], data[i + 1]
        raw = data[i + 2 : i + 2 + n]
        i += 2 + n
        kind = tag % 6
        if kind == 0:
            yield int.from_bytes(raw, "big", signed=True)
        elif kind == 1:
            yield struct.unpack(">d", raw[:8].ljust(8, b"\0"))[0]
        elif kind == 2:
            yield raw.decode("utf-8", "replace")
        elif kind == 3:
            yield bool(raw[:1] and raw[0] & 1)
        elif kind == 4:
            yield [int.from_bytes(raw[k : k + 9], "big", signed=True) for k in range(0, len(raw), 9)]
        else:
            yield [raw.decode("latin-1")] * (n % 4)


def otlp_target(data: bytes) -> None:
    attrs = {f"a{i}": v for i, v in enumerate(_values(data))}
    span = make_span("fuzz", resource=_RESOURCE, scope=_SCOPE, start_ns=1, end_ns=2, attributes=attrs)
    doc = json.loads(encode_spans_json([span]))
    message = encode_spans_proto([span])
    message.SerializeToString()
    for kv in doc.get("resourceSpans", [{}])[0]["scopeSpans"][0]["spans"][0].get("attributes", []):
        if "intValue" in kv["value"]:
            assert INT64_MIN <= int(kv["value"]["intValue"]) <= INT64_MAX


#: What ``${env:...}`` references in fuzzed configs find.
_CONFIG_ENV = {"PORT": "4317", "HOST": "collector", "EMPTY": "", "OTEL_SERVICE_NAME": "fuzz"}


@functools.cache
def _config_file() -> str:
    """One scratch file per process: the config is read from a path, as ``run -c`` reads it."""
    fd, path = tempfile.mkstemp(prefix="otelbpf-fuzz-", suffix=".yaml")
    os.close(fd)
    atexit.register(os.unlink, path)
    return path


def config_target(data: bytes) -> None:
    """Any bytes as a config file: loaded, or refused with ConfigError (exit 2 in the CLI),
    never any other exception (a traceback)."""
    path = _config_file()
    with open(path, "wb") as f:
        f.write(data)
    try:
        load_config(path, env=_CONFIG_ENV)
    except ConfigError as exc:
        assert exc.errors, exc


TARGETS: dict[str, Callable[[bytes], None]] = {
    "http1": http1_target,
    "http2": http2_target,
    "hpack": hpack_target,
    "grpc": grpc_target,
    "otlp": otlp_target,
    "sse": sse_target,
    "genai": genai_target,
    "config": config_target,
}


CONFIG_SEED = b"""\
receivers:
  cuda:
  http: {ports: [8080], capture_headers: [x-id]}
processors:
  batch: {timeout: 100ms}
exporters:
  file:
service:
  pipelines:
    traces: {receivers: [cuda, http], processors: [batch], exporters: [file]}
    metrics: {receivers: [cuda], exporters: [file]}
  telemetry: {metrics_interval: 10s}
"""


def seeds() -> dict[str, list[bytes]]:
    """Valid inputs per target, for mutation to start from (and for the short runs' examples)."""
    get = b"GET /a?q=1 HTTP/1.1\r\nHost: x\r\n\r\n"
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    chunked_req = b"POST /up HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n0\r\nX-T: y\r\n\r\n"
    chunked_resp = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\na\r\n0123456789\r\n0\r\n\r\n"
    ec, es = Encoder(), Encoder()
    c1, s1 = grpc_call(ec, es, 1)
    c3, s3 = grpc_call(ec, es, 3, path="/pkg.Svc/Other", grpc_status="5")
    b1 = Encoder().encode([(":method", "GET"), (":path", "/"), ("cookie", "a=b")])
    events = (
        b': hi\n\ndata: {"model": "m", "choices": []}\r\n\r\nevent: x\ndata: a\ndata: b\n\n'
        b'data: {"usage": {"prompt_tokens": 1, "completion_tokens": 2}}\n\ndata: [DONE]\n\n'
    )
    body = json.dumps({"messages": [{"role": "user", "content": 'q"\\'}], "model": "m", "stream": True}).encode()
    usage = json.dumps(
        {
            "id": "c",
            "model": "m",
            "choices": [{"delta": {"content": "x"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 4},
        }
    ).encode()
    sse_body = (
        b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body) + body,
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events.split(b"\n\n") if e)
        + b"0\r\n\r\n",
    )
    return {
        "http1": [
            encode_chunks([(True, get, 0), (False, ok, 0)]),
            encode_chunks([(True, chunked_req, 0), (False, chunked_resp, 0)]),
            encode_chunks(
                [
                    (True, get + get + b"HEAD / HTTP/1.1\r\n\r\n", 0),
                    (False, ok + ok, 0),
                    (False, b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n", 0),
                ]
            ),
            encode_chunks(
                [
                    (True, b"POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\nab", 3),
                    (False, b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n", 0),
                ]
            ),
            encode_chunks([(True, sse_body[0], 0), (False, sse_body[1], 0)]),
        ],
        "http2": [encode_chunks([(True, c1, 0), (False, s1, 0), (True, c3, 0), (False, s3, 0)])],
        "hpack": [bytes([len(b1)]) + b1 + Encoder().encode([(":status", "200"), ("grpc-status", "0")])],
        "grpc": [b"/demo.Echo/Unary\x00200\x000\x00svc:50051\x00meta", b"/a/b\x00404\x0013\x00u:p@h\x00v\x00\0\0\0"],
        "sse": [
            encode_chunks([(False, events[:30], 0), (False, events[30:], 0)]),
            encode_chunks([(False, events[:20], 9), (False, events[20:], 0)]),
        ],
        "genai": [
            encode_chunks([(True, body, 0), (False, usage, 0), (False, usage, 0)]),
            encode_chunks([(True, body[:20], 7), (False, b"x", 0), (False, usage[:30], 0), (False, usage[30:], 0)]),
        ],
        "config": [
            CONFIG_SEED,
            CONFIG_SEED.replace(
                b"  cuda:\n", b"  cuda: &c {ring_buffer_size: 1MiB, search_paths: ['/usr/lib/*']}\n  nccl: *c\n"
            ),
            CONFIG_SEED.replace(
                b"  file:\n",
                b"  file: {file_mode: '0600'}\n  otlp: {endpoint: '${env:HOST}:${PORT:-1}', "
                b"headers: {a: '$$x ${EMPTY:-y}'}, tls: {insecure: true}}\n",
            ).replace(b"exporters: [file]}\n  telemetry", b"exporters: [file, otlp]}\n  telemetry"),
        ],
        "otlp": [
            bytes([0, 9])
            + (1 << 70).to_bytes(9, "big")
            + bytes([2, 3])
            + b"abc"
            + bytes([1, 8])
            + bytes(8)
            + bytes([4, 18])
            + bytes(18)
            + bytes([5, 2])
            + b"zz"
        ],
    }
