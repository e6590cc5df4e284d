"""Library discovery on disk and in real processes: globs, /proc/PID/maps, paths as a
process sees them (its cwd, its mount namespace)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.agent import FAKE_CUDA, FAKE_CUDART, WORKLOAD, real_cudart, wait_until
from otelbpf.families.cuda.probes import cuda_family
from otelbpf.sensor import libraries

pytestmark = pytest.mark.usefixtures("built")

FAMILIES = [cuda_family(["cudart", "cuda"])]


def inode(path: Path | str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def loaded_workload(lib: Path, go: Path, cwd: Path | None = None) -> subprocess.Popen:
    """cuda_workload with ``lib`` dlopen'ed, waiting for ``go`` before its first CUDA call."""
    proc = subprocess.Popen(
        [str(WORKLOAD), "--lib", str(lib), "--iterations", "1", "--wait-for-file", str(go)],
        stdout=subprocess.DEVNULL,
        cwd=cwd,
    )
    shown = str(lib) if lib.is_absolute() else os.path.join(cwd or os.getcwd(), lib)
    if not wait_until(lambda: os.path.normpath(shown) in libraries.mapped_paths(proc.pid), timeout=10):
        proc.kill()
        raise AssertionError(f"cuda_workload never mapped {lib}")
    return proc


@pytest.fixture
def workload(tmp_path: Path) -> Iterator[subprocess.Popen]:
    go = tmp_path / "go"
    proc = loaded_workload(FAKE_CUDART, go)
    try:
        yield proc
    finally:
        go.touch()
        proc.wait(10)


def test_globs_find_libraries_through_symlinks_and_skip_other_files(tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libcudart.so").symlink_to(FAKE_CUDART)
    (tmp_path / "lib" / "libcuda.so").symlink_to(FAKE_CUDA)
    shutil.copy(FAKE_CUDART, tmp_path / "lib" / "libcudart.so.12.bak")
    shutil.copy(FAKE_CUDART, tmp_path / "lib" / "libcudnn.so.9")
    found = list(libraries.from_globs([str(tmp_path / "**" / "libcud*"), str(real_cudart().parent / "*")], FAMILIES))
    by_path = {lib.path: lib for lib in found}
    assert by_path.keys() == {str(FAKE_CUDART.resolve()), str(FAKE_CUDA.resolve()), str(real_cudart().resolve())}
    fake = by_path[str(FAKE_CUDART.resolve())]
    assert (fake.shown_path, fake.family, fake.kind, fake.key) == (fake.path, "cuda", "cudart", inode(FAKE_CUDART))
    assert by_path[str(FAKE_CUDA.resolve())].kind == "cuda"
    assert by_path[str(real_cudart().resolve())].key == inode(real_cudart())


def test_globs_only_find_the_libraries_of_enabled_kinds(tmp_path: Path) -> None:
    (tmp_path / "libcuda.so.1").symlink_to(FAKE_CUDA)
    (tmp_path / "libcudart.so.12").symlink_to(FAKE_CUDART)
    found = list(libraries.from_globs([str(tmp_path / "*")], [cuda_family(["cudart"])]))
    assert [(lib.path, lib.kind) for lib in found] == [(str(FAKE_CUDART.resolve()), "cudart")]


def test_mapped_paths_of_a_running_process(workload: subprocess.Popen) -> None:
    paths = libraries.mapped_paths(workload.pid)
    assert {str(FAKE_CUDART), str(WORKLOAD)} <= paths
    assert any(os.path.basename(p) == "libc.so.6" for p in paths)
    assert all(p.startswith("/") for p in paths)
    assert not any(p.endswith("(deleted)") or p.startswith("[") for p in paths)


def test_from_process_finds_the_loaded_library_by_inode(workload: subprocess.Popen) -> None:
    [lib] = list(libraries.from_process(workload.pid, FAMILIES))
    assert lib.path == f"/proc/{workload.pid}/root{FAKE_CUDART}"
    assert lib.shown_path == str(FAKE_CUDART)
    assert (lib.family, lib.kind, lib.key) == ("cuda", "cudart", inode(FAKE_CUDART))


def test_a_deleted_library_is_reported_by_its_path_without_the_marker(tmp_path: Path) -> None:
    lib = tmp_path / "libcudart.so.12"
    shutil.copy(FAKE_CUDART, lib)
    go = tmp_path / "go"
    proc = loaded_workload(lib, go)
    try:
        lib.unlink()
        with open(f"/proc/{proc.pid}/maps") as f:
            assert f"{lib} (deleted)" in f.read()
        assert str(lib) in libraries.mapped_paths(proc.pid)
    finally:
        go.touch()
        proc.wait(10)


def test_a_relative_path_is_resolved_against_the_process_cwd(tmp_path: Path) -> None:
    shutil.copy(FAKE_CUDART, tmp_path / "libcudart.so.12")
    proc = subprocess.Popen(["sleep", "30"], cwd=tmp_path)
    try:
        wait_until(lambda: os.readlink(f"/proc/{proc.pid}/cwd") == str(tmp_path))
        lib = libraries.in_process(proc.pid, "libcudart.so.12", FAMILIES)
        assert lib is not None
        assert lib.shown_path == str(tmp_path / "libcudart.so.12")
        assert lib.path == f"/proc/{proc.pid}/root{tmp_path}/libcudart.so.12"
        assert lib.key == inode(tmp_path / "libcudart.so.12")
        assert libraries.in_process(proc.pid, "libcublas.so.12", FAMILIES) is None
        assert libraries.in_process(proc.pid, "libcuda.so.1", FAMILIES) is None  # no such file
    finally:
        proc.kill()
        proc.wait()


def test_a_library_only_in_the_process_mount_namespace_is_found_through_its_root(tmp_path: Path) -> None:
    """As in a container: the path exists for the process, not for the agent."""
    if shutil.which("unshare") is None:
        pytest.skip("util-linux unshare is not installed")
    mnt = tmp_path / "ns"
    mnt.mkdir()
    script = f"mount -t tmpfs none {mnt} && cp {FAKE_CUDART} {mnt}/ && echo ready && exec sleep 30"
    proc = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        shown = f"{mnt}/libcudart.so.12"
        assert not os.path.exists(shown)  # not in this mount namespace
        lib = libraries.in_process(proc.pid, shown, FAMILIES)
        assert lib is not None
        assert (lib.path, lib.shown_path, lib.kind) == (f"/proc/{proc.pid}/root{shown}", shown, "cudart")
        assert lib.key == inode(lib.path) != inode(FAKE_CUDART)
    finally:
        proc.kill()
        proc.wait()


def test_a_process_that_is_gone_has_no_libraries() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    time.sleep(0.01)
    assert libraries.mapped_paths(proc.pid) == set()
    assert list(libraries.from_process(proc.pid, FAMILIES)) == []
    assert proc.pid not in libraries.all_pids()


def test_all_pids_lists_live_processes() -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        pids = libraries.all_pids()
        assert os.getpid() in pids and proc.pid in pids and 1 in pids
    finally:
        proc.kill()
        proc.wait()


# -- executables recognised by content: the CUDA runtime linked statically -------------


def waiting(program: Path, gate: Path) -> subprocess.Popen:
    """``program`` started and waiting for ``gate`` before its main CUDA calls."""
    proc = subprocess.Popen([str(program), "1", str(gate)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_a_static_runtime_executable_is_found_in_its_process(nvcc_programs: dict[str, Path], tmp_path: Path) -> None:
    program = nvcc_programs["static"]
    proc = waiting(program, tmp_path / "go")
    try:
        exe = libraries.executable(proc.pid, FAMILIES)
        assert exe is not None
        assert (exe.path, exe.shown_path, exe.family, exe.kind, exe.key) == (
            f"/proc/{proc.pid}/exe",
            str(program),
            "cuda",
            "cudart_static",
            inode(program),
        )
        assert exe in list(libraries.from_process(proc.pid, FAMILIES))
    finally:
        (tmp_path / "go").touch()
        proc.wait(10)


def test_a_shared_runtime_executable_is_not_one_its_library_is(nvcc_programs: dict[str, Path], tmp_path: Path) -> None:
    proc = waiting(nvcc_programs["shared"], tmp_path / "go")
    try:
        assert libraries.executable(proc.pid, FAMILIES) is None
        assert [lib.kind for lib in libraries.from_process(proc.pid, FAMILIES)] == ["cudart"]
    finally:
        (tmp_path / "go").touch()
        proc.wait(10)


def test_a_stripped_static_runtime_is_recognised_so_it_can_be_reported(nvcc_programs: dict[str, Path]) -> None:
    program = nvcc_programs["stripped"]
    lib = libraries.executable(-1, FAMILIES, str(program))  # no such pid: by the path it was started by
    assert lib is not None and (lib.path, lib.kind) == (str(program), "cudart_static")


def test_a_gone_process_falls_back_to_the_path_it_was_started_by(nvcc_programs: dict[str, Path]) -> None:
    program = nvcc_programs["static"]
    proc = subprocess.run([str(program), "0"], capture_output=True, text=True, check=True)
    pid = json.loads(proc.stdout)["pid"]
    lib = libraries.executable(pid, FAMILIES, str(program))
    assert lib is not None and (lib.path, lib.shown_path, lib.key) == (str(program), str(program), inode(program))
    assert libraries.executable(pid, FAMILIES, "static_runtime") is None  # relative: no cwd left to resolve it
    assert libraries.executable(pid, FAMILIES) is None


def test_other_executables_and_scripts_are_not_of_any_kind(tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\nexec sleep 30\n")
    script.chmod(0o755)
    for path in ("/bin/sleep", sys.executable, str(script)):
        assert libraries.executable(-1, FAMILIES, path) is None
    # A family without content kinds never reads executables.
    assert libraries.executable(os.getpid(), [cuda_family(["cuda"])]) is None


def test_each_executable_is_read_once(
    nvcc_programs: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    copy = tmp_path / "copy"
    shutil.copy(nvcc_programs["static"], copy)  # an inode no other test has classified
    reads = []
    real = libraries.elf.content
    monkeypatch.setattr(libraries.elf, "content", lambda path, symbol: reads.append(path) or real(path, symbol))
    for _ in range(3):
        assert libraries.executable(-1, FAMILIES, str(copy)).kind == "cudart_static"
    assert reads == [str(copy)]


def test_in_process_falls_back_to_the_host_path_only_for_a_gone_process(tmp_path: Path) -> None:
    shutil.copy(FAKE_CUDART, tmp_path / "libcudart.so.12")
    shown = str(tmp_path / "libcudart.so.12")
    proc = subprocess.Popen(["true"])
    proc.wait()
    lib = libraries.in_process(proc.pid, shown, FAMILIES)
    assert lib is not None and (lib.path, lib.shown_path) == (shown, shown)
    # Alive in a mount namespace where that path is something else (here: nothing): the
    # host's file is not the one it opened.
    if shutil.which("unshare") is None:
        pytest.skip("util-linux unshare is not installed")
    script = f"mount -t tmpfs none {tmp_path} && echo ready && exec sleep 30"
    hidden = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script], stdout=subprocess.PIPE, text=True
    )
    try:
        assert hidden.stdout.readline().strip() == "ready"
        assert libraries.in_process(hidden.pid, shown, FAMILIES) is None
    finally:
        hidden.kill()
        hidden.wait()


def test_a_library_opened_by_a_process_now_a_zombie_is_found_by_its_host_path(tmp_path: Path) -> None:
    """A short-lived process that opened the library and exited, not reaped yet: its /proc
    entry is there, its namespace is not; the host path stands in as for one already gone."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    assert wait_until(lambda: Path(f"/proc/{child.pid}/stat").read_text().split()[2] == "Z", timeout=10)
    try:
        lib = libraries.in_process(child.pid, str(FAKE_CUDART), [cuda_family(["cudart"])])
        assert lib is not None and lib.path == str(FAKE_CUDART) and lib.kind == "cudart"
    finally:
        child.wait()
