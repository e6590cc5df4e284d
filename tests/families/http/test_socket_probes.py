"""The sockets family's program, loaded by BCC at the smallest and largest payload sizes, fed by
real TCP syscalls of a child process (the agent's own pid is never traced, and the loader is
the agent here): every record carries exactly the bytes its syscall moved, up to the payload
size, in a record as long as what it carries."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest

from harness import cached_load
from otelbpf.base.events import Kind, SockFunc, Stat
from otelbpf.families.http.probes import IGNORE, TRACK, socket_family
from otelbpf.families.http.sockets import Connections
from otelbpf.sensor import program
from otelbpf.sensor.ringbuf import VariableRingReader

pytestmark = pytest.mark.bpf

RING = 1 << 20
PENDING_STATE = 3  # SK_PENDING in sockets.c: set by the kernel only
#: Waits for a line on stdin (its pid is watched by then), then talks TCP to itself and prints
#: what each syscall moved: [fd, SockFunc, hex] in order.
EXCHANGE = r"""
import json, socket, sys
MESSAGE = bytes(range(256)) * 40  # 10,240 bytes: longer than the largest payload
SENDTO, RECVFROM, SENDMSG = 5, 6, 7
sys.stdin.readline()
moved = []
with socket.create_server(("127.0.0.1", 0)) as server:
    client = socket.create_connection(server.getsockname())
    conn, _ = server.accept()
    with client, conn:
        for size in (1, 100, len(MESSAGE)):
            client.sendall(MESSAGE[:size])  # send() is sendto(2)
            moved.append((client.fileno(), SENDTO, MESSAGE[:size].hex()))
            got = b""
            while len(got) < size:
                chunk = conn.recv(size - len(got))  # recvfrom(2)
                moved.append((conn.fileno(), RECVFROM, chunk.hex()))
                got += chunk
        parts = [b"GET / HTTP/1.1\r\n", b"Host: x\r\n", b"\r\n", MESSAGE[:300]]
        sent = conn.sendmsg(parts)  # several iovecs
        moved.append((conn.fileno(), SENDMSG, b"".join(parts)[:sent].hex()))
        moved.append((client.fileno(), RECVFROM, client.recv(sent).hex()))
print(json.dumps(moved))
"""


class Loaded:
    def __init__(self, payload: int, *, place_tail_calls: bool = True, cached: bool = False) -> None:
        self.family = socket_family([], payload_bytes=payload, ring_bytes=RING)
        text, cflags = program.build([self.family], filter_pids=True, events_ring_bytes=64 << 10)
        # loads every tracepoint: the verifier's say
        self.bpf = cached_load.load(text, cflags, [self.family] if place_tail_calls else [], cached=cached)
        self.ring = VariableRingReader(self.bpf[b"sockdata"].map_fd, RING, self.family.rings[0].dtype)

    def watch(self, pid: int) -> None:
        watched = self.bpf[b"watched"]
        watched[watched.Key(pid)] = watched.Leaf(1)

    def close(self) -> None:
        self.ring.close()
        self.bpf.cleanup()


@pytest.fixture(params=[(64, False), (8192, False), (64, True)], ids=["payload64", "payload8192", "payload64-cached"])
def loaded(request: pytest.FixtureRequest) -> Iterator[tuple[int, Loaded]]:
    payload, cached = request.param
    prog = Loaded(payload, cached=cached)
    try:
        yield payload, prog
    finally:
        prog.close()


def test_records_carry_exactly_the_bytes_each_syscall_moved(loaded: tuple[int, Loaded]) -> None:
    payload, prog = loaded
    _, moved, mine = _exchange(prog)
    data = mine[mine["kind"] == Kind.SOCK_DATA]
    got = [(int(r["fd"]), int(r["func"]), int(r["ret"]), int(r["cap"]), r["data"]) for r in data]
    assert [(fd, func) for fd, func, _ in moved] == [(fd, func) for fd, func, *_ in got]
    assert {func for _, func, _ in moved} == {SockFunc.sendto, SockFunc.recvfrom, SockFunc.sendmsg}
    for (_, _, bytes_moved), (_, _, ret, cap, captured) in zip(moved, got):
        assert ret == len(bytes_moved)
        assert cap == min(ret, payload) == len(captured)
        assert captured == bytes_moved[:cap]
    assert {Kind.SOCK_CONNECT, Kind.SOCK_ACCEPT} <= {int(k) for k in mine["kind"]}


def _exchange(prog: Loaded) -> tuple[int, list[tuple[int, int, bytes]], np.ndarray]:
    """Run EXCHANGE watched: its pid, what it says each syscall moved, the records of its fds."""
    child = subprocess.Popen([sys.executable, "-c", EXCHANGE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    prog.watch(child.pid)
    out, _ = child.communicate("go\n", timeout=60)
    assert child.returncode == 0
    moved = [(fd, func, bytes.fromhex(h)) for fd, func, h in json.loads(out)]
    recs = prog.ring.drain()
    mine = recs[(recs["pid"] == child.pid) & np.isin(recs["fd"], sorted({fd for fd, _, _ in moved}))]
    return child.pid, moved, mine


def test_the_loading_process_is_never_traced_until_agent_self_says_otherwise(loaded: tuple[int, Loaded]) -> None:
    """The agent's own exports are HTTP and gRPC: the pid in ``agent_self`` (set by
    program.load to its caller's) is skipped even when watched. Cleared, it is traced."""
    import ctypes
    import os
    import socket

    _, prog = loaded
    prog.watch(os.getpid())
    self_map = prog.bpf[b"agent_self"]

    def exchange() -> np.ndarray:
        prog.ring.drain()
        with socket.create_server(("127.0.0.1", 0)) as server, socket.create_connection(server.getsockname()) as client:
            conn, _ = server.accept()
            with conn:
                client.sendall(b"GET / HTTP/1.1\r\n\r\n")
                conn.recv(100)
        recs = prog.ring.drain()
        return recs[recs["pid"] == os.getpid()]

    try:
        assert self_map[ctypes.c_int(0)].value == os.getpid()
        assert len(exchange()) == 0
        self_map[ctypes.c_int(0)] = ctypes.c_uint32(0)
        assert (exchange()["kind"] == Kind.SOCK_DATA).any()
    finally:
        self_map[ctypes.c_int(0)] = ctypes.c_uint32(os.getpid())


def test_exits_before_the_capture_is_in_place_are_counted_lost() -> None:
    """The data exits tail-call the capture program, which user space places right after the
    compile: a call returning before that is counted lost, never captured from stale
    arguments, and the next calls are captured once it is in place."""
    prog = Loaded(64, place_tail_calls=False)
    try:
        stats = prog.bpf[b"stats"]

        def lost() -> int:
            return sum(stats[stats.Key(Stat.SOCK_LOST)])

        _, moved, mine = _exchange(prog)
        assert not (mine["kind"] == Kind.SOCK_DATA).any()
        assert lost() >= len(moved)  # every data call of the exchange, at least
        assert {Kind.SOCK_CONNECT, Kind.SOCK_ACCEPT} <= {int(k) for k in mine["kind"]}  # no tail call: unaffected

        program.place_tail_calls(prog.bpf, [prog.family])
        before = lost()
        _, moved, mine = _exchange(prog)
        data = mine[mine["kind"] == Kind.SOCK_DATA]
        assert [(int(r["fd"]), int(r["func"])) for r in data] == [(fd, func) for fd, func, _ in moved]
        assert lost() == before
    finally:
        prog.close()


#: Reads a file, closes it, then connects on the same fd number, each step on a line from stdin:
#: what a library loaded between two requests does to the next request's connection.
REUSE = r"""
import os, socket, sys
server = socket.create_server(("127.0.0.1", 0))
sys.stdin.readline()
fd = os.open(sys.executable, os.O_RDONLY)
os.read(fd, 16)  # the first I/O on an fd number the kernel has not classified
print(fd, flush=True)
sys.stdin.readline()
os.read(fd, 16)  # user space's verdict on it is in by now
os.close(fd)
print(fd, flush=True)
sys.stdin.readline()
client = socket.create_connection(server.getsockname())  # the lowest free number: the file's
conn, _ = server.accept()
print(client.fileno(), flush=True)
sys.stdin.readline()
client.sendall(b"GET /after HTTP/1.1\r\nHost: x\r\n\r\n")
conn.recv(100)
print("done", flush=True)
"""


def test_a_verdict_is_taken_only_by_the_fd_state_it_answers() -> None:
    """User space answers an unclassified fd a drain later. Its answer on a file read and closed
    by then must not silence the connection that reuses the number: a stale IGNORE written
    straight into ``sock_state`` lost one client span in three in CI (the frontend's driver
    library, loaded between two of its calls to the backend)."""
    prog = Loaded(64)
    child = subprocess.Popen([sys.executable, "-c", REUSE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        state = prog.bpf[b"sock_state"]

        def update(name: str, items: list[tuple[int, int]]) -> None:
            table = prog.bpf[name.encode()]
            for k, v in items:
                table[table.Key(k)] = table.Leaf(v)

        def step() -> str:
            assert child.stdin is not None and child.stdout is not None
            child.stdin.write("\n")
            child.stdin.flush()
            return child.stdout.readline().strip()

        conns = Connections([], update)
        prog.watch(child.pid)
        fd = int(step())
        recs = prog.ring.drain()
        unknown = recs[(recs["pid"] == child.pid) & (recs["fd"] == fd) & (recs["kind"] == Kind.SOCK_UNKNOWN)]
        assert len(unknown) == 1
        conns.prepare([(child.pid, fd)])
        assert conns.unknown(child.pid, fd, int(unknown["ts_ns"][0])) is None  # a file: ignored
        conns.flush()
        key = state.Key((child.pid << 32) | fd)
        assert state[key].state == PENDING_STATE  # taken at the fd's next call
        assert int(step()) == fd
        assert state[key].state == IGNORE

        # The same answer again, now stale: the number is a new connection by the time it lands.
        conns.unknown(child.pid, fd, int(unknown["ts_ns"][0]))
        assert int(step()) == fd  # connected: the kernel marked it TRACK
        conns.flush()
        assert step() == "done"
        recs = prog.ring.drain()
        sent = recs[(recs["pid"] == child.pid) & (recs["fd"] == fd) & (recs["kind"] == Kind.SOCK_DATA)]
        assert [bytes(r["data"][: r["cap"]]) for r in sent] == [b"GET /after HTTP/1.1\r\nHost: x\r\n\r\n"[:64]]
        assert state[key].state == TRACK
    finally:
        child.kill()
        child.wait()
        prog.close()
