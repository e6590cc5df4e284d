"""CPU cost of the agent's HTTP pipeline per traced syscall, without the kernel.

    .venv/bin/python bench/http_pipeline.py [--requests 20000] [--conns 32] [--payload 4096]
                                            [--profile] [--out FILE]

Builds the records the sockets probes would put on the ``sockdata`` ring for an HTTP/1.1
keep-alive server (accept, then a read of a request and a write of a response per request,
then close, on ``--conns`` connections interleaved like wrk's) and feeds them, in ring-sized
batches, to the real ``HttpCorrelator``; then writes the spans it built with the file exporter,
and encodes them as the ``otlp`` exporter does (and as the SDK's ``encode_spans`` would).
Reports CPU microseconds per record for each stage (``time.process_time``): this is the number
that decides how many requests/s the agent follows before its ring fills (one core / cost).
``--profile`` prints the top of a cProfile of the correlator stage.

No BPF is involved: this isolates the Python half measured end to end by bench/http.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[0] = str(ROOT)  # not bench/ first: its profile.py would shadow the stdlib module cProfile imports
sys.path.append(str(ROOT / "bench"))  # pipeline_common, after the stdlib

import argparse  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402

from otelbpf.base.events import SOCK_RECORD_DTYPE, Kind, SockFunc  # noqa: E402
from otelbpf.export.otlp_proto import encode_spans_proto  # noqa: E402
from pipeline_common import feed_and_export  # noqa: E402

REQUEST = b"GET /v1/models/llama:predict HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: wrk\r\nAccept: */*\r\n\r\n"
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 13\r\nContent-Type: text/plain\r\n\r\nHello, World!"
PORT, PEER = 8080, 40000


def records(requests: int, conns: int, payload: int) -> np.ndarray:
    """accept x conns (fd: the new connection, ret: the listener), (read, write) x requests
    round-robin over the connections, close x conns: as the sensor delivers them, each payload
    its first ``payload`` bytes."""
    n = 2 * conns + 2 * requests
    arr = np.zeros(n, dtype=SOCK_RECORD_DTYPE)
    arr["data"] = [b""] * n
    pid, tid, t = 4242, 4242, 1_000_000_000
    i = 0
    for c in range(conns):
        r = arr[i]
        r["ts_ns"], r["duration_ns"], r["pid"], r["tid"], r["fd"], r["ret"] = t, 500, pid, tid, 100 + c, 3
        r["kind"], r["func"], r["family"], r["port"], r["local_port"] = (
            Kind.SOCK_ACCEPT,
            SockFunc.accept4,
            2,
            PEER + c,
            PORT,
        )
        r["addr"] = socket.inet_aton("127.0.0.1") + bytes(12)
        t, i = t + 1000, i + 1
    for k in range(requests):
        fd = 100 + k % conns
        for func, data in ((SockFunc.read, REQUEST), (SockFunc.write, RESPONSE)):
            r = arr[i]
            r["ts_ns"], r["duration_ns"], r["pid"], r["tid"], r["fd"] = t, 800, pid, tid, fd
            r["ret"], r["cap"] = len(data), min(len(data), payload)
            r["kind"], r["func"] = Kind.SOCK_DATA, func
            arr["data"][i] = data[:payload]
            t, i = t + 2000, i + 1
    for c in range(conns):
        r = arr[i]
        r["ts_ns"], r["duration_ns"], r["pid"], r["tid"], r["fd"] = t, 300, pid, tid, 100 + c
        r["kind"], r["func"] = Kind.SOCK_CLOSE, SockFunc.close
        t, i = t + 1000, i + 1
    return arr


def run(arr: np.ndarray, batch: int, profile: bool) -> dict:
    done = feed_and_export(arr, PORT, batch, profile)
    spans = done.spans
    # What the otlp exporters would spend encoding the same spans (no network): ours, the SDK's.
    t0 = time.process_time()
    for s in range(0, len(spans), 512):
        encode_spans_proto(spans[s : s + 512]).SerializeToString()
    t1 = time.process_time()
    for s in range(0, len(spans), 512):
        encode_spans(spans[s : s + 512]).SerializeToString()
    t2 = time.process_time()
    return {
        "records": len(arr),
        "spans": len(spans),
        "problems": done.problems(),
        "correlate_us_per_record": round(1e6 * done.correlate_s / len(arr), 2),
        "export_us_per_span": round(1e6 * done.export_s / max(1, len(spans)), 2),
        "otlp_proto_us_per_span": round(1e6 * (t1 - t0) / max(1, len(spans)), 2),
        "sdk_encode_spans_us_per_span": round(1e6 * (t2 - t1) / max(1, len(spans)), 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--conns", type=int, default=32)
    ap.add_argument("--payload", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=2048, help="records per on_ring call (one drain)")
    ap.add_argument("--repeats", type=int, default=3, help="runs; the fastest is reported (noise only adds)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    arr = records(args.requests, args.conns, args.payload)
    runs = [run(arr, args.batch, args.profile) for _ in range(1 if args.profile else args.repeats)]
    res = dict(runs[0])
    for key in (
        "correlate_us_per_record",
        "export_us_per_span",
        "otlp_proto_us_per_span",
        "sdk_encode_spans_us_per_span",
    ):
        res[key] = min(r[key] for r in runs)
        res[key.replace("_us_", "_us_all_runs_")] = [r[key] for r in runs]
    per_request = 2 * res["correlate_us_per_record"] + res["export_us_per_span"]
    res["us_per_request"] = round(per_request, 2)
    res["requests_per_core_second"] = int(1e6 / per_request)
    print(json.dumps(res, indent=2))
    if args.out:
        args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, "result": res}, indent=2) + "\n")


if __name__ == "__main__":
    main()
