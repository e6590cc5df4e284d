"""Servers that hand each request's CUDA work to another thread, for the hand-off tests.

Run as ``python -m harness.pool_apps KIND PORT CUDART``; prints ``ready`` once listening.

- ``pool``: a stdlib ``ThreadingHTTPServer`` (a thread per connection reads the request) that
  submits the request's work to a ``concurrent.futures.ThreadPoolExecutor`` and waits for it.
  ``GET /work/K/N``: a pool worker calls ``cudaMalloc(K * MARKER_BYTES)`` and ``cudaFree``, so
  the allocation's size says which request it served, then waits until N requests' work is done,
  so the N requests are all open at once and each is served by a worker of its own (a worker
  taking queued work without sleeping is another case: docs/design-notes.md). ``GET /hop/K/N``:
  the same, handed to a dispatcher pool whose task submits the work to a second worker pool.
- ``loop``: an asyncio server whose loop thread holds ``LOOP_BATCH`` requests open at once, then
  hands each one's work to a pool (``run_in_executor``): the waker served several requests, so
  none of them is the work's one parent.
"""

from __future__ import annotations

import asyncio
import ctypes
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

#: ``cudaMalloc`` size of request K's work: K * MARKER_BYTES.
MARKER_BYTES = 4096
#: Requests the ``loop`` server holds open before handing any of them on.
LOOP_BATCH = 3


def work(cudart: ctypes.CDLL, marker: int, done: threading.Barrier | None = None) -> None:
    """A request's CUDA work, on whichever thread runs it; then ``done`` is waited on."""
    ptr = ctypes.c_void_p()
    assert cudart.cudaMalloc(ctypes.byref(ptr), marker * MARKER_BYTES) == 0
    assert cudart.cudaFree(ptr) == 0
    if done is not None:
        done.wait(timeout=10)
        time.sleep(0.03 * (marker % 10))  # the responses a little apart too


def serve_pool(port: int, cudart: ctypes.CDLL) -> None:
    workers = ThreadPoolExecutor(max_workers=4, thread_name_prefix="worker")
    dispatch = ThreadPoolExecutor(max_workers=2, thread_name_prefix="dispatch")
    hop_workers = ThreadPoolExecutor(max_workers=2, thread_name_prefix="hopworker")  # its own threads
    rounds: dict[int, threading.Barrier] = {}  # N -> the N workers of a round (reusable)
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            _, route, marker, together = self.path.split("/")
            with lock:
                done = rounds.setdefault(int(together), threading.Barrier(int(together)))
            if route == "work":
                workers.submit(work, cudart, int(marker), done).result()
            else:
                dispatch.submit(lambda: hop_workers.submit(work, cudart, int(marker), done).result()).result()
            body = f"done {marker}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print("ready", flush=True)
    httpd.serve_forever()


async def serve_loop(port: int, cudart: ctypes.CDLL) -> None:
    pool = ThreadPoolExecutor(max_workers=LOOP_BATCH, thread_name_prefix="loopworker")
    waiting: list[asyncio.Future[None]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        marker = int(head.split(b" ")[1].rsplit(b"/", 1)[1])
        gate = asyncio.get_running_loop().create_future()
        waiting.append(gate)
        if len(waiting) == LOOP_BATCH:  # every request of the batch is open on the loop thread
            for g in waiting:
                g.set_result(None)
            waiting.clear()
        await gate
        await asyncio.get_running_loop().run_in_executor(pool, work, cudart, marker)
        body = f"done {marker}".encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    print("ready", flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    kind, port, lib = sys.argv[1], int(sys.argv[2]), ctypes.CDLL(sys.argv[3])
    if kind == "pool":
        serve_pool(port, lib)
    else:
        asyncio.run(serve_loop(port, lib))
