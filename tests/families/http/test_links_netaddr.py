"""Same-host links by connection address, and socket addresses read from /proc."""

from __future__ import annotations

import os
import socket

from otelbpf.correlate.spans import new_context
from otelbpf.families.http.correlator import parse_traceparent
from otelbpf.families.http.links import MAX_PER_CONNECTION, PeerLinks
from otelbpf.families.http.netaddr import TCP_LISTEN, TcpTables, address_from_raw, fd_inode


def test_a_server_finds_the_client_request_in_flight_on_its_connection():
    links = PeerLinks()
    first, second = new_context(), new_context()
    e1 = links.add(("127.0.0.1", 40000), 8080, 0, 100, first)
    links.end(e1, 200)
    links.add(("127.0.0.1", 40000), 8080, 0, 300, second)  # keep-alive: the next request, still open
    assert links.find(("127.0.0.1", 40000), 8080, 0, 150) == first
    assert links.find(("127.0.0.1", 40000), 8080, 0, 350) == second
    assert links.find(("127.0.0.1", 40000), 8080, 0, 250) is None
    assert links.find(("127.0.0.1", 40001), 8080, 0, 150) is None  # another connection
    assert links.find(("127.0.0.1", 40000), 8080, 3, 150) is None  # another HTTP/2 stream


def test_addresses_of_real_sockets_from_proc():
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, peer = listener.accept()
    tables = TcpTables()
    pid = os.getpid()
    got = tables.lookup(pid, fd_inode(pid, client.fileno()))
    assert got.local == client.getsockname() and got.remote == listener.getsockname()
    assert tables.lookup(pid, fd_inode(pid, server.fileno())).remote == peer
    assert tables.lookup(pid, fd_inode(pid, listener.fileno())).state == TCP_LISTEN
    assert listener.getsockname()[1] in tables.listening_ports(pid)
    r, w = os.pipe()
    assert fd_inode(pid, r) is None  # not a socket
    for s in (client, server, listener):
        s.close()
    os.close(r)
    os.close(w)


def test_ipv4_mapped_addresses_read_as_ipv4():
    mapped = b"\0" * 10 + b"\xff\xff" + socket.inet_aton("10.1.2.3")
    assert address_from_raw(socket.AF_INET6, 443, mapped) == ("10.1.2.3", 443)
    assert address_from_raw(socket.AF_INET, 80, socket.inet_aton("127.0.0.1") + b"\0" * 12) == ("127.0.0.1", 80)
    assert address_from_raw(socket.AF_UNIX, 0, b"\0" * 16) is None


def test_traceparent_parsing_accepts_only_valid_headers():
    ctx = parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    assert (ctx.trace_id, ctx.span_id, ctx.is_remote, int(ctx.trace_flags)) == (
        0x4BF92F3577B34DA6A3CE929D0E0E4736,
        0x00F067AA0BA902B7,
        True,
        1,
    )
    for bad in (
        None,
        "",
        "00-0000-00f067aa0ba902b7-01",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-xyz",
    ):
        assert parse_traceparent(bad) is None


def test_a_busy_connection_keeps_only_its_recent_requests():
    """One keep-alive connection's many requests: memory stays bounded, the newest are found."""
    links = PeerLinks()
    ctxs = []
    for i in range(MAX_PER_CONNECTION + 500):
        ctxs.append(new_context())
        links.end(links.add(("10.0.0.1", 40000), 8080, 0, i * 10, ctxs[-1]), i * 10 + 5)
    last = MAX_PER_CONNECTION + 499
    assert links.find(("10.0.0.1", 40000), 8080, 0, last * 10 + 1) == ctxs[-1]
    assert links.find(("10.0.0.1", 40000), 8080, 0, 1) is None  # dropped: beyond the cap
    assert len(links._by_key[(("10.0.0.1", 40000), 8080, 0)]) == MAX_PER_CONNECTION


def test_a_sweep_forgets_only_keys_whose_requests_all_ended_before_the_window():
    """HTTP/2 registers a key per stream: ended ones go at the next sweep (every 1024 adds), the rest stay."""
    links = PeerLinks(retention_ns=1000)
    still_open = links.add(("10.0.0.1", 1), 8080, 1, 0, new_context())
    recent = links.add(("10.0.0.1", 2), 8080, 1, 0, new_context())
    links.end(recent, 10**6)  # ended inside the window of the sweep below
    half_done = [links.add(("10.0.0.1", 3), 8080, 1, t, new_context()) for t in (0, 1)]
    links.end(half_done[0], 5)
    for stream in range(1, 1020):
        links.end(links.add(("10.0.0.1", 4), 8080, stream, stream, new_context()), stream + 1)
    assert len(links._by_key) == 1022
    links.add(("10.0.0.1", 5), 8080, 1, 10**6, new_context())  # the 1024th add: horizon 10**6 - 1000
    assert set(links._by_key) == {(("10.0.0.1", p), 8080, 1) for p in (1, 2, 3, 5)}
    links.end(still_open, 7)
    links.end(half_done[1], 9)
    for stream in range(2, 1026):
        links.add(("10.0.0.1", 5), 8080, stream, 2 * 10**6, new_context())  # next sweep: horizon 2 * 10**6 - 1000
    assert not {(("10.0.0.1", p), 8080, 1) for p in (1, 2, 3)} & set(links._by_key)
    assert links.find(("10.0.0.1", 5), 8080, 2, 2 * 10**6) is not None
