"""The one path for what root writes and reads back (issue 31, items 4, 5, 9 and 10), at the
level of ``OutputDir`` and ``ReadDir``: a folder another user owns or can write is refused
(a root-owned sticky one such as /tmp is not), an entry another user owns is never replaced,
what is read back as trusted must be writable by no one else, and a folder read as root is
read without following links. The exporters', the report's, the cache's and MCP's own tests
show each of these where it is used."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from otelbpf.base.safe_files import OutputDir, ReadDir, UnsafeOutput

NOBODY = 65534
# CI runs as root: there the test must run, never skip.
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 and os.environ.get("CI") != "true", reason="playing another user needs root"
)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def folder(path: Path, perms: int, uid: int = 0) -> Path:
    path.mkdir()
    os.chown(path, uid, uid)
    path.chmod(perms)  # after the chown, which clears the sticky bit on some filesystems
    return path


@pytest.mark.parametrize(
    ("uid", "perms", "why"),
    [
        (NOBODY, 0o755, r"is owned by uid 65534, not the agent's \(uid 0\)"),
        (NOBODY, 0o777, r"is owned by uid 65534, not the agent's \(uid 0\)"),
        (NOBODY, 0o1777, r"is owned by uid 65534, not the agent's \(uid 0\)"),  # sticky, but theirs
        (0, 0o777, r"is writable by other users \(mode 0777\)"),
        (0, 0o775, r"is writable by other users \(mode 0775\)"),
    ],
)
def test_a_folder_another_user_owns_or_can_write_is_refused(tmp_path: Path, uid: int, perms: int, why: str) -> None:
    out = folder(tmp_path / "out", perms, uid)
    with pytest.raises(UnsafeOutput, match=f"output directory {out} {why}: they could replace or remove"):
        OutputDir(str(out))
    assert list(out.iterdir()) == []


def test_the_check_holds_for_a_subfolder_too(tmp_path: Path) -> None:
    out = folder(tmp_path / "out", 0o1777)
    folder(out / "profiles", 0o777, NOBODY)
    d = OutputDir(str(out))
    with pytest.raises(UnsafeOutput, match="profiles is owned by uid 65534"):
        d.subdir("profiles")
    d.close()


def test_a_root_owned_sticky_folder_is_written_as_in_tmp(tmp_path: Path) -> None:
    """Others can add names there but never remove or replace root's: the page and files go
    in, owner-only."""
    shared = folder(tmp_path / "tmp", 0o1777)
    d = OutputDir(str(shared))
    d.write_whole("report.html", b"page")
    os.close(d.open_append("traces.jsonl"))
    d.close()
    assert (shared / "report.html").read_bytes() == b"page"
    assert mode(shared / "report.html") == 0o600 and mode(shared / "traces.jsonl") == 0o600


def test_write_modes_the_operator_configured_are_not_held_against_the_folder(tmp_path: Path) -> None:
    d = OutputDir(str(tmp_path / "group"), dir_mode=0o770, file_mode=0o660)
    d.write_whole("x", b"x")
    d.close()
    assert mode(tmp_path / "group") == 0o770


def test_a_whole_file_never_replaces_another_users_entry(tmp_path: Path) -> None:
    """In /tmp another user leaves ``report.html`` (a file or a link of theirs): root's page
    neither writes into it nor removes it."""
    shared = folder(tmp_path / "tmp", 0o1777)
    theirs = shared / "report.html"
    theirs.write_text("theirs\n")
    os.chown(theirs, NOBODY, NOBODY)
    link = shared / "profile.pb.gz"
    link.symlink_to(theirs)
    os.chown(link, NOBODY, NOBODY, follow_symlinks=False)
    d = OutputDir(str(shared))
    with pytest.raises(UnsafeOutput, match=r"report.html is owned by uid 65534, not the agent's \(uid 0\); remove"):
        d.write_whole("report.html", b"page")
    with pytest.raises(UnsafeOutput, match="profile.pb.gz is owned by uid 65534"):
        d.write_whole("profile.pb.gz", b"page")
    d.close()
    assert theirs.read_text() == "theirs\n" and theirs.stat().st_uid == NOBODY and link.is_symlink()
    assert sorted(p.name for p in shared.iterdir()) == ["profile.pb.gz", "report.html"]  # no temp file left


def test_what_is_read_back_must_be_writable_by_no_one_else(tmp_path: Path) -> None:
    """An entry left 0666 (restored from a backup) is anyone's to rewrite: never trusted."""
    d = OutputDir(str(tmp_path / "cache"))
    d.write_whole("entry", b"code")
    (tmp_path / "cache" / "entry").chmod(0o666)
    with pytest.raises(UnsafeOutput, match=r"entry is writable by other users \(mode 0666\): refusing to read it"):
        d.read_whole("entry", 100)
    (tmp_path / "cache" / "entry").chmod(0o640)
    assert d.read_whole("entry", 100) == b"code"
    d.close()


def test_a_folder_read_as_root_is_read_without_following_links(tmp_path: Path) -> None:
    private = folder(tmp_path / "private", 0o700)
    (private / "traces.jsonl").write_text("root's\n")
    (private / "profiles").mkdir()
    served = tmp_path / "served"
    served.mkdir()
    (served / "traces.jsonl").symlink_to(private / "traces.jsonl")
    (served / "profiles").symlink_to(private / "profiles")
    os.mkfifo(served / "metrics.jsonl")
    (served / "traces-1.jsonl").write_text("mine\n")

    with ReadDir(str(served)) as d:
        assert d.names(lambda n: n.endswith(".jsonl")) == ["metrics.jsonl", "traces-1.jsonl", "traces.jsonl"]
        with d.open_text("traces-1.jsonl") as f:
            assert f.read() == "mine\n"
        with pytest.raises(UnsafeOutput, match="traces.jsonl is a symbolic link: refusing to read it"):
            d.open_text("traces.jsonl")
        with pytest.raises(UnsafeOutput, match="metrics.jsonl is not a regular file"):  # and never blocks
            d.open_text("metrics.jsonl")
        with pytest.raises(UnsafeOutput, match="profiles is a symbolic link or not a directory"):
            d.subdir("profiles")
        with pytest.raises(UnsafeOutput, match="not a plain file name"):
            d.open_text("../private/traces.jsonl")
