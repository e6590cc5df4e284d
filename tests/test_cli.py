"""The command line as a user meets it: exit codes and messages, in a child process."""

from __future__ import annotations

import subprocess
import sys

import pytest


def otelbpf(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "otelbpf.cli", *args], capture_output=True, text=True, timeout=timeout)


def test_invalid_config_exits_2_naming_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "receivers:\n  cuda:\n    launch_sample_every: ten\n"
        "exporters:\n  otlp:\n    endpoint: localhost:4317\n    compression: zstd\n"
        "service:\n  pipelines:\n    traces: {receivers: [cuda], exporters: [otlp]}\n"
    )
    out = otelbpf("run", "-c", str(bad))
    assert out.returncode == 2
    assert "receivers.cuda.launch_sample_every" in out.stderr
    assert "exporters.otlp.compression" in out.stderr and "'gzip' or 'none'" in out.stderr
    assert "Traceback" not in out.stderr


def test_config_typo_suggests_the_option(tmp_path):
    bad = tmp_path / "typo.yaml"
    bad.write_text("receivers:\n  cuda:\n    launch_error: true\nservice:\n  pipelines:\n"
                   "    metrics: {receivers: [cuda], exporters: [file]}\nexporters:\n  file: {}\n")
    out = otelbpf("validate", "-c", str(bad))
    assert out.returncode == 2 and "did you mean 'launch_errors'" in out.stderr


def test_validate_prints_pipelines():
    out = otelbpf("validate", "-c", "config/otelbpf.yaml")
    assert out.returncode == 0, out.stderr
    assert "traces: receivers=['cuda', 'http', 'nccl', 'ibverbs']" in out.stdout


@pytest.mark.bpf
def test_unknown_pid_is_a_clear_error():
    out = otelbpf("run", "--pid", "999999999")
    assert out.returncode == 1 and "no process with pid 999999999" in out.stderr


def test_pid_and_command_together_is_a_usage_error():
    out = otelbpf("run", "--pid", "1", "--", "true")
    assert out.returncode == 2 and "either --pid or -- COMMAND" in out.stderr


def test_summary_of_a_missing_directory(tmp_path):
    out = otelbpf("summary", str(tmp_path / "nope"))
    assert out.returncode == 2 and "does not exist" in out.stdout
