"""Which agent `otelbpf top` reads (live/agents.py): one is followed, several are listed and
one is picked (--agent, or asked on a terminal), never the newest by surprise."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from otelbpf.live import agents, endpoint


class Answer(io.StringIO):
    def __init__(self, text: str, tty: bool) -> None:
        super().__init__(text)
        self._tty = tty

    def isatty(self) -> bool:
        return self._tty


@pytest.fixture
def two_agents(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[agents.RunningAgent]:
    monkeypatch.setenv(endpoint.RUN_DIR_ENV, str(tmp_path))
    found = [
        agents.RunningAgent(4242, str(tmp_path / "agent-4242.sock"), 3, 30.0),
        agents.RunningAgent(77, str(tmp_path / "agent-77.sock"), 1, 4000.0),
    ]
    monkeypatch.setattr(agents, "running", lambda directory=None: found)
    return found


def test_a_socket_or_an_agent_named_is_taken_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(endpoint.RUN_DIR_ENV, str(tmp_path))
    out = io.StringIO()
    assert agents.choose("/some/agent.sock", None, Answer("", False), out) == "/some/agent.sock"
    assert agents.choose(None, 1234, Answer("", False), out) == os.path.join(str(tmp_path), "agent-1234.sock")
    assert out.getvalue() == ""


def test_one_agent_or_none_is_followed_as_the_newest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(endpoint.RUN_DIR_ENV, str(tmp_path))
    (tmp_path / "agent-1.sock").write_text("")  # stale: nothing answers there
    assert agents.running() == []
    assert agents.choose(None, None, Answer("", True), io.StringIO()) == ""


def test_several_agents_are_listed_and_the_one_typed_is_read(two_agents: list[agents.RunningAgent]) -> None:
    out = io.StringIO()
    assert agents.choose(None, None, Answer("77\n", True), out) == two_agents[1].socket
    listing = out.getvalue()
    assert "2 agents are running" in listing and "4242" in listing and "up      67m" in listing
    assert agents.choose(None, None, Answer("\n", True), io.StringIO()) == two_agents[0].socket
    wrong = io.StringIO()
    assert agents.choose(None, None, Answer("5\n", True), wrong) is None and "'5' is none of them" in wrong.getvalue()


def test_several_agents_and_no_terminal_to_ask_on_says_how_to_pick(two_agents: list[agents.RunningAgent]) -> None:
    out = io.StringIO()
    assert agents.choose(None, None, Answer("", False), out) is None
    assert "otelbpf top --agent PID (e.g. --agent 4242)" in out.getvalue()


def test_doctor_live_answers_for_a_running_agent_and_fails_without_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    monkeypatch.setenv(endpoint.RUN_DIR_ENV, str(run))
    out = io.StringIO()
    assert agents.check_live(out) == 1 and "no agent socket" in out.getvalue()
    s = 10**9
    snap = {"version": 1, "agent_pid": 99, "time_unix_nano": 500 * s, "metrics_time_unix_nano": 470 * s}
    server = endpoint.StateServer(lambda: {**snap, "processes": [{}, {}]})
    try:
        out = io.StringIO()
        assert agents.check_live(out) == 0
        assert out.getvalue() == "agent pid 99 answers: 2 processes, last metrics collection 30s ago\n"
        assert agents.check_live(io.StringIO(), max_age_s=60) == 0
        stale = io.StringIO()
        assert agents.check_live(stale, max_age_s=20) == 1 and "over 20s old" in stale.getvalue()
    finally:
        server.close()


def test_doctor_names_a_running_agents_losses_and_their_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(endpoint.RUN_DIR_ENV, str(tmp_path / "run"))
    own = {
        "resource": {"service.name": "otelbpf", "process.pid": 7},
        "metrics": [
            {
                "name": "otelbpf.events.lost",
                "kind": "sum",
                "points": [
                    {"attributes": {"reason": "string_ring_full"}, "value": 62},
                    {"attributes": {"reason": "ring_buffer_full"}, "value": 0},
                ],
            },
            {"name": "otelbpf.events.dropped", "kind": "sum", "points": [{"attributes": {"reason": "x"}, "value": 1}]},
        ],
    }
    snap = {"version": 1, "agent_pid": 7, "time_unix_nano": 1, "metrics_time_unix_nano": 1, "processes": [own]}
    assert agents.losses(snap) == {"string_ring_full": 62, "x": 1}
    server = endpoint.StateServer(lambda: snap)
    try:
        out = io.StringIO()
        agents.running_report(out)
    finally:
        server.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("LOSSES   running agent   pid 7 lost 62: string_ring_full: ")
    assert "fix: raise service.telemetry.string_ring_size" in lines[0] and len(lines) == 2
