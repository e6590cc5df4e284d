"""CPU cost of the agent's HTTP/2 + gRPC pipeline per traced syscall, without the kernel.

    .venv/bin/python bench/http2_pipeline.py [--calls 500] [--conns 8] [--message 64] [--traceparent]
                                             [--payload 4096] [--repeats 5] [--shift K] [--profile] [--out FILE]

The bytes are real: a grpcio client makes ``--calls`` unary calls (``--message`` bytes each) to the
harness's grpcio server (tests/harness/grpc_demo.py) over one channel, through the recording relay
(tests/harness/tcp_recorder.py), which keeps each chunk as its recv() returned it. In steady state
grpcio writes a whole call's frames in one sendmsg (client: HEADERS + WINDOW_UPDATE + DATA; server:
HEADERS + DATA + trailers, checked with strace), so a relay chunk is what one sendmsg wrote and one
recvmsg read.

That connection is replayed ``--conns`` times, chunks interleaved round-robin, as the records the
sockets probes would put on the ``sockdata`` ring with both ends traced on one host: the client's
connect (and local address), the server's accept, then per chunk the sender's sendmsg and the
receiver's recvmsg, then both closes. They are fed in ring-sized batches to the real
``HttpCorrelator`` (client and server spans), and the spans are written with the file exporter.

Reports CPU microseconds (``time.process_time``, min over ``--repeats``: noise only adds) per
record and per call, for the whole correlator and for ``H2Connection.feed`` alone on the same
chunks (the HTTP/2 parsing share). ``--profile`` prints the top of a cProfile of the correlator.
``--shift K``: streams sampled at 2^-K (issue 38: every stream parsed and counted, spans built for
the kept ones), as the head sampler's shift would have it under pressure.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[0] = str(ROOT)  # not bench/ first: its profile.py would shadow the stdlib module cProfile imports
sys.path.append(str(ROOT / "bench"))  # pipeline_common, after the stdlib
sys.path.append(str(ROOT / "tests"))

import argparse  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402

import grpc  # noqa: E402
import numpy as np  # noqa: E402

from harness import grpc_demo  # noqa: E402
from harness.tcp_recorder import TcpRecorder  # noqa: E402
from otelbpf.base.events import SOCK_RECORD_DTYPE, Kind, SockFunc  # noqa: E402
from otelbpf.families.http.protocols.http2 import H2Connection  # noqa: E402
from pipeline_common import feed_and_export  # noqa: E402

PORT, PEER = 50051, 40000
CLIENT_PID, SERVER_PID = 4242, 5353
LOCALHOST = socket.inet_aton("127.0.0.1") + bytes(12)
#: A chunk of one captured connection: (client_to_server, bytes).
Chunk = tuple[bool, bytes]


def capture(calls: int, message: int, traceparent: bool) -> list[Chunk]:
    """One grpcio channel's bytes, both directions, for ``calls`` unary calls (each with its own
    ``traceparent`` metadata if asked, as an instrumented client sends: a header block that is new
    every call)."""
    server, port = grpc_demo.serve()
    recorder = TcpRecorder(("127.0.0.1", port))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{recorder.port}") as channel:
            unary = grpc_demo.unary(channel)
            for i in range(calls):
                metadata = (("traceparent", f"00-{i + 1:032x}-{i + 1:016x}-01"),) if traceparent else None
                unary(b"%08d" % i + b"x" * max(0, message - 8), metadata=metadata)
        deadline = time.monotonic() + 5
        while len(recorder.stream(0)) < 2 * calls and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # the channel's last frames (GOAWAY, acks)
        return [(c.client_to_server, c.data) for c in recorder.stream(0)]
    finally:
        recorder.close()
        server.stop(0)


class _Records:
    """Fills an array of records as the sensor delivers them (``SOCK_RECORD_DTYPE``), in ring order."""

    def __init__(self, n: int, payload: int) -> None:
        self.arr = np.zeros(n, dtype=SOCK_RECORD_DTYPE)
        self.arr["data"] = [b""] * n
        self.payload = payload
        self.i = 0
        self.t = 1_000_000_000

    def add(self, kind: Kind, func: SockFunc, pid: int, fd: int, duration: int = 800, ret: int = 0) -> np.void:
        r = self.arr[self.i]
        r["ts_ns"], r["duration_ns"], r["pid"], r["tid"], r["fd"], r["ret"] = self.t, duration, pid, pid, fd, ret
        r["kind"], r["func"] = kind, func
        self.i, self.t = self.i + 1, self.t + duration + 1000
        return r

    def data(self, func: SockFunc, pid: int, fd: int, data: bytes) -> None:
        r = self.add(Kind.SOCK_DATA, func, pid, fd, ret=len(data))
        r["cap"] = min(len(data), self.payload)
        self.arr["data"][self.i - 1] = data[: self.payload]


def records(chunks: list[Chunk], conns: int, payload: int) -> np.ndarray:
    """Both ends of ``conns`` copies of the captured connection, chunks interleaved round-robin."""
    rec = _Records(conns * (2 * len(chunks) + 5), payload)
    for c in range(conns):
        fd = 100 + c
        r = rec.add(Kind.SOCK_CONNECT, SockFunc.connect, CLIENT_PID, fd)
        r["family"], r["port"], r["addr"] = 2, PORT, LOCALHOST
        r = rec.add(Kind.SOCK_LOCAL, SockFunc.connect, CLIENT_PID, fd)
        r["family"], r["port"], r["addr"] = 2, PEER + c, LOCALHOST
        r = rec.add(Kind.SOCK_ACCEPT, SockFunc.accept4, SERVER_PID, fd, ret=3)
        r["family"], r["port"], r["local_port"], r["addr"] = 2, PEER + c, PORT, LOCALHOST
    for c2s, data in chunks:
        for c in range(conns):
            sender, receiver = (CLIENT_PID, SERVER_PID) if c2s else (SERVER_PID, CLIENT_PID)
            rec.data(SockFunc.sendmsg, sender, 100 + c, data)
            rec.data(SockFunc.recvmsg, receiver, 100 + c, data)
    for c in range(conns):
        rec.add(Kind.SOCK_CLOSE, SockFunc.close, CLIENT_PID, 100 + c)
        rec.add(Kind.SOCK_CLOSE, SockFunc.close, SERVER_PID, 100 + c)
    return rec.arr[: rec.i]


class FixedShift:
    """The head sampler as the correlator sees it, at a fixed shift and with no kernel behind it."""

    def __init__(self, shift: int) -> None:
        self.shift = shift

    def streams_decided(self, counts: list[int]) -> None:
        pass

    def processed(self, stamp: int) -> None:
        pass

    def tick(self, *, count_only: bool = False) -> None:
        pass

    def over_budget(self, spans: int) -> None:
        pass

    def red_deltas(self, bounds: tuple[float, ...]) -> list:
        return []

    def h2_deltas(self, bounds: tuple[float, ...]) -> list:
        return []


def run_correlator(arr: np.ndarray, batch: int, profile: bool, shift: int | None = None) -> dict:
    options = {} if shift is None else {"sampler": FixedShift(shift)}
    done = feed_and_export(arr, PORT, batch, profile, top=30, **options)
    grpc_spans = sum(1 for s in done.spans if s.attributes.get("rpc.system") == "grpc")
    return {
        "spans": len(done.spans),
        "grpc_spans": grpc_spans,
        "problems": done.problems(),
        "correlate_us": 1e6 * done.correlate_s,
        "export_us": 1e6 * done.export_s,
    }


def run_parser(chunks: list[Chunk], conns: int) -> dict:
    """``H2Connection.feed`` alone, both ends of every connection (each chunk parsed twice, as in the correlator)."""
    t0 = time.process_time()
    done = 0
    for _ in range(2 * conns):
        conn = H2Connection()
        for i, (c2s, data) in enumerate(chunks):
            done += len(conn.feed(c2s, data, 0, (i, i, 1)))
        done += len(conn.close((0, 0, 1)))
    return {"streams": done, "parse_us": 1e6 * (time.process_time() - t0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=500, help="unary calls captured on the one channel")
    ap.add_argument("--conns", type=int, default=8, help="copies of the captured connection replayed")
    ap.add_argument("--message", type=int, default=64, help="request (and echoed response) message bytes")
    ap.add_argument("--traceparent", action="store_true", help="each call sends its own traceparent")
    ap.add_argument("--payload", type=int, default=4096, help="payload bytes a record captures")
    ap.add_argument("--batch", type=int, default=2048, help="records per on_ring call (one drain)")
    ap.add_argument("--repeats", type=int, default=5, help="runs; the fastest is reported (noise only adds)")
    ap.add_argument("--shift", type=int, help="HTTP/2 streams sampled at 2^-SHIFT (spans of the kept ones only)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    chunks = capture(args.calls, args.message, args.traceparent)
    arr = records(chunks, args.conns, args.payload)
    data_records = 2 * len(chunks) * args.conns
    calls = args.calls * args.conns
    runs = [
        run_correlator(arr, args.batch, args.profile, args.shift) for _ in range(1 if args.profile else args.repeats)
    ]
    parses = [run_parser(chunks, args.conns) for _ in range(1 if args.profile else args.repeats)]
    correlate = min(r["correlate_us"] for r in runs)
    export = min(r["export_us"] for r in runs)
    parse = min(p["parse_us"] for p in parses)
    res = {
        "calls": calls,
        "records": len(arr),
        "data_records": data_records,
        "data_records_per_call": round(data_records / calls, 2),
        "spans": runs[0]["spans"],
        "grpc_spans": runs[0]["grpc_spans"],
        "problems": runs[0]["problems"],
        "correlate_us_per_record": round(correlate / len(arr), 2),
        "correlate_us_per_call": round(correlate / calls, 2),
        "correlate_us_per_call_all_runs": [round(r["correlate_us"] / calls, 2) for r in runs],
        "h2_parse_us_per_data_record": round(parse / data_records, 2),
        "h2_parse_us_per_call": round(parse / calls, 2),
        "h2_parse_us_per_call_all_runs": [round(p["parse_us"] / calls, 2) for p in parses],
        "export_us_per_span": round(export / max(1, runs[0]["spans"]), 2),
    }
    per_call = (correlate + export) / calls
    res["us_per_call"] = round(per_call, 2)
    res["calls_per_core_second"] = int(1e6 / per_call)
    print(json.dumps(res, indent=2))
    if args.out:
        args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, "result": res}, indent=2) + "\n")


if __name__ == "__main__":
    main()
