"""Socket addresses from /proc, for what syscall arguments do not say.

A connect() names the peer but not the local port the kernel picked; an
accept() names the peer but not the listener's port when the listener was
bound before the agent; a socket older than the agent says nothing at all.
``/proc/PID/fd/N`` gives the socket's inode and ``/proc/PID/net/tcp{,6}``
(the table of the process's network namespace) maps inodes to addresses, so
no kernel struct is ever read. Tables are cached per namespace and re-read
when an inode is missing from them.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass

TCP_LISTEN = 0x0A
#: A namespace's tables are re-read on a miss at most this often.
_REREAD_S = 0.002


@dataclass(frozen=True)
class TcpSocket:
    local: tuple[str, int]
    remote: tuple[str, int]
    state: int
    family: int  # socket.AF_INET or AF_INET6 (the table it was found in)


def fd_inode(pid: int, fd: int) -> int | None:
    """The socket inode behind a file descriptor, or None (gone, or not a socket)."""
    try:
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return None
    if target.startswith("socket:[") and target.endswith("]"):
        return int(target[8:-1])
    return None


def _ipv4(hex8: str) -> str:
    return socket.inet_ntop(socket.AF_INET, bytes.fromhex(hex8)[::-1])


def _ipv6(hex32: str) -> str:
    raw = b"".join(bytes.fromhex(hex32[i : i + 8])[::-1] for i in range(0, 32, 8))
    if raw[:12] == b"\0" * 10 + b"\xff\xff":
        return socket.inet_ntop(socket.AF_INET, raw[12:])  # IPv4-mapped: written as IPv4, as peers see it
    return socket.inet_ntop(socket.AF_INET6, raw)


def parse_tcp_table(text: str, family: int) -> dict[int, TcpSocket]:
    """inode -> socket, from the text of /proc/net/tcp or /proc/net/tcp6."""
    conv = _ipv4 if family == socket.AF_INET else _ipv6
    out: dict[int, TcpSocket] = {}
    for line in text.splitlines()[1:]:
        f = line.split()
        if len(f) < 10:
            continue
        laddr, lport = f[1].split(":")
        raddr, rport = f[2].split(":")
        inode = int(f[9])
        if inode:
            out[inode] = TcpSocket((conv(laddr), int(lport, 16)), (conv(raddr), int(rport, 16)), int(f[3], 16), family)
    return out


def address_from_raw(family: int, port: int, raw: bytes) -> tuple[str, int] | None:
    """A sockaddr's address as the kernel probe copied it (network order)."""
    if family == socket.AF_INET:
        return socket.inet_ntop(socket.AF_INET, raw[:4]), port
    if family == socket.AF_INET6:
        if raw[:12] == b"\0" * 10 + b"\xff\xff":
            return socket.inet_ntop(socket.AF_INET, raw[12:16]), port
        return socket.inet_ntop(socket.AF_INET6, raw[:16]), port
    return None


class TcpTables:
    """inode -> TcpSocket per network namespace, read lazily from /proc."""

    def __init__(self) -> None:
        self._tables: dict[str, dict[int, TcpSocket]] = {}
        self._read_at: dict[str, float] = {}

    def lookup(self, pid: int, inode: int) -> TcpSocket | None:
        try:
            netns = os.readlink(f"/proc/{pid}/ns/net")
        except OSError:
            return None
        table = self._tables.get(netns)
        if table is None or (inode not in table and time.monotonic() - self._read_at.get(netns, 0) > _REREAD_S):
            table = self._read(pid, netns)
        return table.get(inode) if table is not None else None

    def get(self, pid: int, inode: int) -> TcpSocket | None:
        """Like ``lookup``, from the table as last read (see ``refresh``)."""
        try:
            netns = os.readlink(f"/proc/{pid}/ns/net")
        except OSError:
            return None
        return self._tables.get(netns, {}).get(inode)

    def refresh(self, pids: set[int]) -> None:
        """Read the table of each network namespace these processes are in, once."""
        seen: set[str] = set()
        for pid in pids:
            try:
                netns = os.readlink(f"/proc/{pid}/ns/net")
            except OSError:
                continue
            if netns not in seen:
                seen.add(netns)
                self._read(pid, netns)

    def listening_ports(self, pid: int) -> set[int]:
        """Ports with a listening socket in the namespace of ``pid`` (as last read)."""
        try:
            netns = os.readlink(f"/proc/{pid}/ns/net")
        except OSError:
            return set()
        table = self._tables.get(netns) or self._read(pid, netns) or {}
        return {s.local[1] for s in table.values() if s.state == TCP_LISTEN}

    def _read(self, pid: int, netns: str) -> dict[int, TcpSocket] | None:
        table: dict[int, TcpSocket] = {}
        for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
            try:
                with open(f"/proc/{pid}/net/{name}") as f:
                    table.update(parse_tcp_table(f.read(), family))
            except OSError:
                continue
        self._tables[netns] = table
        self._read_at[netns] = time.monotonic()
        return table
