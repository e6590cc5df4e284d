"""The status line `otelbpf run` prints on a terminal (live/status.py) and the loss causes it
names (base/losses.py)."""

from __future__ import annotations

import io
import re

import pytest

from otelbpf.base.events import Stat
from otelbpf.base.losses import LOSS_CAUSES, explain
from otelbpf.families.registry import load_config
from otelbpf.live import status


def sample(events: int, at: float, **lost: int) -> status.Sample:
    return status.Sample(processes=3, libraries=2, probes=48, events=events, lost=lost, at=at)


def test_the_line_gives_processes_libraries_rate_and_losses_by_reason():
    first = sample(100, at=10.0)
    assert status.format_line(None, first) == (
        "otelbpf: 3 processes seen, 2 libraries (48 probes), 100 events so far, lost 0"
    )
    later = sample(12_100, at=15.0, string_ring_full=62, ring_buffer_full=3)
    assert status.format_line(first, later) == (
        "otelbpf: 3 processes seen, 2 libraries (48 probes), 2,400 events/s, "
        "lost 65 (string_ring_full 62, ring_buffer_full 3)"
    )


def test_each_kind_of_loss_is_explained_once_with_its_fix(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(status.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    line = status.StatusLine(out, every_s=5, first_s=2)
    samples = iter([sample(0, 102.0), sample(50, 107.0, string_ring_full=4), sample(90, 112.0, string_ring_full=9)])
    for now in (101.0, 102.0, 103.0, 107.0, 112.0):
        clock[0] = now
        line.tick(lambda: next(samples))
    lines = out.getvalue().splitlines()
    assert [x.split(",")[0] for x in lines if "processes seen" in x] == ["otelbpf: 3 processes seen"] * 3
    explained = [x for x in lines if x.startswith("otelbpf: lost ")]
    assert explained == [f"otelbpf: lost 4 records: {explain('string_ring_full')}"]
    assert "fix: raise service.telemetry.string_ring_size" in explained[0]


@pytest.mark.parametrize(
    ("setting", "tty", "shown"),
    [("", True, True), ("", False, False), ("on", False, True), ("off", True, False)],
)
def test_shown_on_a_terminal_unless_told(setting, tty, shown):
    class Stream(io.StringIO):
        def isatty(self) -> bool:
            return tty

    assert status.wanted(Stream(), {"OTELBPF_STATUS": setting}) is shown
    # under run -- COMMAND the command's output has the terminal: only when asked
    assert status.wanted(Stream(), {"OTELBPF_STATUS": setting}, command=True) is (setting == "on")


def test_every_kernel_loss_has_a_cause():
    from otelbpf.agent import _KERNEL_DROP_REASONS

    for stat in Stat:
        reason = _KERNEL_DROP_REASONS.get(stat.name.lower(), stat.name.lower())
        assert reason in LOSS_CAUSES, reason


def test_the_options_a_fix_names_exist():
    config = load_config(None).model_dump()
    for reason, (_what, fix) in LOSS_CAUSES.items():
        for path in re.findall(r"\b(?:receivers|service)\.[a-z_.]+[a-z_]", fix):
            node = config
            for part in path.split("."):
                assert isinstance(node, dict) and part in node, f"{reason}: {path} is no option"
                node = node[part]
