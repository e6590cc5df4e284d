"""A node without headers for its kernel (COS, Bottlerocket, Flatcar): BCC compiles against the
newest installed ones (sensor/kernel_headers.py), since the probes read no kernel struct."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.agent import REPO
from otelbpf.sensor import kernel_headers


def headers(usr_src: Path, name: str, split: bool = True) -> Path:
    build = usr_src / name
    (build / "include" / "generated").mkdir(parents=True)
    if split:
        (usr_src / f"{name.rsplit('-', 1)[0]}-common" / "include" / "linux").mkdir(parents=True, exist_ok=True)
    return build


def test_the_newest_installed_headers_are_chosen(tmp_path: Path) -> None:
    usr_src = tmp_path / "src"
    headers(usr_src, "linux-headers-6.1.0-9-amd64")
    newest = headers(usr_src, "linux-headers-6.1.0-57-amd64")
    assert kernel_headers.installed(str(usr_src)) == (str(newest), str(usr_src / "linux-headers-6.1.0-57-common"))
    lone = headers(tmp_path / "rpm", "linux-headers-6.8.0", split=False)
    assert kernel_headers.installed(str(tmp_path / "none"), str(tmp_path / "rpm")) == (str(lone), str(lone))
    assert kernel_headers.installed(str(tmp_path / "none")) is None


def test_bcc_is_pointed_at_them_only_when_the_kernels_own_are_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # fallback sets the variable in os.environ: a copy of it, put back after the test
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if k != "BCC_KERNEL_SOURCE"})
    usr_src, modules = tmp_path / "src", tmp_path / "modules"
    build = headers(usr_src, "linux-headers-6.1.0-57-amd64")
    (modules / "6.18.0" / "build" / "include").mkdir(parents=True)
    args = {"modules": str(modules), "roots": (str(usr_src),), "kheaders": str(tmp_path / "no-kheaders")}
    assert kernel_headers.fallback("6.18.0", **args) is None  # the running kernel's are there
    note = kernel_headers.fallback("6.19.0", **args)
    assert note is not None and f"compiling against {build}" in note
    merged = Path(os.environ["BCC_KERNEL_SOURCE"])  # one tree: the generated headers and the rest
    assert (merged / "include" / "generated").resolve() == build / "include" / "generated"
    assert (merged / "include" / "linux").resolve() == usr_src / "linux-headers-6.1.0-57-common" / "include" / "linux"
    assert kernel_headers.fallback("6.19.0", **args) is None  # set already: kept


@pytest.mark.bpf
def test_the_agent_starts_with_the_kernels_headers_folder_absent(tmp_path: Path) -> None:
    """/lib/modules/$(uname -r) hidden under an empty folder, in a mount namespace of the agent's
    own; the program cache off, so BCC really compiles."""
    if kernel_headers.installed() is None or shutil.which("unshare") is None:
        if os.environ.get("CI") == "true":  # CI's set-up installs both: the test must run there
            pytest.fail("no kernel headers under /usr/src or no unshare(1): scripts/setup.sh installs them")
        pytest.skip("needs headers under /usr/src (scripts/setup.sh) and unshare(1)")
    out = subprocess.run(
        [sys.executable, "-m", "otelbpf.cli", "run", "--receivers", "cuda", "--print-config"],
        capture_output=True,
        text=True,
        check=True,
    )
    doc = yaml.safe_load(out.stdout)
    doc["service"]["program_cache"]["directory"] = ""
    doc["exporters"]["file"]["directory"] = str(tmp_path / "out")
    cfg = tmp_path / "otelbpf.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    empty = tmp_path / "empty"
    empty.mkdir()
    release = os.uname().release
    agent = f"{sys.executable} -m otelbpf.cli run -c {cfg} --duration 2"
    script = f"mount --bind {empty} /lib/modules/{release} && exec {agent}"
    env = {k: v for k, v in os.environ.items() if k != "BCC_KERNEL_SOURCE"}
    if not os.path.isdir(f"/lib/modules/{release}"):
        script = agent  # nothing to hide: the folder is absent already
    run = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"no kernel headers for {release}" in run.stderr and "otelbpf running: compiled in" in run.stderr
