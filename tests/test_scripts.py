"""The set-up and the two commands the README gives (scripts/): they parse, and the set-up's
options are what the README says. Running them installs packages: CI does (.ci/run)."""

from __future__ import annotations

import subprocess

import pytest

from harness.agent import REPO

SCRIPTS = ["scripts/setup.sh", "scripts/demo.sh", "scripts/test.sh", "examples/demo_job.sh"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_scripts_parse(script: str) -> None:
    subprocess.run(["bash", "-n", str(REPO / script)], check=True)


def test_setup_has_a_demo_size_and_a_test_size() -> None:
    usage = subprocess.run(["bash", str(REPO / "scripts/setup.sh"), "--help"], capture_output=True, text=True)
    assert usage.returncode == 0 and "--test" in usage.stdout and "--bench" in usage.stdout and "wrk" in usage.stdout
    bad = subprocess.run(["bash", str(REPO / "scripts/setup.sh"), "--tests"], capture_output=True, text=True)
    assert bad.returncode == 1 and "unknown option --tests" in bad.stderr
    test_sh = (REPO / "scripts/test.sh").read_text()
    assert "scripts/setup.sh --test" in test_sh  # CI (.ci/run -> scripts/test.sh) installs everything
    demo_sh = (REPO / "scripts/demo.sh").read_text()
    assert "bash scripts/setup.sh\n" in demo_sh and "--test" not in demo_sh
