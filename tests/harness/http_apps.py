"""Small real HTTP services for end-to-end tests, run as their own processes.

``python -m harness.http_apps backend PORT``
    ThreadingHTTPServer (HTTP/1.1, keep-alive): ``GET /work`` -> 200 ``done``;
    ``GET /status/N`` -> status N; anything else -> 200 with the path echoed.
``python -m harness.http_apps frontend PORT BACKEND_PORT CUDART``
    Same server; ``GET /predict`` calls the backend's ``/work`` over HTTP and then a
    probed CUDA function (``cudaMalloc``/``cudaMemcpy``/``cudaFree`` through ctypes from
    the library at CUDART), on the handler's own thread, then answers 200.
``python -m harness.http_apps asyncio PORT BACKEND_PORT``
    An asyncio server (one thread serves every connection): each request waits 300 ms, then
    calls the backend's ``/work`` and answers 200. Concurrent requests are open on the same
    thread at once, which thread-based causality must notice.
Each prints ``ready`` once listening.
"""

from __future__ import annotations

import asyncio
import ctypes
import http.client
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Backend(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Set-Cookie", "session=server-secret")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/work":
            self._reply(200, b"done")
        elif self.path.startswith("/status/"):
            self._reply(int(self.path.rsplit("/", 1)[1]), b"status")
        else:
            self._reply(200, self.path.encode())

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self._reply(201, b"created")


class Frontend(Backend):
    backend_port = 0
    cudart: ctypes.CDLL | None = None

    def do_GET(self) -> None:
        if self.path != "/predict":
            return super().do_GET()
        downstream = http.client.HTTPConnection("127.0.0.1", self.backend_port, timeout=10)
        downstream.request("GET", "/work")
        assert downstream.getresponse().read() == b"done"
        downstream.close()
        lib = self.cudart
        ptr = ctypes.c_void_p()
        assert lib.cudaMalloc(ctypes.byref(ptr), 4096) == 0
        host = ctypes.create_string_buffer(4096)
        assert lib.cudaMemcpy(ptr, host, 4096, 1) == 0
        assert lib.cudaFree(ptr) == 0
        self._reply(200, b"prediction")


async def _asyncio_server(port: int, backend_port: int) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.readuntil(b"\r\n\r\n"):
            await asyncio.sleep(0.3)
            down_r, down_w = await asyncio.open_connection("127.0.0.1", backend_port)
            down_w.write(b"GET /work HTTP/1.1\r\nHost: backend\r\nConnection: close\r\n\r\n")
            await down_w.drain()
            await down_r.read()
            down_w.close()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nasync")
            await writer.drain()

    async def guarded(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handle(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(guarded, "127.0.0.1", port)
    print("ready", flush=True)
    await server.serve_forever()


def main(argv: list[str]) -> None:
    role, port = argv[0], int(argv[1])
    if role == "asyncio":
        asyncio.run(_asyncio_server(port, int(argv[2])))
        return
    handler: type[Backend] = Backend
    if role == "frontend":
        Frontend.backend_port = int(argv[2])
        Frontend.cudart = ctypes.CDLL(argv[3])
        handler = Frontend
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
