"""Real TLS and GenAI-provider services for end-to-end tests, run as their own processes.

``python -m harness.tls_apps sse-tls PORT CERT KEY``
    harness/streaming_apps.py's OpenAI-compatible completions server (HTTP/1.1, SSE in chunked
    encoding, planted ``FIRST_S`` and ``GAP_S``) served over HTTPS by Python's ``ssl`` (the
    system's OpenSSL).
``python -m harness.tls_apps providers PORT [CERT KEY]``
    One server answering in the wire formats of three providers, plain or over HTTPS:
    OpenAI's ``POST /v1/chat/completions`` (JSON, or SSE with a final usage event),
    Anthropic's ``POST /v1/messages`` (JSON, or its SSE events ``message_start`` ...
    ``message_delta`` with usage) and Gemini's ``POST /v1beta/models/{model}:generateContent``
    and ``:streamGenerateContent?alt=sse`` (``usageMetadata``). Streams send their first
    chunk ``FIRST_S`` after the request, then one per token ``GAP_S`` apart.
``python -m harness.tls_apps gateway PORT UPSTREAM CA [CERT KEY]``
    An application calling a hosted model: ``GET /ask`` makes a (non-streamed) Anthropic
    ``POST UPSTREAM/v1/messages`` with urllib over HTTPS (CA: the certificate to trust), on the
    thread serving the request, and answers ``answered``; served over HTTPS with CERT and KEY.
``python -m harness.tls_apps statuses PORT CERT KEY``
    A keep-alive HTTPS server for load: ``GET /missing...`` gets 404 and ``missing``, any other
    GET 200 and ``ok`` (both with Content-Length: the connection stays open).
``python -m harness.tls_apps load PORT CONNS SECONDS CA``
    Load for ``statuses``: CONNS keep-alive HTTPS connections, one request in flight on each,
    for SECONDS, every fourth a ``/missing`` one; prints the responses it read in full, by
    status, as JSON (its own count, to hold the agent's against). Not a server: no ``ready``.
``python -m harness.tls_apps grpc-gen PORT``
    gRPC generation streams (grpcio, plaintext HTTP/2; messages built here byte by byte):
    Triton's ``inference.GRPCInferenceService/ModelStreamInfer`` answering each
    ``ModelInferRequest`` with ``len(TOKENS)`` ``ModelStreamInferResponse`` messages (model
    ``<request's>-served``, id ``req-1``, one output each), the first ``FIRST_S`` after the
    request, then ``GAP_S`` apart, and a final one without outputs (as decoupled models end);
    and a TGI-style ``generate.v2.TextGeneration/GenerateStream`` streaming ``len(TOKENS)``
    messages with the same pacing.
``python -m harness.tls_apps h2-tls PORT CERT KEY``
    HTTP/2 over TLS (ALPN ``h2``; the ``h2`` library over Python's ``ssl``): every request gets
    200 and an OpenAI-style JSON completion (model ``<request's>-served``, 5 output tokens).
``python -m harness.tls_apps async-tls PORT CERT KEY``
    The completions stream again, on asyncio's TLS (``asyncio.start_server(ssl=...)``: OpenSSL
    with memory BIOs, as uvicorn serves vLLM's and SGLang's APIs): each request gets a chunked
    ``text/event-stream`` of ``len(TOKENS)`` token events (``FIRST_S``, then ``GAP_S`` apart)
    and ``[DONE]``.
Each prints ``ready`` once listening.

``make_cert(folder)`` writes a self-signed certificate for 127.0.0.1 and localhost (the
``openssl`` command) and returns (cert, key).
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from harness.streaming_apps import FIRST_S, GAP_S, TOKENS, Completions


def make_cert(folder: Path) -> tuple[Path, Path]:
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-days", "2", "-subj", "/CN=localhost",
            "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


def server_context(cert: str, key: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    # A TLS 1.2 client may renegotiate (the bad-input test does): OpenSSL 3 refuses unless
    # SSL_OP_ALLOW_CLIENT_RENEGOTIATION (1 << 8), which Python does not name.
    ctx.options = (ctx.options & ~ssl.OP_NO_RENEGOTIATION) | (1 << 8)
    return ctx


class Providers(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        path = self.path
        if path.startswith("/v1/messages"):
            self._anthropic(request)
        elif path.startswith("/v1beta/models/"):
            model = path.split("/v1beta/models/", 1)[1].split(":", 1)[0]
            self._gemini(model, "streamGenerateContent" in path, request)
        else:
            self._openai(request)

    # -- helpers --

    def _json(self, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _sse_start(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        time.sleep(FIRST_S)

    def _event(self, data: str, event: str | None = None) -> None:
        text = (f"event: {event}\n" if event else "") + f"data: {data}\n\n"
        raw = text.encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(raw), raw))
        self.wfile.flush()

    def _end(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    # -- providers --

    def _openai(self, request: dict) -> None:
        model, prompt = request.get("model", "") + "-served", request.get("max_tokens", 0)
        if not request.get("stream"):
            self._json(
                {
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "model": model,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(TOKENS)}}],
                    "usage": {"prompt_tokens": prompt, "completion_tokens": len(TOKENS)},
                }
            )
            return
        self._sse_start()
        for i, text in enumerate(TOKENS):
            if i:
                time.sleep(GAP_S)
            chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": model,
                     "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}  # fmt: skip
            self._event(json.dumps(chunk))
        usage = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": model, "choices": [],
                 "usage": {"prompt_tokens": prompt, "completion_tokens": len(TOKENS)}}  # fmt: skip
        self._event(json.dumps(usage))
        self._event("[DONE]")
        self._end()

    def _anthropic(self, request: dict) -> None:
        model, prompt = request.get("model", "") + "-served", request.get("max_tokens", 0)
        if not request.get("stream"):
            self._json(
                {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [{"type": "text", "text": "".join(TOKENS)}],
                    "stop_reason": "end_turn",
                    "usage": {"input_tokens": prompt, "output_tokens": len(TOKENS)},
                }
            )
            return
        self._sse_start()
        start = {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                 "model": model, "content": [], "usage": {"input_tokens": prompt, "output_tokens": 1}}}  # fmt: skip
        self._event(json.dumps(start), "message_start")
        for i, text in enumerate(TOKENS):
            if i:
                time.sleep(GAP_S)
            delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}
            self._event(json.dumps(delta), "content_block_delta")
        end = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": len(TOKENS)}}
        self._event(json.dumps(end), "message_delta")
        self._event(json.dumps({"type": "message_stop"}), "message_stop")
        self._end()

    def _gemini(self, model: str, stream: bool, request: dict) -> None:
        prompt = int(request.get("generationConfig", {}).get("maxOutputTokens", 0))

        def body(texts: list[str], done: bool) -> dict:
            out: dict = {
                "candidates": [{"content": {"role": "model", "parts": [{"text": "".join(texts)}]}}],
                "modelVersion": model + "-served",
            }
            if done:
                out["candidates"][0]["finishReason"] = "STOP"
                out["usageMetadata"] = {
                    "promptTokenCount": prompt,
                    "candidatesTokenCount": len(TOKENS),
                    "totalTokenCount": prompt + len(TOKENS),
                }
            return out

        if not stream:
            self._json(body(TOKENS, True))
            return
        self._sse_start()
        for i, text in enumerate(TOKENS):
            if i:
                time.sleep(GAP_S)
            self._event(json.dumps(body([text], i == len(TOKENS) - 1)))
        self._end()


class Gateway(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    upstream = ""
    context: ssl.SSLContext | None = None

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        body = json.dumps({"model": "claude-gw", "max_tokens": 3, "messages": [{"role": "user", "content": "q"}]})
        request = urllib.request.Request(
            self.upstream + "/v1/messages", data=body.encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, context=self.context, timeout=10) as r:
            r.read()
        self.send_response(200)
        self.send_header("Content-Length", "8")
        self.end_headers()
        self.wfile.write(b"answered")


class Statuses(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # the head and the body are two writes: without TCP_NODELAY the body waits for the
    # client's delayed ACK of the head (40 ms a request)
    disable_nagle_algorithm = True

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        missing = self.path.startswith("/missing")
        body = b"missing" if missing else b"ok"
        self.send_response(404 if missing else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def load(port: int, conns: int, seconds: float, ca: str) -> dict[int, int]:
    """The ``load`` client: responses read in full, by status."""
    ctx = ssl.create_default_context(cafile=ca)
    socks = [
        ctx.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="127.0.0.1")
        for _ in range(conns)
    ]
    done: Counter[int] = Counter()
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for s in socks:
            path = "/missing" if n % 4 == 3 else "/ok"
            n += 1
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        for s in socks:
            buf = b""
            while True:
                head, sep, rest = buf.partition(b"\r\n\r\n")
                if sep:
                    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                    if len(rest) >= length:
                        break
                chunk = s.recv(4096)
                if not chunk:
                    raise SystemExit("server closed")
                buf += chunk
            done[int(buf.split(b" ", 2)[1])] += 1
    for s in socks:
        s.close()
    return dict(done)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def pb(field: int, value: bytes | str) -> bytes:
    """One length-delimited protobuf field (a string or a message)."""
    raw = value.encode() if isinstance(value, str) else value
    return _varint(field << 3 | 2) + _varint(len(raw)) + raw


def model_infer_request(model: str) -> bytes:
    """inference.ModelInferRequest: model_name (1), id (3), one input tensor (5)."""
    return pb(1, model) + pb(3, "req-1") + pb(5, pb(1, "text_input") + pb(2, "BYTES"))


def _model_stream_infer(requests, context):
    for request in requests:
        model = ""
        if request[:1] == b"\x0a":  # field 1, length-delimited
            model = request[2 : 2 + request[1]].decode()
        time.sleep(FIRST_S)
        for i, _text in enumerate(TOKENS):
            if i:
                time.sleep(GAP_S)
            yield pb(2, pb(1, model + "-served") + pb(3, "req-1") + pb(5, pb(1, "text_output") + pb(2, "BYTES")))
        final = pb(4, pb(1, "triton_final_response") + pb(2, b"\x08\x01"))
        yield pb(2, pb(1, model + "-served") + pb(3, "req-1") + final)


def _generate_stream(request, context):
    time.sleep(FIRST_S)
    for i, text in enumerate(TOKENS):
        if i:
            time.sleep(GAP_S)
        yield pb(1, text)


def serve_grpc_generation(port: int):
    from concurrent import futures

    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    triton = grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService",
        {"ModelStreamInfer": grpc.stream_stream_rpc_method_handler(_model_stream_infer)},
    )
    tgi = grpc.method_handlers_generic_handler(
        "generate.v2.TextGeneration", {"GenerateStream": grpc.unary_stream_rpc_method_handler(_generate_stream)}
    )
    server.add_generic_rpc_handlers((triton, tgi))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server


def triton_stream(port: int, model: str) -> int:
    """One ModelStreamInfer call with one request, as a client: the responses received."""
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        return len(list(call(iter([model_infer_request(model)]), timeout=10)))


def tgi_stream(port: int) -> int:
    import grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return len(list(channel.unary_stream("/generate.v2.TextGeneration/GenerateStream")(pb(1, "hi"), timeout=10)))


def _h2_connection(sock) -> None:
    import h2.config
    import h2.connection
    import h2.events

    conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=False))
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    bodies: dict[int, bytes] = {}
    while True:
        data = sock.recv(65536)
        if not data:
            return
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.DataReceived):
                bodies[event.stream_id] = bodies.get(event.stream_id, b"") + event.data
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                request = json.loads(bodies.pop(event.stream_id, b"") or b"{}")
                body = json.dumps(
                    {
                        "id": "h2-1",
                        "model": request.get("model", "") + "-served",
                        "choices": [{"index": 0, "message": {"content": "".join(TOKENS)}, "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": request.get("max_tokens", 0), "completion_tokens": len(TOKENS)},
                    }
                ).encode()
                headers = [(":status", "200"), ("content-type", "application/json"), ("content-length", str(len(body)))]
                conn.send_headers(event.stream_id, headers)
                conn.send_data(event.stream_id, body, end_stream=True)
        sock.sendall(conn.data_to_send())


def serve_h2_tls(port: int, cert: str, key: str) -> None:
    import socket
    import threading

    ctx = server_context(cert, key)
    ctx.set_alpn_protocols(["h2"])
    listener = socket.create_server(("127.0.0.1", port))
    print("ready", flush=True)
    while True:
        raw, _ = listener.accept()

        def run(raw=raw) -> None:
            try:
                with ctx.wrap_socket(raw, server_side=True) as sock:
                    _h2_connection(sock)
            except (OSError, ssl.SSLError):
                pass

        threading.Thread(target=run, daemon=True).start()


async def _async_completions(reader, writer) -> None:
    import asyncio

    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            model = json.loads(await reader.readexactly(length)).get("model", "") + "-served"
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(FIRST_S)
            events = [{"model": model, "choices": [{"index": 0, "delta": {"content": t}}]} for t in TOKENS]
            for i, event in enumerate(events):
                if i:
                    await asyncio.sleep(GAP_S)
                raw = f"data: {json.dumps(event)}\n\n".encode()
                writer.write(b"%x\r\n%s\r\n" % (len(raw), raw))
                await writer.drain()
            raw = b"data: [DONE]\n\n"
            writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(raw), raw))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, StopIteration):
        writer.close()


def serve_async_tls(port: int, cert: str, key: str) -> None:
    import asyncio

    async def main() -> None:
        server = await asyncio.start_server(_async_completions, "127.0.0.1", port, ssl=server_context(cert, key))
        print("ready", flush=True)
        await server.serve_forever()

    asyncio.run(main())


def serve(handler: type[BaseHTTPRequestHandler], port: int, tls: tuple[str, str] | None) -> None:
    httpd = ThreadingHTTPServer(("127.0.0.1", port), handler)
    if tls:
        httpd.socket = server_context(*tls).wrap_socket(httpd.socket, server_side=True)
    print("ready", flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    if os.environ.get("LOAD_LIBRARY"):  # e.g. the CUDA stand-in: a process that uses a GPU library
        ctypes.CDLL(os.environ["LOAD_LIBRARY"])
    kind, port = sys.argv[1], int(sys.argv[2])
    if kind == "load":
        print(json.dumps(load(port, int(sys.argv[3]), float(sys.argv[4]), sys.argv[5])), flush=True)
        sys.exit(0)
    if kind == "grpc-gen":
        grpc_server = serve_grpc_generation(port)
        print("ready", flush=True)
        grpc_server.wait_for_termination()
    if kind == "async-tls":
        serve_async_tls(port, sys.argv[3], sys.argv[4])
    if kind == "h2-tls":
        serve_h2_tls(port, sys.argv[3], sys.argv[4])
    if kind == "gateway":
        Gateway.upstream, Gateway.context = sys.argv[3], ssl.create_default_context(cafile=sys.argv[4])
        serve(Gateway, port, (sys.argv[5], sys.argv[6]) if len(sys.argv) > 6 else None)
    if kind == "statuses":
        serve(Statuses, port, (sys.argv[3], sys.argv[4]))
    certs = (sys.argv[3], sys.argv[4]) if len(sys.argv) > 4 else None
    serve(Completions if kind == "sse-tls" else Providers, port, certs)
