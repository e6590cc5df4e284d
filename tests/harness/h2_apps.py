"""Small real HTTP/2 services (the ``h2`` library, cleartext, a thread per connection), run as
their own processes, for end-to-end tests of HTTP/2 under load.

``python -m harness.h2_apps server PORT``
    ``GET /ok`` -> 200; ``/missing`` -> 404; ``/fail`` -> 500; ``/reset`` -> RST_STREAM
    (INTERNAL_ERROR) instead of a response; anything else -> 200. Every stream of a batch read
    together is answered in one write. The server's SETTINGS go out as soon as it accepts,
    before it reads the client's preface (as many servers do).
``python -m harness.h2_apps frontend PORT BACKEND_PORT HTTP1_PORT CUDART``
    ``GET /predict`` calls the backend's ``/ok`` over HTTP/2, an HTTP/1 service's ``/work``
    (harness/http_apps.py ``backend``), and then a probed CUDA function (``cudaMalloc``/
    ``cudaMemcpy``/``cudaFree`` through ctypes from the library at CUDART), on the connection's
    own thread, then answers 200.
Each prints ``ready`` once listening.

``H2Client`` (imported by tests): one client connection; ``run(paths)`` sends a stream per
path at once and reads until every one ended, and says how each did (the status, or "reset").
"""

from __future__ import annotations

import ctypes
import http.client
import socket
import sys
import threading

import h2.config
import h2.connection
import h2.events
import h2.exceptions

STATUS = {"/ok": 200, "/missing": 404, "/fail": 500}
INTERNAL_ERROR = 2


class H2Client:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())

    def run(self, paths: list[str]) -> list[str]:
        """One stream per path, sent together; each one's outcome, in order: its status or "reset"."""
        pending: dict[int, int] = {}
        outcome: list[str] = [""] * len(paths)
        for i, path in enumerate(paths):
            stream = self.conn.get_next_available_stream_id()
            headers = [(":method", "GET"), (":scheme", "http"), (":path", path), (":authority", "svc")]
            self.conn.send_headers(stream, headers, end_stream=True)
            pending[stream] = i
        self.sock.sendall(self.conn.data_to_send())
        while pending:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("server closed")
            for event in self.conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    outcome[pending[event.stream_id]] = dict(event.headers)[":status"]
                elif isinstance(event, h2.events.DataReceived):
                    self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    pending.pop(event.stream_id, None)
                elif isinstance(event, h2.events.StreamReset):
                    outcome[pending.pop(event.stream_id)] = "reset"
            out = self.conn.data_to_send()
            if out:
                self.sock.sendall(out)
        return outcome

    def close(self) -> None:
        self.conn.close_connection()
        try:
            self.sock.sendall(self.conn.data_to_send())
        except OSError:
            pass
        self.sock.close()


class Server:
    def __init__(self, port: int, handler=None) -> None:
        self.listener = socket.create_server(("127.0.0.1", port), backlog=256)
        self.handler = handler or (lambda path: STATUS.get(path, 200))

    def serve(self) -> None:
        print("ready", flush=True)
        while True:
            sock, _ = self.listener.accept()
            threading.Thread(target=self.connection, args=(sock,), daemon=True).start()

    def connection(self, sock: socket.socket) -> None:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        conn.initiate_connection()
        sock.sendall(conn.data_to_send())  # SETTINGS, before the client's preface is read
        try:
            while True:
                data = sock.recv(65536)
                if not data:
                    break
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.RequestReceived):
                        self.answer(conn, event.stream_id, dict(event.headers)[":path"])
                    elif isinstance(event, h2.events.ConnectionTerminated):
                        return
                out = conn.data_to_send()
                if out:
                    sock.sendall(out)
        except (OSError, h2.exceptions.ProtocolError):
            pass
        finally:
            sock.close()

    def answer(self, conn: h2.connection.H2Connection, stream: int, path: str) -> None:
        if path == "/reset":
            conn.reset_stream(stream, error_code=INTERNAL_ERROR)
            return
        status = self.handler(path)
        body = b"ok"
        conn.send_headers(stream, [(":status", str(status)), ("content-length", str(len(body)))])
        conn.send_data(stream, body, end_stream=True)


def frontend(port: int, backend_port: int, http1_port: int, cudart_path: str) -> Server:
    cudart = ctypes.CDLL(cudart_path)
    local = threading.local()

    def handle(path: str) -> int:
        if path != "/predict":
            return STATUS.get(path, 200)
        if not hasattr(local, "backend"):  # one connection to each backend per serving thread
            local.backend = H2Client(backend_port)
            local.http1 = http.client.HTTPConnection("127.0.0.1", http1_port, timeout=10)
        assert local.backend.run(["/ok"]) == ["200"]
        local.http1.request("GET", "/work")
        assert local.http1.getresponse().read() == b"done"
        ptr = ctypes.c_void_p()
        assert cudart.cudaMalloc(ctypes.byref(ptr), 4096) == 0
        host = ctypes.create_string_buffer(4096)
        assert cudart.cudaMemcpy(ptr, host, 4096, 1) == 0
        assert cudart.cudaFree(ptr) == 0
        return 200

    return Server(port, handle)


def main(argv: list[str]) -> None:
    role, port = argv[0], int(argv[1])
    if role == "frontend":
        frontend(port, int(argv[2]), int(argv[3]), argv[4]).serve()
    else:
        Server(port).serve()


if __name__ == "__main__":
    main(sys.argv[1:])
