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
``python -m harness.streaming_apps batch PORT CUDART``
    An asyncio HTTP/1.1 server whose handlers hand each request to a batching engine thread (as
    vLLM's engine loop serves its API server): the engine waits ``BATCH_WINDOW_S`` after a batch's
    first request, then runs one step for the whole batch (``cudaMalloc``, ``cudaMemcpy``,
    ``cudaFree`` through the library at CUDART) and answers every request in it with 200 ``batched``.
Each prints ``ready`` once listening.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import queue
import sys
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc

TOKENS = ["The", " answer", " is", " forty", "-two"]
FIRST_S = 0.15
GAP_S = 0.04
GRPC_SERVICE = "demo.Tokens"
BATCH_WINDOW_S = 0.3


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
        body = json.dumps(
            {
                "id": "cmpl-json",
                "object": "chat.completion",
                "created": 0,
                "model": model,
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "".join(TOKENS)}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": request.get("max_tokens", 0), "completion_tokens": len(TOKENS)},
            }
        ).encode()
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
        self._event(
            {
                "id": "cmpl-sse",
                "object": "chat.completion.chunk",
                "model": model,
                "choices": [],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(TOKENS)},
            }
        )
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
        GRPC_SERVICE, {"Generate": grpc.unary_stream_rpc_method_handler(_generate)}
    )
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server


def generate(port: int) -> list[bytes]:
    """One streaming call, as a client in this process."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return list(channel.unary_stream(f"/{GRPC_SERVICE}/Generate")(b"prompt", timeout=10))


def _engine(requests: queue.Queue, cudart: ctypes.CDLL) -> None:
    """Batches: the requests that arrive within BATCH_WINDOW_S of the first, one CUDA step for all."""
    while True:
        batch = [requests.get()]
        deadline = time.monotonic() + BATCH_WINDOW_S
        while (left := deadline - time.monotonic()) > 0:
            try:
                batch.append(requests.get(timeout=left))
            except queue.Empty:
                break
        ptr, host = ctypes.c_void_p(), ctypes.create_string_buffer(4096)
        assert cudart.cudaMalloc(ctypes.byref(ptr), 4096) == 0
        assert cudart.cudaMemcpy(ptr, host, 4096, 1) == 0
        assert cudart.cudaFree(ptr) == 0
        for loop, done in batch:
            loop.call_soon_threadsafe(done.set_result, len(batch))


async def _batching_server(port: int, cudart: ctypes.CDLL) -> None:
    requests: queue.Queue = queue.Queue()
    threading.Thread(target=_engine, args=(requests, cudart), daemon=True).start()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                done = asyncio.get_running_loop().create_future()
                requests.put((asyncio.get_running_loop(), done))
                await done
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\nbatched")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    print("ready", flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    kind, port = sys.argv[1], int(sys.argv[2])
    if kind == "batch":
        asyncio.run(_batching_server(port, ctypes.CDLL(sys.argv[3])))
    elif kind == "sse":
        httpd = ThreadingHTTPServer(("127.0.0.1", port), Completions)
        print("ready", flush=True)
        httpd.serve_forever()
    else:
        grpc_server = serve_grpc(port)
        print("ready", flush=True)
        grpc_server.wait_for_termination()
