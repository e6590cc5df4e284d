"""Where profiles go: the exporter a profiles pipeline names (``profile_exporter``), and the
local default, pprof files on disk, one gzipped pprof per process and profile kind per interval.
What every exporter takes is ``encoded_profile.py``'s ``ProfileRecord``.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import threading
from collections.abc import Sequence

from otelbpf.base.health import Health
from otelbpf.base.safe_files import OutputDir
from otelbpf.config import (
    ExporterConfig,
    FileExporterConfig,
    OtlpExporterConfig,
    OtlpHttpExporterConfig,
    PyroscopeExporterConfig,
)
from otelbpf.export.encoded_profile import ProfileExporter, ProfileRecord
from otelbpf.export.sender import redact_http_client_logs

log = logging.getLogger(__name__)


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


#: A profile file's name (or its CPU timeline's, written beside it): its end time (ms) is the last field.
_PROFILE_FILE = re.compile(r"^.+-(\d+)\.(?:pb|timeline\.json)\.gz$")


class PprofFileExporter:
    """``<directory>/profiles/<service>-<pid>-<kind>-<end time ms>.pb.gz``, one file per
    record, written whole under a random temporary name (O_EXCL) and renamed into place,
    never through a link (``OutputDir``).

    At most about ``max_files`` are kept: past a tenth more, the folder is read again and the
    profiles that ended first (any run's) are removed down to ``max_files``, each counted in
    ``otelbpf.export.files_removed{signal=profiles}``. A host that starts processes all day
    writes one file per process and interval (7,500 in 7 minutes of bench/footprint.py's
    mixed load); reading the folder only every tenth of the bound keeps that cheap."""

    def __init__(
        self,
        directory: str,
        health: Health,
        name: str = "file",
        *,
        max_files: int = 0,
        file_mode: int = 0o600,
        dir_mode: int = 0o700,
    ) -> None:
        self._out = OutputDir(directory, dir_mode=dir_mode, file_mode=file_mode).subdir("profiles")
        self.directory = self._out.path
        self._health = health
        self._name = name
        self._lock = threading.Lock()
        self._max = max_files
        self._slack = max_files // 10 + 1
        self._count = len(self._profiles()) if max_files else 0  # files here, as last counted

    def _profiles(self) -> list[tuple[int, str]]:
        """(end time ms, name) of the profile files here (links and other names left out)."""
        out = []
        with os.scandir(self._out.fd) as entries:
            for e in entries:
                m = _PROFILE_FILE.match(e.name)
                if m and e.is_file(follow_symlinks=False):
                    out.append((int(m.group(1)), e.name))
        return out

    def _trim(self) -> None:
        """Remove the profiles that ended first, down to ``max_files``."""
        files = sorted(self._profiles())
        removed = 0
        for _, name in files[: max(len(files) - self._max, 0)]:
            try:
                os.unlink(name, dir_fd=self._out.fd)
            except FileNotFoundError:
                continue
            removed += 1
        self._count = len(files) - removed
        if removed:
            self._health.add("otelbpf.export.files_removed", removed, signal="profiles")
            log.info("removed %d profiles from %s: more than %d files", removed, self.directory, self._max)

    def file_name(self, r: ProfileRecord) -> str:
        service = _UNSAFE.sub("_", r.labels.get("service_name", "unknown"))[:80]
        return f"{service}-{r.pid}-{r.kind}-{r.end_ns // 1_000_000}.pb.gz"

    def path_for(self, r: ProfileRecord) -> str:
        return os.path.join(self.directory, self.file_name(r))

    def export(self, records: Sequence[ProfileRecord]) -> None:
        with self._lock:
            for r in records:
                try:
                    self._out.write_whole(self.file_name(r), r.pprof)
                    if r.profile is not None and r.profile.timeline is not None:
                        # when the samples were taken, per thread (analyze/idle.py joins them with CUDA calls)
                        body = json.dumps(
                            {"pid": r.pid, "start_ns": r.start_ns, "end_ns": r.end_ns} | r.profile.timeline.to_json(),
                            separators=(",", ":"),
                        )
                        self._out.write_whole(
                            self.file_name(r)[: -len(".pb.gz")] + ".timeline.json.gz", gzip.compress(body.encode(), 1)
                        )
                        self._count += 1
                except OSError as exc:
                    log.warning("profile not written: %s", exc)
                    self._health.add("otelbpf.export.failures", 1, signal="profiles", exporter=self._name)
                    self._health.add(
                        "otelbpf.export.dropped", 1, signal="profiles", reason="export_failed", exporter=self._name
                    )
                    continue
                self._health.add("otelbpf.export.sent", 1, signal="profiles", exporter=self._name)
                self._count += 1
            if self._max and self._count >= self._max + self._slack:
                try:
                    self._trim()
                except OSError as exc:
                    log.warning("could not trim %s: %s", self.directory, exc)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        del timeout_s  # nothing queued
        with self._lock:
            self._out.close()


def profile_exporter(name: str, cfg: ExporterConfig, health: Health) -> ProfileExporter:
    """The exporter a profiles pipeline names: pprof files, Pyroscope, or OTLP profiles."""
    if isinstance(cfg, FileExporterConfig):
        return PprofFileExporter(
            cfg.directory,
            health,
            name,
            max_files=cfg.max_profile_files,
            file_mode=cfg.file_mode,
            dir_mode=cfg.dir_mode,
        )
    # Imported when a pipeline names them: their protobuf and gRPC modules load only then.
    if isinstance(cfg, PyroscopeExporterConfig):
        from otelbpf.export.pyroscope import PyroscopeExporter

        redact_http_client_logs()
        return PyroscopeExporter(name, cfg, health)
    if isinstance(cfg, (OtlpExporterConfig, OtlpHttpExporterConfig)):
        from otelbpf.export.otlp_profiles import otlp_profile_exporter

        redact_http_client_logs()
        return otlp_profile_exporter(name, cfg, health)
    raise TypeError(f"no profile exporter for {type(cfg).__name__}")
