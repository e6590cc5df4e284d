"""One run per output folder (export/runs.py): an earlier run's files move to previous/<start>/,
run.json names the run the readers read, append keeps the old behaviour."""

from __future__ import annotations

import json
import os
from pathlib import Path

from otelbpf.config.exporters import FileExporterConfig
from otelbpf.export import runs

T0 = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC


def folder(tmp_path: Path, **options: object) -> FileExporterConfig:
    return FileExporterConfig(directory=str(tmp_path / "out"), **options)


def write_run_files(out: Path) -> None:
    (out / "traces.jsonl").write_text("{}\n")
    (out / "traces-20270115T080001Z.jsonl").write_text("{}\n")
    (out / "metrics.jsonl").write_text("{}\n")
    (out / "profiles").mkdir()
    (out / "profiles" / "a.pb.gz").write_bytes(b"x")
    (out / "report.html").write_text("<html>")


def test_each_run_starts_the_folder_afresh_and_the_earlier_one_moves_under_previous(tmp_path: Path) -> None:
    cfg = folder(tmp_path)
    out = Path(cfg.directory)
    assert runs.begin_run(cfg, "the host", now=T0) is None
    assert json.loads((out / "run.json").read_text()) == {
        "started": "2027-01-15T08:00:00+00:00",
        "pid": os.getpid(),
        "watching": "the host",
    }
    write_run_files(out)
    (out / "notes.txt").write_text("the user's own file stays")
    moved = runs.begin_run(cfg, "pids 12", now=T0 + 60)
    assert moved == str(out / "previous" / "20270115T080000Z")
    assert sorted(os.listdir(out)) == ["notes.txt", "previous", "run.json"]
    assert sorted(os.listdir(moved)) == [
        "metrics.jsonl",
        "profiles",
        "report.html",
        "run.json",
        "traces-20270115T080001Z.jsonl",
        "traces.jsonl",
    ]
    assert json.loads((out / "run.json").read_text())["watching"] == "pids 12"
    which = runs.which_run(str(out))
    assert which == (
        f"the run started 2027-01-15 08:01:00 UTC (agent pid {os.getpid()}, watching pids 12); "
        f"1 earlier run in {out / 'previous'}/"
    )


def test_append_adds_to_the_files_there(tmp_path: Path) -> None:
    cfg = folder(tmp_path, append=True)
    out = Path(cfg.directory)
    out.mkdir(mode=0o700)
    write_run_files(out)
    assert runs.begin_run(cfg, "the host", now=T0) is None
    assert not (out / "previous").exists() and (out / "traces.jsonl").exists()


def test_an_older_agents_files_are_named_by_their_time_and_only_five_earlier_runs_are_kept(tmp_path: Path) -> None:
    cfg = folder(tmp_path)
    out = Path(cfg.directory)
    out.mkdir(mode=0o700)
    for i in range(7):
        (out / "traces.jsonl").write_text("{}\n")
        os.utime(out / "traces.jsonl", (T0 + i, T0 + i))
        (out / "run.json").unlink(missing_ok=True)  # an agent from before run.json
        runs.begin_run(cfg, "the host", now=T0 + i)
    kept = sorted(os.listdir(out / "previous"))
    assert kept == [f"20270115T08000{i}Z" for i in range(2, 7)]
    assert runs.which_run(str(out)).endswith(f"; 5 earlier runs in {out / 'previous'}/")


def test_a_link_in_the_folder_is_moved_as_a_link_never_followed(tmp_path: Path) -> None:
    cfg = folder(tmp_path)
    out = Path(cfg.directory)
    out.mkdir(mode=0o700)
    elsewhere = tmp_path / "precious.jsonl"
    elsewhere.write_text("keep me\n")
    (out / "traces.jsonl").symlink_to(elsewhere)
    moved = runs.begin_run(cfg, "the host", now=T0)
    assert moved is not None and os.path.islink(os.path.join(moved, "traces.jsonl"))
    assert elsewhere.read_text() == "keep me\n"


def test_which_run_of_a_folder_without_run_json(tmp_path: Path) -> None:
    assert runs.which_run(str(tmp_path / "missing")) is None
    assert runs.which_run(str(tmp_path)) == f"the files in {tmp_path} (no run.json: an older agent's, or runs appended)"


def test_a_folder_with_no_runs_files_keeps_what_only_looks_like_them(tmp_path: Path) -> None:
    """directory: "." in a project: its own profiles/ and report.html are not an earlier run."""
    cfg = folder(tmp_path)
    out = Path(cfg.directory)
    (out / "profiles").mkdir(parents=True, mode=0o700)
    out.chmod(0o700)
    (out / "report.html").write_text("the project's own")
    assert runs.begin_run(cfg, "the host", now=T0) is None
    assert sorted(os.listdir(out)) == ["profiles", "report.html", "run.json"]
