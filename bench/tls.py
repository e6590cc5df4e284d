"""Cost of the tls receiver per TLS record, against an empty uprobe and uretprobe on the same
functions (the floor), in one run (needs root and the system's libssl.so.3).

A child process (Python's ``ssl``, the system OpenSSL) holds a TLS connection over a socketpair
and, in a timed loop, writes a 256-byte record with ``SSL_write`` on one end and reads it with
``SSL_read`` on the other: two TLS calls (and a write and a read syscall) per iteration. Run in
rounds with
  none     no probe;
  floor    an empty uprobe and an empty uretprobe on SSL_read, SSL_write, SSL_read_ex and
           SSL_write_ex: what any probe there costs;
  tls      the receiver's programs (bpf/tls.c): arguments kept at entry, the fd taken from the
           syscall inside the call (its sys_enter tracepoints attached too), 256 bytes of
           plaintext copied to the ring at return;
  filtered the receiver's programs for a process it does not trace (host mode, processes: gpu,
           a process that is no library user): the uprobes fire and return at once.
Prints ns per iteration (median of the rounds' best-of-5) and per TLS record (half of it), the
overhead against none, and the kernel's account of the receiver's programs
(``kernel.bpf_stats_enabled``). A second child times ``os.write`` to /dev/null with and without
the sys_enter programs: what every syscall on the host pays for the fd finder.

    sudo .venv/bin/python bench/tls.py [--iterations 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bcc import BPF

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from otelbpf.families.http.probes import socket_family  # noqa: E402
from otelbpf.families.tls.probes import (  # noqa: E402
    SYSCALL_PROGRAM,
    SYSCALLS,
    Rejected,
    openssl_probes,
    tls_family,
)
from otelbpf.sensor import program  # noqa: E402

LIBSSL = "/usr/lib/x86_64-linux-gnu/libssl.so.3"

CHILD = """
import math, socket, ssl, sys, threading, time
cert, key, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
sctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
sctx.load_cert_chain(cert, key)
cctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
cctx.check_hostname = False
cctx.verify_mode = ssl.CERT_NONE
a, b = socket.socketpair()
got = {}
t = threading.Thread(target=lambda: got.setdefault("s", sctx.wrap_socket(b, server_side=True)))
t.start()
c = cctx.wrap_socket(a, server_hostname="x")
t.join()
s = got["s"]
payload = b"x" * 256
def loop(k):
    for _ in range(k):
        c.sendall(payload)
        s.recv(256)
loop(2000)
best = math.inf
for _ in range(5):
    t0 = time.perf_counter_ns()
    loop(n)
    best = min(best, (time.perf_counter_ns() - t0) / n)
print(best)
"""

SYSCALL_CHILD = """
import math, os, sys, time
n = int(sys.argv[1])
fd = os.open("/dev/null", os.O_WRONLY)
b = b"x"
best = math.inf
for _ in range(5):
    t0 = time.perf_counter_ns()
    for _ in range(n):
        os.write(fd, b)
    best = min(best, (time.perf_counter_ns() - t0) / n)
print(best)
"""


def child(code: str, *args: str) -> float:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True, cwd="/")
    return float(out.stdout)


def program_stats(bpf: BPF) -> dict[str, dict[str, float]]:
    out = {}
    for name, fn in bpf.funcs.items():
        info = dict(
            line.split(":\t", 1)
            for line in Path(f"/proc/self/fdinfo/{fn.fd}").read_text().splitlines()
            if ":\t" in line
        )
        runs = int(info.get("run_cnt", "0"))
        if runs:
            key = name.decode() if isinstance(name, bytes) else name
            out[key] = {"runs": runs, "mean_ns": round(int(info["run_time_ns"]) / runs, 1)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    probes = openssl_probes(LIBSSL, Rejected())
    tmp = Path(tempfile.mkdtemp())
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-subj", "/CN=x", "-keyout", str(tmp / "k.pem"), "-out", str(tmp / "c.pem")],
        check=True, capture_output=True,
    )  # fmt: skip
    certs = (str(tmp / "c.pem"), str(tmp / "k.pem"))

    def build(lib_users_only: bool) -> BPF:
        fam = tls_family(
            payload_bytes=4096,
            ring_bytes=64 << 20,
            max_connections=65536,
            lib_users_only=lib_users_only,
            rejected=Rejected(),
        )
        # tls.c uses sockets.c's sampling maps: compiled with it, its tracepoints detached so
        # that every condition pays only what it names
        sockets = socket_family([], payload_bytes=1024, ring_bytes=1 << 20)
        text, cflags = program.build([sockets, fam], filter_pids=False, events_ring_bytes=1 << 20)
        bpf = BPF(text=text, cflags=cflags)
        for tp in list(bpf.tracepoint_fds):
            bpf.detach_tracepoint(tp)
        return bpf

    empty = BPF(text="int empty(struct pt_regs *ctx) { return 0; }")
    full, filtered = build(False), build(True)

    def attach(mode: str) -> None:
        bpf = {"floor": empty, "tls": full, "filtered": filtered}[mode]
        for p in probes:
            fn = "empty" if mode == "floor" else p.program
            if p.ret:
                bpf.attach_uretprobe(name=LIBSSL, addr=p.vaddr, fn_name=fn)
            else:
                bpf.attach_uprobe(name=LIBSSL, addr=p.vaddr, fn_name=fn)
        if mode != "floor":
            for sc in SYSCALLS:
                bpf.attach_tracepoint(tp=f"syscalls:sys_enter_{sc}", fn_name=SYSCALL_PROGRAM)

    def detach(mode: str) -> None:
        bpf = {"floor": empty, "tls": full, "filtered": filtered}[mode]
        for p in probes:
            if p.ret:
                bpf.detach_uretprobe(name=LIBSSL, addr=p.vaddr)
            else:
                bpf.detach_uprobe(name=LIBSSL, addr=p.vaddr)
        if mode != "floor":
            for sc in SYSCALLS:
                bpf.detach_tracepoint(tp=f"syscalls:sys_enter_{sc}")

    modes = ("none", "floor", "tls", "filtered")
    results: dict[str, list[float]] = {m: [] for m in modes}
    syscall: dict[str, list[float]] = {"none": [], "fd_finder": []}
    knob = Path("/proc/sys/kernel/bpf_stats_enabled")
    before = knob.read_text().strip()
    knob.write_text("1")
    try:
        for _ in range(args.rounds):
            for mode in modes:
                if mode != "none":
                    attach(mode)
                try:
                    results[mode].append(child(CHILD, *certs, str(args.iterations)))
                finally:
                    if mode != "none":
                        detach(mode)
            syscall["none"].append(child(SYSCALL_CHILD, str(args.iterations * 10)))
            for sc in SYSCALLS:
                full.attach_tracepoint(tp=f"syscalls:sys_enter_{sc}", fn_name=SYSCALL_PROGRAM)
            try:
                syscall["fd_finder"].append(child(SYSCALL_CHILD, str(args.iterations * 10)))
            finally:
                for sc in SYSCALLS:
                    full.detach_tracepoint(tp=f"syscalls:sys_enter_{sc}")
    finally:
        knob.write_text(before)
    med = {m: statistics.median(v) for m, v in results.items()}
    print(
        json.dumps(
            {
                "ns_per_iteration": {m: round(v, 1) for m, v in med.items()},
                "overhead_ns_per_record": {m: round((v - med["none"]) / 2, 1) for m, v in med.items() if m != "none"},
                "rounds": {m: [round(x, 1) for x in v] for m, v in results.items()},
                "write_syscall_ns": {m: round(statistics.median(v), 1) for m, v in syscall.items()},
                "tls_programs": program_stats(full),
                "filtered_programs": program_stats(filtered),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
