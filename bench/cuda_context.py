"""What the agent's probe on ``cuCtxSetCurrent`` costs the caller, side by side in one run.

    sudo .venv/bin/python bench/cuda_context.py [--calls 100000] [--rounds 7] [--out FILE]

Some frameworks set the thread's context around every operation, so this probe (bpf/cuda.c:
an entry that keeps the context in task storage and a return that updates the thread's device
stack, nothing on the ring) may be on a hot path. ``cuCtxSetCurrent`` of a private copy of
the stand-in driver (a primary context, made current again and again), called from this
process through ctypes (the ctypes call is in every variant alike), timed per round of
``--calls`` calls, the variants interleaved round by round:

- ``none``: no probe;
- ``floor``: an empty uprobe and an empty uretprobe on the function (the kernel's own cost);
- ``agent``: the agent's program (the cuda family alone, built and loaded as the agent does),
  its ``uprobe_cuCtxSetCurrent`` and ``uretprobe_cuda_context``.

The program runs with its pid filter on (only this process watched), as ``--pid`` mode does.
Results: a table on stdout and ``bench/results/cuda_context-<date>.json``; docs/BENCHMARKS.md
has the figures.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime as dt
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from otelbpf.families.cuda.probes import CONTEXT_RETURN_PROGRAM, cuda_family  # noqa: E402
from otelbpf.sensor import elf, program  # noqa: E402

FAKE_CUDA = ROOT / "build/examples/fakecuda/libcuda.so.1"
RESULTS = ROOT / "bench/results"
SYMBOL = "cuCtxSetCurrent"
EMPTY = "int empty(struct pt_regs *ctx) { return 0; }"


class Variant:
    """One loaded program and the two probes it puts on the library (none for ``none``)."""

    def __init__(self, name: str, lib: Path) -> None:
        from bcc import BPF

        self.name, self.lib, self.bpf = name, lib, None
        if name == "none":
            return
        if name == "floor":
            self.bpf = BPF(text=EMPTY)
            self.entry, self.ret = "empty", "empty"
            return
        fam = cuda_family(["cuda"])
        text, cflags = program.build([fam], filter_pids=True, events_ring_bytes=1 << 20)
        self.bpf = program.load(text, cflags, [fam])
        watched = self.bpf["watched"]
        watched[watched.Key(os.getpid())] = watched.Leaf(1)
        self.entry, self.ret = f"uprobe_{SYMBOL}", CONTEXT_RETURN_PROGRAM

    def attach(self, addr: int) -> None:
        self.addr = addr
        if self.bpf is not None:
            self.bpf.attach_uprobe(name=str(self.lib), addr=addr, fn_name=self.entry)
            self.bpf.attach_uretprobe(name=str(self.lib), addr=addr, fn_name=self.ret)

    def detach(self) -> None:
        if self.bpf is not None:
            self.bpf.detach_uprobe(name=str(self.lib), addr=self.addr)
            self.bpf.detach_uretprobe(name=str(self.lib), addr=self.addr)

    def close(self) -> None:
        if self.bpf is not None:
            self.bpf.cleanup()


def round_ns(fn: ctypes._CFuncPtr, ctx: ctypes.c_void_p, calls: int) -> float:
    """Mean ns per call over ``calls`` calls."""
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn(ctx)
    return (time.perf_counter_ns() - t0) / calls


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (eBPF)")
    if not FAKE_CUDA.exists():
        sys.exit(f"{FAKE_CUDA} is missing: run `bash examples/build.sh`")
    work = Path(tempfile.mkdtemp(prefix="otelbpf-context-"))
    lib = work / "libcuda.so.1"  # a private inode: no other program's probes on it
    shutil.copy2(FAKE_CUDA, lib)
    [site] = elf.resolve(str(lib), [SYMBOL])[SYMBOL]  # where the agent puts both probes
    drv = ctypes.CDLL(str(lib))
    ctx = ctypes.c_void_p()
    if drv.cuInit(0) or drv.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0):
        sys.exit("the stand-in driver did not give a primary context")
    fn = getattr(drv, SYMBOL)
    fn.argtypes, fn.restype = [ctypes.c_void_p], ctypes.c_int
    variants = [Variant(n, lib) for n in ("none", "floor", "agent")]
    times: dict[str, list[float]] = {v.name: [] for v in variants}
    try:
        round_ns(fn, ctx, a.calls)  # warm
        for _ in range(a.rounds):
            for v in variants:
                v.attach(site.probe_vaddr)
                times[v.name].append(round_ns(fn, ctx, a.calls))
                v.detach()
    finally:
        for v in variants:
            v.close()
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    floor = med["floor"] - med["none"]
    res = {
        "date": dt.date.today().isoformat(),
        "probe_at": {"vaddr": site.vaddr, "probe_vaddr": site.probe_vaddr},
        "calls_per_round": a.calls,
        "rounds": a.rounds,
        "ns_per_call": times,
        "median_ns_per_call": med,
        "overhead_ns": {k: round(med[k] - med["none"], 1) for k in med if k != "none"},
        "ratio_to_floor": round((med["agent"] - med["none"]) / floor, 2),
    }
    print(f"{SYMBOL} through ctypes, median of {a.rounds} rounds of {a.calls} calls (ns per call):")
    for k in med:
        extra = "" if k == "none" else f"  +{med[k] - med['none']:.0f} ns"
        ratio = f"  ({res['ratio_to_floor']}x the floor)" if k == "agent" else ""
        print(f"  {k:7} {med[k]:8.0f}{extra}{ratio}")
    out = a.out or RESULTS / f"cuda_context-{res['date']}.json"
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
