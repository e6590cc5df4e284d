"""otelbpf.config.messages: every problem at once, each at its option path and file position,
with the value, the allowed values or keys, and a "did you mean"."""

from __future__ import annotations

import pytest

from harness.config_text import MINIMAL, errors_of, load, one_error, with_cuda
from otelbpf.config import (
    ConfigError,
)


def test_wrong_type_names_the_dotted_path_and_the_value():
    error = one_error(MINIMAL.replace("  cuda:\n", "  cuda:\n    launch_sample_every: ten\n"))

    assert error == "test.yaml:3:5: receivers.cuda.launch_sample_every: Input should be a valid integer, got 'ten'"


def test_typo_in_a_key_names_its_path_and_suggests_the_option():
    error = one_error(MINIMAL.replace("  cuda:\n", "  cuda:\n    lanuch_errors: true\n"))

    assert error.startswith(
        "test.yaml:3:5: receivers.cuda.lanuch_errors: unknown option (did you mean 'launch_errors'?)"
    )
    assert "allowed: libraries, search_paths, launch_sample_every, launch_errors," in error


def test_typo_in_a_top_level_section():
    errors = errors_of(MINIMAL.replace("\nexporters:", "\nexporter:"))

    assert errors[0] == (
        "test.yaml:3:1: exporter: unknown option (did you mean 'exporters'?); "
        "allowed: receivers, processors, exporters, targets, service"
    )
    assert "exporter 'file' is not defined under exporters; defined exporters: none" in errors[1]


def test_bad_enum_value_lists_the_allowed_values():
    text = MINIMAL + "  telemetry: {log_level: verbose}\n"

    assert one_error(text).endswith(
        "service.telemetry.log_level: Input should be 'debug', 'info', 'warning' or 'error', got 'verbose'"
    )


def test_bad_library_name_lists_the_allowed_libraries():
    error = one_error(with_cuda("libraries: [cudart, nvml]"))

    assert "receivers.cuda.libraries[1]: Input should be 'cudart' or 'cuda', got 'nvml'" in error


def test_every_error_is_listed_at_once():
    text = """\
        receivers:
          cuda: {launch_sample_every: -1, top_kernels: many}
        exporters:
          file: {rotate_size: huge}
        service:
          pipelines:
            traces: {receivers: [cuda], exporters: [file, otlp]}
          telemetry: {drain_interval: 0}
        """
    with pytest.raises(ConfigError) as caught:
        load(text)

    paths = [e.split(": ")[1] for e in caught.value.errors]
    assert paths == [
        "receivers.cuda.launch_sample_every",
        "receivers.cuda.top_kernels",
        "exporters.file.rotate_size",
        "service.telemetry.drain_interval",
        "service.pipelines.traces.exporters[1]",
    ]
    assert str(caught.value).startswith("invalid otelbpf configuration (test.yaml, 5 errors):\n  test.yaml:2:")
