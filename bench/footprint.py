"""The agent's own footprint: RSS, CPU, start and stop time, idle and under load (issue 14).

    sudo .venv/bin/python bench/footprint.py [--seconds 20] [--rate 50000] [--quick] [--out FILE]
    sudo .venv/bin/python bench/footprint.py --churn [--seconds 600] [--every 5] [--configs all]

Two agents, one after the other, each in host mode and stopped with SIGTERM:

- ``default``: the embedded default config (cuda, http for GPU processes, nccl, ibverbs, profiling), file exporters;
- ``all``: every receiver (cuda, profiling, nccl, ibverbs, http) in the pipelines.

Each goes through the same windows, ``--seconds`` long, with its RSS (VmRSS) sampled every
second throughout and its CPU read per thread (/proc/PID/task/TID/stat) over each window:

0. ``warmup``: the ``--warmup`` seconds right after "running" (default 30: three profile
   intervals), when the profiler names every stack of the host's processes for the first time;
1. ``idle``: nothing to trace (the host's own processes still get profiled);
2. ``launches``: ``build/bench/launch_loop --rate R`` calling ``cudaLaunchKernel`` on a private
   copy of the stand-in runtime (default sampling: launches counted in the kernel, no span);
3. ``mixed`` (``all`` only): the launches, plus ``build/bench/http_server`` under a paced
   keep-alive HTTP/1.1 client (``--http-rate`` requests/s from this process) and
   ``build/examples/nccl_job`` (2 ranks, all-reduce after each batch of kernels) running in a loop.

Start time is Popen to the agent's "otelbpf running" line (with the compile time it logs);
stop time is SIGTERM to exit, with the phases Agent.stop logs ("otelbpf stopped in ...": see
also bench/stop_time.py for --pid and command modes). The RSS growth over the load windows
(least squares, MiB per minute) says whether memory is flat. The agent's own
``otelbpf.ring.usage`` exports give each window's most-filled moment of every BPF ring (its
whole size is resident: the evidence for sizing ``ring_buffer_size``). Each run also reports the
agent's peak RSS (VmHWM) read just before the stop: start included, what a memory limit must
allow for.

``--churn``: is memory flat? One long window per config (``--seconds``, 600 for 10 minutes)
under bench/churn.py's load: a PyTorch-like job (torch on the CPU, libtorch_cpu.so's symbols),
``cuda_workload`` in a loop, and a stream of short-lived Python processes that each load other
libraries (what grows an agent: each new process is described, its maps snapshotted, its
libraries' symbol tables read when the profiler samples it). RssAnon and RssFile
(/proc/PID/status) every ``--every`` seconds; reported at "running", after 1, 5 and 10 minutes,
with the least-squares slope over the whole run and over its second half. File-backed pages
(RssFile: the agent's code and libraries, ELF files' name pages read through mappings) are
clean, shared with every process mapping the same file and dropped first under pressure; the
anonymous ones (RssAnon) are the agent's own.

The machine's load average and the CPU of processes not ours are recorded with every window:
on a shared machine the CPU and start/stop figures move with them (memory much less). Results:
a table on stdout and bench/results/footprint-<date>.json; numbers in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_launch import (  # noqa: E402  (bench/ is not a package)
    FAKE_CUDART,
    LAUNCH_LOOP,
    ROOT,
    TICKS,
    cpu_by_thread,
    cpu_times,
    finish_paced,
    machine,
    machine_pct,
    paced,
    thread_ticks,
)

DEFAULT_CONFIG = ROOT / "otelbpf/config/otelbpf.yaml"
HTTP_SERVER = ROOT / "build/bench/http_server"
NCCL_JOB = ROOT / "build/examples/nccl_job"
RESULTS = ROOT / "bench/results"
ALL_RECEIVERS = ["cuda", "nccl", "ibverbs", "http"]


class BenchError(Exception):
    pass


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def rss_kib(pid: int) -> int:
    m = re.search(r"^VmRSS:\s*(\d+)", Path(f"/proc/{pid}/status").read_text(), re.M)
    return int(m.group(1)) if m else 0


def rss_split_kib(pid: int) -> tuple[int, int]:
    """(RssAnon, RssFile) of ``pid``, KiB."""
    text = Path(f"/proc/{pid}/status").read_text()
    return tuple(
        int(m.group(1)) if (m := re.search(rf"^{k}:\s*(\d+)", text, re.M)) else 0  # type: ignore[return-value]
        for k in ("RssAnon", "RssFile")
    )


def peak_rss_mib(pid: int) -> float | None:
    """The process's peak RSS so far (VmHWM, MiB): its start included, which a limit must allow
    for; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    m = re.search(r"^VmHWM:\s*(\d+)", text, re.M)
    return round(int(m.group(1)) / 1024, 1) if m else None


class RssSampler:
    """VmRSS of one process every ``period`` seconds, on a thread, as (seconds since start, KiB)."""

    def __init__(self, pid: int, period: float = 1.0) -> None:
        self.pid, self.period, self.t0 = pid, period, time.monotonic()
        self.samples: list[tuple[float, int]] = []
        self.split: list[tuple[float, int, int]] = []  # (seconds, RssAnon KiB, RssFile KiB)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                t = round(time.monotonic() - self.t0, 1)
                self.samples.append((t, rss_kib(self.pid)))
                self.split.append((t, *rss_split_kib(self.pid)))
            except OSError:
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, a: float, b: float) -> list[tuple[float, int]]:
        return [(t, kib) for t, kib in self.samples if a <= t <= b]


def slope_mib_per_min(samples: list[tuple[float, int]]) -> float | None:
    """Least-squares RSS growth over ``samples``, MiB per minute."""
    if len(samples) < 3:
        return None
    n = len(samples)
    mt = sum(t for t, _ in samples) / n
    mk = sum(k for _, k in samples) / n
    den = sum((t - mt) ** 2 for t, _ in samples)
    return round(sum((t - mt) * (k - mk) for t, k in samples) / den * 60 / 1024, 2) if den else None


def config_for(name: str, workdir: Path, lib: Path, http_port: int) -> Path:
    cfg = yaml.safe_load(DEFAULT_CONFIG.read_text())
    cfg["receivers"]["cuda"]["search_paths"] = [str(lib)]
    cfg["exporters"]["file"]["directory"] = str(workdir / name / "out")
    if name == "all":
        cfg["receivers"]["http"]["ports"] = [http_port]
        cfg["receivers"]["http"]["processes"] = "all"  # the bench server uses no GPU library
        for sig in ("traces", "metrics"):
            cfg["service"]["pipelines"][sig]["receivers"] = list(ALL_RECEIVERS)
    path = workdir / name / "otelbpf.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


class AgentRun:
    """One `otelbpf run -c CONFIG` (host mode) of this checkout, its stderr kept."""

    def __init__(self, name: str, config: Path, workdir: Path) -> None:
        self.name, self.lines = name, []
        self.running = threading.Event()
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "otelbpf.cli", "run", "-c", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            cwd=workdir,
            env=env,
        )
        self.start_s = 0.0
        self.stopped_at: float | None = None  # when Agent.stop said it was done (report.html follows)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stderr:  # type: ignore[union-attr]
            self.lines.append(line.rstrip("\n"))
            if "otelbpf stopped in" in line:
                self.stopped_at = time.monotonic()
            if "otelbpf running" in line and not self.running.is_set():
                self.start_s = time.monotonic() - self.t0
                self.running.set()

    def wait_running(self, timeout_s: float = 120) -> None:
        while not self.running.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() - self.t0 > timeout_s:
                self.proc.kill()
                raise BenchError(f"{self.name}: the agent did not start:\n" + "\n".join(self.lines[-20:]))

    def from_cache(self) -> bool:
        """The programs were loaded from the program cache (no compile)."""
        return any("otelbpf running" in ln and "(programs from the cache)" in ln for ln in self.lines)

    def compile_s(self) -> float | None:
        m = next((re.search(r"compiled in ([\d.]+)s", ln) for ln in self.lines if "otelbpf running" in ln), None)
        return float(m.group(1)) if m else None

    def stop(self, timeout_s: float = 120) -> dict:
        """SIGTERM to exit, and the phases Agent.stop logged."""
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        took = time.monotonic() - t0
        time.sleep(0.3)  # the reader's last lines
        phases = next((ln.split("otelbpf stopped in ", 1)[1] for ln in self.lines if "otelbpf stopped in" in ln), "")
        stopped = None if self.stopped_at is None else round(self.stopped_at - t0, 2)
        return {
            # SIGTERM to "otelbpf stopped": probes gone, everything flushed (the stop)
            "sigterm_to_stopped_s": stopped,
            # then report.html from the file exporter's output (its `report` option; Ctrl-C skips it)
            "report_s": None if stopped is None else round(took - stopped, 2),
            "sigterm_to_exit_s": round(took, 2),
            "exit_status": self.proc.returncode,
            "phases": phases,
            "warnings": sum(" WARNING " in ln for ln in self.lines),
            "errors": [ln for ln in self.lines if " ERROR " in ln][:5],
        }


def window(agent: AgentRun, rss: RssSampler, seconds: float, during=None) -> dict:
    """CPU per agent thread and RSS over ``seconds`` (while ``during``'s load runs, if given)."""
    pid = agent.proc.pid
    before, m0, t0, wall0 = thread_ticks(pid), cpu_times(), time.monotonic(), time.time_ns()
    a = t0 - rss.t0
    extra = during(seconds) if during is not None else time.sleep(seconds)
    after, m1, secs = thread_ticks(pid), cpu_times(), time.monotonic() - t0
    cpu = cpu_by_thread(before, after, secs)
    series = rss.between(a, a + secs + 0.5)
    kib = [k for _, k in series] or [rss_kib(pid)]
    return {
        "seconds": round(secs, 1),
        "agent_cpu_pct_of_core": cpu,
        "rss_mib": {
            "min": round(min(kib) / 1024, 1),
            "max": round(max(kib) / 1024, 1),
            "end": round(kib[-1] / 1024, 1),
        },
        "rss_slope_mib_per_min": slope_mib_per_min(series),
        "machine_busy_pct_of_core": machine_pct(m0, m1),
        "others_pct_of_core": round(machine_pct(m0, m1) - cpu["total"], 1),
        "load_average": load(),
        "wall_ns": [wall0, time.time_ns()],
        **(extra or {}),
    }


def ring_peaks(metrics: Path, wall_ns: list[int]) -> dict[str, float]:
    """The most bytes that waited in each BPF ring (MiB) in the agent's exports of
    ``otelbpf.ring.usage`` made during the window (each covers its export interval)."""
    peaks: dict[str, float] = {}
    for line in metrics.read_text().splitlines() if metrics.exists() else ():
        for rm in json.loads(line).get("resourceMetrics", []):
            for sm in rm.get("scopeMetrics", []):
                for metric in sm.get("metrics", []):
                    if metric["name"] != "otelbpf.ring.usage":
                        continue
                    for p in metric.get("gauge", {}).get("dataPoints", []):
                        if not wall_ns[0] < int(p["timeUnixNano"]) <= wall_ns[1]:
                            continue
                        ring = next(a["value"]["stringValue"] for a in p["attributes"] if a["key"] == "ring")
                        peaks[ring] = max(peaks.get(ring, 0.0), int(p.get("asInt", 0)) / 2**20)
    return {ring: round(v, 3) for ring, v in sorted(peaks.items())}


def launches(lib: Path, rate: int):
    def run(seconds: float) -> dict:
        proc, out = paced(lib, rate, seconds)
        r = finish_paced(proc, out)
        return {"launches": {"asked_rate": rate, "achieved_rate": round(r["achieved_rate"]), "calls": r["calls"]}}

    return run


def http_client(port: int, rate: int, seconds: float, result: dict) -> None:
    """Paced keep-alive HTTP/1.1 GETs on one connection (raw socket: bench/http.py shadows the
    stdlib's http package here); counts what was answered."""
    t0, done, failed = time.monotonic(), 0, 0
    conn = socket.create_connection(("127.0.0.1", port), timeout=5)
    while (now := time.monotonic()) < t0 + seconds:
        due = t0 + done / rate
        if due > now:
            time.sleep(due - now)
        try:
            conn.sendall(f"GET /footprint/{done % 100} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
            got = b""
            while not got.endswith(b"hello, world\n"):  # http_server's fixed response
                chunk = conn.recv(4096)
                if not chunk:
                    raise OSError("closed")
                got += chunk
        except OSError:
            failed += 1
            conn.close()
            conn = socket.create_connection(("127.0.0.1", port), timeout=5)
        done += 1
    conn.close()
    result.update(requests=done, failed=failed, achieved_rate=round(done / (time.monotonic() - t0)))


def nccl_loop(seconds: float, result: dict) -> None:
    """nccl_job runs (2 ranks, kernels then an all-reduce per iteration) back to back."""
    end, runs = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        p = subprocess.run(
            [str(NCCL_JOB), "--ranks", "2", "--iterations", "200", "--kernels", "8", "--kernel-us", "200"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if p.returncode != 0:
            result["error"] = p.stderr.strip()[-300:]
            return
        runs += 1
    result["runs"] = runs


def mixed(lib: Path, rate: int, port: int, http_rate: int):
    def run(seconds: float) -> dict:
        h: dict = {}
        n: dict = {}
        threads = [
            threading.Thread(target=http_client, args=(port, http_rate, seconds, h)),
            threading.Thread(target=nccl_loop, args=(seconds, n)),
        ]
        for t in threads:
            t.start()
        out = launches(lib, rate)(seconds)
        for t in threads:
            t.join()
        return {**out, "http": h, "nccl_job": n}

    return run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(name: str, workdir: Path, lib: Path, port: int, a: argparse.Namespace, log) -> dict:
    cfg = config_for(name, workdir, lib, port)
    load_before = load()
    agent = AgentRun(name, cfg, workdir / name)
    agent.wait_running()
    rss = RssSampler(agent.proc.pid)
    out: dict = {
        "config": name,
        "receivers": ["cuda", "profiling"] if name == "default" else [*ALL_RECEIVERS, "profiling"],
        "start": {
            "to_running_s": round(agent.start_s, 2),
            "bpf_compile_s": agent.compile_s(),
            "programs_from_cache": agent.from_cache(),
            "load_average": load_before,
        },
        "rss_at_running_mib": round(rss_kib(agent.proc.pid) / 1024, 1),
    }
    try:
        # The first profile rounds name every stack the host's processes show for the first
        # time (their libraries' symbol tables, /proc/kallsyms): a start-up cost, measured on
        # its own so that "idle" is what the agent costs from then on.
        out["warmup"] = window(agent, rss, a.warmup)
        log(f"  {name} warm-up: cpu {out['warmup']['agent_cpu_pct_of_core']['total']:.1f}%")
        out["idle"] = window(agent, rss, a.seconds)
        log(f"  {name} idle: cpu {out['idle']['agent_cpu_pct_of_core']['total']:.1f}%, rss {out['idle']['rss_mib']}")
        out["launches"] = window(agent, rss, a.seconds, launches(lib, a.rate))
        log(
            f"  {name} launches: cpu {out['launches']['agent_cpu_pct_of_core']['total']:.1f}%, "
            f"rss {out['launches']['rss_mib']}"
        )
        if name == "all":
            out["mixed"] = window(agent, rss, a.seconds, mixed(lib, a.rate, port, a.http_rate))
            log(
                f"  {name} mixed: cpu {out['mixed']['agent_cpu_pct_of_core']['total']:.1f}%, "
                f"rss {out['mixed']['rss_mib']}"
            )
        out["rss_series"] = rss.samples
        out["rss_slope_after_start_mib_per_min"] = slope_mib_per_min([s for s in rss.samples if s[0] >= 2.0])
    finally:
        rss.stop()
        out["peak_rss_mib"] = peak_rss_mib(agent.proc.pid)  # before the stop and its report.html
        out["stop"] = agent.stop()
    out["stop"]["load_average"] = load()
    for w in ("warmup", "idle", "launches", "mixed"):
        if w in out:
            out[w]["ring_peak_mib"] = ring_peaks(workdir / name / "out" / "metrics.jsonl", out[w]["wall_ns"])
    log(
        f"  {name} start {out['start']['to_running_s']} s, stop {out['stop']['sigterm_to_stopped_s']} s "
        f"(+ report.html {out['stop']['report_s']} s) "
        f"({out['stop']['phases']})"
    )
    return out


def at_minutes(rss: RssSampler, t_running: float, minutes: float) -> dict | None:
    """RssAnon/RssFile (MiB) of the sample nearest ``minutes`` after "running"."""
    if not rss.split:
        return None
    t, anon, file = min(rss.split, key=lambda s: abs(s[0] - t_running - minutes * 60))
    if abs(t - t_running - minutes * 60) > 30:
        return None  # the run was shorter
    return {
        "t_s": t,
        "anon_mib": round(anon / 1024, 1),
        "file_mib": round(file / 1024, 1),
        "rss_mib": round((anon + file) / 1024, 1),
    }


def measure_churn(name: str, workdir: Path, lib: Path, port: int, a: argparse.Namespace, log) -> dict:
    """One long window under bench/churn.py's load, RssAnon/RssFile sampled throughout."""
    from churn import Churn

    cfg = config_for(name, workdir, lib, port)
    agent = AgentRun(name, cfg, workdir / name)
    agent.wait_running(timeout_s=600)  # BCC's compile alone took minutes at load average 40
    rss = RssSampler(agent.proc.pid, a.every)
    anon, file = rss_split_kib(agent.proc.pid)
    out: dict = {
        "config": name,
        "mode": "churn",
        "start": {"to_running_s": round(agent.start_s, 2), "bpf_compile_s": agent.compile_s()},
        "at_running": {"anon_mib": round(anon / 1024, 1), "file_mib": round(file / 1024, 1)},
    }
    churn = Churn(workdir / name / "churn")
    # the agent's CPU seconds (all its threads) and the machine's load, once a minute
    cpu_minutes: list[dict] = []
    t_cpu0, ticks0 = time.monotonic(), sum(t for _, t in thread_ticks(agent.proc.pid).values())
    try:
        churn.start()
        t_end = time.monotonic() + a.seconds
        while time.monotonic() < t_end:
            time.sleep(min(60.0, max(t_end - time.monotonic(), 0)))
            t, anon, file = rss.split[-1] if rss.split else (0, 0, 0)
            ticks = sum(t for _, t in thread_ticks(agent.proc.pid).values())
            now = time.monotonic()
            cpu_minutes.append(
                {
                    "t_s": round(now - t_cpu0, 1),
                    "agent_cpu_s": round((ticks - ticks0) / TICKS, 2),
                    "agent_cpu_s_per_min": round((ticks - ticks0) / TICKS * 60 / max(now - t_cpu0, 1e-9), 2),
                    "load_average": load(),
                }
            )
            t_cpu0, ticks0 = now, ticks
            log(
                f"  {name} {t:6.0f} s: anon {anon / 1024:.1f} MiB, file {file / 1024:.1f} MiB, "
                f"{churn.started} short-lived processes, load {load()[0]}, "
                f"agent cpu {cpu_minutes[-1]['agent_cpu_s_per_min']} s/min"
            )
    finally:
        churn.stop()
        rss.stop()
        out["peak_rss_mib"] = peak_rss_mib(agent.proc.pid)  # before the stop and its report.html
        out["stop"] = agent.stop()
    out["short_lived_processes"] = churn.started
    out["agent_cpu_by_minute"] = cpu_minutes
    out["at_minutes"] = {str(m): at_minutes(rss, 0.0, m) for m in (1, 5, 10)}
    anon_series = [(t, k) for t, k, _ in rss.split]
    total_series = [(t, k + f) for t, k, f in rss.split]
    half = rss.split[-1][0] / 2 if rss.split else 0
    out["slope_mib_per_min"] = {
        "rss": slope_mib_per_min(total_series),
        "anon": slope_mib_per_min(anon_series),
        "rss_second_half": slope_mib_per_min([s for s in total_series if s[0] >= half]),
        "anon_second_half": slope_mib_per_min([s for s in anon_series if s[0] >= half]),
    }
    out["max_mib"] = {
        "anon": round(max(k for _, k, _ in rss.split) / 1024, 1) if rss.split else None,
        "rss": round(max(k + f for _, k, f in rss.split) / 1024, 1) if rss.split else None,
    }
    out["rss_split_series"] = rss.split
    out["load_average_end"] = load()
    return out


def report_churn(res: dict) -> None:
    print(f"\nFootprint under churn (load average before: {res['load_average_before']})")
    for r in res["runs"]:
        marks = ", ".join(f"{m} min {v['anon_mib']}+{v['file_mib']}" for m, v in r["at_minutes"].items() if v)
        print(
            f"{r['config']}: running {r['at_running']['anon_mib']}+{r['at_running']['file_mib']} MiB "
            f"(anon+file), {marks}; max {r['max_mib']}; peak (VmHWM, start included) {r.get('peak_rss_mib')} MiB; "
            f"slope MiB/min {r['slope_mib_per_min']}; "
            f"{r['short_lived_processes']} short-lived processes"
        )


def report(res: dict) -> None:
    print(f"\nFootprint (load average before: {res['load_average_before']}, {res['machine']['cpus']} CPUs)")
    print(f"{'config':8} {'window':9} {'cpu %':>6} {'rss MiB min/max/end':>22} {'slope':>6} {'others %':>8}  load")
    for r in res["runs"]:
        for w in ("warmup", "idle", "launches", "mixed"):
            if w in r:
                x = r[w]
                mib = x["rss_mib"]
                print(
                    f"{r['config']:8} {w:9} {x['agent_cpu_pct_of_core']['total']:6.1f} "
                    f"{mib['min']:>8}/{mib['max']}/{mib['end']:<6} {x['rss_slope_mib_per_min'] or 0:>6} "
                    f"{x['others_pct_of_core']:8.1f}  {x['load_average'][0]}  rings at their fullest (MiB): "
                    f"{x.get('ring_peak_mib')}"
                )
        print(
            f"{r['config']:8} start {r['start']['to_running_s']} s (compile {r['start']['bpf_compile_s']} s), "
            f"stop {r['stop']['sigterm_to_stopped_s']} s (+ report.html {r['stop']['report_s']} s): "
            f"{r['stop']['phases']}; peak RSS (VmHWM, start included) {r.get('peak_rss_mib')} MiB"
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20.0, help="length of each window")
    p.add_argument(
        "--warmup",
        type=float,
        default=30.0,
        help="the window right after start, reported apart from idle (three profile intervals at the default)",
    )
    p.add_argument("--rate", type=int, default=50_000, help="cudaLaunchKernel calls per second")
    p.add_argument("--http-rate", type=int, default=500, help="HTTP requests per second in the mixed window")
    p.add_argument(
        "--http-port",
        type=int,
        default=0,
        help="the bench server's port (default: a free one); the traced ports are in the program text, "
        "so a fixed port lets the `all` agent start from the program cache",
    )
    p.add_argument("--configs", default="default,all")
    p.add_argument("--quick", action="store_true", help="5 s windows: a smoke check, not numbers to report")
    p.add_argument("--churn", action="store_true", help="one long window under process churn (see bench/churn.py)")
    p.add_argument("--every", type=float, default=1.0, help="RSS sampling period, seconds")
    p.add_argument("--out", type=Path)
    p.add_argument("--keep-workdir", action="store_true")
    a = p.parse_args()
    if a.quick:
        a.seconds = a.warmup = 5.0
    if os.geteuid() != 0:
        sys.exit("needs root (the agent loads eBPF)")
    for f in (LAUNCH_LOOP, FAKE_CUDART, HTTP_SERVER, NCCL_JOB):
        if not f.exists():
            sys.exit(f"{f} is missing: run `bash examples/build.sh`")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    workdir = Path(tempfile.mkdtemp(prefix="otelbpf-footprint-"))
    lib = workdir / "lib" / "libcudart.so.12"  # a private inode: other agents' probes stay off it
    lib.parent.mkdir()
    shutil.copy2(FAKE_CUDART, lib)
    port = a.http_port or free_port()
    server = subprocess.Popen([str(HTTP_SERVER), str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    res: dict = {
        "date": dt.date.today().isoformat(),
        "machine": machine(),
        "load_average_before": load(),
        "plan": {
            "seconds": a.seconds,
            "rate": a.rate,
            "http_rate": a.http_rate,
            "quick": a.quick,
            "churn": a.churn,
            "every": a.every,
        },
        "runs": [],
    }
    try:
        time.sleep(0.3)
        for name in a.configs.split(","):
            log(f"{name}:")
            res["runs"].append((measure_churn if a.churn else measure)(name, workdir, lib, port, a, log))
    finally:
        server.terminate()
        server.wait()
        if not a.keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    (report_churn if a.churn else report)(res)
    mode = "-churn" if a.churn else "-quick" if a.quick else ""
    out = a.out or RESULTS / f"footprint-{res['date']}{mode}.json"
    out.write_text(json.dumps(res, indent=1) + "\n")
    log(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
