"""The tls probe family: uprobes on OpenSSL's ``SSL_read``/``SSL_write`` (and ``_ex``).

A library is probed when its file name is a libssl's (``libssl.so.3``, ``libssl.so.1.1``, a
wheel's ``libssl-1b2c3d4e.so.3``) *and* its exported functions are OpenSSL's: ``SSL_read`` and
``SSL_write`` with ``SSL_get_fd``, ``SSL_CTX_new`` and ``OPENSSL_init_ssl`` (1.1 and later)
or ``SSL_library_init`` (1.0). A file with that name that is something else (a shim exporting
an ``SSL_read`` of its own) is left alone and counted (``rejected_libraries``): the probes
read the call's arguments as OpenSSL's, and another library's could mean anything.

The fd of each call comes from the socket syscall made inside it (bpf/tls.c); the program
that sees those syscalls is attached here, after the load, to the data syscalls' sys_enter
tracepoints (the sockets family owns the ``TRACEPOINT_PROBE`` names for them).

HTTP/1 requests over TLS are head-sampled in the kernel as plain ones are (bpf/tls.c
``tls_gate``, on sockets.c's maps and functions: the family's C follows sockets.c's, ``after``):
kept with the http receiver's probability, shed while the agent is more than ``backlog_bytes``
behind this family's own ring, shed ones counted in the kernel into the same RED series.
User space hands the kernel the stamp of the last record it processed (``PROCESSED_MAP``,
the correlator), and reads each kept record's shift from its ``addr`` (families/http/tls.py).
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

from otelbpf.base.events import SOCK_RECORD_DTYPE
from otelbpf.sensor import elf
from otelbpf.sensor.family import LibraryKind, ProbeAt, ProbeFamily, RingSpec

log = logging.getLogger(__name__)

RING = "tlsdata"
STATS_MAP = "tls_stats"
#: ``tls_stats`` slots (TLS_STAT_* in bpf/tls.c), by the reason they are exported with.
STATS = ("records", "lost", "no_data", "nested", "map_full", "no_fd", "bad_read", "stale", "shed")
#: Where user space writes the stamp of the last tlsdata record it processed (slot 0).
PROCESSED_MAP = "tls_processed"
#: A record's ``addr``: the SSL pointer (its low 56 bits) and its request's sampling shift (the
#: top byte) in bytes 0-8, the record's stamp (the ring's bytes written up to it) in bytes 8-16.
SSL_BITS, STAMP_OFFSET = 56, 8
#: ``sock_rec.flags`` bits of TLS records (TLSF_* in bpf/tls.c).
TLSF_FD_CACHED, TLSF_NO_FD = 1, 2

ENTRY_PROGRAMS = {
    "SSL_read": "uprobe_ssl_read",
    "SSL_write": "uprobe_ssl_write",
    "SSL_read_ex": "uprobe_ssl_read_ex",
    "SSL_write_ex": "uprobe_ssl_write_ex",
}
RET_PROGRAM = "uretprobe_ssl"
#: SSL_free's entry: a connection's end (a shed request still open is counted, its state goes).
FREE_SYMBOL, FREE_PROGRAM = "SSL_free", "uprobe_ssl_free"
SYSCALL_PROGRAM = "tls_sys_enter"
SYSCALLS = ("read", "write", "readv", "writev", "recvfrom", "sendto", "recvmsg", "sendmsg")
#: On close()'s entry: the end of the connection of the SSL that used the socket.
CLOSE_PROGRAM = "tls_sys_close"

#: libssl.so, libssl.so.3, libssl.so.1.1, a wheel's libssl-<hash>.so.3 (auditwheel, delocate).
LIBRARY = re.compile(r"^libssl(-[0-9a-f]{8,})?\.so(\.[0-9]+)*$")
_REQUIRED = ("SSL_read", "SSL_write", "SSL_get_fd", "SSL_CTX_new")
_ANY_OF = ("OPENSSL_init_ssl", "SSL_library_init")

#: Bounds of the plaintext copied per call (a power of two; the scratch record fits 32 KiB).
MIN_PAYLOAD, MAX_PAYLOAD = 64, 8192


class Rejected:
    """libssl-named files that are not OpenSSL, counted (read by the correlator)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0
        self.paths: list[str] = []

    def add(self, path: str) -> None:
        with self._lock:
            self.count += 1
            if len(self.paths) < 16:
                self.paths.append(path)


def is_openssl(names: set[str]) -> bool:
    """Whether a library's exported functions are OpenSSL's libssl."""
    return all(n in names for n in _REQUIRED) and any(n in names for n in _ANY_OF)


def openssl_probes(path: str, rejected: Rejected) -> list[ProbeAt]:
    """Entry and return probes on the read and write functions ``path`` exports and an entry
    probe on ``SSL_free``, or none (counted) when it is not OpenSSL."""
    wanted = [*ENTRY_PROGRAMS, FREE_SYMBOL, *_REQUIRED[2:], *_ANY_OF]
    sites = elf.resolve(path, wanted)
    if not is_openssl(set(sites)):
        log.warning("tls: %s is named like libssl but does not export OpenSSL's functions: not probed", path)
        rejected.add(path)
        return []
    out = []
    for symbol, program in ENTRY_PROGRAMS.items():
        for site in sites.get(symbol, ()):
            out.append(ProbeAt(site.probe_vaddr, program, symbol))
            out.append(ProbeAt(site.probe_vaddr, RET_PROGRAM, symbol, ret=True))
    for site in sites.get(FREE_SYMBOL, ()):
        out.append(ProbeAt(site.probe_vaddr, FREE_PROGRAM, FREE_SYMBOL))
    return out


def attach_syscalls(bpf: Any) -> None:
    """The fd finder on the data syscalls' entries, and the connection's end on close()'s (BCC
    detaches them at close)."""
    for name in SYSCALLS:
        bpf.attach_tracepoint(tp=f"syscalls:sys_enter_{name}", fn_name=SYSCALL_PROGRAM)
    bpf.attach_tracepoint(tp="syscalls:sys_enter_close", fn_name=CLOSE_PROGRAM)


def tls_family(
    *,
    payload_bytes: int,
    ring_bytes: int,
    max_connections: int,
    lib_users_only: bool,
    rejected: Rejected,
    backlog_bytes: int = 0,
) -> ProbeFamily:
    """``backlog_bytes``: plaintext records waiting for user space past which new HTTP/1
    requests are shed (0: half the ring), compiled in so that it holds from the first request."""
    if payload_bytes & (payload_bytes - 1) or not MIN_PAYLOAD <= payload_bytes <= MAX_PAYLOAD:
        raise ValueError(f"payload size must be a power of two in [{MIN_PAYLOAD}, {MAX_PAYLOAD}], got {payload_bytes}")
    kind = LibraryKind(
        name="libssl",
        file_pattern=LIBRARY,
        open_prefix="libssl",
        probes=(),
        find_probes=lambda path: openssl_probes(path, rejected),
        marks_user=False,  # nearly every process loads libssl: that makes none a GPU process
        users_only=lib_users_only,  # and a libssl file only other processes map is not trapped
    )
    return ProbeFamily(
        name="tls",
        c_file="tls.c",
        libraries=(kind,),
        cflags=(
            f"-DTLS_PAYLOAD={payload_bytes}",
            f"-DTLS_RING_PAGES={ring_bytes // 4096}",
            f"-DTLS_FD_ENTRIES={max_connections}",
            f"-DTLS_BACKLOG_BYTES={backlog_bytes or ring_bytes // 2}",
            *(("-DTLS_LIB_USERS_ONLY=1",) if lib_users_only else ()),
        ),
        rings=(RingSpec(RING, SOCK_RECORD_DTYPE, ring_bytes, variable=True, cut=True),),
        counting_maps=(STATS_MAP,),
        on_load=attach_syscalls,
        after=("sockets",),  # tls.c uses sockets.c's sampling maps, RED counts and thread state
    )
