"""otelbpf.config.units: durations and sizes as written, stored as int ns and bytes."""

from __future__ import annotations

import pytest

from harness.config_text import load, with_cuda
from otelbpf.config import (
    format_duration,
    format_size,
    parse_duration,
    parse_size,
    to_seconds,
)


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("250ms", 250_000_000),
        ("1s", 1_000_000_000),
        ("10us", 10_000),
        ("10µs", 10_000),
        ("2m", 120_000_000_000),
        ("1m30s", 90_000_000_000),
        ("1.5s", 1_500_000_000),
        ("1h", 3_600_000_000_000),
        ("7ns", 7),
        ("0us", 0),
        (2, 2_000_000_000),
        (0.05, 50_000_000),
        ("3", 3_000_000_000),
    ],
)
def test_durations(text: str | float, ns: int):
    assert parse_duration(text) == ns


@pytest.mark.parametrize("text", ["10 seconds", "1d", "ms", "", "-1s", -1, True, "1s2"])
def test_bad_durations(text: object):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_duration_helpers():
    assert format_duration(50_000_000) == "50ms"
    assert format_duration(90_000_000_000) == "90s"
    assert format_duration(0) == "0ns"
    assert all(parse_duration(format_duration(ns)) == ns for ns in (1, 1_500, 10**9, 3_600 * 10**9))
    assert to_seconds(parse_duration("250ms")) == 0.25


def test_durations_in_the_file_become_nanoseconds():
    config = load(with_cuda("min_span_duration: 10us") + "  telemetry: {drain_interval: 0.1, metrics_interval: 1m}\n")

    assert config.receivers["cuda"].min_span_duration == 10_000
    assert config.service.telemetry.drain_interval == 100_000_000
    assert config.service.telemetry.metrics_interval == 60_000_000_000


def test_sizes():
    assert parse_size("64KiB") == 65536
    assert parse_size("4mib") == 4 << 20
    assert parse_size("1GiB") == 1 << 30
    assert parse_size(4096) == 4096
    assert parse_size("512B") == 512
    assert format_size(4 << 20) == "4MiB"
    for bad in ("4MB", "1.5MiB", "lots", -1):
        with pytest.raises(ValueError, match="size"):
            parse_size(bad)
