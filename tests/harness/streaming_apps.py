"""Small real streaming services for end-to-end tests, run as their own processes.

``python -m harness.streaming_apps sse PORT``
    An OpenAI-compatible ``POST /v1/chat/completions`` on ThreadingHTTPServer (HTTP/1.1,
    keep-alive). Streamed (``"stream": true``): ``text/event-stream`` in chunked encoding,
    ``FIRST_S`` after the request the first of ``len(TOKENS)`` token events, ``GAP_S`` apart, then
    a usage event (``"choices": []``, prompt tokens = the request's ``max_tokens``) and
    ``data: [DONE]``, each event one chunk in one write. Not streamed: one JSON completion with
    its ``usage``. The response's model is the request's with ``-served`` appended.
``python -m harness.streaming_apps grpc PORT``
    A gRPC server-streaming ``demo.Tokens/Generate`` (grpcio, raw bytes): ``len(TOKENS)``
    messages, the first ``FIRST_S`` after the call, then ``GAP_S`` apart.
Each prints ``ready`` once listening.
"""

from __future__ import annotations

import json
import sys
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc

TOKENS = ["The", " answer", " is", " forty", "-two"]
FIRST_S = 0.15
GAP_S = 0.04
GRPC_SERVICE = "demo.Tokens"


class Completions(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        model = request["model"] + "-served"
        if request.get("stream"):
            self._stream(model, request.get("max_tokens", 0))
            return
        body = json.dumps({"id": "cmpl-json", "object": "chat.completion", "created": 0, "model": model,
                           "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(TOKENS)},
                                        "finish_reason": "stop"}],
                           "usage": {"prompt_tokens": request.get("max_tokens", 0),
                                     "completion_tokens": len(TOKENS)}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _stream(self, model: str, prompt_tokens: int) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        time.sleep(FIRST_S)
        for i, text in enumerate(TOKENS):
            if i:
                time.sleep(GAP_S)
            last = i == len(TOKENS) - 1
            choice = {"index": 0, "delta": {"content": text}, "finish_reason": "stop" if last else None}
            self._event({"id": "cmpl-sse", "object": "chat.completion.chunk", "model": model, "choices": [choice]})
        self._event({"id": "cmpl-sse", "object": "chat.completion.chunk", "model": model, "choices": [],
                     "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(TOKENS)}})
        self._event("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _event(self, data: object) -> None:
        payload = b"data: " + (data.encode() if isinstance(data, str) else json.dumps(data).encode()) + b"\n\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
        self.wfile.flush()


def _generate(request: bytes, context: grpc.ServicerContext):
    time.sleep(FIRST_S)
    for i, text in enumerate(TOKENS):
        if i:
            time.sleep(GAP_S)
        yield text.encode()


def serve_grpc(port: int) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    handler = grpc.method_handlers_generic_handler(
        GRPC_SERVICE, {"Generate": grpc.unary_stream_rpc_method_handler(_generate)})
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server


def generate(port: int) -> list[bytes]:
    """One streaming call, as a client in this process."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return list(channel.unary_stream(f"/{GRPC_SERVICE}/Generate")(b"prompt", timeout=10))


if __name__ == "__main__":
    kind, port = sys.argv[1], int(sys.argv[2])
    if kind == "sse":
        httpd = ThreadingHTTPServer(("127.0.0.1", port), Completions)
        print("ready", flush=True)
        httpd.serve_forever()
    else:
        grpc_server = serve_grpc(port)
        print("ready", flush=True)
        grpc_server.wait_for_termination()
