"""One run per output folder: the file exporter's folder holds the latest run at its top level.

Each ``otelbpf run`` used to append to ``./otelbpf-out``, so ``summary`` showed every earlier
run's processes beside this one's (three ``otelbpf (pid ...)`` blocks after three runs). Now a
run starts by moving what an earlier run left at the top level (``traces*.jsonl``,
``metrics*.jsonl``, ``profiles/``, ``report.html``, ``run.json``) into
``previous/<its start time>/``, and writes ``run.json`` (when and how it started). The files
stay where they always were, so every reader (``summary``, ``diagnose``, ``report``, ``mcp``,
a Collector's ``otlpjsonfile`` receiver, scripts reading ``otelbpf-out/traces.jsonl``) reads
the latest run with no change; ``exporters.file.append: true`` keeps the old behaviour.
``previous/`` keeps the last ``KEEP_PREVIOUS`` runs: the folder stays bounded.

Moves are renames between directories held open (``OutputDir``): a link in the folder is
moved as a link, never followed, and the folder is refused on the same terms as the
exporter's (another user's, or writable by others)."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from datetime import UTC, datetime

from otelbpf.base.safe_files import OutputDir, UnsafeOutput
from otelbpf.config import Config
from otelbpf.config.exporters import FileExporterConfig

log = logging.getLogger(__name__)

RUN_FILE = "run.json"
PREVIOUS = "previous"
#: Earlier runs kept under ``previous/``, the oldest removed first.
KEEP_PREVIOUS = 5
_RUN_FILES = re.compile(r"(?:traces|metrics)(?:-[^/]*)?\.jsonl|profiles|report\.html|" + re.escape(RUN_FILE))
_STAMP = "%Y%m%dT%H%M%SZ"


def file_exporters(config: Config) -> list[FileExporterConfig]:
    """The file exporters a pipeline uses, one per folder."""
    used = {name for signal in config.pipeline_signals() if (p := config.pipeline(signal)) for name in p.exporters}
    found: dict[str, FileExporterConfig] = {}
    for name in sorted(used):
        cfg = config.exporters.get(name)
        if isinstance(cfg, FileExporterConfig):
            found.setdefault(os.path.abspath(cfg.directory), cfg)
    return list(found.values())


def begin_run(cfg: FileExporterConfig, watching: str, now: float | None = None) -> str | None:
    """Before the exporters open their files: an earlier run's files go to
    ``previous/<its start>/`` (unless ``cfg.append``), and ``run.json`` says this run started,
    ``watching`` what (``the host``, ``pids 12, 34``, ``command python``). Returns the folder
    the earlier run went to, or None."""
    started = time.time() if now is None else now
    out = OutputDir(cfg.directory, dir_mode=cfg.dir_mode, file_mode=cfg.file_mode)
    try:
        names = sorted(n for n in os.listdir(out.fd) if _RUN_FILES.fullmatch(n))
        if cfg.append and names:
            return None  # the folder's run.json, if any, still names the run that began it
        # a profiles/ or report.html alone is not taken for a run's: the folder may be "." in a project
        ours = any(n.endswith(".jsonl") or n == RUN_FILE for n in names)
        moved = _move_previous(out, names) if ours else None
        run = {"started": datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds"), "pid": os.getpid()}
        out.write_whole(RUN_FILE, (json.dumps({**run, "watching": watching}) + "\n").encode())
        return moved
    finally:
        out.close()


def _move_previous(out: OutputDir, names: list[str]) -> str:
    stamp = _started(out) or time.strftime(_STAMP, time.gmtime(_newest_mtime(out, names)))
    previous = out.subdir(PREVIOUS)
    try:
        taken = set(os.listdir(previous.fd))
        label = stamp
        for n in range(2, 1000):
            if label not in taken:
                break
            label = f"{stamp}-{n}"
        target = previous.subdir(label)
        try:
            for name in names:
                os.rename(name, name, src_dir_fd=out.fd, dst_dir_fd=target.fd)
        finally:
            target.close()
        _prune(previous)
        return os.path.join(previous.path, label)
    finally:
        previous.close()


def _started(out: OutputDir) -> str | None:
    """The start of the run whose ``run.json`` is in ``out``, as a folder name."""
    try:
        run = json.loads(out.read_whole(RUN_FILE, 4096))
        return datetime.fromisoformat(run["started"]).astimezone(UTC).strftime(_STAMP)
    except (OSError, UnsafeOutput, ValueError, KeyError, TypeError):
        return None  # no run.json (an older agent's files): the files' own time names them


def _newest_mtime(out: OutputDir, names: list[str]) -> float:
    times = []
    for name in names:
        try:
            times.append(os.stat(name, dir_fd=out.fd, follow_symlinks=False).st_mtime)
        except OSError:
            pass
    return max(times, default=time.time())


def _prune(previous: OutputDir) -> None:
    runs = sorted(n for n in os.listdir(previous.fd) if re.fullmatch(r"\d{8}T\d{6}Z(?:-\d+)?", n))
    for name in runs[:-KEEP_PREVIOUS]:
        shutil.rmtree(name, dir_fd=previous.fd)  # fd-based: safe against links swapped in
        log.info("removed %s: %d earlier runs are kept", os.path.join(previous.path, name), KEEP_PREVIOUS)


def which_run(directory: str) -> str | None:
    """What ``summary``, ``diagnose`` and ``report`` read in ``directory``: ``the run started
    <time> (agent pid N, watching ...); K earlier runs in DIR/previous/``. None when the folder
    does not exist (the reader says so itself)."""
    if not os.path.isdir(directory):
        return None
    try:
        with open(os.path.join(directory, RUN_FILE), "rb", opener=_no_follow) as f:
            run = json.loads(f.read(4096))
        started = datetime.fromisoformat(run["started"]).strftime("%Y-%m-%d %H:%M:%S UTC")
        this = f"the run started {started} (agent pid {run['pid']}, watching {run.get('watching', '?')})"
    except (OSError, ValueError, KeyError, TypeError):
        this = f"the files in {directory} (no {RUN_FILE}: an older agent's, or runs appended)"
    try:
        earlier = [n for n in os.listdir(os.path.join(directory, PREVIOUS)) if not n.startswith(".")]
    except OSError:
        earlier = []
    if earlier:
        this += f"; {len(earlier)} earlier run{'s' if len(earlier) > 1 else ''} in {os.path.join(directory, PREVIOUS)}/"
    return this


def _no_follow(path: str, flags: int) -> int:
    return os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK)
