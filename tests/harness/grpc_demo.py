"""A small real gRPC service (grpcio, raw-bytes messages, no generated code).

``demo.Echo/Unary`` echoes its request, or fails with NOT_FOUND when the
request is ``b"missing"``. ``demo.Echo/Stream`` sends the request back three
times, then ends with FAILED_PRECONDITION and a non-ASCII message (which
travels percent-encoded in ``grpc-message``), so a test sees trailers.

Run as a process: ``python -m harness.grpc_demo PORT`` serves until killed
and prints ``ready`` once listening; ``python -m harness.grpc_demo --call
PORT N`` makes N unary calls and one streaming call, then exits.
"""

from __future__ import annotations

import sys
from concurrent import futures

import grpc

SERVICE = "demo.Echo"
STREAM_ERROR = "stream ended on purpose: ü"


def _unary(request: bytes, context: grpc.ServicerContext) -> bytes:
    if request == b"missing":
        context.abort(grpc.StatusCode.NOT_FOUND, "no such thing")
    return request


def _stream(request: bytes, context: grpc.ServicerContext):
    for _ in range(3):
        yield request
    context.abort(grpc.StatusCode.FAILED_PRECONDITION, STREAM_ERROR)


def serve(port: int = 0, workers: int = 4) -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Unary": grpc.unary_unary_rpc_method_handler(_unary),
            "Stream": grpc.unary_stream_rpc_method_handler(_stream),
        },
    )
    server.add_generic_rpc_handlers((handler,))
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server, bound


def unary(channel: grpc.Channel):
    return channel.unary_unary(f"/{SERVICE}/Unary")


def stream(channel: grpc.Channel):
    return channel.unary_stream(f"/{SERVICE}/Stream")


def call(port: int, n: int) -> None:
    """``n`` unary calls (the last asks for a missing thing) and one streaming call."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        for i in range(n):
            try:
                unary(channel)(b"missing" if i == n - 1 else b"hello %d" % i, timeout=10)
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.NOT_FOUND
        try:
            list(stream(channel)(b"tick", timeout=10))
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION


if __name__ == "__main__":
    if sys.argv[1] == "--call":
        call(int(sys.argv[2]), int(sys.argv[3]))
    else:
        server, bound = serve(int(sys.argv[1]))
        print(f"ready {bound}", flush=True)
        server.wait_for_termination()
