"""The sockets probe family: syscall tracepoints for HTTP/1.x, HTTP/2 and gRPC.

The tracepoints in ``bpf/sockets.c`` attach themselves when the program
loads (no library to find). What is configurable is compiled in: the ports
(a generated ``port_wanted()``: comparisons, no map lookup on the hot path),
the payload bytes copied per call, and the ring's size.
"""

from __future__ import annotations

from otelbpf.base.events import SOCK_RECORD_DTYPE, SOCKF_SHIFT_BIT, SockFunc
from otelbpf.correlate.metrics import DURATION_BOUNDS
from otelbpf.sensor.family import ProbeFamily, RingSpec, TailCall

RING = "sockdata"
#: Kernel maps user space writes into (see bpf/sockets.c): its verdicts on fds the kernel could
#: not classify (never ``sock_state`` itself), and the ports of listeners older than the agent.
VERDICT_MAP = "sock_verdict"
LISTEN_MAP = "listen_ports"
#: ``sock_state`` values a verdict gives.
TRACK, IGNORE = 1, 2
#: HTTP/1 head sampling (bpf/sockets.c http_gate): user space writes the shift (requests kept
#: with probability 2^-shift), the stamp of the last data record it processed and the backlog
#: past which requests are shed; the kernel counts its decisions and the shed requests.
SAMPLING_MAP = "http_sampling"
SAMPLING_SHIFT, SAMPLING_PROCESSED, SAMPLING_BACKLOG = 0, 1, 2
DECISIONS_MAP = "http_decisions"
#: http_decisions slots, as otelbpf.http.sampled's ``decision``: kept; shed by the draw; shed for
#: the backlog; shed and not counted (http_red full); kept, then shed because its first record
#: found the ring full (also in ``kept``); a client request shed with the server request its
#: thread was serving.
DECISIONS = ("kept", "probability", "backlog", "red_map_full", "ring_full", "parent")
RED_MAP = "http_red"
#: The programs in sock_capture_prog, by slot: the capture every data call's exit hands over,
#: and HTTP/2's (bpf/h2_frames.h H2_PROG_*).
TAIL_CALLS = ("sock_capture", "h2_capture", "h2_walk", "h2_blocks", "h2_ends")
#: HTTP/2 streams counted in the kernel (bpf/h2_frames.h): by process, end, gRPC or not, method,
#: :status, grpc-status, how the stream ended, duration bucket; and the walk's own counts.
H2_RED_MAP = "h2_red"
H2_STATS_MAP = "h2_stats"
#: h2_stats slots (H2S_* in h2_frames.h), as otelbpf.http.problems' ``reason`` (but the switches,
#: ``switched`` and ``switched_backlog``: otelbpf.http.h2.counted_connections counts them as announced).
H2_STATS = (
    "switched",
    "h2_walk_desync",
    "h2_walk_steps",
    "h2_not_settings",
    "h2_stream_table_full",
    "h2_stream_untracked",
    "h2_red_map_full",
    "h2_announce_lost",
    "switched_backlog",
)
#: h2_red_key.end: the response's END_STREAM, a RST_STREAM, the connection's close.
H2_ENDS = ("", "ended", "reset", "closed")
#: Connections whose HTTP/2 frames the kernel follows, and streams it holds (LRU maps).
H2_CONN_ENTRIES, H2_STREAM_ENTRIES = 16384, 65536
#: The most the kernel will shed: 1 request in 2^20 kept.
MAX_SHIFT = 20
#: HM_* in sockets.c, by index.
METHODS = ("", "GET", "POST", "PUT", "DELETE", "HEAD", "PATCH", "OPTIONS", "CONNECT", "TRACE", "QUERY")
#: Bits of a data record's flags that hold its request's sampling shift.
SHIFT_BIT, SHIFT_MASK = SOCKF_SHIFT_BIT, 0x1F


def bounds_c() -> tuple[str, str, str]:
    """The RED histograms' bounds for the kernel's buckets (ns): the same as the spans' (metrics.py).
    As an array initializer, and as ``HTTP_BOUND(i)``, a conditional that folds to a constant for
    a constant ``i`` (no array on the stack)."""
    ns = [f"{round(b * 1e9)}ULL" for b in DURATION_BOUNDS]
    chain = "".join(f"(i) == {i} ? {b} : " for i, b in enumerate(ns)) + "0ULL"
    return (
        f"-DHTTP_BUCKETS={len(DURATION_BOUNDS)}",
        "-DHTTP_BOUNDS_NS={" + ",".join(ns) + "}",
        f"-DHTTP_BOUND(i)=({chain})",
    )


def verdict(ts_ns: int, state: int) -> int:
    """A ``sock_verdict`` value: ``state`` for the fd's state the kernel set at ``ts_ns`` (the
    time in the record that reported it), ignored if the fd has been set again since."""
    return ((ts_ns & 0xFFFFFFFF) << 8) | state


#: iovecs copied per readv/writev/sendmsg/recvmsg (gRPC gives every header of a
#: HEADERS frame an iovec of its own: ~20 for one small request).
MAX_IOV = 64
#: Bounds of the payload copied per call: a power of two (the BPF code masks
#: offsets with it) whose scratch record fits the 32 KiB per-CPU value limit.
MIN_PAYLOAD, MAX_PAYLOAD = 64, 8192
#: Threads whose last wake-up is kept (an LRU: the threads of traced processes woken lately).
HANDOFF_ENTRIES = 16384


def port_filter_c(ports: list[int]) -> str:
    """``port_wanted(port)``: true for every port when ``ports`` is empty."""
    test = " || ".join(f"port == {int(p)}" for p in sorted(set(ports))) or "1"
    return f"static __always_inline int port_wanted(u16 port)\n{{\n    return {test};\n}}\n"


def socket_family(
    ports: list[int],
    *,
    payload_bytes: int,
    ring_bytes: int,
    state_entries: int = 65536,
    lib_users_only: bool = False,
    handoffs: bool = False,
    backlog_bytes: int = 0,
    min_shift: int = 0,
) -> ProbeFamily:
    """The family for the configured ports (empty: every TCP port). ``lib_users_only``: in
    host mode, only processes that opened a library another family probes (and their
    children) are traced; the others cost one map lookup per socket syscall. ``handoffs``:
    who woke whom among a traced process's threads (sched_wakeup, common.h), so that CUDA
    work handed to a pool thread is a child of the request that handed it. ``backlog_bytes``:
    records waiting for user space past which HTTP/1 requests are shed (0: half the ring);
    ``min_shift``: requests are kept with probability 2^-min_shift at most (sampling.py); both
    compiled in, so that they hold from the first request, before user space writes its own."""
    if payload_bytes & (payload_bytes - 1) or not MIN_PAYLOAD <= payload_bytes <= MAX_PAYLOAD:
        raise ValueError(f"payload size must be a power of two in [{MIN_PAYLOAD}, {MAX_PAYLOAD}], got {payload_bytes}")
    assert int(SockFunc.close) == 12  # SF_* in sockets.c
    return ProbeFamily(
        name="sockets",
        c_file="sockets.c",
        libraries=(),
        generated_c=port_filter_c(ports),
        cflags=(
            f"-DSOCK_PAYLOAD={payload_bytes}",
            f"-DSOCK_RING_PAGES={ring_bytes // 4096}",
            f"-DSOCK_STATE_ENTRIES={state_entries}",
            f"-DSOCK_MAX_IOV={MAX_IOV}",
            *bounds_c(),
            f"-DSOCK_BACKLOG_BYTES={backlog_bytes or ring_bytes // 2}",
            f"-DSAMPLING_MIN_SHIFT={min_shift}",
            f"-DH2_CONN_ENTRIES={H2_CONN_ENTRIES}",
            f"-DH2_STREAM_ENTRIES={H2_STREAM_ENTRIES}",
            *(("-DSOCK_LIB_USERS_ONLY=1",) if lib_users_only else ()),
            *(("-DHANDOFFS=1", f"-DHANDOFF_ENTRIES={HANDOFF_ENTRIES}") if handoffs else ()),
        ),
        rings=(RingSpec(RING, SOCK_RECORD_DTYPE, ring_bytes, variable=True, cut=True),),
        tail_calls=tuple(TailCall("sock_capture_prog", i, name) for i, name in enumerate(TAIL_CALLS)),
        counting_maps=(RED_MAP, H2_RED_MAP),
    )
