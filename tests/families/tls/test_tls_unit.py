"""The tls family without the kernel: which files are OpenSSL (names and exported functions, on
the system's real libssl and on a gcc-built impostor), its config, and its correlator's hand-off
and counts."""

from __future__ import annotations

import glob
import subprocess

import numpy as np
import pytest

from otelbpf.base.events import SOCK_RECORD_DTYPE
from otelbpf.families.registry import load_config_text
from otelbpf.families.tls.correlator import TlsCorrelator
from otelbpf.families.tls.probes import (
    ENTRY_PROGRAMS,
    FREE_PROGRAM,
    FREE_SYMBOL,
    LIBRARY,
    PROCESSED_MAP,
    RET_PROGRAM,
    STATS,
    STATS_MAP,
    Rejected,
    openssl_probes,
    tls_family,
)

SYSTEM_LIBSSL = sorted(glob.glob("/usr/lib/x86_64-linux-gnu/libssl.so.3") + glob.glob("/usr/lib*/libssl.so.3"))


@pytest.mark.parametrize(
    ("name", "matches"),
    [
        ("libssl.so.3", True),
        ("libssl.so.1.1", True),
        ("libssl.so", True),
        ("libssl-4f6e0b2c.so.3", True),  # a wheel's (auditwheel) copy
        ("libssl3.so", False),  # NSS
        ("libssl.so.3.bak", False),
        ("libsslx.so", False),
    ],
)
def test_library_names(name: str, matches: bool) -> None:
    assert bool(LIBRARY.match(name)) is matches


def test_the_system_openssl_gets_an_entry_and_a_return_probe_on_each_function() -> None:
    if not SYSTEM_LIBSSL:  # Debian's python3 links libssl3: its absence is a broken machine, not a skip
        pytest.fail("no system libssl.so.3")
    rejected = Rejected()
    probes = openssl_probes(SYSTEM_LIBSSL[0], rejected)
    assert rejected.count == 0
    assert sorted(p.label for p in probes if not p.ret) == sorted([*ENTRY_PROGRAMS, FREE_SYMBOL])
    assert {p.program for p in probes if p.ret} == {RET_PROGRAM} and len(probes) == 9
    assert [p.program for p in probes if p.label == FREE_SYMBOL] == [FREE_PROGRAM]


def test_a_library_exporting_ssl_read_that_is_not_openssl_is_rejected_and_counted(tmp_path) -> None:
    src = tmp_path / "fake.c"
    src.write_text(
        "int SSL_read(void *s, void *b, int n) { return 0; }\n"
        "int SSL_write(void *s, const void *b, int n) { return n; }\n"
    )
    lib = tmp_path / "libssl.so.3"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    rejected = Rejected()
    assert openssl_probes(str(lib), rejected) == [] and rejected.count == 1 and rejected.paths == [str(lib)]


def test_the_family_compiles_in_its_options_and_checks_the_payload() -> None:
    fam = tls_family(
        payload_bytes=1024, ring_bytes=1 << 20, max_connections=4096, lib_users_only=True, rejected=Rejected()
    )
    assert "-DTLS_PAYLOAD=1024" in fam.cflags and "-DTLS_LIB_USERS_ONLY=1" in fam.cflags
    assert "-DTLS_BACKLOG_BYTES=524288" in fam.cflags  # half the ring unless told
    assert fam.rings[0].name == "tlsdata" and fam.libraries[0].open_prefix == "libssl"
    assert fam.after == ("sockets",)  # its C uses sockets.c's sampling maps: compiled after them
    told = tls_family(
        payload_bytes=1024,
        ring_bytes=1 << 20,
        max_connections=4096,
        lib_users_only=True,
        rejected=Rejected(),
        backlog_bytes=8192,
    )
    assert "-DTLS_BACKLOG_BYTES=8192" in told.cflags
    with pytest.raises(ValueError):
        tls_family(
            payload_bytes=1000, ring_bytes=1 << 20, max_connections=4096, lib_users_only=False, rejected=Rejected()
        )


def test_the_tls_receiver_needs_the_http_receiver() -> None:
    base = "exporters: {file: {}}\nservice: {pipelines: {traces: {receivers: [%s], exporters: [file]}}}\n"
    load_config_text("receivers: {http: {}, tls: {}}\n" + base % "http, tls")  # fine
    with pytest.raises(Exception, match="http receiver"):
        load_config_text("receivers: {tls: {}}\n" + base % "tls")
    with pytest.raises(Exception, match="payload_size"):
        load_config_text("receivers: {http: {}, tls: {payload_size: 100}}\n" + base % "http, tls")


def test_the_correlator_hands_batches_on_and_counts_kernel_deltas() -> None:
    got: list[int] = []
    counts: dict[tuple, int] = {}
    stats = [[0] * len(STATS)]

    def count(metric: str, n: int, **attrs: object) -> None:
        key = (metric, tuple(sorted(attrs.items())))
        counts[key] = counts.get(key, 0) + n

    consumers: list = []
    rejected = Rejected()
    written: list[tuple[str, list[tuple[int, int]], list[int]]] = []
    corr = TlsCorrelator(
        lambda: consumers,
        count,
        lambda name: list(enumerate(stats[0])),
        rejected,
        lambda name, items: written.append((name, items, list(got))),
    )
    arr = np.zeros(3, dtype=SOCK_RECORD_DTYPE)
    stamps = [200, 4096 + 300, 4096]  # bpf/tls.c: the ring's bytes written up to each record
    for i, stamp in enumerate(stamps):
        arr["addr"][i] = (0x7F0012345678).to_bytes(8, "little") + stamp.to_bytes(8, "little")
    corr.on_ring("tlsdata", arr)  # nobody parses it yet: counted, and off the ring all the same
    assert counts[("otelbpf.tls.records.dropped", (("reason", "no_http_receiver"),))] == 3
    assert written == [(PROCESSED_MAP, [(0, 4396)], [])]
    consumers.append(lambda a: got.append(len(a)))
    arr["addr"][2] = (0x7F0012345678).to_bytes(8, "little") + (9000).to_bytes(8, "little")
    corr.on_ring("tlsdata", arr)
    # the stamp goes back once the batch is parsed, never before (nor a lower one later)
    assert got == [3] and written[-1] == (PROCESSED_MAP, [(0, 9000)], [3])
    corr.on_ring("tlsdata", arr[:1])
    assert len(written) == 2
    stats[0] = [5, 0, 2, 0, 0, 0, 0, 0, 0]
    rejected.add("/x/libssl.so.3")
    corr.collect()
    stats[0] = [7, 0, 2, 0, 0, 0, 0, 0, 4]
    corr.collect()
    assert counts[("otelbpf.tls.calls", (("outcome", "shed"),))] == 4
    assert counts[("otelbpf.tls.calls", (("outcome", "records"),))] == 7
    assert counts[("otelbpf.tls.calls", (("outcome", "no_data"),))] == 2
    assert counts[("otelbpf.tls.libraries.rejected", (("reason", "not_openssl"),))] == 1
    # the sensor's stop: the final counts are counted at once, before the final export's round
    # (where the health source runs beside this collect()), and not again after
    stats[0] = [9, 1, 2, 0, 0, 0, 0, 0, 4]
    corr.on_unload({STATS_MAP: {i: v for i, v in enumerate(stats[0])}})
    assert counts[("otelbpf.tls.calls", (("outcome", "records"),))] == 9
    assert counts[("otelbpf.tls.calls", (("outcome", "lost"),))] == 1
    corr.collect()
    assert counts[("otelbpf.tls.calls", (("outcome", "records"),))] == 9
