"""`otelbpf doctor` against the real host: real BPF loads, real privilege drops, real processes.

The doctor runs in a child process so that dropping capabilities (setpriv) and BCC's probes stay
out of the pytest process.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from otelbpf.doctor import scan_processes

REPO_ROOT = Path(__file__).resolve().parents[1]
DOCTOR = "import sys; from otelbpf.doctor import run_doctor; sys.exit(run_doctor())"
HOLD_LIBRARY = "import ctypes, sys, time; ctypes.CDLL(sys.argv[1]); print('loaded', flush=True); time.sleep(30)"


def run_doctor_process(*prefix: str) -> subprocess.CompletedProcess[str]:
    """Run the doctor in a child, optionally under a privilege-dropping wrapper."""
    return subprocess.run(
        [*prefix, sys.executable, "-c", DOCTOR],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
    )


def status_of(output: str, check: str) -> str:
    """The status word on the doctor's line for `check` (lines are `STATUS  name  detail`)."""
    for line in output.splitlines():
        if line[9:].startswith(check + " "):
            return line.split()[0]
    raise AssertionError(f"no line for {check!r} in doctor output:\n{output}")


def drop_capabilities(caps: str) -> list[str]:
    """A setpriv prefix that removes `caps` (e.g. "-all" or "-sys_admin") from a root child, for good."""
    return ["setpriv", f"--inh-caps={caps}", f"--ambient-caps={caps}", f"--bounding-set={caps}", "--"]


def libcudart_path() -> Path:
    spec = importlib.util.find_spec("nvidia.cuda_runtime")
    assert spec is not None and spec.submodule_search_locations, "nvidia-cuda-runtime-cu12 is not installed"
    path = Path(next(iter(spec.submodule_search_locations)), "lib", "libcudart.so.12").resolve()
    assert path.is_file(), f"{path} missing from the nvidia-cuda-runtime-cu12 wheel"
    return path


@pytest.fixture
def process_with_libcudart() -> Iterator[tuple[int, Path]]:
    """A real process that has dlopen'ed the real libcudart.so.12, killed afterwards."""
    path = libcudart_path()
    child = subprocess.Popen([sys.executable, "-c", HOLD_LIBRARY, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "loaded"
        yield child.pid, path
    finally:
        child.kill()
        child.wait()


@pytest.mark.bpf
def test_doctor_passes_as_root_and_reports_what_this_kernel_has() -> None:
    started = time.monotonic()
    result = run_doctor_process()
    elapsed = time.monotonic() - started
    out = result.stdout

    assert result.returncode == 0, out + result.stderr
    assert "Result: OK, the sensor can run on this host." in out
    for check in (
        "privileges",
        "bpf syscall",
        "ring buffer",
        "tracefs",
        "kernel headers",
        "bcc",
        "bcc compile",
        "uprobes",
        "tracepoints",
    ):
        assert status_of(out, check) == "OK", out
    kprobes_expected = "OK" if Path("/sys/bus/event_source/devices/kprobe").exists() else "MISSING"
    assert status_of(out, "kprobes") == kprobes_expected, out
    assert status_of(out, "fentry") in ("OK", "MISSING"), out
    # this kernel (6.18, as CI's) makes uprobe-multi links: the sensor's uprobes are links
    assert status_of(out, "uprobe links") == "OK", out
    assert "fired for 3 of 3 calls" in out
    assert elapsed < 5, f"doctor took {elapsed:.1f} s"


@pytest.mark.bpf
def test_doctor_without_capabilities_fails_and_says_how_to_fix_it() -> None:
    result = run_doctor_process(*drop_capabilities("-all"))
    out = result.stdout

    assert result.returncode == 1, out + result.stderr
    assert status_of(out, "privileges") == "FAIL"
    assert status_of(out, "bpf syscall") == "FAIL"
    assert "kernel refused to load a tracepoint program (EPERM)" in out
    assert "missing CAP_BPF" in out and "CAP_PERFMON" in out
    assert "Result: the sensor CANNOT run on this host" in out
    assert "fix: run as root (sudo otelbpf doctor) or grant CAP_BPF,CAP_PERFMON,CAP_SYS_ADMIN" in out


@pytest.mark.bpf
def test_doctor_without_cap_sys_admin_finds_perf_uprobes_broken() -> None:
    """CAP_BPF + CAP_PERFMON load programs, but BCC's perf uprobe events (kernels without
    uprobe-multi links; forced here) still need CAP_SYS_ADMIN."""
    result = run_doctor_process("env", "OTELBPF_UPROBE_MULTI=0", *drop_capabilities("-sys_admin"))
    out = result.stdout

    assert result.returncode == 1, out + result.stderr
    assert status_of(out, "bpf syscall") == "OK"
    assert status_of(out, "tracepoints") == "OK"
    assert status_of(out, "uprobes") == "FAIL"
    assert status_of(out, "uprobe links") == "MISSING"
    assert "missing CAP_SYS_ADMIN" in out
    assert "fix: grant CAP_SYS_ADMIN" in out


@pytest.mark.bpf
def test_doctor_without_cap_sys_admin_passes_where_uprobes_are_links() -> None:
    """This kernel (and CI's) makes uprobe-multi links, which CAP_BPF + CAP_PERFMON attach."""
    result = run_doctor_process(*drop_capabilities("-sys_admin"))
    out = result.stdout

    assert result.returncode == 0, out + result.stderr
    assert status_of(out, "privileges") == "OK"
    assert status_of(out, "uprobes") == "OK"
    assert "a uprobe-multi link) fired for 3 of 3 calls" in out
    assert "CAP_SYS_ADMIN" not in out.split("privileges", 1)[1].splitlines()[0].split("effective:")[1]


@pytest.mark.bpf
def test_doctor_lists_a_process_mapping_the_real_libcudart(process_with_libcudart: tuple[int, Path]) -> None:
    pid, path = process_with_libcudart
    result = run_doctor_process()

    assert f"pid {pid} (" in result.stdout, result.stdout
    line = next(line for line in result.stdout.splitlines() if f"pid {pid} (" in line)
    assert line.endswith(f"CUDA runtime {path}"), line


def test_scan_processes_finds_libcudart_in_a_real_process(process_with_libcudart: tuple[int, Path]) -> None:
    pid, path = process_with_libcudart
    scan = scan_processes()

    mine = [lib for lib in scan.libraries if lib.pid == pid]
    assert [(lib.kind, lib.path) for lib in mine] == [("CUDA runtime", str(path))], scan.libraries
    assert mine[0].comm.startswith("python")
    assert scan.scanned > 1


def test_scan_processes_survives_processes_exiting_mid_scan() -> None:
    """Spawn short-lived processes while scanning, so some vanish between listing and reading."""
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            subprocess.run(["true"], check=True)

    spawner = threading.Thread(target=churn)
    spawner.start()
    try:
        scans = [scan_processes() for _ in range(30)]
    finally:
        stop.set()
        spawner.join()
    assert all(scan.scanned > 0 for scan in scans)


def test_program_cache_check_says_whether_starts_can_skip_the_compile(tmp_path: Path) -> None:
    from otelbpf.doctor import check_program_cache

    d = tmp_path / "cache"
    assert check_program_cache(str(d)).status == "OK" and "absent" in check_program_cache(str(d)).detail
    d.mkdir(mode=0o700)
    (d / ("a" * 64 + ".bpfprog.json")).write_text("{}")
    ok = check_program_cache(str(d))
    assert (ok.status, ok.required) == ("OK", False) and "1 compiled program(s)" in ok.detail
    d.chmod(0o777)
    shared = check_program_cache(str(d))
    assert shared.status == "FAIL" and "mode 777" in shared.detail and shared.fix.endswith(f"chmod 700 {d}")
    link = tmp_path / "link"
    link.symlink_to(d)
    assert "symbolic link" in check_program_cache(str(link)).detail
