"""Cost of the torch receiver's probes per operator call, against an empty uprobe on the same
function, in one run (needs root and the CPU torch wheel).

A child process calls ``torch.mm`` on 2x2 tensors (a few µs: the dispatcher, not the
arithmetic) in a timed loop; it is run, in rounds, with
  none       no probe;
  empty      an empty uprobe on ``at::_ops::mm::call``'s entry;
  empty_ret  an empty uprobe on its ``ret`` (single-stepped: ``ret`` is not emulated);
  uretprobe  an empty uretprobe on it, for comparison only: the receiver cannot use one (an
             exception thrown through it aborts the program; this loop throws none);
  torch      the torch receiver's programs (bpf/torch.c) on its entry and ``ret``: a frame
             pushed and popped, one 64-byte event per call.
Prints ns per call (median of the rounds' best-of-5), the overhead of each against none, and
the kernel's own account of the receiver's programs (``kernel.bpf_stats_enabled``: mean ns per
run), which tells the BPF work from the uprobe mechanism's.

    sudo .venv/bin/python bench/torch_ops.py [--calls 50000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
from pathlib import Path

from bcc import BPF

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from otelbpf.families.torch.probes import ENTRY_PROGRAM, EXIT_PROGRAM, operator_sites, torch_family  # noqa: E402
from otelbpf.sensor import program  # noqa: E402

CHILD = """
import sys, time, torch
torch.set_num_threads(1)
a = torch.ones(2, 2)
n = int(sys.argv[1])
for _ in range(2000):
    torch.mm(a, a)
best = float("inf")
for _ in range(5):
    t = time.perf_counter_ns()
    for _ in range(n):
        torch.mm(a, a)
    best = min(best, (time.perf_counter_ns() - t) / n)
print(best)
"""


def child(calls: int) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, str(calls)], capture_output=True, text=True, check=True, cwd="/")
    return float(out.stdout)


def program_stats(bpf: BPF) -> dict[str, dict[str, float]]:
    """run_cnt and mean ns per run of each program that ran (from its fd's fdinfo)."""
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
    ap.add_argument("--calls", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    spec = importlib.util.find_spec("torch")  # not imported: bench/ holds an http.py
    if spec is None or spec.origin is None:
        raise SystemExit("torch is not installed: pip install torch==2.13.0")
    lib = str(Path(spec.origin).parent / "lib" / "libtorch_cpu.so")
    (site,) = [s for s in operator_sites(lib, ["mm"]) if s.operator == "mm"]
    text, cflags = program.build([torch_family(["mm"])], filter_pids=False, events_ring_bytes=64 << 20)
    empty = BPF(text="int empty(struct pt_regs *ctx) { return 0; }")
    full = BPF(text=text, cflags=cflags)

    def attach(mode: str) -> None:
        if mode == "empty":
            empty.attach_uprobe(name=lib, addr=site.entry, fn_name="empty")
        elif mode == "empty_ret":
            for addr in site.exits:
                empty.attach_uprobe(name=lib, addr=addr, fn_name="empty")
        elif mode == "uretprobe":
            empty.attach_uretprobe(name=lib, addr=site.entry, fn_name="empty")
        elif mode == "torch":
            full.attach_uprobe(name=lib, addr=site.entry, fn_name=ENTRY_PROGRAM)
            for addr in site.exits:
                full.attach_uprobe(name=lib, addr=addr, fn_name=EXIT_PROGRAM)

    def detach(mode: str) -> None:
        bpf = full if mode == "torch" else empty
        if mode == "uretprobe":
            bpf.detach_uretprobe(name=lib, addr=site.entry)
            return
        addrs = {"empty": [site.entry], "empty_ret": list(site.exits), "torch": [site.entry, *site.exits]}[mode]
        for addr in addrs:
            bpf.detach_uprobe(name=lib, addr=addr)

    results: dict[str, list[float]] = {m: [] for m in ("none", "empty", "empty_ret", "uretprobe", "torch")}
    knob = Path("/proc/sys/kernel/bpf_stats_enabled")
    before = knob.read_text().strip()
    knob.write_text("1")
    try:
        run_rounds(args, results, attach, detach)
    finally:
        knob.write_text(before)
    print(
        json.dumps(
            {
                "ns_per_call": {m: round(statistics.median(v), 1) for m, v in results.items()},
                "overhead_ns": {
                    m: round(statistics.median(v) - statistics.median(results["none"]), 1)
                    for m, v in results.items()
                    if m != "none"
                },
                "rounds": {m: [round(x, 1) for x in v] for m, v in results.items()},
                "torch_programs": program_stats(full),
                "ret_sites": len(site.exits),
            },
            indent=1,
        )
    )


def run_rounds(args: argparse.Namespace, results: dict[str, list[float]], attach, detach) -> None:
    for _ in range(args.rounds):
        for mode in results:
            if mode != "none":
                attach(mode)
            try:
                results[mode].append(child(args.calls))
            finally:
                if mode != "none":
                    detach(mode)


if __name__ == "__main__":
    main()
