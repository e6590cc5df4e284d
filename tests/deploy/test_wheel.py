"""Installed like a Python tool: a wheel built from the package alone (what the Dockerfile's
first stage copies), installed into a fresh venv of the distribution's Python that sees
Debian's BCC (python3-bpfcc), works outside the repository: its console script validates a
config, its BPF C sources come from the package, and the agent it installs really compiles,
attaches and counts a workload's launches.

The fresh venv gets the wheel with `pip install --no-deps`; its dependencies come from this
test environment's site-packages through a .pth file, so the test needs no network."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from harness.agent import FAKE_CUDART, REPO, WORKLOAD

DEBIAN_PYTHON = Path("/usr/bin/python3")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built from a copy holding only pyproject.toml, setup.py, README.md, otelbpf/ and bpf/ (no repo around),
    with this environment's setuptools (no build isolation: no network needed)."""
    setuptools = tuple(int(x) for x in metadata.version("setuptools").split(".")[:2])
    assert setuptools >= (68, 0), f"pyproject.toml's build backend needs setuptools>=68, not {setuptools}"
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, src / name)
    for tree in ("otelbpf", "bpf"):
        shutil.copytree(REPO / tree, src / tree, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("dist")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (whl,) = out.glob("otelbpf-*.whl")
    return whl


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A venv of Debian's python3 with system site-packages (for bcc) and the wheel installed."""
    if not DEBIAN_PYTHON.exists():
        pytest.fail("no /usr/bin/python3: scripts/setup.sh installs Debian's python3 and python3-bpfcc")
    probe = subprocess.run([str(DEBIAN_PYTHON), "-c", "import bcc, venv"], capture_output=True, text=True)
    assert probe.returncode == 0, f"Debian's python3 lacks bcc (apt-get install python3-bpfcc): {probe.stderr}"
    path = tmp_path_factory.mktemp("venv") / "otelbpf"
    subprocess.run([str(DEBIAN_PYTHON), "-m", "venv", "--system-site-packages", "--without-pip", str(path)], check=True)
    site = Path(
        subprocess.check_output(
            [str(path / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    (site / "test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(path / "bin" / "python"),
            "install",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    return path


def in_venv(venv: Path, *argv: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env={**env, "PATH": f"{venv / 'bin'}:{env.get('PATH', '')}"},
    )


def test_wheel_carries_every_module_and_bpf_source(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    package = REPO / "otelbpf"
    wanted = [str(p.relative_to(REPO)) for p in package.rglob("*.py") if "__pycache__" not in p.parts]
    wanted.append("otelbpf/config/otelbpf.yaml")  # the built-in default config, read as package data
    wanted += [
        f"otelbpf/analyze/report_assets/{p.name}"  # the report's vendored scripts and their licenses
        for p in (package / "analyze" / "report_assets").iterdir()
    ]
    sources = [f"otelbpf/bpf/{p.name}" for p in (REPO / "bpf").iterdir() if p.suffix in (".c", ".h")]
    assert any(s.endswith(".c") for s in sources) and any(s.endswith(".h") for s in sources)
    missing = [name for name in wanted + sources if name not in names]
    assert not missing, f"not in {wheel.name}: {missing}"
    metadata = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "otelbpf = otelbpf.cli:entry" in zipfile.ZipFile(wheel).read(metadata).decode()


def test_installed_tool_works_outside_the_repository(venv, tmp_path):
    where = in_venv(
        venv, "python", "-c", "import bcc, otelbpf; print(otelbpf.__file__); print(bcc.__file__)", cwd=tmp_path
    )
    assert where.returncode == 0, where.stderr
    module, bcc = where.stdout.split()
    assert Path(module).is_relative_to(venv), f"otelbpf imported from {module}, not the installed wheel"
    assert bcc.startswith("/usr/lib/python3/dist-packages/"), "BCC is Debian's"
    sources = in_venv(
        venv,
        "python",
        "-c",
        "from importlib import resources; d = resources.files('otelbpf') / 'bpf'; "
        "print(sorted(p.name for p in d.iterdir() if p.name.endswith(('.c', '.h'))))",
        cwd=tmp_path,
    )
    shipped = sorted(p.name for p in (REPO / "bpf").iterdir() if p.suffix in (".c", ".h"))
    assert sources.stdout.strip() == repr(shipped)
    builtin = in_venv(venv, "otelbpf", "validate", cwd=tmp_path)  # the default config, from the package
    assert builtin.returncode == 0 and "traces: receivers=" in builtin.stdout, builtin.stdout + builtin.stderr
    config = tmp_path / "otelbpf.yaml"
    shutil.copy(REPO / "otelbpf" / "config" / "otelbpf.yaml", config)
    valid = in_venv(venv, "otelbpf", "validate", "-c", str(config), cwd=tmp_path)
    assert valid.returncode == 0 and "traces: receivers=" in valid.stdout, valid.stdout + valid.stderr
    config.write_text(config.read_text().replace("launch_sample_every: 0", "launch_sample_every: -1"))
    invalid = in_venv(venv, "otelbpf", "validate", "-c", str(config), cwd=tmp_path)
    assert invalid.returncode == 2 and "launch_sample_every" in invalid.stderr


@pytest.mark.bpf
def test_installed_agent_compiles_its_packaged_probes_and_counts_launches(venv, tmp_path):
    subprocess.run([str(REPO / "examples" / "build.sh")], check=True, capture_output=True, text=True)
    config = tmp_path / "otelbpf.yaml"
    config.write_text(
        "receivers: {cuda: {search_paths: []}}\n"
        "exporters: {file: {directory: ./out}}\n"
        "service:\n  pipelines:\n    metrics: {receivers: [cuda], exporters: [file]}\n"
        "  telemetry: {metrics_interval: 300ms, drain_interval: 20ms}\n"
    )
    run = in_venv(
        venv,
        "otelbpf",
        "run",
        "-c",
        str(config),
        "--",
        str(WORKLOAD),
        "--lib",
        str(FAKE_CUDART),
        "--iterations",
        "2",
        "--launches-per-iter",
        "3",
        cwd=tmp_path,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    summary = json.loads(next(line for line in run.stdout.splitlines() if line.startswith('{"workload"')))
    launches = [
        p
        for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
        for rm in json.loads(line)["resourceMetrics"]
        for sm in rm["scopeMetrics"]
        for m in sm["metrics"]
        if m["name"] == "cuda.kernel.launches"
        for p in m["sum"]["dataPoints"]
    ]
    assert launches, run.stderr
    assert int(launches[-1]["asInt"]) == sum(k["launches"] for k in summary["kernels"]) == 6
