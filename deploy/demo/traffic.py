"""A small "inference service" and its clients, to give otelbpf something to show.

The compose stack runs this in its `demo` container, and tests/deploy runs it under the real
agent to check that every dashboard query names a metric the agent exports. With no GPU it
uses the stand-in CUDA and NCCL libraries built by examples/build.sh (their calls succeed:
real copies, plausible sync waits, ranks that really wait for each other).

Each round:
  - HTTP/1.1 requests to `GET /predict` on a ThreadingHTTPServer whose handler, on its own
    thread, allocates device memory, copies a pinned or a pageable host buffer in, waits for
    the device and copies back (so CUDA spans are children of the request span); one
    `GET /missing` (404) and one `GET /overloaded` (503) for the error panels;
  - gRPC unary calls to `demo.Inference/Predict` (one fails with NOT_FOUND);
  - cuda_workload (kernel launches by name, pinned copies, stream syncs);
  - nccl_job with 2 ranks, rank 1 slowed down, so a straggler is found.

Usage: traffic.py --build DIR [--rounds N] [--requests N] [--pause S]
(--rounds 0 runs until killed). Prints one JSON line per round with what it did.
"""

from __future__ import annotations

import argparse
import ctypes
import http.client
import json
import subprocess
import sys
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc

COPY_BYTES = 1 << 20
CUDA_MEMCPY_H2D, CUDA_MEMCPY_D2H = 1, 2
GRPC_SERVICE = "demo.Inference"


class Cuda:
    """The few runtime calls a request makes, through ctypes (the agent probes the library)."""

    def __init__(self, path: Path) -> None:
        self.lib = ctypes.CDLL(str(path))
        self.pinned = ctypes.c_void_p()
        self._check(self.lib.cudaMallocHost(ctypes.byref(self.pinned), ctypes.c_size_t(COPY_BYTES)), "cudaMallocHost")
        self.pageable = ctypes.create_string_buffer(COPY_BYTES)

    @staticmethod
    def _check(rc: int, call: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{call} returned {rc}")

    def infer(self, pinned: bool) -> None:
        """malloc, H2D, sync, D2H, free: the shape of one small inference step."""
        lib, dev = self.lib, ctypes.c_void_p()
        host = self.pinned if pinned else ctypes.cast(self.pageable, ctypes.c_void_p)
        size = ctypes.c_size_t(COPY_BYTES)
        self._check(lib.cudaMalloc(ctypes.byref(dev), size), "cudaMalloc")
        try:
            self._check(lib.cudaMemcpy(dev, host, size, CUDA_MEMCPY_H2D), "cudaMemcpy")
            self._check(lib.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
            self._check(lib.cudaMemcpy(host, dev, ctypes.c_size_t(COPY_BYTES // 4), CUDA_MEMCPY_D2H), "cudaMemcpy")
        finally:
            self._check(lib.cudaFree(dev), "cudaFree")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    cuda: Cuda
    served = 0
    lock = threading.Lock()

    def log_message(self, *args) -> None:
        pass

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/predict":
            with Handler.lock:
                Handler.served += 1
                pinned = Handler.served % 2 == 0
            self.cuda.infer(pinned)
            self._reply(200, b"prediction")
        elif self.path == "/overloaded":
            self._reply(503, b"try later")
        else:
            self._reply(404, b"not found")


def _grpc_predict(request: bytes, context: grpc.ServicerContext) -> bytes:
    if request == b"unknown-model":
        context.abort(grpc.StatusCode.NOT_FOUND, "no such model")
    return request[::-1]


def start_grpc() -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        GRPC_SERVICE, {"Predict": grpc.unary_unary_rpc_method_handler(_grpc_predict)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def http_round(port: int, requests: int) -> dict[int, int]:
    statuses: dict[int, int] = {}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    for path in ["/predict"] * requests + ["/missing", "/overloaded"]:
        conn.request("GET", path, headers={"Host": "demo"})
        response = conn.getresponse()
        response.read()
        statuses[response.status] = statuses.get(response.status, 0) + 1
    conn.close()
    return statuses


def grpc_round(port: int, requests: int) -> dict[str, int]:
    codes: dict[str, int] = {}
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        predict = channel.unary_unary(f"/{GRPC_SERVICE}/Predict")
        for payload in [b"features"] * requests + [b"unknown-model"]:
            try:
                predict(payload, timeout=10)
                code = "OK"
            except grpc.RpcError as e:
                code = e.code().name
            codes[code] = codes.get(code, 0) + 1
    return codes


def run_json(argv: list[str]) -> dict:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", type=Path, required=True, help="examples/build.sh's output (build/examples)")
    parser.add_argument("--rounds", type=int, default=1, help="0 = until killed")
    parser.add_argument("--requests", type=int, default=10, help="HTTP and gRPC requests per round")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds between rounds")
    args = parser.parse_args(argv)
    build: Path = args.build

    Handler.cuda = Cuda(build / "fakecudart" / "libcudart.so.12")
    http_server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=http_server.serve_forever, daemon=True).start()
    grpc_server, grpc_port = start_grpc()
    try:
        done = 0
        while args.rounds == 0 or done < args.rounds:
            workload = run_json([str(build / "cuda_workload"), "--lib", str(build / "fakecudart" / "libcudart.so.12"),
                                 "--iterations", "5", "--launches-per-iter", "6", "--async",
                                 "--host-memory", "pinned", "--alloc-bytes", "65536",
                                 "--h2d-bytes", "65536", "--d2h-bytes", "16384"])
            nccl = run_json([str(build / "nccl_job"), "--ranks", "2", "--iterations", "10", "--kernels", "2",
                             "--slow-rank", "1", "--slow-kind", "compute", "--slow-ms", "80"])
            report = {
                "round": done + 1,
                "http": http_round(http_server.server_address[1], args.requests),
                "grpc": grpc_round(grpc_port, args.requests),
                "cuda_workload_pid": workload["pid"],
                "nccl_ranks": [r["pid"] for r in nccl["ranks"]],
            }
            print(json.dumps(report), flush=True)
            done += 1
            time.sleep(args.pause)
    finally:
        http_server.shutdown()
        grpc_server.stop(None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
