"""``otelbpf report DIR -o FILE`` as root (issue 31, item 4): the page holds command lines and
paths, so it is written owner-only, never through a link, never into a folder another user
owns or can write (their folder: they could swap or remove it; their link: root would write
wherever it points), and never over another user's file. A root-owned sticky folder such as
/tmp is fine: there no one else can remove or replace root's page. Each refusal is one line
and exit 2."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from harness.agent import REPO
from otelbpf.analyze.report import run

NOBODY = 65534
VICTIM_TEXT = "root:x:0:0:root:/root:/bin/bash\n"
# CI runs as root: there the test must run, never skip.
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 and os.environ.get("CI") != "true", reason="playing another user needs root"
)


@pytest.fixture
def telemetry(tmp_path: Path) -> Path:
    """An output folder (empty: a page with no findings is still a page)."""
    d = tmp_path / "otelbpf-out"
    d.mkdir(mode=0o700)
    return d


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "passwd"
    path.write_text(VICTIM_TEXT)
    return path


def folder(path: Path, perms: int, uid: int = 0) -> Path:
    path.mkdir()
    os.chown(path, uid, uid)
    path.chmod(perms)
    return path


def report(telemetry: Path, output: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return run(str(telemetry), str(output), out, err), out.getvalue(), err.getvalue()


def test_the_page_is_owner_only_whatever_the_umask(telemetry: Path, tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        rc, out, _ = report(telemetry, tmp_path / "report.html")
    finally:
        os.umask(old)
    assert rc == 0 and out.startswith(f"wrote {tmp_path / 'report.html'}")
    assert stat.S_IMODE((tmp_path / "report.html").stat().st_mode) == 0o600


def test_a_link_at_the_output_name_is_replaced_never_written_through(
    telemetry: Path, tmp_path: Path, victim: Path
) -> None:
    (tmp_path / "report.html").symlink_to(victim)
    rc, _, _ = report(telemetry, tmp_path / "report.html")
    assert rc == 0 and victim.read_text() == VICTIM_TEXT
    assert not (tmp_path / "report.html").is_symlink() and "<!DOCTYPE html>" in (tmp_path / "report.html").read_text()


@pytest.mark.parametrize(("uid", "perms"), [(NOBODY, 0o755), (NOBODY, 0o1777), (0, 0o777)])
def test_a_folder_another_user_owns_or_can_write_is_refused(
    telemetry: Path, tmp_path: Path, victim: Path, uid: int, perms: int
) -> None:
    """The issue's case: in a folder of theirs, another user points ``report.html`` at a
    file of root's; root's report overwrote it."""
    theirs = folder(tmp_path / "theirs", perms, uid)
    (theirs / "report.html").symlink_to(victim)
    rc, out, err = report(telemetry, theirs / "report.html")
    assert rc == 2 and out == ""
    why = "is owned by uid 65534" if uid else "is writable by other users (mode 0777)"
    assert len(err.splitlines()) == 1 and "refusing to write in it" in err
    assert err.startswith(f"otelbpf report: {theirs / 'report.html'} not written: output directory {theirs} {why}")
    assert victim.read_text() == VICTIM_TEXT and sorted(p.name for p in theirs.iterdir()) == ["report.html"]


def test_in_tmp_the_page_is_written_but_never_over_another_users_file(telemetry: Path, tmp_path: Path) -> None:
    shared = folder(tmp_path / "tmp", 0o1777)
    rc, _, _ = report(telemetry, shared / "mine.html")
    assert rc == 0 and stat.S_IMODE((shared / "mine.html").stat().st_mode) == 0o600
    (shared / "report.html").write_text("theirs\n")
    os.chown(shared / "report.html", NOBODY, NOBODY)
    rc, _, err = report(telemetry, shared / "report.html")
    assert rc == 2 and f"{shared / 'report.html'} is owned by uid 65534, not the agent's (uid 0)" in err
    assert (shared / "report.html").read_text() == "theirs\n" and (shared / "report.html").stat().st_uid == NOBODY


def test_the_command_refuses_with_one_line_and_exit_2(telemetry: Path, tmp_path: Path, victim: Path) -> None:
    theirs = folder(tmp_path / "theirs", 0o755, NOBODY)
    (theirs / "report.html").symlink_to(victim)
    cli = subprocess.run(
        [sys.executable, "-m", "otelbpf.cli", "report", str(telemetry), "-o", str(theirs / "report.html")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert cli.returncode == 2, cli.stderr
    said = f"otelbpf report: {theirs / 'report.html'} not written: output directory {theirs} is owned by uid 65534"
    lines = cli.stderr.splitlines()
    assert sum("not written" in line for line in lines) == 1 and lines[-1].startswith(said)
    assert "Traceback" not in cli.stderr
    assert victim.read_text() == VICTIM_TEXT


def test_the_folder_of_the_user_who_ran_sudo_is_theirs_to_write_in(
    telemetry: Path, tmp_path: Path, victim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`sudo otelbpf report out -o report.html` in the operator's own home: the user in SUDO_UID
    holds root already, so their folder is no other user's; still never through a link, and
    never a folder others can write."""
    monkeypatch.setenv("SUDO_UID", str(NOBODY))
    home = folder(tmp_path / "home", 0o755, NOBODY)
    (home / "report.html").symlink_to(victim)
    rc, _, err = report(telemetry, home / "report.html")
    assert rc == 0, err
    assert victim.read_text() == VICTIM_TEXT and not (home / "report.html").is_symlink()
    assert stat.S_IMODE((home / "report.html").stat().st_mode) == 0o600
    (home / "report.html").unlink()
    (home / "report.html").write_text("an older page of theirs\n")
    os.chown(home / "report.html", NOBODY, NOBODY)
    rc, _, err = report(telemetry, home / "report.html")
    assert rc == 0 and "<!DOCTYPE html>" in (home / "report.html").read_text(), err
    shared = folder(tmp_path / "shared", 0o777, NOBODY)
    rc, _, err = report(telemetry, shared / "report.html")
    assert rc == 2 and "is writable by other users (mode 0777)" in err
