"""Memory one hostile connection makes the agent hold, measured with tracemalloc.

    .venv/bin/python bench/hostile_memory.py [--scale 1.0] [--only NAME,...] [--out FILE]

Each scenario sends, through the real ``HttpCorrelator`` as socket records (tests/harness/hostile.py),
what issue 13 row 4 found held without bound, on one connection of one process:
- ``pipelined``: 1M HTTP/1 requests pipelined, never answered;
- ``open_streams``: 1M HTTP/2 streams opened (HEADERS), never ended;
- ``continuation``: one header block of 100 MB of CONTINUATION frames;
- ``hpack_table``: SETTINGS_HEADER_TABLE_SIZE of 4 GiB, then a table size update to 1 GiB and
  10k distinct 1 KiB headers indexed into it;
- ``grpc_routes``: 60k gRPC calls, each on its own path (one metric series per route).
Reports, per scenario, the bytes still allocated once it is over (the connection still open: what
it holds; the four source files that allocated most of it) and the peak while it ran
(``tracemalloc``, Python allocations: numpy and the parser's buffers included; records are
delivered in batches of 2,048 as the agent drains them; spans within the default budget of 20,000
per second, counted and let go as the exporter takes them), with the problems counted. ``--scale``
multiplies every count (0.1 to compare with an older tree in reasonable time).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[0] = str(ROOT)
sys.path.append(str(ROOT / "tests"))

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402

from hpack import Encoder  # noqa: E402

from harness.hostile import Wire, continuation, grpc_call, h2_connection, headers_frame, settings  # noqa: E402
from otelbpf.families.http.protocols.http2 import PREFACE  # noqa: E402

#: Records per ring batch, as the agent drains them (the 16 MiB ring holds ~4k of 4 KiB).
BATCH = 2048


def pipelined(w: Wire, n: int) -> None:
    request = b"GET /a HTTP/1.1\r\nHost: x\r\nUser-Agent: flood\r\n\r\n"
    w.accept(10)
    per_read = 100
    for _ in range(0, n, per_read):
        w.client_sent(10, request * per_read)
    w.flush()


def open_streams(w: Wire, n: int) -> None:
    enc = Encoder()
    w.accept(10)
    w.client_sent(10, PREFACE + settings())
    per_read = 100
    for first in range(0, n, per_read):
        frames = []
        for sid in range(2 * first + 1, 2 * (first + per_read) + 1, 2):
            block = enc.encode(
                [
                    (":method", "POST"),
                    (":scheme", "http"),
                    (":path", "/svc.S/M"),
                    (":authority", "a"),
                    ("content-type", "application/grpc"),
                ]
            )
            frames.append(headers_frame(block, sid))
        w.client_sent(10, b"".join(frames))
    w.flush()


def continuation_flood(w: Wire, n: int) -> None:
    """``n`` MB of CONTINUATION (frames of 16 KiB, the default maximum)."""
    w.accept(10)
    block = Encoder().encode([(":method", "GET"), (":path", "/"), (":scheme", "http"), (":authority", "a")])
    w.client_sent(10, PREFACE + settings() + headers_frame(block, 1, end_headers=False))
    frame = continuation(b"\0" * 16_000, 1)
    per_read = 64
    for _ in range(0, n * 1_000_000 // 16_000, per_read):
        w.client_sent(10, frame * per_read)
    w.flush()


def hpack_table(w: Wire, n: int) -> None:
    """A table allowed 4 GiB by the server's SETTINGS, then ``n`` distinct 1 KiB headers indexed."""
    enc = Encoder()
    enc.header_table_size = 1 << 30
    w.accept(10)
    w.client_sent(10, PREFACE + settings())
    w.server_sent(10, settings(header_table_size=(1 << 32) - 1))
    for sid in range(1, 2 * n, 2):
        block = enc.encode([(":method", "GET"), (":path", "/"), (f"x-h{sid}", "v" * 1000)])
        w.client_sent(10, headers_frame(block, sid, end_stream=True))
    w.flush()


def grpc_routes(w: Wire, n: int) -> None:
    """``n`` unary calls, one after another, each on its own path."""
    ec, es = Encoder(), Encoder()
    c2s, s2c = h2_connection([])
    w.accept(10)
    w.client_sent(10, c2s)
    w.server_sent(10, s2c)
    for i in range(n):
        c, s = grpc_call(ec, es, 2 * i + 1, path=f"/svc.S{i}/M")
        w.client_sent(10, c)
        w.server_sent(10, s)
    w.flush()
    w.correlator.collect()


SCENARIOS = {
    "pipelined": (pipelined, 1_000_000),
    "open_streams": (open_streams, 1_000_000),
    "continuation": (continuation_flood, 100),
    "hpack_table": (hpack_table, 10_000),
    "grpc_routes": (grpc_routes, 60_000),
}


def measure(name: str, scale: float) -> dict:
    fn, n = SCENARIOS[name]
    n = max(1, int(n * scale))
    # Spans leave with the exporter (its queue is bounded on its own); the agent's default span budget.
    w = Wire(keep_spans=False, batch=BATCH, correlator_options={"max_spans_per_second": 20_000})
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    t0 = time.process_time()
    fn(w, n)
    cpu = time.process_time() - t0
    gc.collect()
    held, peak = tracemalloc.get_traced_memory()
    by_file = tracemalloc.take_snapshot().statistics("filename")
    tracemalloc.stop()
    top = {Path(st.traceback[0].filename).name: round(st.size / 1e6, 2) for st in by_file[:4]}
    return {
        "scenario": name,
        "n": n,
        "held_mb": round((held - base) / 1e6, 2),
        "peak_mb": round((peak - base) / 1e6, 2),
        "cpu_s": round(cpu, 1),
        "spans": w.spans_made,
        "problems": w.problems(),
        "routes_folded": w.count("otelbpf.http.routes_folded"),
        "held_by_file_mb": top,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--only", default=",".join(SCENARIOS))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    results = []
    for name in args.only.split(","):
        results.append(measure(name, args.scale))
        print(json.dumps(results[-1]), flush=True)
    if args.out:
        args.out.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
