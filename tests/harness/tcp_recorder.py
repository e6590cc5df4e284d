"""A recording TCP relay: real client <-> relay <-> real server, every chunk kept.

Parser tests feed the exact byte streams that real HTTP/1.x and gRPC peers
exchanged, chunked as the relay's recv() calls returned them (as a server's
read() syscalls would see them), instead of hand-written bytes.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass


@dataclass
class Chunk:
    conn: int  # connection number, in accept order
    client_to_server: bool
    data: bytes
    t: float  # time.monotonic() of the recv


class TcpRecorder:
    """Listens on 127.0.0.1:``port``; relays each connection to ``upstream``."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.chunks: list[Chunk] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._conns = 0
        self._threads: list[threading.Thread] = []
        self._closing = False
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            n = self._conns
            self._conns += 1
            for src, dst, c2s in ((client, server, True), (server, client, False)):
                t = threading.Thread(target=self._pump, args=(n, src, dst, c2s), daemon=True)
                t.start()
                self._threads.append(t)

    def _pump(self, n: int, src: socket.socket, dst: socket.socket, c2s: bool) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            with self._lock:
                self.chunks.append(Chunk(n, c2s, data, time.monotonic()))
            try:
                dst.sendall(data)
            except OSError:
                return

    def stream(self, conn: int = 0) -> list[Chunk]:
        with self._lock:
            return [c for c in self.chunks if c.conn == conn]

    def close(self) -> None:
        self._closing = True
        self._listener.close()
        for t in self._threads:
            t.join(2)
