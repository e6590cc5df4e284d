"""SIGTERM-to-exit of `otelbpf run` with the default receivers, in host, --pid and run -- modes.

Each round starts the agent (the embedded default config: cuda and profiling, file
exporters) in a fresh working directory, waits for its "otelbpf running" line and a few
seconds of steady state, sends SIGTERM and times the exit, and prints the phases of the stop
the agent logs ("otelbpf stopped in ...").

    .venv/bin/python bench/stop_time.py [--rounds 3] [--settle 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def one(mode: str, settle_s: float) -> tuple[float, int]:
    """Seconds from SIGTERM to the agent's exit, and its exit status."""
    work = Path(tempfile.mkdtemp(prefix="otelbpf-stop-"))
    target = None
    args = [sys.executable, "-m", "otelbpf.cli", "run"]
    if mode == "pid":
        target = subprocess.Popen(["sleep", "600"])
        args += ["--pid", str(target.pid)]
    elif mode == "command":
        args += ["--", "sleep", "600"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    agent = subprocess.Popen(args, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in agent.stdout:  # type: ignore[union-attr]
            if "otelbpf running" in line:
                break
        else:
            raise RuntimeError(f"{mode}: the agent did not start")
        time.sleep(settle_s)
        t0 = time.monotonic()
        agent.send_signal(signal.SIGTERM)
        out, _ = agent.communicate(timeout=600)
        took = time.monotonic() - t0
        print("    " + next((ln.split(": ", 1)[1] for ln in out.splitlines() if "otelbpf stopped in" in ln), "?"))
        return took, agent.returncode
    finally:
        if agent.poll() is None:
            agent.kill()
        if target is not None:
            target.kill()
            target.wait()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--settle", type=float, default=3.0, help="seconds of steady state before SIGTERM")
    a = p.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    for mode in ("host", "pid", "command"):
        times = []
        for _ in range(a.rounds):
            took, rc = one(mode, a.settle)
            times.append(took)
            print(f"  {mode:8s} {took:6.2f} s  (exit {rc}, load {os.getloadavg()[0]:.1f})", flush=True)
        print(f"{mode:8s} median {statistics.median(times):.2f} s, max {max(times):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
