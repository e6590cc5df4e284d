"""What leaves the profiler: one gzipped pprof per process and profile kind per interval,
with the labels Pyroscope indexes it by; and the local default, pprof files on disk.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from otelbpf.config import ExporterConfig, FileExporterConfig, PyroscopeExporterConfig
from otelbpf.export.health import Health


@dataclass(frozen=True)
class ProfileRecord:
    name: str                 # Pyroscope profile name (__name__): process_cpu, memory
    kind: str                 # cpu | cuda_memory
    labels: dict[str, str]    # service_name, host_name, process_pid, configured ones
    pid: int
    start_ns: int             # wall clock, the interval it covers
    end_ns: int
    sample_rate: int          # Hz for CPU profiles, 0 otherwise
    pprof: bytes              # gzipped profile.proto


class ProfileExporter(Protocol):
    def export(self, records: Sequence[ProfileRecord]) -> None:
        """Take the records (never block for long); failures are counted, not raised."""

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Send what is queued within ``timeout_s``, then stop."""


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


class PprofFileExporter:
    """``<directory>/profiles/<service>-<pid>-<kind>-<end time ms>.pb.gz``, one file per
    record, written whole under a temporary name and renamed into place."""

    def __init__(self, directory: str, health: Health, name: str = "file") -> None:
        self.directory = os.path.join(directory, "profiles")
        self._health = health
        self._name = name
        self._lock = threading.Lock()

    def path_for(self, r: ProfileRecord) -> str:
        service = _UNSAFE.sub("_", r.labels.get("service_name", "unknown"))[:80]
        return os.path.join(self.directory, f"{service}-{r.pid}-{r.kind}-{r.end_ns // 1_000_000}.pb.gz")

    def export(self, records: Sequence[ProfileRecord]) -> None:
        with self._lock:
            for r in records:
                try:
                    os.makedirs(self.directory, exist_ok=True)
                    path = self.path_for(r)
                    tmp = f"{path}.tmp"
                    with open(tmp, "wb") as f:
                        f.write(r.pprof)
                    os.replace(tmp, path)
                except OSError:
                    self._health.add("otelbpf.export.failures", 1, signal="profiles", exporter=self._name)
                    self._health.add("otelbpf.export.dropped", 1, signal="profiles", reason="export_failed",
                                     exporter=self._name)
                    continue
                self._health.add("otelbpf.export.sent", 1, signal="profiles", exporter=self._name)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        del timeout_s  # nothing queued


def profile_exporter(name: str, cfg: ExporterConfig, health: Health) -> ProfileExporter:
    """The exporter a profiles pipeline names (config validation admits only these two)."""
    if isinstance(cfg, FileExporterConfig):
        return PprofFileExporter(cfg.directory, health, name)
    if isinstance(cfg, PyroscopeExporterConfig):
        from otelbpf.export.pyroscope import PyroscopeExporter

        return PyroscopeExporter(name, cfg, health)
    raise TypeError(f"no profile exporter for {type(cfg).__name__}")
