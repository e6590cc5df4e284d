"""The command line as a user meets it: exit codes and messages, in a child process."""

from __future__ import annotations

import subprocess
import sys

import pytest


def otelbpf(*args: str, timeout: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run(
        [sys.executable, "-m", "otelbpf.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


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
    bad.write_text(
        "receivers:\n  cuda:\n    launch_error: true\nservice:\n  pipelines:\n"
        "    metrics: {receivers: [cuda], exporters: [file]}\nexporters:\n  file: {}\n"
    )
    out = otelbpf("validate", "-c", str(bad))
    assert out.returncode == 2 and "did you mean 'launch_errors'" in out.stderr


def test_validate_prints_pipelines():
    out = otelbpf("validate", "-c", "otelbpf/config/otelbpf.yaml")
    assert out.returncode == 0, out.stderr
    assert "traces: receivers=['cuda', 'http', 'tls', 'nccl', 'ibverbs']" in out.stdout


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


def test_receivers_chosen_on_the_command_line_or_in_the_environment():
    import yaml

    out = otelbpf("run", "--receivers", "cuda,http", "--print-config")
    assert out.returncode == 0, out.stderr
    pipes = yaml.safe_load(out.stdout)["service"]["pipelines"]
    assert pipes["traces"]["receivers"] == pipes["metrics"]["receivers"] == ["cuda", "http"]
    assert "profiles" not in pipes
    out = otelbpf("validate", env={"OTELBPF_RECEIVERS": "cuda,nccl,profiling"})
    assert out.returncode == 0, out.stderr
    assert "traces: receivers=['cuda', 'nccl']" in out.stdout and "profiles: receivers=['profiling']" in out.stdout
    bad = otelbpf("run", "--receivers", "cuda,tpu", "--print-config")
    assert bad.returncode == 2 and "'tpu': name some of cuda, http, nccl, ibverbs, profiling" in bad.stderr


def test_print_config_shows_the_effective_config_without_secrets(tmp_path):
    import yaml

    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317",
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer s3cr3t-t0ken",
    }
    out = otelbpf("run", "--print-config", env=env)
    assert out.returncode == 0, out.stderr
    assert "s3cr3t" not in out.stdout
    doc = yaml.safe_load(out.stdout)
    [otlp] = [e for e in doc["exporters"].values() if e.get("endpoint") == "http://collector:4317"]
    assert otlp["headers"] == {"authorization": "REDACTED"}


_THREADS = (
    "import os, sys\n"
    "from otelbpf.cli import _import_numpy_single_threaded\n"
    "if sys.argv[1] == 'agent': _import_numpy_single_threaded()\n"
    "else: import numpy\n"
    "print(len(os.listdir('/proc/self/task')), os.environ.get('OPENBLAS_NUM_THREADS'))\n"
)


def test_the_agent_imports_numpy_without_openblas_threads_and_leaves_the_environment_as_it_was():
    """OpenBLAS starts a thread per core at numpy's import, which the agent never uses; the
    request for one thread must not stay in the environment a watched command inherits."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}

    def threads(mode: str) -> tuple[int, str]:
        out = subprocess.run(
            [sys.executable, "-c", _THREADS, mode], capture_output=True, text=True, env=env, check=True
        )
        count, var = out.stdout.split()
        return int(count), var

    assert threads("agent") == (1, "None")
    if (os.cpu_count() or 1) > 1:  # the comparison that shows the test can fail: plain numpy starts more
        assert threads("plain")[0] > 1


def test_version():
    from otelbpf import __version__

    out = otelbpf("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"otelbpf {__version__}"


def test_print_config_spells_durations_and_sizes_as_written_and_loads_back(tmp_path):
    import yaml

    from otelbpf.families.registry import load_config

    out = otelbpf("run", "--print-config")
    assert out.returncode == 0, out.stderr
    doc = yaml.safe_load(out.stdout)
    telemetry = doc["service"]["telemetry"]
    assert telemetry["metrics_interval"] == "10s" and telemetry["drain_interval"] == "50ms"
    assert doc["receivers"]["http"]["ring_buffer_size"] == "16MiB"
    assert doc["receivers"]["cuda"]["ring_buffer_size"] == "auto"
    printed = tmp_path / "printed.yaml"
    printed.write_text(out.stdout)
    assert load_config(printed) == load_config(None)


@pytest.mark.parametrize("command", ["summary", "diagnose", "report", "mcp"])
def test_the_readers_describe_their_directory(command):
    out = otelbpf(command, "--help")
    assert out.returncode == 0 and "output folder" in out.stdout


def test_diagnose_documents_its_exit_status():
    assert "1 findings printed" in " ".join(otelbpf("diagnose", "--help").stdout.split())


@pytest.mark.parametrize("config", ["otelbpf-gateway.yaml", "otelbpf-k8s.yaml", "otlpjsonfile-replay.yaml"])
def test_validate_on_a_collector_config_says_so_in_one_error(config):
    out = otelbpf("validate", "-c", f"examples/collector/{config}")
    assert out.returncode == 2
    assert "1 error" in out.stderr and "is an OpenTelemetry Collector configuration, not otelbpf's" in out.stderr


@pytest.mark.parametrize(
    ("command", "status", "says"),
    [
        ("/nonexistent/cmd", 127, "/nonexistent/cmd: no such file"),
        ("otelbpf-no-such-command", 127, "otelbpf-no-such-command: command not found on PATH"),
        ("/", 126, "/: is a directory"),
        ("README.md", 127, "command not found on PATH"),
        ("./README.md", 126, "./README.md: not executable"),
    ],
)
def test_run_checks_its_command_before_compiling(command, status, says):
    """The shell's statuses, at once: before, `run -- /nonexistent/cmd` compiled for 22 s first."""
    import time

    start = time.monotonic()
    out = otelbpf("run", "--", command, "arg")
    assert (out.returncode, out.stdout) == (status, "") and says in out.stderr
    assert time.monotonic() - start < 10 and "compiled" not in out.stderr
