"""Benchmark the CUDA launch probes and the agent's drain loop, side by side in one run.

    sudo .venv/bin/python bench/cuda_launch.py [--quick] [--out FILE] [--keep-workdir]

Measures, on this machine and in one invocation (so every number shares the same machine state):

1. Per-call cost of ``cudaLaunchKernel`` from a C caller (build/bench/launch_loop), for the
   stand-in runtime (CET-built: ``endbr64; push %rbp``) and NVIDIA's real libcudart.so.12
   (``push %rbp``): no probe; an empty BCC uprobe on the address the agent uses (and, for the
   stand-in, on sym+0 to show what ``endbr64`` costs); the agent with default settings (host
   mode, and --pid mode with its in-kernel pid filter); with ``launch_errors: true``; with
   ``launch_sample_every: 1``.
2. Sustained events: ``launch_loop --rate 1000000 --seconds 10`` with an event per launch, for a
   sweep of ring-buffer sizes and drain intervals: rate achieved, events received and lost,
   CPU of each agent thread (from /proc/PID/task/TID/stat), peak RSS, spans sampled out, and
   whether the agent's ``cuda.kernel.launches`` equals the calls made.
3. Start-up: time to the agent's "otelbpf running" line, BCC compile and attach time.
4. The idle agent's CPU and RSS.

The probed libraries are private copies in a temporary directory: uprobes belong to inodes, so
a copy keeps probes other programs on this machine put on the originals out of the numbers
(and ours out of theirs). Every agent is stopped with SIGINT; the run ends by checking that
/sys/kernel/tracing/uprobe_events is empty. Results: a table on stdout and
bench/results/cuda_launch-<date>.json. Numbers, method and findings: docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_LOOP = ROOT / "build/bench/launch_loop"
FAKE_CUDART = ROOT / "build/examples/fakecudart/libcudart.so.12"
DEFAULT_CONFIG = ROOT / "otelbpf/config/otelbpf.yaml"
RESULTS = ROOT / "bench/results"
UPROBE_EVENTS = Path("/sys/kernel/tracing/uprobe_events")
SYMBOL = "cudaLaunchKernel"
TICKS = os.sysconf("SC_CLK_TCK")
EMPTY_PROGRAM = "int empty_uprobe(struct pt_regs *ctx) { return 0; }"


class BenchError(Exception):
    """The benchmark cannot run or a measurement is invalid; the message says why."""


@dataclass(frozen=True)
class Plan:
    """How much to measure: the full run, or a quick smoke check."""

    calls: int  # launch_loop calls per run (per-call cost)
    runs: int  # launch_loop runs per round; the round's value is their median
    rounds: int  # rounds per case, interleaved with the references; the median is reported
    idle_s: float  # window for the idle agent's CPU
    rate: int  # calls per second asked of launch_loop in the throughput test
    rate_s: float  # how long it runs
    sweep: tuple[tuple[str, str, int], ...]  # (ring_buffer_size, drain_interval, max_spans_per_second) per run
    spans: int  # spans built and exported in-process to time one span


FULL = Plan(
    calls=100_000,
    runs=1,
    rounds=9,
    idle_s=10,
    rate=1_000_000,
    rate_s=10,
    sweep=(
        ("4MiB", "50ms", 20000),
        ("4MiB", "20ms", 20000),
        ("8MiB", "50ms", 20000),
        ("16MiB", "50ms", 20000),
        ("16MiB", "20ms", 20000),
        ("4MiB", "50ms", 0),
        ("16MiB", "50ms", 0),
    ),
    spans=20_000,
)
QUICK = Plan(
    calls=30_000,
    runs=1,
    rounds=3,
    idle_s=3,
    rate=1_000_000,
    rate_s=3,
    sweep=(("4MiB", "50ms", 20000), ("16MiB", "20ms", 20000)),
    spans=2_000,
)


# -- machine and processes --------------------------------------------------


def machine() -> dict:
    """What the numbers were measured on."""
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = re.search(r"^model name\s*:\s*(.*)$", cpuinfo, re.M)
    flags = re.search(r"^flags\s*:\s*(.*)$", cpuinfo, re.M)
    mem = re.search(r"^MemTotal:\s*(\d+)", Path("/proc/meminfo").read_text(), re.M)
    git = ["git", "-C", str(ROOT)]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--", "otelbpf"], capture_output=True, text=True).stdout
    import bcc

    return {
        "kernel": platform.release(),
        "cpu_model": model.group(1) if model else "unknown",
        "cpus": os.cpu_count(),
        "virtualized": bool(flags and "hypervisor" in flags.group(1).split()),
        "memory_gib": round(int(mem.group(1)) / 2**20, 1) if mem else None,
        "python": platform.python_version(),
        "bcc": getattr(bcc, "__version__", "unknown"),
        "git_commit": commit,
        "agent_code_modified": bool(dirty.strip()),
        "nice": os.nice(0),  # inherited by every process the benchmark starts
    }


def cpu_times() -> dict[str, int]:
    """Machine-wide CPU ticks (all cores) from /proc/stat."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    total = sum(f[:8])
    return {"total": total, "busy": total - f[3] - f[4], "steal": f[7]}


def machine_pct(before: dict[str, int], after: dict[str, int], key: str = "busy") -> float:
    """CPU ``key`` (busy or steal) between two cpu_times(), in % of one core (2 cores: up to 200)."""
    share = (after[key] - before[key]) / max(1, after["total"] - before["total"])
    return round(100 * share * (os.cpu_count() or 1), 1)


def thread_ticks(pid: int) -> dict[int, tuple[str, int]]:
    """tid -> (thread name, utime + stime in clock ticks) for every thread of ``pid``."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
            stat = (task / "stat").read_text()
        except OSError:
            continue  # the thread ended
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(task.name)] = (comm, int(fields[11]) + int(fields[12]))
    return out


def cpu_by_thread(
    before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]], seconds: float
) -> dict[str, float]:
    """% of one core per thread name over a window (threads sharing a name are summed)."""
    pct: dict[str, float] = {}
    for tid, (comm, ticks) in after.items():
        used = ticks - before.get(tid, (comm, 0))[1]
        pct[comm] = pct.get(comm, 0.0) + 100.0 * used / TICKS / seconds
    pct["total"] = sum(pct.values())
    return {k: round(v, 1) for k, v in sorted(pct.items())}


def bpf_holders(exclude: set[int]) -> list[str]:
    """Other processes holding BPF programs ("pid comm"): another agent or a test may be
    probing this machine's libraries meanwhile, which would show in the numbers."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) in exclude:
            continue
        try:
            if any(os.readlink(fd) == "anon_inode:bpf-prog" for fd in (d / "fd").iterdir()):
                found.append(f"{d.name} {(d / 'comm').read_text().strip()}")
        except OSError:
            continue  # gone, or a kernel thread
    return found


def memory_kib(pid: int) -> dict[str, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    return {k: int(re.search(rf"^{k}:\s*(\d+)", status, re.M).group(1)) for k in ("VmRSS", "VmHWM")}


def real_cudart() -> Path:
    """NVIDIA's CUDA 13 runtime (the toolkit's libcudart.so.13, byte-identical to the PyPI
    wheel `nvidia-cuda-runtime` 13.0), what current PyTorch ships; else the cu12 wheel's."""
    for candidate in (
        Path("/usr/local/cuda-13.0/lib64/libcudart.so.13"),
        Path("/usr/local/cuda/lib64/libcudart.so.13"),
    ):
        if candidate.exists():
            return candidate.resolve()
    spec = importlib.util.find_spec("nvidia.cuda_runtime")
    for location in (spec.submodule_search_locations if spec else None) or []:
        for name in ("libcudart.so.13", "libcudart.so.12"):
            candidate = Path(location) / "lib" / name
            if candidate.exists():
                return candidate
    raise BenchError("no NVIDIA libcudart found: install the CUDA 13 toolkit or pip install nvidia-cuda-runtime-cu12")


def first_bytes(path: Path, offset: int, n: int = 8) -> str:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(n).hex(" ")


# -- launch_loop ------------------------------------------------------------


def loop(lib: Path, plan: Plan) -> dict:
    """launch_loop in loop mode: ns per call of each run and their median."""
    p = subprocess.run(
        [str(LAUNCH_LOOP), "--lib", str(lib), "--calls", str(plan.calls), "--runs", str(plan.runs)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if p.returncode != 0:
        raise BenchError(f"launch_loop failed on {lib}: {p.stderr.strip()}")
    return json.loads(p.stdout)


def paced(lib: Path, rate: float, seconds: float) -> tuple[subprocess.Popen, Path]:
    """Start launch_loop in rate mode; its JSON line goes to a file read by ``finish_paced``."""
    out = lib.parent / f"rate-{time.monotonic_ns()}.json"
    with open(out, "w") as f:
        proc = subprocess.Popen(
            [str(LAUNCH_LOOP), "--lib", str(lib), "--rate", str(rate), "--seconds", str(seconds)],
            stdout=f,
            stderr=subprocess.PIPE,
            text=True,
        )
    return proc, out


def finish_paced(proc: subprocess.Popen, out: Path) -> dict:
    """Wait for a paced launch_loop; adds its own CPU time (from wait4) to its JSON."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read() if proc.stderr else ""
    if proc.returncode != 0:
        raise BenchError(f"launch_loop --rate failed (exit {proc.returncode}): {err.strip()}")
    result = json.loads(out.read_text())
    result["pid"] = proc.pid
    result["cpu_s"] = round(usage.ru_utime + usage.ru_stime, 3)
    return result


# -- probes -----------------------------------------------------------------


@contextmanager
def empty_uprobes(sites: list[tuple[Path, int]]) -> Iterator[dict]:
    """An empty BCC uprobe on each (library, ELF virtual address), detached on exit.

    Yields a dict that gets "seconds": how long detaching took (the kernel's uprobe
    unregistration, which also dominates the agent's stop time).
    """
    from bcc import BPF

    bpf = BPF(text=EMPTY_PROGRAM)
    timing: dict = {}
    try:
        for path, vaddr in sites:
            bpf.attach_uprobe(name=str(path), addr=vaddr, fn_name="empty_uprobe")
        yield timing
    finally:
        t0 = time.monotonic()
        bpf.cleanup()
        timing["seconds"] = time.monotonic() - t0


@dataclass
class Agent:
    """One `otelbpf run` in a subprocess, configured from otelbpf/config/otelbpf.yaml plus overrides."""

    name: str
    workdir: Path
    libs: list[Path]  # receivers.cuda.search_paths: attached at start-up
    cuda: dict = field(default_factory=dict)  # receivers.cuda overrides
    telemetry_cfg: dict = field(default_factory=dict)  # service.telemetry overrides
    pid: int | None = None  # --pid (in-kernel pid filter); None: host mode
    effective: dict = field(default_factory=dict)  # the receivers.cuda and telemetry it ran with
    proc: subprocess.Popen | None = None
    lines: list[str] = field(default_factory=list)
    seconds_to_running: float = 0.0
    stop_seconds: float = 0.0
    startup: dict = field(default_factory=dict)  # otelbpf.startup.duration{phase}, once read

    @property
    def outdir(self) -> Path:
        return self.workdir / self.name / "out"

    def _config(self) -> Path:
        cfg = yaml.safe_load(DEFAULT_CONFIG.read_text())
        cuda = cfg["receivers"]["cuda"]
        cuda.update(self.cuda, search_paths=[str(p) for p in self.libs])
        cfg["exporters"]["file"]["directory"] = str(self.outdir)
        cfg["service"]["telemetry"].update(self.telemetry_cfg)
        self.effective = {
            **{k: v for k, v in cuda.items() if k != "search_paths"},
            **cfg["service"]["telemetry"],
            "pipelines": {sig: p["receivers"] for sig, p in cfg["service"]["pipelines"].items()},
        }
        path = self.workdir / self.name / "otelbpf.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        return path

    def start(self, timeout_s: float = 90) -> None:
        """Start and wait for "otelbpf running"; check it attached to every benchmark library."""
        # The agent of this checkout (PYTHONPATH first), whatever the venv has installed.
        cmd = [sys.executable, "-m", "otelbpf.cli", "run", "-c", str(self._config())]
        cmd += ["--pid", str(self.pid)] if self.pid else []
        # Probes released before the agent exits: the next case must not pay for this one's.
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OTELBPF_DETACH": "wait"}
        running = threading.Event()
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=self.workdir, env=env
        )

        def read() -> None:
            for line in self.proc.stderr:
                self.lines.append(line.rstrip("\n"))
                if "otelbpf running" in line:
                    self.seconds_to_running = time.monotonic() - t0
                    running.set()

        threading.Thread(target=read, daemon=True).start()
        while not running.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() - t0 > timeout_s:
                self.stop()
                raise BenchError(f"agent {self.name} did not start:\n" + "\n".join(self.lines[-20:]))
        for lib in self.libs:
            attached = [ln for ln in self.lines if f"probes to {lib} " in ln]
            if not attached or re.search(r"attached 0 probes", attached[-1]):
                self.stop()
                raise BenchError(f"agent {self.name} did not attach to {lib}:\n" + "\n".join(self.lines[-20:]))

    def stop(self, timeout_s: float = 120) -> None:
        """SIGINT (the agent detaches, drains, flushes), SIGKILL only if it hangs."""
        if self.proc is None or self.proc.returncode is not None:
            return
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired as e:
            self.proc.kill()
            self.proc.wait()
            raise BenchError(f"agent {self.name} did not stop within {timeout_s:.0f}s of SIGINT; killed it") from e
        finally:
            self.stop_seconds = time.monotonic() - t0
        time.sleep(0.2)  # let the stderr reader catch the last lines

    def attached_elsewhere(self) -> list[str]:
        """Libraries of other programs on this host the agent also attached to (host mode)."""
        mine = {str(p) for p in self.libs}
        found = [m.group(1) for ln in self.lines if (m := re.search(r"attached \d+ probes to (\S+)", ln))]
        return sorted(set(found) - mine)

    def telemetry(self, launch_pids: Sequence[int] = ()) -> dict:
        """The agent's own counters and the launch counts it exported, from its OTLP-JSON files.

        Read after the agent stopped: its last metrics export carries the final totals.
        """
        from otelbpf.analyze.summary import load

        latest, spans, _procs = load(str(self.outdir))

        def values(key: tuple | None, name: str) -> dict[str, float]:
            out = {}
            for (n, attrs), (_t, dp, _kind) in latest.get(key, {}).items():
                if n == name:
                    label = ",".join(f"{k}={v}" for k, v in attrs) or "total"
                    out[label] = int(dp["asInt"]) if "asInt" in dp else float(dp.get("asDouble", 0))
            return out

        me = next((k for k in latest if k[0] == "otelbpf"), None)
        health = {
            n: values(me, n)
            for n in (
                "otelbpf.events.received",
                "otelbpf.events.lost",
                "otelbpf.events.dropped",
                "otelbpf.spans.sampled_out",
                "otelbpf.export.sent",
                "otelbpf.export.dropped",
                "otelbpf.startup.duration",
                "otelbpf.attach.failures",
                "process.cpu.time",
                "process.memory.usage",
            )
        }
        launches = {}
        for pid in launch_pids:
            key = next((k for k in latest if k[1] == pid), None)
            launches[pid] = int(sum(values(key, "cuda.kernel.launches").values()))
        self.startup = health["otelbpf.startup.duration"]
        return {
            "health": health,
            "launches_by_pid": launches,
            "spans_in_file": sum(sum(st["count"].values()) for st in spans.values()),
        }

    def describe(self) -> dict:
        return {
            "mode": f"--pid {self.pid}" if self.pid else "host",
            "overrides": {**self.cuda, **self.telemetry_cfg},
            **self.effective,
            "seconds_to_running": round(self.seconds_to_running, 3),
            "stop_seconds": round(self.stop_seconds, 3),
            "startup_duration_s": self.startup,
            "other_libraries_attached": self.attached_elsewhere(),
        }


@contextmanager
def running(agent: Agent, registry: list[Agent]) -> Iterator[Agent]:
    registry.append(agent)
    agent.start()
    try:
        yield agent
    finally:
        agent.stop()


# -- the measurements -------------------------------------------------------


@dataclass
class Libraries:
    """Private copies of the two runtimes, one per role, and where they are probed.

    Copies are separate inodes, so each carries only its own probes. Only the copies named
    libcudart.so.12 match the agent's library pattern (^libcudart\\.so); the others are named
    so that a running host-mode agent never attaches to them, which lets the unprobed and
    empty-probe cases be measured in the same minutes as each agent configuration.
    """

    dirs: dict[str, Path]  # role -> directory holding "fake" and "real" copies
    sites: dict = field(default_factory=dict)

    ROLES = {
        "agent": "libcudart.so.12",
        "plain": "cudart-plain.so.12",
        "empty": "cudart-empty.so.12",
        "empty_sym0": "cudart-empty-sym0.so.12",
    }

    def path(self, role: str, lib: str) -> Path:
        return self.dirs[role] / lib / self.ROLES[role]

    @classmethod
    def copy_into(cls, workdir: Path) -> Libraries:
        from otelbpf.sensor.elf import resolve

        libs = cls({role: workdir / role for role in cls.ROLES})
        sources = {"fake": FAKE_CUDART, "real": real_cudart()}
        for role in cls.ROLES:
            for lib, src in sources.items():
                dst = libs.path(role, lib)
                dst.parent.mkdir(parents=True)
                shutil.copy2(src, dst)
        for lib in sources:
            path = libs.path("agent", lib)
            site = resolve(str(path), [SYMBOL])[SYMBOL][0]
            libs.sites[lib] = {
                "vaddr": site.vaddr,
                "probe_vaddr": site.probe_vaddr,
                "first_bytes": first_bytes(path, site.file_offset),
            }
        return libs


class Samples:
    """ns/call samples per (case, library): one launch_loop median per round."""

    def __init__(self, plan: Plan, log) -> None:
        self.plan, self.log = plan, log
        self.rounds: dict[tuple[str, str], list[float]] = {}
        self.runs: dict[tuple[str, str], list[float]] = {}

    def take(self, case: str, lib: str, path: Path) -> float:
        r = loop(path, self.plan)
        self.rounds.setdefault((case, lib), []).append(r["median_ns_per_call"])
        self.runs.setdefault((case, lib), []).extend(r["ns_per_call"])
        return r["median_ns_per_call"]

    def median(self, case: str, lib: str) -> float:
        return statistics.median(self.rounds[(case, lib)])


CASES = {
    "a": ("no probe", "-"),
    "b": ("empty uprobe, agent's address", "fake sym+4, real sym+0"),
    "b0": ("empty uprobe, fake at sym+0", "fake sym+0 (endbr64)"),
    "c": ("agent default settings (--pid)", "entry only, in-kernel count, pid filter"),
    "c-host": ("agent default settings (host mode)", "entry only, in-kernel count"),
    "d": ("agent launch_errors: true (--pid)", "entry + uretprobe"),
    "e": ("agent launch_sample_every: 1 (--pid)", "entry + a ring-buffer event per launch"),
    "e16": ("e with a 16MiB ring and no spans (--pid)", "entry + an event per launch, fewer ring-full failures"),
}


def per_call(libs: Libraries, plan: Plan, workdir: Path, agents: list[Agent], log) -> tuple[list[dict], dict, dict]:
    """ns/call per case, the idle default agent, and the empty uprobes' detach time.

    One empty BCC program stays attached to the "empty" copies throughout. Without an agent,
    rounds of (a, b, b0); then per agent configuration, rounds of (a, b, agent): every agent
    case is measured interleaved with its own no-probe and empty-probe references.
    """
    samples = Samples(plan, log)
    sites = libs.sites
    empty = [
        (libs.path("empty", "fake"), sites["fake"]["probe_vaddr"]),
        (libs.path("empty", "real"), sites["real"]["probe_vaddr"]),
        (libs.path("empty_sym0", "fake"), sites["fake"]["vaddr"]),
    ]
    paired: dict[str, dict] = {}
    idle: dict = {}
    foreign: dict[str, list[str]] = {}

    def mine() -> set[int]:
        return {os.getpid()} | {a.proc.pid for a in agents if a.proc is not None}

    def rounds(case: str) -> None:
        foreign.setdefault(case, []).extend(h for h in bpf_holders(mine()) if h not in foreign.get(case, []))
        for _ in range(plan.rounds):
            for lib in ("fake", "real"):
                samples.take("a", lib, libs.path("plain", lib))
                samples.take("b", lib, libs.path("empty", lib))
                if case == "b0":
                    if lib == "fake":
                        samples.take("b0", lib, libs.path("empty_sym0", lib))
                else:
                    samples.take(case, lib, libs.path("agent", lib))
        for shown in ("a", "b", case) if case == "b0" else (case,):
            libs_seen = [lib for lib in ("fake", "real") if (shown, lib) in samples.rounds]
            cells = [f"{lib} {samples.median(shown, lib):8.1f} ns" for lib in libs_seen]
            log(f"  {shown:>6}. {CASES[shown][0]:<38} " + "  ".join(cells))

    with empty_uprobes(empty) as detach:
        rounds("b0")
        agent_libs = [libs.path("agent", "fake"), libs.path("agent", "real")]
        me = os.getpid()  # --pid: this process, so the launch_loops it starts are watched
        for case, agent in (
            ("c", Agent("default-pid", workdir, agent_libs, pid=me)),
            ("c-host", Agent("default-host", workdir, agent_libs)),
            ("d", Agent("launch-errors", workdir, agent_libs, cuda={"launch_errors": True}, pid=me)),
            ("e", Agent("sample-every-1", workdir, agent_libs, cuda={"launch_sample_every": 1}, pid=me)),
            # In (e) launch_loop outruns the default ring, so most events fail to reserve (cheaply);
            # here more of them are written, which is the cost of an event that reaches the agent.
            (
                "e16",
                Agent(
                    "sample-every-1-16MiB",
                    workdir,
                    agent_libs,
                    pid=me,
                    cuda={"launch_sample_every": 1, "ring_buffer_size": "16MiB", "max_spans_per_second": 0},
                ),
            ),
        ):
            start = {k: len(v) for k, v in samples.rounds.items()}
            with running(agent, agents):
                if case == "c-host":
                    idle = idle_window(agent, plan.idle_s)
                rounds(case)
            paired[case] = {  # the a and b rounds taken while this agent ran, round by round
                lib: {r: samples.rounds[(r, lib)][start.get((r, lib), 0) :] for r in ("a", "b")}
                for lib in ("fake", "real")
            }
            paired[case]["agent"] = agent.describe()
            paired[case]["agent_telemetry"] = agent.telemetry()["health"]
            if case == "c-host":
                idle["telemetry"] = paired[case]["agent_telemetry"]
                idle["agent"] = paired[case]["agent"]
    rows = []
    for case, (config, probe) in CASES.items():
        row: dict = {"key": case, "config": config, "probe": probe}
        for lib in ("fake", "real"):
            if (case, lib) in samples.rounds:
                row[lib] = {
                    "median_ns": round(samples.median(case, lib), 2),
                    "round_medians_ns": samples.rounds[(case, lib)],
                    "runs_ns": samples.runs[(case, lib)],
                    **({"same_window": paired[case][lib]} if case in paired else {}),
                }
        if case in paired:
            row["agent"], row["agent_telemetry"] = paired[case]["agent"], paired[case]["agent_telemetry"]
        seen = foreign.values() if case in ("a", "b") else [foreign.get(case, [])]
        row["other_bpf_processes"] = sorted({h for hs in seen for h in hs})
        rows.append(row)
    return rows, idle, {"probes": len(empty), "seconds": round(detach["seconds"], 3)}


def idle_window(agent: Agent, seconds: float) -> dict:
    """CPU and memory of an agent with nothing to do (host mode still rescans /proc every 5 s)."""
    time.sleep(1.0)  # let start-up work (first /proc scan) settle
    pid = agent.proc.pid
    before, m0, t0 = thread_ticks(pid), cpu_times(), time.monotonic()
    time.sleep(seconds)
    after, m1, secs = thread_ticks(pid), cpu_times(), time.monotonic() - t0
    return {
        "seconds": round(secs, 1),
        "cpu_pct_of_core": cpu_by_thread(before, after, secs),
        "memory_kib": memory_kib(pid),
        "machine_busy_pct_of_core": machine_pct(m0, m1),
    }


def throughput_run(agent: Agent, libs: list[Path], rate: float, seconds: float, agents: list[Agent], log) -> dict:
    """One agent, ``len(libs)`` paced launch_loops sharing ``rate``; CPU and loss over the window."""
    with running(agent, agents):
        time.sleep(1.0)
        pid = agent.proc.pid
        others = bpf_holders({os.getpid(), pid})
        before, m0, t0 = thread_ticks(pid), cpu_times(), time.monotonic()
        procs = [paced(lib, rate / len(libs), seconds) for lib in libs]
        loops = [finish_paced(p, out) for p, out in procs]
        after, m1, secs = thread_ticks(pid), cpu_times(), time.monotonic() - t0
        mem = memory_kib(pid)
    tel = agent.telemetry([r["pid"] for r in loops])
    cpu = cpu_by_thread(before, after, secs)
    loops_cpu = sum(r["cpu_s"] for r in loops) / secs * 100
    calls = sum(r["calls"] for r in loops)
    h = tel["health"]
    result = {
        "agent": agent.describe(),
        "launch_loops": loops,
        "window_s": round(secs, 2),
        "calls": calls,
        "achieved_rate": round(sum(r["achieved_rate"] for r in loops)),
        # launch_loop makes one uncounted warm-up call before it starts timing
        "launches_metric": sum(tel["launches_by_pid"].values()),
        "launches_metric_equals_calls": sum(tel["launches_by_pid"].values()) == calls + len(loops),
        "events_received": h["otelbpf.events.received"].get("ring=events", 0),
        "events_lost_kernel": h["otelbpf.events.lost"],
        "events_dropped_userspace": h["otelbpf.events.dropped"],
        "spans_sampled_out": sum(h["otelbpf.spans.sampled_out"].values()),
        "spans_exported": tel["spans_in_file"],
        "export_dropped": h["otelbpf.export.dropped"],
        "agent_cpu_pct_of_core": cpu,
        "launch_loop_cpu_pct_of_core": round(loops_cpu, 1),
        "other_cpu_pct_of_core": round(machine_pct(m0, m1) - cpu["total"] - loops_cpu, 1),
        "steal_pct_of_core": machine_pct(m0, m1, "steal"),
        "agent_memory_kib": mem,
        "other_bpf_processes": others,
    }
    lost = sum(result["events_lost_kernel"].values())
    e = agent.effective
    log(
        f"  ring {e['ring_buffer_size']:>5} drain {e['drain_interval']:>4} spans/s {e['max_spans_per_second']:>5} "
        f"x{len(libs)}: {result['achieved_rate']:>9,}/s, received {result['events_received']:,}, lost {lost:,}, "
        f"drain {cpu.get('otelbpf-drain', 0):.1f}%, "
        f"agent {cpu['total']:.1f}%"
    )
    return result


def sweep_cuda(ring: str, spans: int) -> dict:
    return {"launch_sample_every": 1, "ring_buffer_size": ring, "max_spans_per_second": spans}


def throughput(libs: Libraries, plan: Plan, workdir: Path, agents: list[Agent], log) -> list[dict]:
    """The sweep in ``plan.sweep``, then two callers if one could not reach the rate."""
    runs = []
    fake = libs.path("agent", "fake")
    for ring, drain, spans in plan.sweep:
        agent = Agent(
            f"rate-{ring}-{drain}-{spans}",
            workdir,
            [fake],
            cuda=sweep_cuda(ring, spans),
            telemetry_cfg={"drain_interval": drain},
            pid=os.getpid(),
        )
        runs.append(throughput_run(agent, [fake], plan.rate, plan.rate_s, agents, log))
    if runs[0]["achieved_rate"] < 0.98 * plan.rate:
        second = workdir / "agent-2" / "fake" / "libcudart.so.12"
        second.parent.mkdir(parents=True)
        shutil.copy2(fake, second)
        ring, drain, spans = plan.sweep[0]
        agent = Agent(
            f"rate-2procs-{ring}-{drain}",
            workdir,
            [fake, second],
            cuda=sweep_cuda(ring, spans),
            telemetry_cfg={"drain_interval": drain},
            pid=os.getpid(),
        )
        runs.append(throughput_run(agent, [fake, second], plan.rate, plan.rate_s, agents, log))
    return runs


def span_costs(n: int, workdir: Path) -> dict:
    """CPU per launch span to build (make_span) and to write with the file exporter.

    In-process, with the agent's own code and a launch span's attributes: the sustained
    runs show the span threads' CPU; this says what one span costs, so the budget
    (max_spans_per_second) can be compared with what the exporter sustains.
    """
    from opentelemetry.sdk.resources import Resource

    from otelbpf.correlate.spans import make_span, scope
    from otelbpf.export.jsonfile import FileSpanExporter

    resource = Resource({"service.name": "launch_loop", "process.pid": 4242})
    attrs = {
        "cuda.api.function": "cudaLaunchKernel",
        "thread.id": 4242,
        "cuda.stream": "0x0",
        "cuda.kernel.name": "bench_kernel(float*, int)",
        "cuda.kernel.function_address": "0x5555555551a0",
        **{f"cuda.{d}.{a}": 1 for d in ("grid", "block") for a in "xyz"},
    }
    t0 = time.process_time()
    spans = [
        make_span(
            "cudaLaunchKernel",
            resource=resource,
            scope=scope("otelbpf.cuda"),
            start_ns=i,
            end_ns=i + 1,
            attributes=dict(attrs),
        )
        for i in range(n)
    ]
    t1 = time.process_time()
    exporter = FileSpanExporter(str(workdir / "span-costs"))
    for i in range(0, n, 512):  # the batch processor's default send_batch_size
        exporter.export(spans[i : i + 512])
    t2 = time.process_time()
    exporter.shutdown()
    return {"spans": n, "make_span_us": round(1e6 * (t1 - t0) / n, 1), "file_export_us": round(1e6 * (t2 - t1) / n, 1)}


# -- report -----------------------------------------------------------------


def print_report(res: dict) -> None:
    rows = res["per_call"]
    base = {k: rows[0][k]["median_ns"] for k in ("fake", "real")}
    plan = res["plan"]
    print(
        f"\nPer-call cost of cudaLaunchKernel: launch_loop, median of {plan['rounds']} rounds "
        f"(each the median of {plan['runs']} runs x {plan['calls']:,} calls)"
    )
    print(f"{'case':<46}{'fake ns':>9}{'+ns':>8}{'real ns':>9}{'+ns':>8}")
    for r in rows:
        cells = ""
        for k in ("fake", "real"):
            cells += f"{r[k]['median_ns']:9.1f}{r[k]['median_ns'] - base[k]:8.1f}" if k in r else f"{'-':>9}{'-':>8}"
        print(f"{r['key'] + '. ' + r['config']:<46}{cells}")
    for r in rows:
        tel = r.get("agent_telemetry") or {}
        lost = tel.get("otelbpf.events.lost", {}).get("reason=ring_buffer_full", 0)
        if lost:
            got = tel["otelbpf.events.received"].get("ring=events", 0)
            print(f"{r['key']}: {lost:,} of {lost + got:,} launch events found the ring full (not written)")
    for k, v in res["ratios"].items():
        case, lib = k.split()
        print(
            f"({case})/(b) on {lib}, median of per-round ratios: ns/call {v['ns_per_call']:.2f}x, added ns "
            f"{v['added_ns']:.2f}x (target <= 1.5x: {'met' if v['ns_per_call'] <= 1.5 else 'NOT met'}); "
            f"rounds {v['per_round_ns_per_call']}"
        )
    print(
        f"\nSustained events: launch_sample_every 1, launch_loop --rate {plan['rate']:,} --seconds {plan['rate_s']:g}"
    )
    print(
        f"{'ring':>6}{'drain':>6}{'spans/s':>8}{'procs':>6}{'rate/s':>11}{'received':>11}{'lost':>10}{'drain%':>7}"
        f"{'proc%':>7}{'spans%':>7}{'agent%':>7}{'other%':>7}{'lag ms':>7}{'RSS pk':>8}{'sampled out':>12}"
        f"{'launches=calls':>15}"
    )
    for t in res["throughput"]:
        c, a = t["agent_cpu_pct_of_core"], t["agent"]
        print(
            f"{a['ring_buffer_size']:>6}{a['drain_interval']:>6}{a['max_spans_per_second']:>8}"
            f"{len(t['launch_loops']):>6}"
            f"{t['achieved_rate']:>11,}{t['events_received']:>11,}{sum(t['events_lost_kernel'].values()):>10,}"
            f"{c.get('otelbpf-drain', 0):>7.1f}{c.get('otelbpf-process', 0):>7.1f}{c.get('otelbpf-spans', 0):>7.1f}"
            f"{c['total']:>7.1f}{t['other_cpu_pct_of_core']:>7.1f}"
            f"{max(r['max_lag_ns'] for r in t['launch_loops']) / 1e6:>7.0f}"
            f"{t['agent_memory_kib']['VmHWM'] / 1024:>7.0f}M"
            f"{t['spans_sampled_out']:>12,}{str(t['launches_metric_equals_calls']):>15}"
        )
    s = res["startup"]
    print(
        f"\nStart-up (median of {s['agents']} agent starts): 'otelbpf running' after "
        f"{s['seconds_to_running_median']:.2f}s; BCC compile {s['compile_s_median']:.2f}s, "
        f"attach {s['attach_s_median']:.3f}s; "
        f"stop (SIGINT to exit) {s['stop_s_median']:.1f}s"
    )
    i = res["idle"]
    print(
        f"Idle agent (host mode) over {i['seconds']}s: {i['cpu_pct_of_core']['total']:.1f}% of a core, "
        f"RSS {i['memory_kib']['VmRSS'] / 1024:.0f} MiB (peak {i['memory_kib']['VmHWM'] / 1024:.0f} MiB)"
    )
    sc = res["span_costs"]
    print(
        f"One launch span: make_span {sc['make_span_us']:.1f} us, file exporter {sc['file_export_us']:.1f} us of CPU "
        f"(in-process, {sc['spans']:,} spans)"
    )
    d = res["empty_uprobe_detach"]
    print(f"Detaching {d['probes']} empty uprobes took {d['seconds']:.2f}s")
    others = sorted({h for r in res["per_call"] + res["throughput"] for h in r["other_bpf_processes"]})
    if others:
        print(f"Other processes held BPF programs during the run (may have probed too): {', '.join(others)}")
    print(f"uprobe_events empty at the end: {res['cleanup']['uprobe_events_empty']}")


def summarize(res: dict, agents: list[Agent]) -> None:
    """Ratios and start-up medians, derived from the raw numbers already in ``res``.

    A ratio compares each round of the default agent with the empty uprobe measured in
    the same round, seconds apart, and takes the median over rounds: this VM's uprobe
    cost drifts by tens of percent over minutes, which a ratio of medians would pick up.
    """
    res["ratios"] = {}
    for row in res["per_call"]:
        if row["key"] not in ("c", "c-host"):
            continue
        for lib in ("fake", "real"):
            ref, agent = row[lib]["same_window"], row[lib]["round_medians_ns"]
            per_round = [(x / b, (x - a) / (b - a)) for x, a, b in zip(agent, ref["a"], ref["b"])]
            res["ratios"][f"{row['key']} {lib}"] = {
                "ns_per_call": round(statistics.median(r[0] for r in per_round), 2),
                "added_ns": round(statistics.median(r[1] for r in per_round), 2),
                "per_round_ns_per_call": [round(r[0], 2) for r in per_round],
                "ratio_of_medians": round(statistics.median(agent) / statistics.median(ref["b"]), 2),
            }
    started = [a for a in agents if a.seconds_to_running and a.startup]
    compile_s = [round(a.startup["phase=compile"], 3) for a in started]
    attach_s = [round(a.startup["phase=attach"], 3) for a in started]
    res["startup"] = {
        "agents": len(started),
        "seconds_to_running": [round(a.seconds_to_running, 3) for a in started],
        "seconds_to_running_median": statistics.median(a.seconds_to_running for a in started),
        "compile_s": compile_s,
        "compile_s_median": statistics.median(compile_s),
        "attach_s": attach_s,
        "attach_s_median": statistics.median(attach_s),
        "stop_s": [round(a.stop_seconds, 2) for a in started],
        "stop_s_median": statistics.median(a.stop_seconds for a in started),
    }


def check_uprobe_events() -> dict:
    text = UPROBE_EVENTS.read_text() if UPROBE_EVENTS.exists() else ""
    return {"uprobe_events_empty": not text.strip(), "uprobe_events": text.splitlines()}


def preflight() -> None:
    if os.geteuid() != 0:
        raise BenchError("needs root to load BPF programs: sudo .venv/bin/python bench/cuda_launch.py")
    if not UPROBE_EVENTS.parent.joinpath("events").exists():
        raise BenchError(
            "tracefs is not mounted at /sys/kernel/tracing (BCC needs it to detach): "
            "sudo scripts/setup.sh, or mount -t tracefs nodev /sys/kernel/tracing"
        )
    if importlib.util.find_spec("bcc") is None:
        raise BenchError("BCC's Python module is not importable from this Python: run scripts/setup.sh")
    build = subprocess.run([str(ROOT / "examples/build.sh")], capture_output=True, text=True)
    if build.returncode != 0:
        raise BenchError(f"examples/build.sh failed:\n{build.stderr}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer and shorter runs: a smoke check, not numbers to report")
    p.add_argument("--out", type=Path, help="JSON results file (default bench/results/cuda_launch-<date>[-quick].json)")
    p.add_argument("--keep-workdir", action="store_true", help="keep the temporary directory (configs, agent output)")
    args = p.parse_args(argv)
    plan = QUICK if args.quick else FULL
    sys.path.insert(0, str(ROOT))

    def log(msg: str) -> None:
        print(msg, flush=True)

    started = time.monotonic()
    agents: list[Agent] = []
    workdir = Path(tempfile.mkdtemp(prefix="otelbpf-bench-"))
    res: dict = {"started": dt.datetime.now().isoformat(timespec="seconds"), "quick": args.quick, "plan": plan.__dict__}
    try:
        preflight()
        res["machine"] = machine()
        m0 = cpu_times()
        time.sleep(1.0)
        busy = res["machine"]["busy_pct_of_core_before_start"] = machine_pct(m0, cpu_times())
        if busy > 10:
            log(f"warning: before the benchmark starts, other programs use {busy}% of a core; numbers will be noisy")
        libs = Libraries.copy_into(workdir)
        res["sites"] = libs.sites
        log(f"workdir {workdir}\nper-call cost ({plan.rounds} rounds of {plan.runs} x {plan.calls:,} calls per case):")
        res["per_call"], res["idle"], res["empty_uprobe_detach"] = per_call(libs, plan, workdir, agents, log)
        log(f"throughput (launch_sample_every: 1, {plan.rate:,}/s for {plan.rate_s:g}s):")
        res["throughput"] = throughput(libs, plan, workdir, agents, log)
        res["span_costs"] = span_costs(plan.spans, workdir)
        summarize(res, agents)
    finally:
        for a in agents:
            if a.proc is not None and a.proc.poll() is None:
                a.stop()
        if not args.keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    res["cleanup"] = check_uprobe_events()
    res["elapsed_s"] = round(time.monotonic() - started, 1)
    out = args.out or RESULTS / f"cuda_launch-{dt.date.today().isoformat()}{'-quick' if args.quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1) + "\n")
    print_report(res)
    print(f"\nelapsed {res['elapsed_s']:.0f}s; results written to {out}")
    return 0 if res["cleanup"]["uprobe_events_empty"] else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"cuda_launch: {exc}", file=sys.stderr)
        sys.exit(1)
