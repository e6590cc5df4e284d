"""TLS plaintext records (the tls receiver's ``tlsdata`` ring, bpf/tls.c) as connections of
their own, parsed like socket payloads.

A record is laid out as a socket record (``SOCK_RECORD_DTYPE``): ``func`` 1 for SSL_read, 2
for SSL_write, ``ret`` the bytes moved (0: the peer closed), ``fd`` the socket the call used
(-1 when none was seen: a memory BIO), the SSL pointer in the first 8 bytes of ``addr``.

The socket path sees the same connection's ciphertext: it infers ``tls`` from the handshake
and counts the bytes unparsed (``otelbpf.http.unparsed_bytes{protocol=tls}``), so nothing is
parsed twice. The plaintext gets a ``Conn`` of its own here, keyed by (pid, fd), or by (pid,
SSL pointer) without an fd; its addresses are the socket connection's when the sockets path
traces it, else read from /proc for the fd; its role (client or server) comes from its first
bytes. The two rings are drained separately, so a socket's close can be processed before the
last plaintext records written before it: a close only marks the TLS connection, which ends
two batches (of either ring) later (``sweep``), or at once when a newer record on the same fd
shows a new connection.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from otelbpf.families.http.sockets import Address, Conn

RING = "tlsdata"  # = otelbpf.families.tls.probes.RING (tests/families/tls check it)
#: TLS connections held at once; the oldest beyond are ended.
MAX_CONNS = 16384
#: Keys of connections without an fd live above every fd (fds are < 2**31).
_NO_FD = 1 << 32


class TlsConns:
    def __init__(
        self,
        socket_conn: Callable[[int, int], Conn | None],
        addresses: Callable[[int, int], tuple[Address | None, Address | None]],
        max_conns: int = MAX_CONNS,
    ) -> None:
        self._socket_conn = socket_conn
        self._addresses = addresses
        self._max = max_conns
        self._conns: OrderedDict[tuple[int, int], Conn] = OrderedDict()
        #: (pid, fd) -> (close time, batch number) of sockets closed while a TLS conn was open on them.
        self._closed: dict[tuple[int, int], tuple[int, int]] = {}
        self.batch = 0

    def __len__(self) -> int:
        return len(self._conns)

    def conn(self, pid: int, fd: int, ssl: int, ts: int) -> tuple[Conn, list[Conn]]:
        """The connection of a record at ``ts``, and those it ends (a new connection on a closed
        fd, the oldest beyond the bound)."""
        ended: list[Conn] = []
        key = (pid, fd) if fd >= 0 else (pid, _NO_FD | (ssl & 0xFFFFFFFFFFFF))
        conn = self._conns.get(key)
        closed = self._closed.get(key)
        if conn is not None and closed is not None and ts > closed[0]:
            ended.append(self._conns.pop(key))
            del self._closed[key]
            conn = None
        if conn is None:
            conn = self._new(pid, fd)
            self._conns[key] = conn
            while len(self._conns) > self._max:
                ended.append(self._conns.popitem(last=False)[1])
        else:
            self._conns.move_to_end(key)
        return conn, ended

    def _new(self, pid: int, fd: int) -> Conn:
        sock = self._socket_conn(pid, fd) if fd >= 0 else None
        if sock is not None:
            local, remote, role = sock.local, sock.remote, sock.role
        elif fd >= 0:
            (local, remote), role = self._addresses(pid, fd), None
        else:
            local, remote, role = None, None, None
        conn = Conn(pid, fd, role, local, remote, midstream=False)
        conn.tls = True
        return conn

    def socket_closed(self, pid: int, fd: int, ts: int) -> None:
        if (pid, fd) in self._conns:
            self._closed[(pid, fd)] = (ts, self.batch)

    def sweep(self) -> list[Conn]:
        """Connections whose socket closed at least two batches ago: every plaintext record
        written before the close has been processed."""
        done = [k for k, (_ts, batch) in self._closed.items() if self.batch - batch >= 2]
        out = []
        for key in done:
            del self._closed[key]
            conn = self._conns.pop(key, None)
            if conn is not None:
                out.append(conn)
        return out

    def forget_process(self, pid: int) -> list[Conn]:
        self._closed = {k: v for k, v in self._closed.items() if k[0] != pid}
        gone = [k for k in self._conns if k[0] == pid]
        return [self._conns.pop(k) for k in gone]
