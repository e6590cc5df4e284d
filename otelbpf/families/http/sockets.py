"""Traced connections: which (pid, fd) is which TCP connection, seen from which end.

The kernel classifies sockets it sees created (connect, accept); this table
finishes the job it cannot do without reading kernel structs, and writes the
answers back into its maps:
- an fd the kernel had never seen (EV_SOCK_UNKNOWN: a socket older than the
  agent, or a file) is looked up in /proc: a TCP socket on a wanted port is
  traced from now on as a connection *joined mid-stream*, anything else is
  ignored;
- an accept() on a listener bound before the agent is traced provisionally;
  the listener's port is looked up, written back for the next accepts, and
  the connection dropped if the port is not wanted;
- both ends' addresses are looked up so that a client and a server on this
  host can recognise the two ends of one connection.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from otelbpf.families.http.netaddr import TCP_LISTEN, TcpTables, address_from_raw, fd_inode
from otelbpf.families.http.probes import IGNORE, LISTEN_MAP, TRACK, VERDICT_MAP, verdict

Address = tuple[str, int]
#: When a chunk was read (http.py's Stamp): (syscall start ns, its end ns, thread id).
Stamp = tuple[int, int, int]


@dataclass
class Conn:
    pid: int
    fd: int
    role: str | None  # "server" (accepted), "client" (connected), None: decided by the bytes
    local: Address | None
    remote: Address | None
    midstream: bool  # traced from the middle: its beginning was not seen
    protocol: str | None = None  # http1 | http2 | tls | unknown, once inferred
    session: Any = None  # the protocol parser
    #: Chunks that came before the protocol was known: (egress, payload, bytes missing after it, stamp).
    pending: list[tuple[bool, bytes, int, Stamp]] = field(default_factory=list)
    #: A connection joined midway: bytes came that are no HTTP/2 server's first (nothing more is held).
    pending_done: bool = False
    ended: bool = False  # EOF or an error was seen
    last_stamp: Stamp = (0, 0, 0)  # of the last chunk parsed
    reported: dict[str, int] = field(default_factory=dict)  # parser problems already counted, by reason
    #: The span attributes naming both ends, and what they were derived from (Host header, role, addresses):
    #: derived once per connection rather than per request (see HttpCorrelator._host_attrs).
    ends_attrs: tuple[tuple[str | None, str | None, Address | None, Address | None], dict[str, Any]] | None = None
    tls: bool = False  # the plaintext of a TLS connection (the tls receiver's records, tls.py)
    #: A TLS connection's: the kernel's id for it (0: none given), and the socket path's
    #: connection its addresses came from (tls.py tells a reused fd's next connection by them).
    tls_id: int = 0
    origin: Conn | None = None
    #: The kernel's head sampling of the request whose records came last: kept with probability 2^-shift.
    shift: int = 0
    #: The last record was written by a thread serving an HTTP/1 request the kernel shed
    #: (SOCKF_SERVING_SHED): the HTTP/2 streams it opens are shed with it.
    serving_shed: bool = False


class Connections:
    def __init__(self, ports: list[int], update_map: Callable[[str, list[tuple[int, int]]], None]) -> None:
        self._ports = set(ports)
        self._update_map = update_map
        self._tables = TcpTables()
        self._conns: dict[tuple[int, int], Conn] = {}
        #: fds traced provisionally and then rejected: records already in flight for them are dropped.
        self._rejected: set[tuple[int, int]] = set()
        self._prepared: dict[tuple[int, int], int | None] = {}  # this batch's unclassified fds -> inode
        self._writes: dict[str, list[tuple[int, int]]] = {VERDICT_MAP: [], LISTEN_MAP: []}

    def wanted(self, *ports: int) -> bool:
        return not self._ports or any(p in self._ports for p in ports)

    def get(self, pid: int, fd: int) -> Conn | None:
        return self._conns.get((pid, fd))

    def rejected(self, pid: int, fd: int) -> bool:
        return (pid, fd) in self._rejected

    def __len__(self) -> int:
        return len(self._conns)

    # -- records ---------------------------------------------------------------

    def connected(self, pid: int, fd: int, family: int, port: int, raw_addr: bytes) -> Conn:
        """The remote address is connect()'s argument; the local one follows (EV_SOCK_LOCAL)."""
        self._rejected.discard((pid, fd))
        remote = address_from_raw(family, port, raw_addr)
        if remote is None:
            remote = self._addresses(pid, fd)[1]
        conn = Conn(pid, fd, "client", None, remote, midstream=False)
        self._conns[(pid, fd)] = conn
        return conn

    def accepted(
        self,
        pid: int,
        fd: int,
        listen_fd: int,
        family: int,
        peer_port: int,
        raw_addr: bytes,
        local_port: int,
        listener_known: bool,
        ts: int,
    ) -> Conn | None:
        """``ts``: the record's time, which names the provisional state a verdict answers."""
        self._rejected.discard((pid, fd))
        if not listener_known:
            learned = self._learn_listener(pid, listen_fd)
            if learned is not None and not self.wanted(learned):
                self._write(VERDICT_MAP, pid, fd, verdict(ts, IGNORE))
                self._rejected.add((pid, fd))
                return None
            self._write(VERDICT_MAP, pid, fd, verdict(ts, TRACK))  # the kernel stops asking
            local_port = learned or 0  # 0: unknown, looked up in /proc below
        # The peer is accept()'s argument and the local port the listener's; /proc only when
        # the caller passed no address buffer or the listener's port is unknown.
        remote = address_from_raw(family, peer_port, raw_addr)
        local: Address | None = ("", local_port) if local_port else None
        if remote is None or local is None:
            found_local, found_remote = self._addresses(pid, fd)
            remote, local = remote or found_remote, local or found_local
        conn = Conn(pid, fd, "server", local, remote, midstream=False)
        self._conns[(pid, fd)] = conn
        return conn

    def prepare(self, unknown: list[tuple[int, int]]) -> None:
        """Look a batch's unclassified fds up together: every fd first, then each network
        namespace's socket table once, read after them, so that a socket already in an fd is
        in the table consulted for it (a table read earlier could miss it and mark a TCP
        socket ignored)."""
        self._prepared = {key: fd_inode(*key) for key in unknown}
        self._tables.refresh({pid for (pid, _), inode in self._prepared.items() if inode is not None})

    def unknown(self, pid: int, fd: int, ts: int) -> Conn | None:
        """First I/O on an fd the kernel had not classified (reported at ``ts``): trace it or not."""
        if (pid, fd) in self._prepared:
            inode = self._prepared.pop((pid, fd))
            sock = self._tables.get(pid, inode) if inode is not None else None
        else:
            inode = fd_inode(pid, fd)
            sock = self._tables.lookup(pid, inode) if inode is not None else None
        if sock is None or sock.state == TCP_LISTEN or not self.wanted(sock.local[1], sock.remote[1]):
            self._write(VERDICT_MAP, pid, fd, verdict(ts, IGNORE))
            return None
        self._write(VERDICT_MAP, pid, fd, verdict(ts, TRACK))
        role = "server" if sock.local[1] in self._tables.listening_ports(pid) else "client"
        conn = Conn(pid, fd, role, sock.local, sock.remote, midstream=True)
        self._conns[(pid, fd)] = conn
        return conn

    def joined(self, pid: int, fd: int) -> Conn:
        """Data on a traced fd whose beginning was lost (its control record was dropped)."""
        local, remote = self._addresses(pid, fd)
        conn = Conn(pid, fd, None, local, remote, midstream=True)
        self._conns[(pid, fd)] = conn
        return conn

    def closed(self, pid: int, fd: int) -> Conn | None:
        return self._conns.pop((pid, fd), None)

    def forget_process(self, pid: int) -> list[Conn]:
        self._rejected = {k for k in self._rejected if k[0] != pid}
        gone = [k for k in self._conns if k[0] == pid]
        return [self._conns.pop(k) for k in gone]

    def flush(self) -> None:
        """Write the batch's decisions into the kernel maps."""
        for name, items in self._writes.items():
            if items:
                self._update_map(name, items)
                items.clear()

    # -- lookups ---------------------------------------------------------------

    def describe(self, pid: int, fd: int) -> tuple[str | None, Address | None, Address | None]:
        """(role, local, remote) of a process's TCP socket, from /proc: ``server`` when its local
        port is one the process listens on (as ``unknown`` decides); all None when not TCP."""
        inode = fd_inode(pid, fd)
        sock = self._tables.lookup(pid, inode) if inode is not None else None
        if sock is None:
            return None, None, None
        role = "server" if sock.local[1] in self._tables.listening_ports(pid) else "client"
        return role, sock.local, sock.remote

    def _addresses(self, pid: int, fd: int) -> tuple[Address | None, Address | None]:
        inode = fd_inode(pid, fd)
        sock = self._tables.lookup(pid, inode) if inode is not None else None
        return (sock.local, sock.remote) if sock else (None, None)

    def _learn_listener(self, pid: int, listen_fd: int) -> int | None:
        inode = fd_inode(pid, listen_fd)
        sock = self._tables.lookup(pid, inode) if inode is not None else None
        if sock is None:
            return None
        family = socket.AF_INET if sock.family == socket.AF_INET else socket.AF_INET6
        self._write(LISTEN_MAP, pid, listen_fd, (int(family) << 16) | sock.local[1])
        return sock.local[1]

    def _write(self, name: str, pid: int, fd: int, value: int) -> None:
        self._writes[name].append(((pid << 32) | (fd & 0xFFFFFFFF), value))
