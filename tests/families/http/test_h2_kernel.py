"""HTTP/2 in the kernel (bpf/h2_frames.h): the sockets program loaded alone with a small ring, fed
by a child process that talks HTTP/2 to itself over loopback with frames crafted byte by byte
(both ends traced), so that what the kernel counts when the ring overflows can be checked
stream by stream: statuses from the static table, plain and Huffman literals, gRPC trailers
(plain, Huffman, a dynamic-table reference the kernel cannot resolve), resets, a stream open
at the close; and the frame walk's edge cases: a frame header split across two writes, 40
frames in one write, DATA frames read in many small pieces, iovecs that cut a frame header,
garbage after the preface."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Iterator

import numpy as np
import pytest

from harness import cached_load
from otelbpf.base.events import Kind
from otelbpf.families.http.probes import H2_ENDS, H2_STATS, socket_family
from otelbpf.sensor import program
from otelbpf.sensor.ringbuf import VariableRingReader

pytestmark = pytest.mark.bpf

SERVER, CLIENT = 1, 2  # SK_ROLE_*
GET, POST = 1, 2  # HM_*

#: The child: an HTTP/2 client and server on one loopback connection, driven a step per line
#: on stdin (it prints one line per step). argv: the ring filler's size in bytes (0: none).
SCENARIO = r"""
import socket, sys, time

def fr(t, f, s, p=b""):
    return len(p).to_bytes(3, "big") + bytes([t, f]) + s.to_bytes(4, "big") + p

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST, SETTINGS, PING, WINDOW = 0, 1, 3, 4, 6, 8
END_STREAM, END_HEADERS = 0x1, 0x4
GET, POST = b"\x82\x86\x84", b"\x83\x86\x84"
GRPC_STATUS_5 = b"\x40\x0bgrpc-status\x015"

def step(what):
    print(what, flush=True)
    sys.stdin.readline()

def read_exactly(sock, n, chunk):
    got = b""
    while len(got) < n:
        part = sock.recv(min(chunk, n - len(got)))
        assert part, "closed"
        got += part
    return got

lsock = socket.create_server(("127.0.0.1", 0))
client = socket.create_connection(lsock.getsockname())
server, _ = lsock.accept()

def fill(n):
    # another traced connection whose records fill the ring (never drained): 4 KiB writes, then
    # 1-byte ones for the room they leave (a 73-byte record must not fit)
    a = socket.create_connection(lsock.getsockname())
    b, _ = lsock.accept()
    for _ in range(n // 4096):
        a.sendall(b"x" * 4096)
        read_exactly(b, 4096, 4096)
    for _ in range(4096 // 64):
        a.sendall(b"x")
        read_exactly(b, 1, 1)
    a.close()
    b.close()

def exchange(request, response, *, chunk=65536, writes=None):
    # the client writes the request, the server reads it, writes the response (whole, or in
    # the pieces ``writes`` cuts it in), the client reads it ``chunk`` bytes at a time
    client.sendall(request)
    read_exactly(server, len(request), 65536)
    for piece in writes or [response]:
        if isinstance(piece, list):
            server.sendmsg(piece)  # iovecs
        else:
            server.sendall(piece)
    read_exactly(client, len(response), chunk)

step("connected")
filler = int(sys.argv[1])
if filler:
    fill(filler)
step("filled")
server.sendall(fr(SETTINGS, 0, 0))  # a server's SETTINGS, before it read the preface
client.sendall(PREFACE + fr(SETTINGS, 0, 0))
read_exactly(server, 24 + 9, 65536)
read_exactly(client, 9, 65536)
get = lambda s: fr(HEADERS, END_STREAM | END_HEADERS, s, GET)
ok = lambda s, block: fr(HEADERS, END_HEADERS, s, block) + fr(DATA, END_STREAM, s, b"ok")
# 1: GET, 200 from the static table, a DATA frame ends it
exchange(get(1), ok(1, b"\x88"))
# 3: POST with a body, 404 from the static table on a HEADERS frame that ends it
exchange(fr(HEADERS, END_HEADERS, 3, POST) + fr(DATA, END_STREAM, 3, b"body"), fr(HEADERS, 5, 3, b"\x8d"))
# 5: 503 as a plain literal with an indexed name (:status)
exchange(get(5), ok(5, b"\x48\x03503"))
# 7: 201 as a Huffman literal, never indexed
exchange(get(7), fr(HEADERS, END_STREAM | END_HEADERS, 7, b"\x18\x82\x10\x03"))
# 9: reset by the server
exchange(fr(HEADERS, END_STREAM | END_HEADERS, 9, GET), fr(RST, 0, 9, (2).to_bytes(4, "big")))
# 11: the response's first frame header split across two writes
resp = fr(HEADERS, END_HEADERS, 11, b"\x88") + fr(DATA, END_STREAM, 11, b"ok")
exchange(fr(HEADERS, END_STREAM | END_HEADERS, 11, GET), resp, writes=[resp[:4], resp[4:]])
# 13: 40 frames in one write
resp = b"".join(fr(WINDOW, 0, 0, b"\x00\x00\x01\x00") for _ in range(20))
resp += b"".join(fr(PING, 0, 0, bytes(8)) for _ in range(18))
resp += fr(HEADERS, END_HEADERS, 13, b"\x88") + fr(DATA, END_STREAM, 13, b"ok")
exchange(fr(HEADERS, END_STREAM | END_HEADERS, 13, GET), resp)
# 15: six 16 KiB DATA frames, read 1000 bytes at a time
body = b"".join(fr(DATA, END_STREAM if i == 5 else 0, 15, bytes(16384)) for i in range(6))
exchange(fr(HEADERS, END_STREAM | END_HEADERS, 15, GET), fr(HEADERS, END_HEADERS, 15, b"\x88") + body, chunk=1000)
# 17: iovecs that cut frame headers (as sendmsg from gRPC's encoder does with header blocks)
h, d = fr(HEADERS, END_HEADERS, 17, b"\x8e"), fr(DATA, END_STREAM, 17, b"ok")
exchange(fr(HEADERS, END_STREAM | END_HEADERS, 17, GET), h + d, writes=[[h[:5], h[5:] + d[:3], d[3:]]])
# gRPC from here on: a connection that carried a gRPC call counts all its calls as gRPC
grpc_req = lambda s: fr(HEADERS, END_HEADERS, s, POST) + fr(DATA, END_STREAM, s, b"\x00\x00\x00\x00\x02hi")
grpc_resp = lambda s, trailers: (fr(HEADERS, END_HEADERS, s, b"\x88") + fr(DATA, 0, s, b"\x00\x00\x00\x00\x02hi")
                                 + fr(HEADERS, END_STREAM | END_HEADERS, s, trailers))
# 19: the first gRPC call, known by its request's content-type (a literal with a new name, as
# gRPC's encoder sends it), answered trailers-only with a grpc-status the kernel cannot read
ctype = b"\x40\x0ccontent-type\x10application/grpc"
exchange(fr(HEADERS, END_HEADERS, 19, POST + ctype) + fr(DATA, END_STREAM, 19, b"\x00\x00\x00\x00\x02hi"),
         fr(HEADERS, END_STREAM | END_HEADERS, 19, b"\x88\xbe"))
# 21: gRPC, grpc-status 14 with a Huffman name and value
exchange(grpc_req(21), grpc_resp(21, b"\x00\x88\x9a\xca\xc8\xb2\x12\x34\xda\x8f\x82\x0b\x5f"))
# 23: gRPC, grpc-status from the dynamic table: unknown
exchange(grpc_req(23), grpc_resp(23, b"\xbe"))
# 25: gRPC, a trailers-only error: :status and grpc-status in one block
exchange(grpc_req(25), fr(HEADERS, END_STREAM | END_HEADERS, 25, b"\x88" + GRPC_STATUS_5))
# 27: gRPC trailers whose literal's name and value are iovecs of their own
tr = GRPC_STATUS_5
head = fr(HEADERS, END_HEADERS, 27, b"\x88") + fr(DATA, 0, 27, b"\x00\x00\x00\x00\x02hi")
th = fr(HEADERS, END_STREAM | END_HEADERS, 27, tr)
exchange(grpc_req(27), head + th, writes=[[head, th[:9], tr[:2], tr[2:13], tr[13:]]])
# 29: open when the connection closes
client.sendall(fr(HEADERS, END_STREAM | END_HEADERS, 29, GET))
read_exactly(server, 9 + 3, 65536)
# garbage after the preface, on a connection of its own
g = socket.create_connection(lsock.getsockname())
gs, _ = lsock.accept()
g.sendall(PREFACE + b"hello, this is not HTTP/2 at all")
read_exactly(gs, 24 + 32, 65536)
g.close()
gs.close()
client.close()
server.close()
step("done")
"""

#: What SCENARIO's streams end as, on each end: (method, :status, grpc, grpc-status, how).
EXPECTED = {
    1: (GET, 200, 0, None, "ended"),
    3: (POST, 404, 0, None, "ended"),
    5: (GET, 503, 0, None, "ended"),
    7: (GET, 201, 0, None, "ended"),
    9: (GET, 0, 0, None, "reset"),
    11: (GET, 200, 0, None, "ended"),
    13: (GET, 200, 0, None, "ended"),
    15: (GET, 200, 0, None, "ended"),
    17: (GET, 500, 0, None, "ended"),
    19: (POST, 200, 1, None, "ended"),
    21: (POST, 200, 1, 14, "ended"),
    23: (POST, 200, 1, None, "ended"),
    25: (POST, 200, 1, 5, "ended"),
    27: (POST, 200, 1, 5, "ended"),
}


class Loaded:
    def __init__(self, ring: int) -> None:
        self.family = socket_family([], payload_bytes=4096, ring_bytes=ring)
        text, cflags = program.build([self.family], filter_pids=True, events_ring_bytes=64 << 10)
        self.bpf = cached_load.load(text, cflags, [self.family], cached=False)
        self.ring = VariableRingReader(self.bpf[b"sockdata"].map_fd, ring, self.family.rings[0].dtype)

    def watch(self, pid: int) -> None:
        watched = self.bpf[b"watched"]
        watched[watched.Key(pid)] = watched.Leaf(1)

    def counted(self, pid: int) -> Counter:
        """h2_red of ``pid``: (role, method, status, grpc, grpc-status, how) -> streams."""
        out: Counter = Counter()
        for k, v in self.bpf[b"h2_red"].items():
            if k.pid == pid:
                code = int(k.code) - 1 if k.code else None
                out[(int(k.role), int(k.method), int(k.status), int(k.grpc), code, H2_ENDS[k.end])] += int(v.count)
        return out

    def stats(self) -> dict[str, int]:
        table = self.bpf[b"h2_stats"]
        return {name: int(sum(table[table.Key(i)])) for i, name in enumerate(H2_STATS)}

    def close(self) -> None:
        self.ring.close()
        self.bpf.cleanup()


@pytest.fixture(scope="module")
def small() -> Iterator[Loaded]:
    prog = Loaded(16 << 10)
    try:
        yield prog
    finally:
        prog.close()


class Child:
    def __init__(self, prog: Loaded, filler: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SCENARIO, str(filler)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        prog.watch(self.proc.pid)
        self.pid = self.proc.pid

    def step(self, expect: str) -> None:
        assert self.proc.stdout is not None and self.proc.stdin is not None
        assert self.proc.stdout.readline().strip() == expect
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def finish(self) -> None:
        self.step("done")
        assert self.proc.wait(timeout=30) == 0


def expected_counts() -> Counter:
    out: Counter = Counter()
    for role in (SERVER, CLIENT):
        for method, status, grpc, code, how in EXPECTED.values():
            out[(role, method, status, grpc, code, how)] += 1
        out[(role, 0, 0, 1, None, "closed")] += 1  # stream 29, open at the close (a gRPC connection's)
    return out


def test_a_connection_whose_records_never_fit_is_counted_stream_by_stream(small: Loaded) -> None:
    """The ring is full before the preface: both ends switch to counting at their first call, and
    every stream of the scenario is counted in the kernel, once per end, as it ended."""
    before = small.stats()
    child = Child(small, 64 << 10)
    try:
        child.step("connected")
        child.step("filled")
        child.finish()
    finally:
        child.proc.kill()
    got = small.counted(child.pid)
    want = expected_counts()
    assert got == want, (sorted((got - want).items(), key=str), sorted((want - got).items(), key=str))
    stats = {k: v - before[k] for k, v in small.stats().items()}
    # both ends of the scenario's connection, both of the garbage one (which then desyncs): the
    # ring full, or the backlog past its limit (nothing drains it here)
    assert stats["switched"] + stats["switched_backlog"] == 4, stats
    assert stats["h2_walk_desync"] == 2, stats
    assert stats["h2_walk_steps"] == stats["h2_stream_untracked"] == stats["h2_red_map_full"] == 0, stats
    small.ring.drain()


def test_with_room_in_the_ring_nothing_is_counted_in_the_kernel() -> None:
    """The same scenario with a ring it fits in: every record goes to the ring, the kernel counts
    nothing, switches nothing, and forgets every stream that ended."""
    prog = Loaded(1 << 20)
    child = Child(prog, 0)
    try:
        child.step("connected")
        child.step("filled")
        child.finish()
        assert prog.counted(child.pid) == Counter()
        stats = prog.stats()
        assert stats["switched"] == stats["switched_backlog"] == 0, stats
        assert stats["h2_walk_desync"] == 2, stats  # the garbage connection's ends
        records = prog.ring.drain()
        mine = records[records["pid"] == child.pid]
        assert not (mine["kind"] == Kind.SOCK_COUNTED).any()
        assert int(sum(prog.bpf[b"stats"][prog.bpf[b"stats"].Key(4)])) == 0  # STAT_SOCK_LOST
        left = [k for k in prog.bpf[b"h2_streams"] if k.conn >> 32 == child.pid]
        assert len(left) <= 2  # stream 29's, on each end (its close forgets the connection, not them)
    finally:
        child.proc.kill()
        prog.close()


def test_a_stream_begun_before_the_switch_is_counted_from_its_start(tmp_path) -> None:
    """Records fit until a stream's request is in; the ring then fills, and the response's write
    and read do not fit: both ends switch, count the stream from its request's time, announce the
    switch at their next call once there is room, and send nothing more of the connection."""
    prog = Loaded(16 << 10)
    child = subprocess.Popen([sys.executable, "-c", SWITCH], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        prog.watch(child.pid)

        def wait(expect: str) -> None:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == expect

        def go() -> None:
            assert child.stdin is not None
            child.stdin.write("\n")
            child.stdin.flush()

        wait("ready")
        go()
        wait("requested")
        before = prog.ring.drain()
        fds = {int(f) for f in before["fd"][(before["pid"] == child.pid) & (before["kind"] == Kind.SOCK_DATA)]}
        assert len(fds) == 2  # the preface and the request reached the ring, both ends
        go()
        wait("answered")  # the filler filled the ring, then the response was written and read
        prog.ring.drain()
        go()
        wait("pinged")  # a call on each end, with room: the announcements
        after = prog.ring.drain()
        go()
        wait("done")
        go()
        assert child.wait(timeout=30) == 0
        mine = after[(after["pid"] == child.pid) & np.isin(after["fd"], sorted(fds))]
        assert sorted(int(f) for f in mine["fd"][mine["kind"] == Kind.SOCK_COUNTED]) == sorted(fds)
        assert not (mine["kind"] == Kind.SOCK_DATA).any()  # nothing more of a counted connection
        got = prog.counted(child.pid)
        assert got == Counter({(SERVER, GET, 200, 0, None, "ended"): 1, (CLIENT, GET, 200, 0, None, "ended"): 1})
        for k, v in prog.bpf[b"h2_red"].items():
            if k.pid == child.pid:
                assert v.min_ns >= 50_000_000  # the 50 ms between request and response
    finally:
        child.kill()
        prog.close()


#: Request, then (a line later) the ring filled by another connection and the response, then a
#: PING each way once the test has drained the ring.
SWITCH = r"""
import socket, sys, time
def fr(t, f, s, p=b""):
    return len(p).to_bytes(3, "big") + bytes([t, f]) + s.to_bytes(4, "big") + p
def step(what):
    print(what, flush=True)
    sys.stdin.readline()
def read_exactly(sock, n):
    got = b""
    while len(got) < n:
        got += sock.recv(n - len(got))
    return got
lsock = socket.create_server(("127.0.0.1", 0))
client = socket.create_connection(lsock.getsockname())
server, _ = lsock.accept()
step("ready")
req = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + fr(4, 0, 0) + fr(1, 5, 1, b"\x82\x86\x84")
client.sendall(req)
read_exactly(server, len(req))
step("requested")
time.sleep(0.05)
a = socket.create_connection(lsock.getsockname())
b, _ = lsock.accept()
for _ in range(16):
    a.sendall(b"x" * 4096)
    read_exactly(b, 4096)
for _ in range(64):  # the room 4 KiB records leave
    a.sendall(b"x")
    read_exactly(b, 1)
resp = fr(4, 0, 0) + fr(1, 4, 1, b"\x88") + fr(0, 1, 1, b"ok")
server.sendall(resp)
read_exactly(client, len(resp))
step("answered")
client.sendall(fr(6, 0, 0, bytes(8)))
read_exactly(server, 17)
server.sendall(fr(6, 1, 0, bytes(8)))
read_exactly(client, 17)
step("pinged")
client.close()
server.close()
step("done")
"""


#: An HTTP/2 server thread that, while serving each of 64 streams, makes an HTTP/1 call on
#: another connection: the kernel decides the stream (h2_keep) and the call inherits it.
INHERIT = r"""
import socket, sys
def fr(t, f, s, p=b""):
    return len(p).to_bytes(3, "big") + bytes([t, f]) + s.to_bytes(4, "big") + p
def read_exactly(sock, n):
    got = b""
    while len(got) < n:
        got += sock.recv(n - len(got))
    return got
h2l = socket.create_server(("127.0.0.1", 0))
h1l = socket.create_server(("127.0.0.1", 0))
client = socket.create_connection(h2l.getsockname())
server, _ = h2l.accept()
up = socket.create_connection(h1l.getsockname())  # the server thread's HTTP/1 upstream
back, _ = h1l.accept()
sys.stdin.readline()
client.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + fr(4, 0, 0))
read_exactly(server, 33)
server.sendall(fr(4, 0, 0))
read_exactly(client, 9)
for s in range(1, 129, 2):
    req = fr(1, 5, s, b"\x82\x86\x84")
    client.sendall(req)
    read_exactly(server, len(req))  # the stream is read: the thread serves it
    call = b"GET /s%d HTTP/1.1\r\nHost: x\r\n\r\n" % s
    up.sendall(call)  # made while serving it
    read_exactly(back, len(call))
    back.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    read_exactly(up, 38)
    resp = fr(1, 5, s, b"\x88")
    server.sendall(resp)  # answered: the thread is done with it
    read_exactly(client, len(resp))
print(up.fileno(), server.fileno(), flush=True)
"""


def test_a_server_stream_is_decided_in_the_kernel_and_its_thread_serves_the_decision() -> None:
    """At 1/4, each HTTP/2 server stream is kept or shed in the kernel as sampling.h2_keep says
    (the connection's sequence: its accept record's time, which the record carries; the shift: its
    record's flags); the HTTP/1 call its thread makes meanwhile is kept or shed with it (only the
    kept ones' reach the ring), as a call made while serving an HTTP/1 request is."""
    from otelbpf.base.events import SOCKF_H2_DECIDED, SockFunc
    from otelbpf.families.http.probes import SAMPLING_MAP, SAMPLING_SHIFT, SHIFT_BIT, SHIFT_MASK
    from otelbpf.families.http.sampling import h2_keep

    prog = Loaded(1 << 20)
    sampling = prog.bpf[SAMPLING_MAP.encode()]
    sampling[sampling.Key(SAMPLING_SHIFT)] = sampling.Leaf(2)
    child = subprocess.Popen([sys.executable, "-c", INHERIT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        prog.watch(child.pid)
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write("\n")
        child.stdin.flush()
        up_fd, server_fd = map(int, child.stdout.readline().split())
        assert child.wait(timeout=30) == 0
        recs = prog.ring.drain()
        mine = recs[recs["pid"] == child.pid]
        [accept] = mine[(mine["kind"] == Kind.SOCK_ACCEPT) & (mine["fd"] == server_fd)]
        seq = int(accept["ts_ns"]) & 0xFFFFFFFF
        reads = mine[(mine["kind"] == Kind.SOCK_DATA) & (mine["fd"] == server_fd) & (mine["func"] == SockFunc.recvfrom)]
        stream_reads = [r for r in reads if int(r["ret"]) == 12]  # a request HEADERS frame each
        assert len(stream_reads) == 64
        assert all(int(r["flags"]) & SOCKF_H2_DECIDED for r in stream_reads)
        assert {int(r["port"]) | int(r["local_port"]) << 16 for r in stream_reads} == {seq}  # for user space
        assert {(int(r["flags"]) >> SHIFT_BIT) & SHIFT_MASK for r in stream_reads} == {2}
        expected = [f"/s{s}" for s in range(1, 129, 2) if h2_keep(seq, s, 2)]
        calls = mine[(mine["kind"] == Kind.SOCK_DATA) & (mine["fd"] == up_fd) & (mine["func"] == SockFunc.sendto)]
        got = [bytes(r["data"][: r["cap"]]).split(b" ")[1].decode() for r in calls]
        assert got == expected
        assert 0 < len(expected) < 64  # 1/4 of 64: P(none or all) < 1e-7
    finally:
        child.kill()
        prog.close()


#: An HTTP/2 server thread that reads its streams two at a time, then one whose HEADERS come in
#: two reads, then one on a connection it closes unanswered; an HTTP/1 call per stream it serves.
#: Driven a step per line on stdin (the test moves the shift between steps).
MULTIPLEX = r"""
import socket, sys, threading
def fr(t, f, s, p=b""):
    return len(p).to_bytes(3, "big") + bytes([t, f]) + s.to_bytes(4, "big") + p
def read_exactly(sock, n):
    got = b""
    while len(got) < n:
        got += sock.recv(n - len(got))
    return got
def step(what):
    print(what, flush=True)
    sys.stdin.readline()
GET = b"\x82\x86\x84"
h2l = socket.create_server(("127.0.0.1", 0))
h1l = socket.create_server(("127.0.0.1", 0))
up = socket.create_connection(h1l.getsockname())  # the server thread's HTTP/1 upstream
back, _ = h1l.accept()
def upstream():  # on a thread of its own: what it serves is not the HTTP/2 thread's
    buf = b""
    while True:
        data = back.recv(4096)
        if not data:
            return
        buf += data
        while b"\r\n\r\n" in buf:
            buf = buf.split(b"\r\n\r\n", 1)[1]
            back.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
threading.Thread(target=upstream, daemon=True).start()
def call(path):
    up.sendall(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path)
    read_exactly(up, 38)
def connect():
    client = socket.create_connection(h2l.getsockname())
    server, _ = h2l.accept()
    client.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + fr(4, 0, 0))
    read_exactly(server, 33)
    server.sendall(fr(4, 0, 0))
    read_exactly(client, 9)
    return client, server
client, server = connect()
step("%d %d" % (up.fileno(), server.fileno()))
for s in range(1, 129, 4):  # two streams in one read, both served before either is answered
    reqs = fr(1, 5, s, GET) + fr(1, 5, s + 2, GET)
    client.sendall(reqs)
    read_exactly(server, len(reqs))
    call(b"/pair%d" % s)
    call(b"/pair%d" % (s + 2))
    resp = fr(1, 5, s, b"\x88") + fr(1, 5, s + 2, b"\x88")
    server.sendall(resp)
    read_exactly(client, len(resp))
for s in range(129, 161, 2):  # the frame header and a byte of the block, then the rest
    req = fr(1, 5, s, GET)
    client.sendall(req)
    step("first")
    read_exactly(server, 10)
    step("second")
    read_exactly(server, 2)
    call(b"/split%d" % s)
    resp = fr(1, 5, s, b"\x88")
    server.sendall(resp)
    read_exactly(client, len(resp))
step("close")
client2, server2 = connect()
req = fr(1, 5, 1, GET)
client2.sendall(req)
read_exactly(server2, len(req))
server2.close()  # unanswered: the thread is done with it
call(b"/after_close")
step("done")
"""


def test_a_thread_serving_several_streams_keeps_a_kept_ones_calls_and_decides_where_the_headers_began() -> None:
    """The kernel's threads serving HTTP/2 streams, where HTTP/2 differs from HTTP/1:
    - two streams read in one call, served together (a thread serving several streams): the HTTP/1
      calls made meanwhile are kept when either stream was kept (a kept stream's children are
      never shed), shed with them only when both were shed;
    - a request whose HEADERS frame comes in two reads, the shift moved from 1/2 to 2^-20 between
      them: decided at the shift of the read that carried the frame header (its record's flags),
      where user space takes it too (Stream.mark);
    - a shed stream whose connection the thread closes unanswered: the thread is done with it, and
      its next call draws on its own instead of being shed with it."""
    from otelbpf.base.events import SOCKF_H2_DECIDED, SockFunc
    from otelbpf.families.http.probes import (
        DECISIONS,
        DECISIONS_MAP,
        SAMPLING_BACKLOG,
        SAMPLING_MAP,
        SAMPLING_SHIFT,
        SHIFT_BIT,
        SHIFT_MASK,
    )
    from otelbpf.families.http.sampling import h2_keep

    prog = Loaded(1 << 20)
    sampling = prog.bpf[SAMPLING_MAP.encode()]

    def shift(k: int) -> None:
        sampling[sampling.Key(SAMPLING_SHIFT)] = sampling.Leaf(k)

    sampling[sampling.Key(SAMPLING_BACKLOG)] = sampling.Leaf(1 << 40)  # the ring is read at the end
    shift(2)
    child = subprocess.Popen(
        [sys.executable, "-c", MULTIPLEX], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        prog.watch(child.pid)
        assert child.stdin is not None and child.stdout is not None

        def step(expect: str | None = None, then_shift: int | None = None) -> str:
            """The child's next step (its line), the shift moved before it goes on."""
            line = child.stdout.readline().strip()
            assert expect is None or line == expect, line
            if then_shift is not None:
                shift(then_shift)
            child.stdin.write("\n")
            child.stdin.flush()
            return line

        up_fd, server_fd = map(int, step().split())
        for _ in range(129, 161, 2):
            step("first", then_shift=1)
            step("second", then_shift=20)
        step("close")  # still 2^-20: the call after the close is shed by its own draw
        step("done")
        assert child.wait(timeout=30) == 0
        recs = prog.ring.drain()
        table = prog.bpf[DECISIONS_MAP.encode()]
        parent = int(sum(table[table.Key(DECISIONS.index("parent"))]))
    finally:
        child.kill()
        prog.close()
    mine = recs[recs["pid"] == child.pid]
    [accept] = mine[(mine["kind"] == Kind.SOCK_ACCEPT) & (mine["fd"] == server_fd)]
    seq = int(accept["ts_ns"]) & 0xFFFFFFFF
    reads = mine[(mine["kind"] == Kind.SOCK_DATA) & (mine["fd"] == server_fd) & (mine["func"] == SockFunc.recvfrom)]
    decided = [r for r in reads if int(r["ret"]) in (24, 10, 2)]
    assert all(int(r["flags"]) & SOCKF_H2_DECIDED for r in decided)
    assert {int(r["port"]) | int(r["local_port"]) << 16 for r in decided} == {seq}  # user space's h2_keep's
    calls = mine[(mine["kind"] == Kind.SOCK_DATA) & (mine["fd"] == up_fd) & (mine["func"] == SockFunc.sendto)]
    got = [bytes(r["data"][: r["cap"]]).split(b" ")[1].decode() for r in calls]

    pairs = [(s, s + 2) for s in range(1, 129, 4)]
    either = [p for p in pairs if h2_keep(seq, p[0], 2) or h2_keep(seq, p[1], 2)]
    assert 0 < len(either) < len(pairs)  # 7/16 shed, 32 pairs: P(none or all) < 1e-7
    split_shifts = [(int(r["flags"]) >> SHIFT_BIT) & SHIFT_MASK for r in reads if int(r["ret"]) in (10, 2)]
    assert split_shifts == [1, 20] * 16  # the frame header's read at 1/2, the block's end at 2^-20
    split = [s for s in range(129, 161, 2) if h2_keep(seq, s, 1)]
    assert split != [s for s in range(129, 161, 2) if h2_keep(seq, s, 20)]  # P(equal) = 2^-16

    expected = [f"/pair{s}" for p in either for s in p] + [f"/split{s}" for s in split]
    assert got == expected  # "/after_close": drawn at 2^-20, not kept
    # shed with their stream: both calls of each pair with both shed, each split one shed; not the
    # call after the close
    assert parent == 2 * (len(pairs) - len(either)) + (16 - len(split))
