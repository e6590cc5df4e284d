"""A host's process churn and a PyTorch-like job, for the footprint benchmarks (issue 14).

What grows an agent's memory on a busy node is not the launch rate but the host's processes:
each new one is described, its maps read, and, once the profiler samples it, its libraries'
symbol tables read. ``Churn`` runs, until stopped:

- a PyTorch-like job: one Python process doing CPU matrix products with torch (libtorch_cpu.so
  mapped and sampled: the huge symbol table of issue 14), and ``cuda_workload`` on the stand-in
  runtime in a loop (kernel launches, allocations: the cuda receiver's path);
- short-lived processes, one after the other: Python interpreters that each import a different
  extension module (numpy, grpc, cryptography, yaml, capstone, sqlite3, ssl, lzma, ...: distinct
  libraries mapped) and spin ~0.3 s so the profiler samples them, then exit.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CUDA_WORKLOAD = ROOT / "build/examples/cuda_workload"
FAKE_CUDART = ROOT / "build/examples/fakecudart/libcudart.so.12"

#: modules whose import maps libraries of their own (extension modules and what they link)
MODULES = [
    "numpy",
    "grpc",
    "cryptography.hazmat.bindings._rust",
    "yaml",
    "capstone",
    "sqlite3",
    "ssl",
    "lzma",
    "bz2",
    "ctypes",
    "decimal",
    "elftools",
    "cxxfilt",
    "pydantic_core",
    "h2",
    "zlib",
    "hashlib",
    "curses",
    "readline",
    "dbm",
    "uuid",
    "xml.parsers.expat",
    "multiprocessing",
    "zoneinfo",
]

SPIN = "import {mod}, time\nend = time.time() + 0.3\nwhile time.time() < end: sum(range(1000))\n"
TORCH_JOB = (
    "import torch, time\na = torch.randn(256, 256)\n"
    "while True:\n    for _ in range(20): a = torch.tanh(a @ a)\n    time.sleep(0.05)\n"
)


class Churn:
    """The job and the churn, on threads; ``started``: short-lived processes so far."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.started = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._job: subprocess.Popen | None = None

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        lib = self.workdir / "libcudart.so.12"  # a private inode, as bench/footprint.py's
        shutil.copy2(FAKE_CUDART, lib)
        self._job = subprocess.Popen([sys.executable, "-c", TORCH_JOB], stdout=subprocess.DEVNULL)
        self._threads = [
            threading.Thread(target=self._short_lived, daemon=True),
            threading.Thread(target=self._cuda_loop, args=(lib,), daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _short_lived(self) -> None:
        for mod in itertools.cycle(MODULES):
            if self._stop.is_set():
                return
            subprocess.run(
                [sys.executable, "-c", SPIN.format(mod=mod)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=60,
            )
            self.started += 1

    def _cuda_loop(self, lib: Path) -> None:
        while not self._stop.is_set():
            subprocess.run(
                [str(CUDA_WORKLOAD), "--lib", str(lib), "--iterations", "200", "--threads", "2"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=60,
            )
            self._stop.wait(0.5)

    def stop(self) -> None:
        self._stop.set()
        if self._job is not None:
            self._job.kill()
            self._job.wait()
        for t in self._threads:
            t.join(timeout=70)
