"""``otelbpf mcp DIR`` serves only regular files under its folder (issue 31, item 9): the server
runs as root, and whoever can write in the folder links a telemetry file, a profile or the
``profiles/`` folder itself to root-only files; none of them is read and answered from."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_server import _write, call

from otelbpf.mcp.folder import Folder, FolderError


@pytest.fixture
def private(tmp_path: Path) -> Path:
    """A root-only output folder: another job's telemetry and profiles."""
    d = tmp_path / "root-only"
    d.mkdir(mode=0o700)
    _write(d)
    text = (d / "traces.jsonl").read_text().replace('"web"', '"payroll"')
    (d / "traces.jsonl").write_text(text)
    (d / "profiles" / "payroll-10-cpu-1.pb.gz").write_bytes((d / "profiles" / "web-10-cpu-1.pb.gz").read_bytes())
    return d


@pytest.fixture
def served(tmp_path: Path) -> Path:
    d = tmp_path / "served"
    d.mkdir()
    _write(d)
    return d


@pytest.mark.parametrize("name", ["traces.jsonl", "traces-20260101T000000-1-000001.jsonl", "metrics.jsonl"])
def test_a_linked_telemetry_file_is_never_read(served: Path, private: Path, name: str) -> None:
    (served / name).unlink(missing_ok=True)
    (served / name).symlink_to(private / "traces.jsonl")
    [(err, text)] = call(served, ("list_processes", {}))
    assert err and f"{served / name} is a symbolic link: refusing to read it" in text
    assert "payroll" not in text
    with pytest.raises(FolderError, match=f"{name} is a symbolic link"):
        Folder(str(served)).load()


def test_a_linked_profile_is_neither_listed_nor_read(served: Path, private: Path) -> None:
    (served / "profiles" / "payroll-10-cpu-1.pb.gz").symlink_to(private / "profiles" / "payroll-10-cpu-1.pb.gz")
    (listed, processes), (err, text) = call(
        served, ("list_processes", {}), ("flamegraph_top", {"profile": "payroll-10-cpu-1.pb.gz"})
    )
    assert not listed and [p["profiles"] for p in processes["processes"] if p["pid"] == 10] == [["web-10-cpu-1.pb.gz"]]
    assert err and "no profile 'payroll-10-cpu-1.pb.gz'" in text
    assert Folder(str(served)).profile_files() == ["web-10-cpu-1.pb.gz"]


def test_a_linked_profiles_folder_is_not_served(served: Path, private: Path) -> None:
    shutil.rmtree(served / "profiles")
    (served / "profiles").symlink_to(private / "profiles")
    (_, processes), (err, text) = call(
        served, ("list_processes", {}), ("flamegraph_top", {"profile": "payroll-10-cpu-1.pb.gz"})
    )
    assert all(p["profiles"] == [] for p in processes["processes"])
    assert err and "no profile 'payroll-10-cpu-1.pb.gz'" in text and Folder(str(served)).profile_files() == []


def test_a_profile_swapped_for_a_link_after_the_listing_is_not_read(served: Path, private: Path) -> None:
    """The name was listed as a regular file; by the time it is opened it is a link."""
    folder = Folder(str(served))
    assert folder.profile_files() == ["web-10-cpu-1.pb.gz"]
    (served / "profiles" / "web-10-cpu-1.pb.gz").unlink()
    (served / "profiles" / "web-10-cpu-1.pb.gz").symlink_to(private / "profiles" / "payroll-10-cpu-1.pb.gz")
    with pytest.raises(OSError, match="web-10-cpu-1.pb.gz is a symbolic link: refusing to read it"):
        folder.read_profile("web-10-cpu-1.pb.gz", 1 << 20)


def test_the_stragglers_tool_reads_no_link_either(served: Path, private: Path) -> None:
    """``stragglers`` reads every trace file of the folder (``collectives.read``), not only the
    ones the other tools load: a ``.jsonl`` linked to a root-only file there is refused too."""
    (served / "nccl.jsonl").symlink_to(private / "traces.jsonl")
    [(err, text)] = call(served, ("stragglers", {}))
    assert err and f"{served / 'nccl.jsonl'} is a symbolic link: refusing to read it" in text
