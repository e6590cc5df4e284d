"""Benchmark the profiler, side by side in one run.

    sudo .venv/bin/python bench/profile.py [--runs N] [--work N] [--out FILE]

Measures, in one invocation (every number shares the same machine state):

0. The agent's own CPU on the host as it is (profiling every process, CUDA memory on), in
   steady state: after start-up and the first collection (which loads kernel symbols);
   in total and on the profile collection thread.
1. A CPU-bound Python workload (a fixed amount of bytecode, no I/O) timed without the agent
   and with the agent profiling the whole host at 99 Hz (the default), runs interleaved
   off/on/off/on so drift in the machine's load hits both alike; medians and slowdown.
2. The agent's CPU time and RSS over the profiled runs (/proc/PID/stat, /proc/PID/status).
3. Symbolization rate: native frames of a live Python process resolved per second
   (Symbolizer.frame, tables warm) and Python line lookups per second (pylines).
4. Cost of one CUDA allocation (cudaMalloc + cudaFree through the stand-in libcudart, from a
   Python loop, as PyTorch's allocator calls them): no agent; the cuda receiver alone (uprobes,
   events); the cuda receiver with profiling's cuda_memory (user stack + Python stack walk at
   each allocation, in-kernel accounting).
5. The same for one cudaDeviceSynchronize and one 4 KiB cudaMemcpy, whose stacks the profiler
   takes too (the cuda_calls profiles). ``--calls-only``: step 5 alone.
6. ``--launches-only``: one cudaLaunchKernel from Python, with the cuda receiver alone, with
   cuda_memory and launch stacks off (``launch_stack_every: 0``), at the default (one launch in
   64 per kernel takes the stack) and at every launch (1): the BPF ns per uprobe run of each.

Results: a table on stdout and bench/results/profile-<date>.json; docs/BENCHMARKS.md
("Profiling") holds the numbers and how to read them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
FAKE_CUDART = REPO / "build" / "examples" / "fakecudart" / "libcudart.so.12"

WORKLOAD = """
import sys, time
def work(n):
    total = 0
    for i in range(n):
        total += (i * i) % 7
    return total
t0 = time.perf_counter()
work(int(sys.argv[1]))
print(time.perf_counter() - t0)
"""

CALL_LOOP = """
import ctypes, sys, time
lib = ctypes.CDLL(sys.argv[1])
lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
lib.cudaFree.argtypes = [ctypes.c_void_p]
lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
n, what = int(sys.argv[2]), sys.argv[3]
p, dst = ctypes.c_void_p(), ctypes.c_void_p()
lib.cudaMalloc(ctypes.byref(dst), 4096)
src = ctypes.create_string_buffer(4096)
def alloc():
    lib.cudaMalloc(ctypes.byref(p), 4096)
    lib.cudaFree(p)
def sync():
    lib.cudaDeviceSynchronize()
def copy():
    lib.cudaMemcpy(dst, src, 4096, 1)
class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]
lib.cudaLaunchKernel.argtypes = [ctypes.c_void_p, Dim3, Dim3, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
kernel, one, block = ctypes.cast(ctypes.CDLL(None).abs, ctypes.c_void_p), Dim3(1, 1, 1), Dim3(32, 1, 1)
def launch():
    lib.cudaLaunchKernel(kernel, one, block, None, 0, None)
call = {"alloc": alloc, "sync": sync, "copy": copy, "launch": launch}[what]
for _ in range(1000):  # warm up; the agent inspects the process meanwhile
    call()
time.sleep(1.0)
t0 = time.perf_counter()
for _ in range(n):
    call()
print((time.perf_counter() - t0) / n * 1e9)
"""


def config(tmp: Path, *, cuda: bool, profiling: bool, cuda_memory: bool = False, launch_stack_every: int = 64) -> Path:
    receivers: dict = {}
    pipelines: dict = {}
    exporters = {"file": {"directory": str(tmp / "out")}}
    if profiling:
        receivers["profiling"] = {
            "interval": "5s",
            "cuda_memory": cuda_memory,
            "launch_stack_every": launch_stack_every,
        }
        pipelines["profiles"] = {"receivers": ["profiling"], "exporters": ["file"]}
    if cuda:
        receivers["cuda"] = {"search_paths": []}
        pipelines["metrics"] = {"receivers": ["cuda"], "exporters": ["file"]}
    doc = {
        "receivers": receivers,
        "exporters": exporters,
        "service": {"pipelines": pipelines, "telemetry": {"log_level": "warning"}},
    }
    path = tmp / f"cfg-{int(cuda)}{int(profiling)}{int(cuda_memory)}-{launch_stack_every}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


class Agent:
    def __init__(self, cfg: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "otelbpf.cli", "run", "-c", str(cfg)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"agent exited: {self.proc.stdout.read()}")
            if any("probes on" in line for line in self._lines()):
                return
        raise SystemExit("agent did not start")

    def _lines(self):
        # log_level warning hides "otelbpf running": wait for the agent's threads instead
        time.sleep(0.5)
        threads = os.listdir(f"/proc/{self.proc.pid}/task")
        names = {Path(f"/proc/{self.proc.pid}/task/{t}/comm").read_text().strip() for t in threads}
        return ["probes on"] if "otelbpf-drain" in names else []

    def settle(self, idle_share: float = 0.05, limit_s: float = 60.0) -> None:
        """Wait until the agent's start-up work is done (inspecting every process on the
        host, loading walkers): a 1-second window in which it used under ``idle_share``."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            c0 = self.cpu_seconds()
            time.sleep(1.0)
            if self.cpu_seconds() - c0 < idle_share:
                return

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def thread_cpu_seconds(self, name: str) -> float:
        """CPU time of the agent's threads called ``name`` (as /proc shows it: 15 bytes)."""
        total = 0
        for tid in os.listdir(f"/proc/{self.proc.pid}/task"):
            stat = Path(f"/proc/{self.proc.pid}/task/{tid}/stat").read_text()
            if stat[stat.index("(") + 1 : stat.rindex(")")] == name:
                fields = stat.rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])
        return total / os.sysconf("SC_CLK_TCK")

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def bpf_run_stats(self, prog_type: int) -> tuple[int, int]:
        """(run_time_ns, run_cnt) summed over the agent's BPF programs of ``prog_type``
        (7: perf_event, 2: kprobe/uprobe), from /proc/PID/fdinfo; needs
        kernel.bpf_stats_enabled=1. A tail call's time counts in the program that made it."""
        total_ns = total_cnt = 0
        for fd in os.listdir(f"/proc/{self.proc.pid}/fd"):
            try:
                info = dict(
                    line.split(":\t", 1)
                    for line in Path(f"/proc/{self.proc.pid}/fdinfo/{fd}").read_text().splitlines()
                    if ":\t" in line
                )
            except OSError:
                continue
            if info.get("prog_type", "").strip() == str(prog_type):
                total_ns += int(info.get("run_time_ns", "0"))
                total_cnt += int(info.get("run_cnt", "0"))
        return total_ns, total_cnt

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(300)


def idle_agent(tmp: Path, seconds: float) -> dict:
    agent = Agent(config(tmp, cuda=True, profiling=True, cuda_memory=True))
    try:
        agent.settle()
        time.sleep(6.0)  # past the first collection (interval 5s): kernel symbols are loaded once
        c0, p0, t0 = agent.cpu_seconds(), agent.thread_cpu_seconds("otelbpf-profile"), time.monotonic()
        time.sleep(seconds)
        c1, p1, t1 = agent.cpu_seconds(), agent.thread_cpu_seconds("otelbpf-profile"), time.monotonic()
        rss = agent.rss_bytes()
    finally:
        agent.stop()
    return {
        "seconds": t1 - t0,
        "agent_share_of_one_core": (c1 - c0) / (t1 - t0),
        "profile_thread_share_of_one_core": (p1 - p0) / (t1 - t0),
        "agent_rss_bytes": rss,
    }


def run_workload(script: Path, work: int) -> tuple[float, float]:
    """(wall seconds the workload reports, CPU seconds it used: user + system, from rusage).

    CPU time is what the profiler costs the program itself (the BPF program runs in its
    context and is charged to it); it leaves out time spent waiting for a CPU, which on a
    2-core VM shared with the agent and other tenants is most of the wall clock's noise."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, str(script), str(work)], capture_output=True, text=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return float(out.stdout.strip()), cpu


def cpu_overhead(tmp: Path, runs: int, work: int) -> dict:
    script = tmp / "work.py"
    script.write_text(WORKLOAD)
    run_workload(script, work // 10)  # warm the page cache
    off: list[float] = []
    on: list[float] = []
    off_cpu: list[float] = []
    on_cpu: list[float] = []
    agent_cpu = 0.0
    rss = 0
    sample_ns = samples = 0
    for i in range(runs):
        wall, cpu = run_workload(script, work)
        off.append(wall)
        off_cpu.append(cpu)
        agent = Agent(config(tmp, cuda=False, profiling=True))
        try:
            agent.settle()  # start-up work is not steady state
            c0 = agent.cpu_seconds()
            ns0, cnt0 = agent.bpf_run_stats(7)
            wall, cpu = run_workload(script, work)
            on.append(wall)
            on_cpu.append(cpu)
            ns1, cnt1 = agent.bpf_run_stats(7)
            sample_ns += ns1 - ns0
            samples += cnt1 - cnt0
            agent_cpu += agent.cpu_seconds() - c0
            rss = max(rss, agent.rss_bytes())
        finally:
            agent.stop()
        print(
            f"  run {i + 1}/{runs}: off {off[-1]:.3f}s ({off_cpu[-1]:.3f}s CPU) on {on[-1]:.3f}s "
            f"({on_cpu[-1]:.3f}s CPU)",
            flush=True,
        )
    m_off, m_on = statistics.median(off), statistics.median(on)
    return {
        "runs": runs,
        "work": work,
        "off_s": off,
        "on_s": on,
        "median_off_s": m_off,
        "median_on_s": m_on,
        "slowdown": m_on / m_off - 1,
        "paired_slowdown_median": statistics.median(b / a for a, b in zip(off, on)) - 1,
        "off_cpu_s": off_cpu,
        "on_cpu_s": on_cpu,
        "cpu_time_slowdown": statistics.median(on_cpu) / statistics.median(off_cpu) - 1,
        "paired_cpu_time_slowdown_median": statistics.median(b / a for a, b in zip(off_cpu, on_cpu)) - 1,
        "agent_cpu_s_per_run": agent_cpu / runs,
        "agent_cpu_share_of_one_core": agent_cpu / sum(on),
        "agent_rss_bytes": rss,
        "bpf_samples": samples,
        "bpf_ns_per_sample": sample_ns / max(samples, 1),
        "bpf_share_of_a_cpu_at_99hz": sample_ns / max(samples, 1) * 99 / 1e9,
    }


def symbolization_rate() -> dict:
    from otelbpf.base.procfs import read_maps
    from otelbpf.correlate.symbolizer import Symbolizer
    from otelbpf.families.profiling import pylines

    pid = os.getpid()
    text = [m for m in read_maps(pid) if m.executable and "libpython" in m.path]
    rng = random.Random(1)
    addrs = [rng.randrange(m.start, m.end) for m in text for _ in range(2000)]
    sym = Symbolizer()
    sym.remember(pid)
    t0 = time.perf_counter()
    first = [sym.frame(pid, a) for a in addrs[:1]]  # cold: reads the symbol table
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    frames = [sym.frame(pid, a) for a in addrs]
    warm = time.perf_counter() - t0
    code = symbolization_rate.__code__
    table, first_line = code.co_linetable, code.co_firstlineno
    t0 = time.perf_counter()
    n = 20_000
    for i in range(n):
        pylines.line_for(table, first_line, (i * 2) % 100, sys.version_info[:2])
    lines = time.perf_counter() - t0
    return {
        "first_frame_s": cold,
        "native_frames_per_s": len(addrs) / warm,
        "resolved_share": sum(1 for f in frames if f.function) / len(frames),
        "python_lines_per_s": n / lines,
        "first": first[0].name,
    }


def alloc_cost(tmp: Path, calls: int, what: str = "alloc") -> dict:
    """ns per call of ``what`` (CALL_LOOP: alloc = cudaMalloc + cudaFree, sync, copy)."""
    script = tmp / "calls.py"
    script.write_text(CALL_LOOP)

    def loop() -> float:
        out = subprocess.run(
            [sys.executable, str(script), str(FAKE_CUDART), str(calls), what],
            capture_output=True,
            text=True,
            check=True,
        )
        return float(out.stdout.strip())

    results: dict[str, list[float]] = {"no_agent": [], "cuda": [], "cuda_and_memory_profile": []}
    uprobe_ns: dict[str, list[float]] = {"cuda": [], "cuda_and_memory_profile": []}
    for _ in range(3):
        results["no_agent"].append(loop())
        for name, cfg in (
            ("cuda", config(tmp, cuda=True, profiling=False)),
            ("cuda_and_memory_profile", config(tmp, cuda=True, profiling=True, cuda_memory=True)),
        ):
            agent = Agent(cfg)
            try:
                agent.settle()
                ns0, cnt0 = agent.bpf_run_stats(2)
                results[name].append(loop())
                ns1, cnt1 = agent.bpf_run_stats(2)
                uprobe_ns[name].append((ns1 - ns0) / max(cnt1 - cnt0, 1))
            finally:
                agent.stop()
    med = {k: statistics.median(v) for k, v in results.items()}
    return {
        "calls": calls,
        "ns_per_alloc_free": results,
        "median_ns": med,
        "probes_ns": med["cuda"] - med["no_agent"],
        "stack_capture_and_accounting_ns": med["cuda_and_memory_profile"] - med["cuda"],
        "bpf_ns_per_probe_run": {k: statistics.median(v) for k, v in uprobe_ns.items()},
    }


def launch_cost(tmp: Path, calls: int, rounds: int = 2) -> dict:
    """ns per cudaLaunchKernel from Python (the stand-in runtime) and BPF ns per uprobe run:
    the cuda receiver alone; with profiling's cuda_memory and launch stacks off
    (launch_stack_every 0); at the default, one launch in 64 per kernel; at every launch (1)."""
    script = tmp / "calls.py"
    script.write_text(CALL_LOOP)

    def loop() -> float:
        out = subprocess.run(
            [sys.executable, str(script), str(FAKE_CUDART), str(calls), "launch"],
            capture_output=True,
            text=True,
            check=True,
        )
        return float(out.stdout.strip())

    configs = {
        "cuda": config(tmp, cuda=True, profiling=False),
        "stacks_off": config(tmp, cuda=True, profiling=True, cuda_memory=True, launch_stack_every=0),
        "every_64": config(tmp, cuda=True, profiling=True, cuda_memory=True, launch_stack_every=64),
        "every_1": config(tmp, cuda=True, profiling=True, cuda_memory=True, launch_stack_every=1),
    }
    wall: dict[str, list[float]] = {"no_agent": [], **{k: [] for k in configs}}
    bpf: dict[str, list[float]] = {k: [] for k in configs}
    for _ in range(rounds):
        wall["no_agent"].append(loop())
        for name, cfg in configs.items():
            agent = Agent(cfg)
            try:
                agent.settle()
                ns0, cnt0 = agent.bpf_run_stats(2)
                wall[name].append(loop())
                ns1, cnt1 = agent.bpf_run_stats(2)
                bpf[name].append((ns1 - ns0) / max(cnt1 - cnt0, 1))
            finally:
                agent.stop()
    med = {k: statistics.median(v) for k, v in wall.items()}
    bpf_med = {k: statistics.median(v) for k, v in bpf.items()}
    return {
        "calls": calls,
        "rounds": rounds,
        "ns_per_launch": wall,
        "median_ns": med,
        "bpf_ns_per_probe_run": bpf_med,
        "bpf_added_per_launch_ns": {
            "every_64_vs_stacks_off": bpf_med["every_64"] - bpf_med["stacks_off"],
            "every_1_vs_stacks_off": bpf_med["every_1"] - bpf_med["stacks_off"],
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--work", type=int, default=30_000_000)
    parser.add_argument("--alloc-calls", type=int, default=20_000)
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--cpu-only", action="store_true", help="only step 1 (the workload with and without)")
    parser.add_argument("--calls-only", action="store_true", help="only step 5 (copies and synchronizes, with stacks)")
    parser.add_argument(
        "--launches-only", action="store_true", help="only launches: stacks off, 1 in 64 (the default), every one"
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the agent loads eBPF")
    subprocess.run(["bash", str(REPO / "examples" / "build.sh")], check=True, capture_output=True)
    stats = Path("/proc/sys/kernel/bpf_stats_enabled")
    stats_before = stats.read_text().strip()
    stats.write_text("1")  # per-program run time, for the in-kernel cost per sample and per probe
    result: dict = {
        "date": dt.datetime.now(dt.UTC).isoformat(),
        "kernel": os.uname().release,
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
    }
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if args.launches_only:
            result["launch"] = a = launch_cost(tmp, args.alloc_calls)
            stats.write_text(stats_before)
            print(f"launch from Python: wall ns {a['median_ns']}; BPF ns per uprobe run {a['bpf_ns_per_probe_run']}")
            out = args.out or REPO / "bench" / "results" / f"profile-launches-{dt.date.today().isoformat()}.json"
            out.write_text(json.dumps(result, indent=2))
            print(f"wrote {out}")
            return 0
        if args.calls_only:
            for what in ("sync", "copy"):
                print(f"{what} from Python, without the agent, with cuda, with cuda + its stacks", flush=True)
                result[what] = alloc_cost(tmp, args.alloc_calls, what)
            stats.write_text(stats_before)
            for what in ("sync", "copy"):
                a = result[what]
                print(
                    f"{what:<6} no agent {a['median_ns']['no_agent']:,.0f} ns, cuda {a['median_ns']['cuda']:,.0f} ns, "
                    f"+ stacks {a['median_ns']['cuda_and_memory_profile']:,.0f} ns: probes +{a['probes_ns']:,.0f} ns, "
                    f"stacks + accounting +{a['stack_capture_and_accounting_ns']:,.0f} ns per call; "
                    f"BPF per uprobe run {a['bpf_ns_per_probe_run']}"
                )
            out = args.out or REPO / "bench" / "results" / f"profile-calls-{dt.date.today().isoformat()}.json"
            out.write_text(json.dumps(result, indent=2))
            print(f"wrote {out}")
            return 0
        if not args.cpu_only:
            print("0. the agent alone, steady state", flush=True)
            result["idle"] = idle_agent(tmp, args.idle_seconds)
        print("1. CPU-bound Python, without and with the profiler at 99 Hz (whole host)", flush=True)
        result["cpu"] = cpu_overhead(tmp, args.runs, args.work)
        if not args.cpu_only:
            print("2. symbolization", flush=True)
            result["symbolization"] = symbolization_rate()
            print("3. cudaMalloc + cudaFree from Python", flush=True)
            result["alloc"] = alloc_cost(tmp, args.alloc_calls)
    stats.write_text(stats_before)
    if args.cpu_only:
        c = result["cpu"]
        print(
            f"CPU workload: wall {c['slowdown']:+.2%} (paired {c['paired_slowdown_median']:+.2%}), "
            f"its CPU time {c['cpu_time_slowdown']:+.2%} (paired {c['paired_cpu_time_slowdown_median']:+.2%}), "
            f"in the kernel {c['bpf_ns_per_sample']:,.0f} ns per sample"
        )
        out = args.out or REPO / "bench" / "results" / f"profile-cpu-{dt.date.today().isoformat()}.json"
        out.write_text(json.dumps(result, indent=2))
        print(f"wrote {out}")
        return 0
    i, c, s, a = result["idle"], result["cpu"], result["symbolization"], result["alloc"]
    median = statistics.median
    print(
        "\n".join(
            [
                "",
                f"agent, idle host  {i['agent_share_of_one_core']:.2%} of one core "
                f"({i['profile_thread_share_of_one_core']:.2%} collecting profiles), "
                f"RSS {i['agent_rss_bytes'] / 2**20:.0f} MiB",
                f"CPU workload      median off {c['median_off_s']:.3f}s  on {c['median_on_s']:.3f}s  "
                f"slowdown {c['slowdown']:+.2%} (paired runs: {c['paired_slowdown_median']:+.2%})",
                f"                  its CPU time: median off {median(c['off_cpu_s']):.3f}s  "
                f"on {median(c['on_cpu_s']):.3f}s  "
                f"slowdown {c['cpu_time_slowdown']:+.2%} (paired runs: {c['paired_cpu_time_slowdown_median']:+.2%})",
                f"in the kernel     {c['bpf_ns_per_sample']:,.0f} ns per CPU sample (walker included), "
                f"{c['bpf_share_of_a_cpu_at_99hz']:.3%} of a busy CPU at 99 Hz",
                f"agent             {c['agent_cpu_s_per_run']:.3f}s CPU per run "
                f"({c['agent_cpu_share_of_one_core']:.2%} of one core), RSS {c['agent_rss_bytes'] / 2**20:.0f} MiB",
                f"symbolization     {s['native_frames_per_s']:,.0f} native frames/s (warm), "
                f"{s['python_lines_per_s']:,.0f} Python lines/s, first frame {s['first_frame_s'] * 1000:.0f} ms",
                f"alloc+free        no agent {a['median_ns']['no_agent']:,.0f} ns, "
                f"cuda receiver {a['median_ns']['cuda']:,.0f} ns, "
                f"+ memory profile {a['median_ns']['cuda_and_memory_profile']:,.0f} ns",
                f"                  probes +{a['probes_ns']:,.0f} ns, "
                f"stacks + accounting +{a['stack_capture_and_accounting_ns']:,.0f} ns per allocation",
                f"                  BPF time per uprobe run: {a['bpf_ns_per_probe_run']}",
            ]
        )
    )
    out = args.out or REPO / "bench" / "results" / f"profile-{dt.date.today().isoformat()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
