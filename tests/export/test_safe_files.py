"""Files as root, safely (issue 13, rows 7 and 8): real symbolic links, hard links and FIFOs
planted where the agent writes; nothing behind them is appended to, truncated or replaced,
and what the agent creates is owner-only by default."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from otelbpf.base.health import Health
from otelbpf.base.safe_files import OutputDir, UnsafeOutput
from otelbpf.export.encoded_profile import ProfileRecord
from otelbpf.export.jsonfile import FileMetricExporter, FileSpanExporter
from otelbpf.export.profile_export import PprofFileExporter

REPO = Path(__file__).resolve().parents[2]
VICTIM_TEXT = "root:x:0:0:root:/root:/bin/bash\n"


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "passwd"
    path.write_text(VICTIM_TEXT)
    return path


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def record(end_ms: int = 5) -> ProfileRecord:
    return ProfileRecord("process_cpu", "cpu", {"service_name": "train"}, 42, 0, end_ms * 1_000_000, 99, b"pprof")


def test_the_output_directory_as_a_link_is_refused(tmp_path: Path, victim: Path):
    elsewhere = tmp_path / "etc"
    elsewhere.mkdir()
    (tmp_path / "out").symlink_to(elsewhere)

    for make in (
        lambda: FileSpanExporter(str(tmp_path / "out")),
        lambda: FileMetricExporter(str(tmp_path / "out")),
        lambda: PprofFileExporter(str(tmp_path / "out"), Health()),
    ):
        with pytest.raises(UnsafeOutput, match="out is a symbolic link or not a directory"):
            make()
    assert list(elsewhere.iterdir()) == []


def test_profiles_directory_as_a_link_is_refused(tmp_path: Path):
    elsewhere = tmp_path / "etc"
    elsewhere.mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "profiles").symlink_to(elsewhere)

    with pytest.raises(UnsafeOutput, match="profiles is a symbolic link"):
        PprofFileExporter(str(tmp_path / "out"), Health())


def test_a_link_planted_after_start_is_never_written_through(tmp_path: Path, victim: Path):
    """The attacker swaps traces.jsonl for a link while the agent runs; the next rotation
    renames the link and opens a fresh file."""
    out = tmp_path / "out"
    exporter = FileSpanExporter(str(out), rotate_bytes=64)
    exporter._out.write(b"x" * 10)
    (out / "traces.jsonl").rename(out / "moved.jsonl")
    (out / "traces.jsonl").symlink_to(victim)
    exporter._out.write(b"y" * 100)  # crosses rotate_bytes: rotates
    exporter._out.write(b"z" * 10)
    exporter.shutdown()

    assert victim.read_text() == VICTIM_TEXT
    assert (out / "moved.jsonl").read_bytes() == b"x" * 10 + b"\n" + b"y" * 100 + b"\n"
    assert not (out / "traces.jsonl").is_symlink() and (out / "traces.jsonl").read_bytes() == b"z" * 10 + b"\n"


def test_a_fifo_or_a_hard_link_is_refused_without_blocking(tmp_path: Path, victim: Path):
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "traces.jsonl")
    os.link(victim, out / "metrics.jsonl")

    with pytest.raises(UnsafeOutput, match="traces.jsonl is not a regular file"):
        FileSpanExporter(str(out))
    with pytest.raises(UnsafeOutput, match="metrics.jsonl has other hard links"):
        FileMetricExporter(str(out))
    assert victim.read_text() == VICTIM_TEXT


def test_profile_temp_file_is_random_and_exclusive(tmp_path: Path, victim: Path):
    """The old exporter wrote ``<final name>.tmp``: a link planted there was truncated and
    filled, then renamed into place."""
    health = Health()
    exporter = PprofFileExporter(str(tmp_path / "out"), health)
    final = exporter.path_for(record())
    Path(f"{final}.tmp").symlink_to(victim)

    exporter.export([record(), record(6)])

    assert victim.read_text() == VICTIM_TEXT
    assert Path(final).read_bytes() == b"pprof" and not Path(final).is_symlink()
    assert sorted(p.name for p in Path(exporter.directory).iterdir() if not p.is_symlink()) == [
        "train-42-cpu-5.pb.gz",
        "train-42-cpu-6.pb.gz",
    ]
    assert health.get("otelbpf.export.sent") == 2


def test_a_profile_whose_final_name_is_a_link_replaces_the_link_only(tmp_path: Path, victim: Path):
    exporter = PprofFileExporter(str(tmp_path / "out"), Health())
    final = Path(exporter.path_for(record()))
    final.symlink_to(victim)

    exporter.export([record()])

    assert victim.read_text() == VICTIM_TEXT and not final.is_symlink() and final.read_bytes() == b"pprof"


def test_owner_only_by_default_whatever_the_umask(tmp_path: Path):
    old = os.umask(0)
    try:
        spans = FileSpanExporter(str(tmp_path / "a" / "out"))
        profiles = PprofFileExporter(str(tmp_path / "a" / "out"), Health())
        profiles.export([record()])
    finally:
        os.umask(old)
    spans.shutdown()
    out = tmp_path / "a" / "out"
    assert mode(out) == 0o700 and mode(out / "profiles") == 0o700
    assert mode(out / "traces.jsonl") == 0o600
    assert mode(out / "profiles" / "train-42-cpu-5.pb.gz") == 0o600


def test_configured_modes_and_an_old_0644_file_tightened(tmp_path: Path):
    out = tmp_path / "out"
    out.mkdir(mode=0o755)
    (out / "metrics.jsonl").write_text("old\n")
    os.chmod(out / "metrics.jsonl", 0o644)

    FileMetricExporter(str(out)).shutdown()
    FileSpanExporter(str(tmp_path / "shared"), file_mode=0o640, dir_mode=0o750).shutdown()

    assert mode(out / "metrics.jsonl") == 0o600 and (out / "metrics.jsonl").read_text() == "old\n"
    assert mode(out) == 0o755  # the operator's existing directory is left as it is
    assert mode(tmp_path / "shared") == 0o750 and mode(tmp_path / "shared" / "traces.jsonl") == 0o640


def test_names_never_leave_the_directory(tmp_path: Path):
    d = OutputDir(str(tmp_path / "out"))
    for name in ("../x", "/etc/passwd", "..", "", "a\0b"):
        with pytest.raises(UnsafeOutput, match="not a plain file name"):
            d.write_whole(name, b"x")
    d.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_the_held_directory_survives_a_swap_of_its_path(tmp_path: Path, victim: Path):
    """Writes go to the directory opened at start, not to whatever the path names later."""
    exporter = PprofFileExporter(str(tmp_path / "out"), Health())
    (tmp_path / "out").rename(tmp_path / "kept")
    (tmp_path / "out").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    exporter.export([record()])
    assert (tmp_path / "kept" / "profiles" / "train-42-cpu-5.pb.gz").read_bytes() == b"pprof"


AGENT_CONFIG = """
receivers: {cuda: {search_paths: []}}
exporters: {file: %s}
service: {pipelines: {traces: {receivers: [cuda], exporters: [file]}}}
"""


def test_run_refuses_a_linked_output_directory_with_a_clear_error(tmp_path: Path, victim: Path):
    (tmp_path / "out").symlink_to(tmp_path)
    config = tmp_path / "c.yaml"
    config.write_text(AGENT_CONFIG % f"{{directory: {tmp_path / 'out'}}}")

    out = subprocess.run(
        [sys.executable, "-m", "otelbpf.cli", "run", "-c", str(config), "--duration", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )

    assert out.returncode == 2, out.stderr[-3000:]
    assert f"otelbpf: output directory {tmp_path / 'out'} is a symbolic link" in out.stderr
    assert "Traceback" not in out.stderr


def test_concurrent_profile_exports_use_distinct_temp_files(tmp_path: Path):
    exporter = PprofFileExporter(str(tmp_path / "out"), Health())
    threads = [threading.Thread(target=exporter.export, args=([record(i)],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    names = sorted(p.name for p in Path(exporter.directory).iterdir())
    assert names == sorted(f"train-42-cpu-{i}.pb.gz" for i in range(8))


NOBODY = 65534
# CI runs as root: there the test must run, never skip.
as_root = pytest.mark.skipif(
    os.geteuid() != 0 and os.environ.get("CI") != "true", reason="giving a file to another user needs root"
)


def other_users_file(path: Path, text: str = "theirs\n") -> Path:
    path.write_text(text)
    os.chown(path, NOBODY, NOBODY)
    path.chmod(0o666)
    return path


@as_root
def test_an_existing_file_of_another_user_is_refused(tmp_path: Path):
    """As root the agent appended to whatever file a user left under the output name."""
    out = tmp_path / "out"
    out.mkdir()
    theirs = other_users_file(out / "traces.jsonl")
    other_users_file(out / "metrics.jsonl")

    with pytest.raises(UnsafeOutput, match=r"traces.jsonl is owned by uid 65534, not the agent's \(uid 0\)"):
        FileSpanExporter(str(out))
    with pytest.raises(UnsafeOutput, match="metrics.jsonl is owned by uid 65534"):
        FileMetricExporter(str(out))
    assert theirs.read_text() == "theirs\n" and mode(theirs) == 0o666 and theirs.stat().st_uid == NOBODY


@as_root
def test_another_users_file_met_while_running_is_counted_and_said_once(tmp_path: Path, caplog):
    """A file planted where the exporter opens again (after a failed rotation) fails the export
    (counted by the caller as otelbpf.export.failures) and is logged once, never written."""
    out = tmp_path / "out"
    exporter = FileSpanExporter(str(out))
    exporter._out._f.close()
    exporter._out._f = None  # as after a rotation whose rename failed
    (out / "traces.jsonl").unlink()
    theirs = other_users_file(out / "traces.jsonl")

    for _ in range(3):
        with pytest.raises(UnsafeOutput):
            exporter._out.write(b"x")
    exporter.shutdown()

    assert theirs.read_text() == "theirs\n"
    assert [r.getMessage() for r in caplog.records if "owned by uid 65534" in r.getMessage()] == [
        f"{out / 'traces.jsonl'} is owned by uid 65534, not the agent's (uid 0); remove it or chown it: "
        "refusing to write to it"
    ]


def test_past_max_files_the_profiles_that_ended_first_go_and_are_counted(tmp_path: Path, victim: Path):
    """Any run's profiles count (an older run's end first and go first); a link or another
    name is left alone; the folder is read again only a tenth past the bound."""
    health = Health()
    folder = tmp_path / "out" / "profiles"
    folder.mkdir(parents=True, mode=0o700)
    for end in (1, 2, 3):
        (folder / f"old-7-cpu-{end}.pb.gz").write_bytes(b"old")
    (folder / "link-7-cpu-0.pb.gz").symlink_to(victim)
    (folder / "notes.txt").write_text("mine\n")
    exporter = PprofFileExporter(str(tmp_path / "out"), health, max_files=4)  # read again at 5
    for end in (10, 11, 12, 13):
        exporter.export([record(end)])
    exporter.shutdown()
    assert sorted(p.name for p in folder.iterdir() if not p.is_symlink()) == [
        "notes.txt",
        "train-42-cpu-10.pb.gz",
        "train-42-cpu-11.pb.gz",
        "train-42-cpu-12.pb.gz",
        "train-42-cpu-13.pb.gz",
    ]
    assert (folder / "link-7-cpu-0.pb.gz").is_symlink() and victim.read_text() == VICTIM_TEXT
    assert health.get("otelbpf.export.files_removed") == 3


@as_root
@pytest.mark.parametrize(("uid", "perms"), [(NOBODY, 0o777), (NOBODY, 0o700), (0, 0o777)])
def test_an_output_folder_another_user_made_or_can_write_is_refused(tmp_path: Path, uid: int, perms: int):
    """Issue 31, item 10: ``out/`` made beforehand (0777, in a world-writable /tmp) by another
    user, who could then swap or remove the agent's files: refused by every file exporter,
    nothing written there."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    out = shared / "out"
    out.mkdir()
    os.chown(out, uid, uid)
    out.chmod(perms)
    why = "is owned by uid 65534, not the agent's (uid 0)" if uid else "is writable by other users (mode 0777)"
    for make in (
        lambda: FileSpanExporter(str(out)),
        lambda: FileMetricExporter(str(out)),
        lambda: PprofFileExporter(str(out), Health()),
    ):
        with pytest.raises(UnsafeOutput) as refused:
            make()
        assert str(refused.value).startswith(f"output directory {out} {why}: they could replace or remove")
    assert list(out.iterdir()) == []


def _owned_by_nobody(path: Path, *, file_in_it: bool) -> None:
    """``path`` made 0777 by another user, or (``file_in_it``) the agent's own folder holding
    another user's ``traces.jsonl``."""
    path.mkdir()
    if file_in_it:
        path.chmod(0o700)
        (path / "traces.jsonl").write_text("theirs\n")
        os.chown(path / "traces.jsonl", NOBODY, NOBODY)
        (path / "traces.jsonl").chmod(0o644)
    else:
        os.chown(path, NOBODY, NOBODY)
        path.chmod(0o777)


@as_root
@pytest.mark.parametrize(
    ("file_in_it", "said"),
    [
        (False, "output directory {out} is owned by uid 65534, not the agent's (uid 0): they could replace"),
        (True, "{out}/traces.jsonl is owned by uid 65534, not the agent's (uid 0); remove it or chown it"),
    ],
)
def test_run_refuses_another_users_folder_or_file_in_one_line_exit_2_before_the_compile(
    tmp_path: Path, file_in_it: bool, said: str
):
    """Issue 31, item 10, through ``otelbpf run``: its folder used without a word, its file a
    raw PermissionError traceback (the agent writes without CAP_DAC_OVERRIDE). Now one line and
    exit 2, from the exporters built before the BPF compile (no probe, no wait)."""
    out = tmp_path / "out"
    _owned_by_nobody(out, file_in_it=file_in_it)
    config = tmp_path / "c.yaml"
    # appending: a new run would move the earlier files aside (export/runs.py) and open afresh
    config.write_text(AGENT_CONFIG % f"{{directory: {out}, append: true}}")

    run = subprocess.run(
        [sys.executable, "-m", "otelbpf.cli", "run", "-c", str(config), "--duration", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )

    assert run.returncode == 2, run.stderr[-3000:]
    said_lines = [line for line in run.stderr.splitlines() if line.startswith("otelbpf: ")]
    assert len(said_lines) == 1 and said_lines[0].startswith(f"otelbpf: {said.format(out=out)}"), run.stderr
    assert "Traceback" not in run.stderr and "compiled in" not in run.stderr
    if file_in_it:
        assert (out / "traces.jsonl").read_text() == "theirs\n"
    else:
        assert list(out.iterdir()) == []
