"""Run the real agent (`otelbpf run`) as a child process, the way a user does.

Each test writes its own config; the agent is started, we wait for its
"otelbpf running" line (BPF compiled, probes attached), drive workloads, then
stop it with a signal and keep its output for assertions and failure reports.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "build" / "examples"
FAKE_CUDART = BUILD / "fakecudart" / "libcudart.so.12"
FAKE_CUDA = BUILD / "fakecuda" / "libcuda.so.1"
WORKLOAD = BUILD / "cuda_workload"


def real_cudart() -> Path:
    import nvidia.cuda_runtime

    return Path(list(nvidia.cuda_runtime.__path__)[0]) / "lib" / "libcudart.so.12"


def config(
    exporter: dict, *, tmp: Path, cuda: dict | None = None, metrics_interval: str = "300ms", extra: dict | None = None
) -> Path:
    """Write a config with one exporter named ``exporter['name']`` in both pipelines."""
    name = exporter.pop("name")
    doc = {
        "receivers": {"cuda": {"search_paths": [], **(cuda or {})}},
        "processors": {"batch": {"timeout": "100ms"}},
        "exporters": {name: exporter},
        "service": {
            "pipelines": {
                "traces": {"receivers": ["cuda"], "processors": ["batch"], "exporters": [name]},
                "metrics": {"receivers": ["cuda"], "processors": ["batch"], "exporters": [name]},
            },
            "telemetry": {"metrics_interval": metrics_interval, "drain_interval": "20ms", "log_level": "info"},
        },
    }
    for k, v in (extra or {}).items():
        doc[k] = v
    path = tmp / "otelbpf.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def otlp_grpc(collector, timeout: str = "2s") -> dict:
    return {"name": "otlp", "endpoint": collector.grpc_endpoint, "timeout": timeout}


def otlp_http(collector, timeout: str = "2s") -> dict:
    return {"name": "otlphttp", "endpoint": collector.http_endpoint, "timeout": timeout}


class AgentProcess:
    """`otelbpf run ...` in the background, with its output captured."""

    def __init__(self, args: list[str], env: dict | None = None) -> None:
        self.args = [sys.executable, "-m", "otelbpf.cli", "run", *args]
        self.proc = subprocess.Popen(
            self.args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
            cwd=REPO,
        )
        self.lines: list[str] = []
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            if "otelbpf running" in line:
                self._ready.set()
        self._ready.set()

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_ready(self, timeout: float = 90) -> None:
        if not self._ready.wait(timeout) or self.proc.poll() is not None and "otelbpf running" not in self.output:
            raise AssertionError(f"agent did not start:\n{self.output}")

    def wait_attached(self, library: Path, timeout: float = 30) -> None:
        """Until the agent has logged its probes on ``library`` (once per file)."""
        needle = f"probes to {library} ("
        deadline = time.monotonic() + timeout
        while needle not in self.output:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(f"agent never attached to {library}:\n{self.output}")
            time.sleep(0.02)

    def stop(self, sig: int = signal.SIGINT, timeout: float = 90) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired as e:
            self.proc.kill()
            raise AssertionError(f"agent did not stop within {timeout}s:\n{self.output}") from e
        self._reader.join(5)
        return rc

    def wait(self, timeout: float = 60) -> int:
        rc = self.proc.wait(timeout)
        self._reader.join(5)
        return rc

    def __enter__(self) -> AgentProcess:
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def run_workload(*args: str, lib: Path = FAKE_CUDART, env: dict | None = None, timeout: float = 60) -> dict:
    """Run cuda_workload to completion; return its JSON summary."""
    out = subprocess.run(
        [str(WORKLOAD), "--lib", str(lib), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_attached(agent: AgentProcess, *args: str, lib: Path = FAKE_CUDART, timeout: float = 60) -> dict:
    """Run cuda_workload under a host-mode agent: it loads ``lib``, waits until the
    agent has attached to that file, and only then makes its CUDA calls."""
    gate = Path(tempfile.mkdtemp(prefix="otelbpf-gate-")) / "go"
    proc = start_workload("--wait-for-file", str(gate), *args, lib=lib)
    try:
        agent.wait_attached(lib)
        gate.touch()
        return finish(proc, timeout)
    finally:
        if proc.poll() is None:
            proc.kill()


def start_workload(*args: str, lib: Path = FAKE_CUDART) -> subprocess.Popen:
    return subprocess.Popen([str(WORKLOAD), "--lib", str(lib), *args], stdout=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = 60) -> dict:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0
    return json.loads(out.strip().splitlines()[-1])


def wait_until(predicate, timeout: float = 10, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()
