"""Benchmark the ibverbs data-path probes: added cost per post and per poll, side by side in one run.

    sudo .venv/bin/python bench/ibverbs.py [--quick] [--out FILE]

The workload (build/examples/ibverbs_workload --bench N) drives the real libibverbs with the
fakeverbs provider (examples/ibverbs/) in a tight loop and times, per round: N calls of
ibv_post_send (one signaled RDMA_WRITE each), N calls of ibv_poll_cq that each return one
completion, and N calls of ibv_poll_cq on an empty CQ. The provider completes work at once
(FAKEVERBS_DELAY_NS=0), so the loop is probe cost plus the provider's own few dozen ns.

Cases, each a separate workload process, repeated `reps` times in turn (a b c d e a b c d e ...)
so every case sees the same machine state:
  none          no probe;
  empty         an empty BCC uprobe (`return 0`) on the provider's post_send and poll_cq, at the
                addresses the agent uses (the function + 4, past endbr64);
  empty+ret     the same plus an empty uretprobe on poll_cq (the agent needs one there: a poll's
                completions are only known when it returns);
  agent         `otelbpf run -- CMD` with the ibverbs receiver (pid filter, data path found in the
                context's ops table);
  agent-host    the agent started first in host mode (no pid filter), the workload run beside it
                (waiting 3 s after opening the device: host mode does not pause it while the
                provider is probed);
  programs      the agent's sensor in this process, with the kernel's BPF statistics on
                (kernel.bpf_stats_enabled, for this case only): the time each of the agent's
                data-path programs itself runs per call, apart from the trap every uprobe pays.
Each case's value is the median over reps of the median over rounds (the first round, which
pays for attaching and page faults, is dropped); ratios are taken within each rep (same machine
state) and their median reported. The agent cases also check that the agent counted every post:
rdma.wr.posted from its OTLP-JSON output equals rounds x N.

The provider is a private copy in a temporary directory (uprobes belong to inodes: probes that
other programs on this machine put on the original do not touch the copy). Results: a table on
stdout and bench/results/ibverbs-<date>.json; numbers and findings in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from elftools.elf.elffile import ELFFile

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ROOT / "build/examples/ibverbs_workload"
PROVIDER = ROOT / "build/examples/ibverbs/libfakeverbs-rdmav34.so"
FAKEDEV = ROOT / "examples/ibverbs/fakedev.sh"
RESULTS = ROOT / "bench/results"
EMPTY_PROGRAM = "int empty_probe(struct pt_regs *ctx) { return 0; }"
ENDBR64 = b"\xf3\x0f\x1e\xfa"
MEASURES = ("post_ns", "poll_ns", "poll_empty_ns")


class BenchError(Exception):
    """The benchmark cannot run or a measurement is invalid; the message says why."""


def probe_site(lib: Path, symbol: str) -> int:
    """ELF address the agent probes for ``symbol`` of the provider: past endbr64."""
    with lib.open("rb") as f:
        elf = ELFFile(f)
        sym = elf.get_section_by_name(".symtab").get_symbol_by_name(symbol)
        if not sym:
            raise BenchError(f"{lib} has no symbol {symbol} (was it stripped?)")
        vaddr = sym[0]["st_value"]
        seg = next(
            s
            for s in elf.iter_segments()
            if s["p_type"] == "PT_LOAD" and s["p_vaddr"] <= vaddr < s["p_vaddr"] + s["p_filesz"]
        )
        f.seek(vaddr - seg["p_vaddr"] + seg["p_offset"])
        return vaddr + 4 if f.read(4) == ENDBR64 else vaddr


def workload_cmd(ops: int, rounds: int, settle_ms: int = 0) -> list[str]:
    return [str(FAKEDEV), str(WORKLOAD), "--bench", str(ops), "--rounds", str(rounds), "--settle-ms", str(settle_ms)]


def parse_bench(stdout: str) -> dict:
    lines = [ln for ln in stdout.splitlines() if ln.startswith('{"bench"')]
    if not lines:
        raise BenchError(f"no bench line in the workload's output:\n{stdout[-2000:]}")
    return json.loads(lines[-1])


def medians(report: dict) -> dict[str, float]:
    rounds = report["bench"][1:]  # round 0: attach, faults, caches
    return {m: statistics.median(r[m] for r in rounds) for m in MEASURES}


def run_workload(env: dict, ops: int, rounds: int, settle_ms: int = 0) -> dict:
    out = subprocess.run(workload_cmd(ops, rounds, settle_ms), capture_output=True, text=True, env=env, timeout=300)
    if out.returncode != 0:
        raise BenchError(f"workload failed ({out.returncode}): {out.stderr[-2000:]}")
    return parse_bench(out.stdout)


def with_empty_probes(env: dict, ops: int, rounds: int, sites: dict[str, int], lib: Path, ret: bool) -> dict:
    from bcc import BPF

    bpf = BPF(text=EMPTY_PROGRAM)
    try:
        for vaddr in sites.values():
            bpf.attach_uprobe(name=str(lib), addr=vaddr, fn_name="empty_probe")
        if ret:
            bpf.attach_uretprobe(name=str(lib), addr=sites["fv_poll_cq"], fn_name="empty_probe")
        return run_workload(env, ops, rounds)
    finally:
        bpf.cleanup()


def agent_config(work: Path, name: str) -> Path:
    out = work / f"out-{name}"
    doc = {
        "receivers": {"ibverbs": {"search_paths": ["/usr/lib/x86_64-linux-gnu/libibverbs.so*"]}},
        "exporters": {"file": {"directory": str(out)}},
        "service": {
            "pipelines": {
                "traces": {"receivers": ["ibverbs"], "exporters": ["file"]},
                "metrics": {"receivers": ["ibverbs"], "exporters": ["file"]},
            },
            "telemetry": {"metrics_interval": "1s", "log_level": "info"},
        },
    }
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def agent_env(env: dict) -> dict:
    return {**env, "PYTHONPATH": str(ROOT)}


def posted_total(out_dir: Path, pid: int) -> int:
    """The newest rdma.wr.posted value summed over the series of ``pid`` in OTLP-JSON lines."""
    latest: dict[str, int] = {}
    for path in sorted(out_dir.rglob("*metrics*")):
        for line in path.read_text().splitlines():
            for rm in json.loads(line).get("resourceMetrics", []):
                attrs = {a["key"]: a["value"] for a in rm["resource"].get("attributes", [])}
                if int(attrs.get("process.pid", {}).get("intValue", -1)) != pid:
                    continue
                for sm in rm.get("scopeMetrics", []):
                    for metric in sm.get("metrics", []):
                        if metric["name"] != "rdma.wr.posted":
                            continue
                        for dp in metric["sum"]["dataPoints"]:
                            key = json.dumps(dp.get("attributes", []), sort_keys=True)
                            latest[key] = int(dp.get("asInt", 0))
    return sum(latest.values())


def with_agent_command(env: dict, ops: int, rounds: int, work: Path, name: str) -> dict:
    cfg = agent_config(work, name)
    out = subprocess.run(
        [sys.executable, "-m", "otelbpf.cli", "run", "-c", str(cfg), "--", *workload_cmd(ops, rounds)],
        capture_output=True,
        text=True,
        env=agent_env(env),
        timeout=300,
        cwd=work,
    )
    if out.returncode != 0:
        raise BenchError(f"agent run failed ({out.returncode}): {out.stderr[-2000:]}")
    report = parse_bench(out.stdout)
    report["agent_posted"] = posted_total(work / f"out-{name}", report["pid"])
    return report


def with_agent_host(env: dict, ops: int, rounds: int, work: Path, name: str) -> dict:
    cfg = agent_config(work, name)
    agent = subprocess.Popen(
        [sys.executable, "-m", "otelbpf.cli", "run", "-c", str(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**agent_env(env), "PYTHONUNBUFFERED": "1"},
        cwd=work,
    )
    try:
        deadline = time.monotonic() + 60
        seen = ""
        while "otelbpf running" not in seen:
            line = agent.stdout.readline()
            if not line or time.monotonic() > deadline:
                raise BenchError(f"the host-mode agent did not start:\n{seen}")
            seen += line
        # Host mode does not pause the program at ibv_open_device: give the agent time to probe
        # the provider before the timed loop starts.
        report = run_workload(env, ops, rounds, settle_ms=3000)
    finally:
        agent.send_signal(signal.SIGINT)
        agent.communicate(timeout=60)
    report["agent_posted"] = posted_total(work / f"out-{name}", report["pid"])
    return report


def with_program_stats(env: dict, ops: int, rounds: int) -> dict:
    """The agent's sensor in-process, pid-filtered and pausing at ibv_open_device like `otelbpf
    run -- CMD`, with the kernel timing every BPF program run."""
    sys.path.insert(0, str(ROOT))
    from otelbpf.agent import spawn_gated
    from otelbpf.families.ibverbs.probes import ibverbs_family
    from otelbpf.sensor.sensor import Sensor, SensorOptions

    stats_knob = Path("/proc/sys/kernel/bpf_stats_enabled")
    proc, gate = spawn_gated(
        [
            "sh",
            "-c",
            'exec "$@" >/dev/null',
            "sh",
            "env",
            f"FAKEVERBS_PROVIDER={env['FAKEVERBS_PROVIDER']}",
            "FAKEVERBS_DELAY_NS=0",
            *workload_cmd(ops, rounds),
        ]
    )
    sensor = Sensor(
        SensorOptions(
            families=[ibverbs_family(slow_completion_ns=10**6)],
            pids=[proc.pid],
            pause_on_load=True,
            search_globs=["/usr/lib/x86_64-linux-gnu/libibverbs.so*"],
        ),
        lambda ring, arr: None,
    )
    sensor.start()
    before = stats_knob.read_text().strip()
    stats_knob.write_text("1")
    try:
        os.write(gate, b"go")
        os.close(gate)
        proc.wait(timeout=300)
        per_program = {}
        for name, fn in sensor.with_bpf(lambda bpf: list(bpf.funcs.items())) or []:
            info = dict(
                line.split(":\t", 1)
                for line in Path(f"/proc/self/fdinfo/{fn.fd}").read_text().splitlines()
                if ":\t" in line
            )
            runs = int(info.get("run_cnt", "0"))
            if runs:
                name = name.decode() if isinstance(name, bytes) else name
                per_program[name] = {"runs": runs, "avg_ns": int(info["run_time_ns"]) / runs}
    finally:
        stats_knob.write_text(before)
        sensor.stop()
    return {"programs": per_program}


def machine() -> dict:
    import bcc

    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        "?",
    )
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    load = os.getloadavg()
    return {
        "kernel": platform.release(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "bcc": bcc.__version__,
        "commit": commit,
        "loadavg_before": load,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smoke check; not numbers to report")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    ops, rounds, reps = (20_000, 4, 1) if args.quick else (100_000, 6, 5)
    if os.geteuid() != 0:
        raise BenchError("needs root (uprobes, and fakedev.sh mounts a private /dev)")
    subprocess.run([str(ROOT / "examples/build.sh")], check=True, capture_output=True)
    if not WORKLOAD.exists():
        raise BenchError("examples/build.sh did not build the ibverbs workload: install libibverbs-dev")

    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="otelbpf-bench-ibverbs-") as tmp:
        work = Path(tmp)
        private = work / "provider" / PROVIDER.name
        private.parent.mkdir()
        shutil.copy2(PROVIDER, private)
        sites = {s: probe_site(private, s) for s in ("fv_post_send", "fv_poll_cq")}
        env = {**os.environ, "FAKEVERBS_PROVIDER": str(private).removesuffix("-rdmav34.so"), "FAKEVERBS_DELAY_NS": "0"}
        cases = {
            "none": lambda i: run_workload(env, ops, rounds),
            "empty": lambda i: with_empty_probes(env, ops, rounds, sites, private, ret=False),
            "empty+ret": lambda i: with_empty_probes(env, ops, rounds, sites, private, ret=True),
            "agent": lambda i: with_agent_command(env, ops, rounds, work, f"agent{i}"),
            "agent-host": lambda i: with_agent_host(env, ops, rounds, work, f"host{i}"),
        }
        programs = []
        for i in range(reps):
            for name, case in cases.items():
                report = case(i)
                report["medians"] = medians(report)
                results.setdefault(name, []).append(report)
                print(
                    f"rep {i} {name:11s} " + "  ".join(f"{m} {v:8.1f}" for m, v in report["medians"].items()),
                    flush=True,
                )
            programs.append(with_program_stats(env, ops, rounds)["programs"])
            print(
                f"rep {i} programs    "
                + "  ".join(
                    f"{n} {p['avg_ns']:.0f}ns x{p['runs']}" for n, p in programs[-1].items() if n.startswith("ibv_po")
                ),
                flush=True,
            )

    summary = {
        name: {m: statistics.median(r["medians"][m] for r in reps_) for m in MEASURES}
        for name, reps_ in results.items()
    }
    base = summary["none"]
    added = {name: {m: v[m] - base[m] for m in MEASURES} for name, v in summary.items() if name != "none"}

    def added_in(rep: int, name: str, m: str) -> float:
        return results[name][rep]["medians"][m] - results["none"][rep]["medians"][m]

    def ratio(name: str, m: str, baseline: str) -> float:
        return statistics.median(added_in(i, name, m) / added_in(i, baseline, m) for i in range(reps))

    ratios = {
        name: {
            "post_vs_empty": ratio(name, "post_ns", "empty"),
            "poll_vs_empty": ratio(name, "poll_ns", "empty"),
            "poll_vs_empty+ret": ratio(name, "poll_ns", "empty+ret"),
            "poll_empty_vs_empty+ret": ratio(name, "poll_empty_ns", "empty+ret"),
        }
        for name in ("agent", "agent-host")
    }
    program_ns = {
        prog: statistics.median(p[prog]["avg_ns"] for p in programs if prog in p)
        for prog in ("ibv_post_send_entry", "ibv_poll_cq_entry", "ibv_poll_cq_return")
    }
    counted = {name: [(r["agent_posted"], ops * rounds) for r in results[name]] for name in ("agent", "agent-host")}
    doc = {
        "machine": machine(),
        "plan": {"ops": ops, "rounds": rounds, "reps": reps},
        "summary_ns": summary,
        "added_ns": added,
        "ratios_median_of_reps": ratios,
        "program_avg_ns": program_ns,
        "programs_raw": programs,
        "agent_counted_posts": counted,
        "raw": results,
    }

    print(f"\nns per call (median), {ops} calls x {rounds} rounds x {reps} reps; added = minus 'none'")
    print(f"{'case':12s} {'post':>8s} {'+post':>7s} {'poll(1)':>8s} {'+poll':>7s} {'poll(0)':>8s} {'+poll0':>7s}")
    for name, v in summary.items():
        a = added.get(name, {m: 0.0 for m in MEASURES})
        print(
            f"{name:12s} {v['post_ns']:8.1f} {a['post_ns']:7.1f} {v['poll_ns']:8.1f} {a['poll_ns']:7.1f} "
            f"{v['poll_empty_ns']:8.1f} {a['poll_empty_ns']:7.1f}"
        )
    for name, r in ratios.items():
        print(f"{name}: " + ", ".join(f"{k} {v:.2f}x" for k, v in r.items()))
    print(
        "BPF program run time per call (kernel statistics): "
        + ", ".join(f"{k} {v:.0f} ns" for k, v in program_ns.items())
        + " (ibv_poll_cq_return: averaged over polls with one completion and empty polls alike)"
    )
    for name, pairs in counted.items():
        print(f"{name}: rdma.wr.posted {[p for p, _ in pairs]} (expected {pairs[0][1]} each)")
    out = args.out or RESULTS / f"ibverbs-{dt.date.today().isoformat()}{'-quick' if args.quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    print(f"results: {out}")
    return 0 if all(p == e for pairs in counted.values() for p, e in pairs) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench/ibverbs.py: {exc}", file=sys.stderr)
        sys.exit(2)
