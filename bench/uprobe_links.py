"""Attaching and releasing uprobes: uprobe-multi links against BCC's perf events, side by side.

    sudo .venv/bin/python bench/uprobe_links.py [--probes 60] [--rounds 3]

Each round, for each way: one BCC object with an empty program (compiled before the clock
starts), ``--probes`` uprobes on as many
functions of libc (every process on the host maps it: the probes are installed in all of them,
as the sensor's are in every process of a probed library), then all of them released. Timed:
the attaches, and the release until the last probe is gone from this process's copy of the
code (the int3 at the last function's entry replaced by the original byte) and the release
returned (the sensor's ``Links.close_all``, or BCC's detaches as ``OTELBPF_DETACH=wait`` makes
them, on 16 threads). The ways alternate within a round.

Results: a table on stdout and bench/results/uprobe_links-<date>.json; figures in
docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime as dt
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bcc import BPF

from otelbpf.sensor import elf, uprobe_links

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
EMPTY = "int empty(struct pt_regs *ctx) { return 0; }"


def _sites(n: int) -> list[tuple[str, int, int]]:
    """(name, probe vaddr, runtime address of the probed byte) of ``n`` libc functions this
    process can find by name and the kernel can probe (some start with an instruction it will
    not single-step: refused either way)."""
    libc = ctypes.CDLL(LIBC)
    names = [ln.split()[-1].split("@")[0] for ln in os.popen(f"nm -D --defined-only {LIBC}") if " T " in ln]
    resolved = elf.resolve(LIBC, names)
    bpf = uprobe_links.bpf_class()(text=EMPTY, uprobe_multi=True)
    prog = bpf.load_func("empty", BPF.KPROBE).fd
    out: list[tuple[str, int, int]] = []
    try:
        for name in names:
            for site in resolved.get(name, [])[:1]:
                if any(v == site.probe_vaddr for _, v, _ in out):
                    continue  # an alias of a function already in
                try:
                    addr = ctypes.cast(getattr(libc, name), ctypes.c_void_p).value
                    os.close(uprobe_links.link(prog, LIBC, elf.file_offset(LIBC, site.probe_vaddr), ret=False))
                except (AttributeError, OSError):
                    continue
                out.append((name, site.probe_vaddr, addr + (site.probe_vaddr - site.vaddr)))
            if len(out) == n:
                break
    finally:
        bpf.cleanup()
    return out


def _round(way: str, sites: list[tuple[str, int, int]]) -> dict[str, float]:
    last = sites[-1][2]
    original = ctypes.string_at(last, 1)
    if way == "links":
        bpf = uprobe_links.bpf_class()(text=EMPTY, uprobe_multi=True)
        links = uprobe_links.Links()
    else:
        bpf = BPF(text=EMPTY)
    t0 = time.perf_counter()  # the compile above is no part of either
    if way == "links":
        for _, vaddr, _ in sites:
            links.attach(bpf, LIBC, vaddr, "empty", ret=False)
    else:
        for _, vaddr, _ in sites:
            bpf.attach_uprobe(name=LIBC, addr=vaddr, fn_name="empty")
    attached = time.perf_counter()
    assert ctypes.string_at(last, 1) == b"\xcc"
    if way == "links":
        links.close_all()
    else:
        with ThreadPoolExecutor(16) as pool:  # as the sensor's stop() with OTELBPF_DETACH=wait
            list(pool.map(bpf.detach_uprobe_event, list(bpf.uprobe_fds)))
    while ctypes.string_at(last, 1) != original:
        time.sleep(0.001)
    released = time.perf_counter()
    bpf.cleanup()
    return {"attach_s": attached - t0, "release_s": released - attached}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--probes", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if not uprobe_links.supported():
        raise SystemExit("this kernel makes no uprobe-multi links: nothing to compare")
    sites = _sites(args.probes)
    runs: dict[str, list[dict[str, float]]] = {"links": [], "perf events": []}
    for i in range(args.rounds):
        for way in ("links", "perf events") if i % 2 == 0 else ("perf events", "links"):
            runs[way].append(_round(way, sites))
    out = {
        "probes": len(sites),
        "rounds": args.rounds,
        "load_average": os.getloadavg(),
        "kernel": os.uname().release,
        "median": {
            way: {k: statistics.median(r[k] for r in rs) for k in ("attach_s", "release_s")} for way, rs in runs.items()
        },
        "runs": runs,
    }
    for way, m in out["median"].items():
        print(f"{way:12} attach {m['attach_s'] * 1e3:8.1f} ms   release {m['release_s'] * 1e3:8.1f} ms")
    path = Path(__file__).parent / "results" / f"uprobe_links-{dt.datetime.now():%Y-%m-%dT%H%M}.json"
    path.write_text(json.dumps(out, indent=2))
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
