"""When tests marked ``bpf`` may skip and when they must fail instead."""

from __future__ import annotations

import pytest

from harness.bpf_gate import bpf_required


@pytest.mark.parametrize(
    ("environment", "required"),
    [
        ({}, False),
        ({"CI": "false"}, False),
        ({"OTELBPF_REQUIRE_BPF": "0"}, False),
        ({"CI": "true"}, True),
        ({"CI": "TRUE"}, True),
        ({"OTELBPF_REQUIRE_BPF": "1"}, True),
    ],
)
def test_bpf_required_follows_ci_and_opt_in(
    monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], required: bool
) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("OTELBPF_REQUIRE_BPF", raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert bpf_required() is required
