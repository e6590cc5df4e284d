"""TLS plaintext records (the tls receiver's ``tlsdata`` ring, bpf/tls.c) as connections of
their own, parsed like socket payloads.

A record is laid out as a socket record (``SOCK_RECORD_DTYPE``): ``func`` 1 for SSL_read, 2
for SSL_write, ``ret`` the bytes moved (0: the peer closed), ``fd`` the socket the call used
(-1 when none was seen: a memory BIO), the SSL pointer in the first 8 bytes of ``addr``, with
the HTTP/1 head sampling's shift of its request in their top byte (bpf/tls.c ``tls_gate``:
kept with probability 2^-shift), which each record sets on its connection as a socket record's
flags do (``Conn.shift``), so that a kept span carries its sampling.

The socket path sees the same connection's ciphertext: it infers ``tls`` from the handshake
and counts the bytes unparsed (``otelbpf.http.unparsed_bytes{protocol=tls}``), so nothing is
parsed twice. The plaintext gets a ``Conn`` of its own here, keyed by (pid, fd), or by (pid,
SSL pointer) without an fd; its addresses are the socket connection's when the sockets path
traces it, else read from /proc for the fd (the role too: server when the process listens on
its local port), else its role comes from its first bytes (an h2 server writes its SETTINGS
before it reads anything: without the role, that first chunk could not be placed). The two
rings are drained separately, so a TLS record can come before the socket's accept or connect
record: the records of a connection neither path knows yet wait for the next batch of either
ring, or of the metrics collection when traffic stops (``wait``/``release``); a connection on
a port the http receiver does not trace is dropped; one whose socket close was processed
first (the whole connection in one drain) takes the closed socket's addresses. And a socket's
close can come before the last plaintext records written before it: a close only marks the TLS
connection, which ends two batches (of either ring) later (``sweep``), or at once when a newer
record on the same fd shows a new connection: one made after the close, or one whose kernel id
differs. That id (bpf/tls.c: a record's ``port`` and ``local_port``, the low and high 16 bits)
is new for each connection, so a closed fd reused at once is told apart even when the socket
ring has not yet told of the close: without it the next connection's preface was parsed as the
middle of the last one's (HTTP/2: every stream of both lost), and took the last one's addresses.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from otelbpf.families.http.sockets import Address, Conn

RING = "tlsdata"  # = otelbpf.families.tls.probes.RING (tests/families/tls check it)
#: The SSL pointer's bits in a record's ``addr`` (tls.probes.SSL_BITS); the shift sits above.
SSL_BITS = 56
#: TLS connections held at once; the oldest beyond are ended.
MAX_CONNS = 16384
#: Records held at once waiting for their connection's socket record (tls.py ``wait``).
MAX_WAITING = 65536
#: Closed sockets remembered for plaintext processed after their close.
MAX_RECENT = 4096
#: Keys of connections without an fd live above every fd (fds are < 2**31).
_NO_FD = 1 << 32


class TlsConns:
    def __init__(
        self,
        socket_conn: Callable[[int, int], Conn | None],
        describe: Callable[[int, int], tuple[str | None, Address | None, Address | None]],
        max_conns: int = MAX_CONNS,
        wanted: Callable[..., bool] = lambda *ports: True,
    ) -> None:
        self._socket_conn = socket_conn
        self._describe = describe
        self._max = max_conns
        self._conns: OrderedDict[tuple[int, int], Conn] = OrderedDict()
        #: (pid, fd) -> (close time, batch number) of sockets closed while a TLS conn was open on them.
        self._closed: dict[tuple[int, int], tuple[int, int]] = {}
        self._wanted = wanted
        #: Records of new connections the socket path has not reported yet, by (pid, fd): held
        #: until the next batch of either ring, so that its connect or accept record, drained
        #: later than them, gives their addresses and role (a short-lived client's /proc is gone).
        self._waiting: dict[tuple[int, int], list[Any]] = {}
        self._waiting_n = 0
        #: (pid, fd)s on ports the http receiver does not trace: their plaintext is dropped.
        self._unwanted: set[tuple[int, int]] = set()
        #: Sockets the socket path saw closed lately, by (pid, fd): (close time, its Conn), for
        #: plaintext processed after the close (the whole connection in one drain).
        self._recent: OrderedDict[tuple[int, int], tuple[int, Conn]] = OrderedDict()
        self.batch = 0

    def wait(self, pid: int, fd: int, item: Any, ts: int = 0, tls_id: int = 0) -> bool:
        """Hold ``item`` (a record at ``ts`` of the kernel's connection ``tls_id``) if it belongs to
        a connection that neither path knows yet."""
        if fd < 0:
            return False
        key = (pid, fd)
        held = self._waiting.get(key)
        if held is None:
            if self._waiting_n >= MAX_WAITING or self._known(key, ts, tls_id):
                return False
            held = self._waiting[key] = []
        held.append(item)
        self._waiting_n += 1
        return True

    def _known(self, key: tuple[int, int], ts: int, tls_id: int) -> bool:
        """Whether a record on ``key`` belongs to a connection one of the paths has told of."""
        tls = self._conns.get(key)
        if tls is not None and (not tls_id or not tls.tls_id or tls.tls_id == tls_id):
            return True  # a connection parsed already
        sock = self._socket_conn(*key)
        if sock is not None:
            return tls is None or sock is not tls.origin  # else the last connection's, not yet closed
        recent = self._recent.get(key)
        return recent is not None and ts <= recent[0]  # written before that socket's close

    def release(self) -> list[Any]:
        """Every record held, each connection's in order."""
        if not self._waiting:
            return []
        out = [item for held in self._waiting.values() for item in held]
        self._waiting.clear()
        self._waiting_n = 0
        return out

    @property
    def waiting(self) -> bool:
        return bool(self._waiting)

    def unwanted(self, pid: int, fd: int) -> bool:
        return (pid, fd) in self._unwanted

    def __len__(self) -> int:
        return len(self._conns)

    def conn(self, pid: int, fd: int, ssl: int, ts: int, tls_id: int = 0) -> tuple[Conn | None, list[Conn]]:
        """The connection of a record at ``ts`` (None: on a port not traced), and those it ends (a
        new connection on a closed fd, the oldest beyond the bound). ``ssl``: the record's first
        ``addr`` bytes, the SSL pointer with the record's sampling shift on top (set on the
        connection for the request it belongs to); ``tls_id``: the kernel's id of its connection."""
        ended: list[Conn] = []
        shift, ssl = ssl >> SSL_BITS, ssl & ((1 << SSL_BITS) - 1)
        key = (pid, fd) if fd >= 0 else (pid, _NO_FD | (ssl & 0xFFFFFFFFFFFF))
        conn = self._conns.get(key)
        closed = self._closed.get(key)
        stale = None  # the socket connection the ended one came from, if the socket path still has it
        if conn is not None and (
            (closed is not None and ts > closed[0]) or (tls_id and conn.tls_id and tls_id != conn.tls_id)
        ):
            ended.append(self._conns.pop(key))
            self._closed.pop(key, None)
            stale, conn = conn.origin, None
        if conn is None:
            conn = self._new(pid, fd, ts, stale)
            if conn is None:
                self._unwanted.add((pid, fd))
                return None, ended
            conn.tls_id = tls_id
            self._conns[key] = conn
            while len(self._conns) > self._max:
                ended.append(self._conns.popitem(last=False)[1])
        else:
            self._conns.move_to_end(key)
        conn.shift = shift
        return conn, ended

    def _new(self, pid: int, fd: int, ts: int, stale: Conn | None = None) -> Conn | None:
        sock = self._socket_conn(pid, fd) if fd >= 0 else None
        if sock is not None and sock is stale:
            sock = None  # the last connection on this fd, its close not processed yet
        recent = self._recent.get((pid, fd)) if sock is None and fd >= 0 else None
        if recent is not None and ts <= recent[0]:
            sock = recent[1]  # a connection whose socket's close was processed first
            self._closed[(pid, fd)] = (recent[0], self.batch)
        if sock is not None:
            local, remote, role = sock.local, sock.remote, sock.role
        elif fd >= 0:
            role, local, remote = self._describe(pid, fd)
            if local is not None and remote is not None and not self._wanted(local[1], remote[1]):
                return None
        else:
            local, remote, role = None, None, None
        return Conn(pid, fd, role, local, remote, midstream=False, tls=True, origin=sock)

    def socket_closed(self, pid: int, fd: int, ts: int, sock: Conn | None = None) -> None:
        """The socket path saw (pid, fd) closed at ``ts``; ``sock``: its connection, if it traced it."""
        self._unwanted.discard((pid, fd))
        if sock is not None:
            self._recent[(pid, fd)] = (ts, sock)
            self._recent.move_to_end((pid, fd))
            while len(self._recent) > MAX_RECENT:
                self._recent.popitem(last=False)
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
        self._unwanted = {k for k in self._unwanted if k[0] != pid}
        for key in [k for k in self._recent if k[0] == pid]:
            del self._recent[key]
        gone = [k for k in self._conns if k[0] == pid]
        return [self._conns.pop(k) for k in gone]
