"""A config file cannot exhaust the host, and `validate` refuses what `run` would fail on
(issue 13, rows 5 and 6): size, depth and alias limits before the document is built; every
value checked against what the kernel, the timers and the transports accept."""

from __future__ import annotations

import resource
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.config_text import MINIMAL, one_error
from otelbpf.families.registry import load_config_text

# Ten levels of nine aliases each: 9^10 (3.5 billion) strings once expanded.
ALIAS_BOMB = 'a: &a ["x","x","x","x","x","x","x","x","x"]\n' + "".join(
    f"{c}: &{c} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]\n" for p, c in zip("abcdefghi", "bcdefghij")
)


def _limited(mib: int):
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (mib << 20, mib << 20))

    return limit


def validate(path: Path) -> subprocess.CompletedProcess:
    """`otelbpf validate -c path` with 1 GiB of address space and 30 s: a config that takes
    more is the bug."""
    return subprocess.run(
        [sys.executable, "-m", "otelbpf.cli", "validate", "-c", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        preexec_fn=_limited(1024),
    )


# --- row 5: limits before parsing ---------------------------------------------------------------


def test_alias_bomb_under_an_unknown_key_fails_fast_with_exit_2(tmp_path: Path):
    path = tmp_path / "bomb.yaml"
    path.write_text(MINIMAL + "unknown:\n" + textwrap.indent(ALIAS_BOMB, "  "))

    t0 = time.monotonic()
    out = validate(path)

    assert out.returncode == 2, out.stderr[-2000:]
    assert time.monotonic() - t0 < 10
    assert f"{path}:" in out.stderr and "YAML aliases (*name) are expanded: an alias bomb" in out.stderr


def test_small_aliases_still_work():
    with_merge = MINIMAL.replace("receivers:\n  cuda:\n", "receivers:\n  cuda: {<<: &base {top_kernels: 7}}\n")
    assert load_config_text(with_merge, source="t").receivers["cuda"].top_kernels == 7


def test_deep_nesting_is_an_error_not_a_traceback(tmp_path: Path):
    path = tmp_path / "deep.yaml"
    path.write_text(MINIMAL + "receivers2: " + "[" * 10_000 + "]" * 10_000 + "\n")

    out = validate(path)

    assert out.returncode == 2, out.stderr[-2000:]
    assert "nested more than 32 levels deep" in out.stderr and "Traceback" not in out.stderr


def test_a_huge_file_is_refused_without_reading_it(tmp_path: Path):
    path = tmp_path / "big.yaml"
    with path.open("w") as f:
        f.write(MINIMAL)
        for _ in range(60):
            f.write("#" * (1 << 20) + "\n")

    out = validate(path)

    assert out.returncode == 2, out.stderr[-2000:]
    assert "larger than 1MiB: not a config file" in out.stderr


def test_dev_zero_as_config_is_refused(tmp_path: Path):
    out = validate(Path("/dev/zero"))

    assert out.returncode == 2 and "larger than 1MiB" in out.stderr


# --- row 6: values checked against what run accepts -----------------------------------------------


def test_ring_buffer_larger_than_the_kernel_takes_names_the_field():
    error = one_error(MINIMAL.replace("  cuda:\n", "  cuda: {ring_buffer_size: 64GiB}\n"))

    assert error.startswith("test.yaml:2:10: receivers.cuda.ring_buffer_size:")
    assert "to 1GiB, got 64GiB" in error


@pytest.mark.parametrize("value", ["100000000000h", "1.0e+400", ".inf", "25h"])
def test_intervals_are_bounded(value: str):
    text = MINIMAL + f"  telemetry: {{metrics_interval: {value}}}\n"

    error = one_error(text)

    assert "service.telemetry.metrics_interval:" in error and "at most 24h" in error


def test_longest_interval_is_accepted():
    config = load_config_text(MINIMAL + "  telemetry: {metrics_interval: 24h}\n", source="t")
    assert config.service.telemetry.metrics_interval == 24 * 3600 * 10**9


@pytest.mark.parametrize("value", ['"a\\r\\nX-Injected: 1"', '"a\\0b"', '"caf\\xe9"', '"a\\tb"'])
def test_header_values_that_no_transport_sends_are_refused(value: str):
    text = MINIMAL.replace("  file:\n", f"  file:\n  otlp: {{endpoint: 'c:4317', headers: {{x-token: {value}}}}}\n")

    error = one_error(text)

    assert "exporters.otlp.headers.x-token:" in error and "printable ASCII only" in error


def test_header_from_the_environment_names_the_variable():
    text = MINIMAL.replace("  file:\n", "  file:\n  otlphttp: {endpoint: 'http://c:4318'}\n")

    error = one_error(
        text.replace("exporters: [file]", "exporters: [otlphttp]"), OTEL_EXPORTER_OTLP_HEADERS="api-key=a%0D%0Ab"
    )

    assert error.startswith("exporters.otlphttp.headers.api-key: '\\r' is not allowed")
    assert error.endswith("(value from OTEL_EXPORTER_OTLP_HEADERS)")


def test_header_names_are_tokens_and_stored_lowercase():
    text = MINIMAL.replace("  file:\n", "  file:\n  otlp: {endpoint: 'c:4317', headers: {X-Api-Key: s3cret}}\n")
    assert load_config_text(text, source="t").exporters["otlp"].headers == {"x-api-key": "s3cret"}

    bad = text.replace("X-Api-Key", '"bad name"')
    assert "is not a header name" in one_error(bad)
    twice = text.replace("{X-Api-Key: s3cret}", "{X-Api-Key: a, x-api-key: b}")
    assert "written twice" in one_error(twice)


def test_pyroscope_credentials_are_header_safe():
    text = MINIMAL.replace(
        "  file:\n", "  file:\n  pyroscope: {endpoint: 'http://p:4040', bearer_token: \"t\\nX: y\"}\n"
    )
    assert "exporters.pyroscope.bearer_token:" in one_error(text)


@pytest.mark.parametrize(
    "option, value",
    [
        ("max_spans_per_second", 10**30),
        ("launch_sample_every", 10**30),
    ],
)
def test_unbounded_integers_are_bounded(option: str, value: int):
    error = one_error(MINIMAL.replace("  cuda:\n", f"  cuda: {{{option}: {value}}}\n"))
    assert f"receivers.cuda.{option}:" in error and "less than or equal" in error


def test_pid_beyond_pid_max_is_refused():
    error = one_error(MINIMAL + "targets: {pids: [100000000000000000000]}\n")
    assert "targets.pids[0]:" in error


def test_file_exporter_modes():
    config = load_config_text(
        MINIMAL.replace("  file:\n", "  file: {file_mode: '0640', dir_mode: '0750'}\n"), source="t"
    )
    assert (config.exporters["file"].file_mode, config.exporters["file"].dir_mode) == (0o640, 0o750)
    assert "the owner (the agent) needs" in one_error(MINIMAL.replace("  file:\n", "  file: {file_mode: '0400'}\n"))
    assert "invalid mode" in one_error(MINIMAL.replace("  file:\n", "  file: {file_mode: 'rw'}\n"))
    assert "NUL" in one_error(MINIMAL.replace("  file:\n", '  file: {directory: "out\\0x"}\n'))


# --- values PyYAML cannot build: marked errors, never a traceback ----------------------------------


def validate_and_run(path: Path) -> str:
    """`otelbpf validate -c path` and `otelbpf run -c path`: both exit 2 with the same message,
    which is returned."""
    outs = [
        subprocess.run(
            [sys.executable, "-m", "otelbpf.cli", command, "-c", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=_limited(1024),
        )
        for command in ("validate", "run")
    ]
    for out in outs:
        assert out.returncode == 2, out.stderr[-2000:]
        assert "Traceback" not in out.stderr
    assert outs[0].stderr == outs[1].stderr
    return outs[0].stderr


@pytest.mark.parametrize(
    "value, where, what",
    [
        ("1" * 5000, "2:23", "cannot build this int value (ValueError: Exceeds the limit (4300 digits)"),
        ("2001-02-30", "2:23", "cannot build this timestamp value (ValueError: day is out of range for month)"),
        ("!!int abc", "2:23", "cannot build this int value"),
        ("!!bool maybe", "2:23", "cannot build this bool value"),
        ("!!timestamp never", "2:23", "cannot build this timestamp value"),
        ("!!map [1]", "2:23", "cannot build this map value"),
        ("!!python/object:os.system {}", "2:23", "could not determine a constructor for the tag"),
        ("!unknown x", "2:23", "could not determine a constructor for the tag '!unknown'"),
    ],
)
def test_values_pyyaml_cannot_build_are_marked_errors(value: str, where: str, what: str):
    error = one_error(MINIMAL.replace("  cuda:\n", f"  cuda: {{top_kernels: {value}}}\n"))

    assert error.startswith(f"test.yaml:{where}: invalid YAML: ") and what in error


@pytest.mark.parametrize(
    "text, where",
    [
        (MINIMAL + "x: &a [*a]\n", "8:4"),
        (MINIMAL + "x: &a {b: {c: *a}}\n", "8:4"),
        ("receivers: &r\n  cuda: *r\n" + MINIMAL.split("\n", 2)[2], "1:12"),
    ],
)
def test_a_recursive_alias_is_a_marked_error(text: str, where: str):
    """PyYAML builds a cycle; walking it (substitution, validation) was a RecursionError."""
    assert one_error(text) == (
        f"test.yaml:{where}: invalid YAML: a recursive alias (*name inside the &name it refers to) builds no value"
    )


def test_validate_and_run_refuse_an_unbuildable_value_alike(tmp_path: Path):
    path = tmp_path / "c.yaml"
    path.write_text(MINIMAL.replace("  cuda:\n", "  cuda: {top_kernels: " + "9" * 5000 + "}\n") + "x: &a [*a]\n")

    assert f"{path}:2:23: invalid YAML: cannot build this int value" in validate_and_run(path)


def test_substitution_repeated_through_aliases_is_bounded(tmp_path: Path):
    """A 680 KB file: one 600 KB ``${X:-...}`` string aliased 20,000 times made 12 GB (minutes of
    CPU) before substitution was bounded; now exit 2 at once, in validate and run alike."""
    path = tmp_path / "c.yaml"
    path.write_text(MINIMAL + 'a: &a "${X:-' + "y" * 600_000 + '}"\nb: [' + ", ".join(["*a"] * 20_000) + "]\n")

    stderr = validate_and_run(path)

    assert f"{path}:8:4: b[" in stderr
    assert "${...} substitution reads and writes more than 4MiB in all" in stderr
