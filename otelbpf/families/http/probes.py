"""The sockets probe family: syscall tracepoints for HTTP/1.x, HTTP/2 and gRPC.

The tracepoints in ``bpf/sockets.c`` attach themselves when the program
loads (no library to find). What is configurable is compiled in: the ports
(a generated ``port_wanted()``: comparisons, no map lookup on the hot path),
the payload bytes copied per call, and the ring's size.
"""

from __future__ import annotations

from otelbpf.base.events import SOCK_RECORD_DTYPE, SockFunc
from otelbpf.sensor.family import ProbeFamily, RingSpec, TailCall

RING = "sockdata"
#: Kernel maps user space writes into (see bpf/sockets.c): its verdicts on fds the kernel could
#: not classify (never ``sock_state`` itself), and the ports of listeners older than the agent.
VERDICT_MAP = "sock_verdict"
LISTEN_MAP = "listen_ports"
#: ``sock_state`` values a verdict gives.
TRACK, IGNORE = 1, 2


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
) -> ProbeFamily:
    """The family for the configured ports (empty: every TCP port). ``lib_users_only``: in
    host mode, only processes that opened a library another family probes (and their
    children) are traced; the others cost one map lookup per socket syscall. ``handoffs``:
    who woke whom among a traced process's threads (sched_wakeup, common.h), so that CUDA
    work handed to a pool thread is a child of the request that handed it."""
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
            *(("-DSOCK_LIB_USERS_ONLY=1",) if lib_users_only else ()),
            *(("-DHANDOFFS=1", f"-DHANDOFF_ENTRIES={HANDOFF_ENTRIES}") if handoffs else ()),
        ),
        rings=(RingSpec(RING, SOCK_RECORD_DTYPE, ring_bytes, variable=True),),
        tail_calls=(TailCall("sock_capture_prog", 0, "sock_capture"),),
    )
