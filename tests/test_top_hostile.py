"""`otelbpf top` drawing values the outside world chose (issue 31): a remote client's request
path, a process's name or OTEL_SERVICE_NAME, a kernel's name. Each is shown as the text it is:
never read as Rich markup (``/[/]`` ended every draw in a MarkupError, ``[link=...]`` drew a
link), its control characters never sent to the terminal."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from otelbpf.live.endpoint import EndpointError
from otelbpf.top import Viewer

S = 1_000_000_000
#: Any of these in what top drew is a command to the terminal (or text shown out of order).
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def snapshot(value: str, agent_pid: object = 1) -> dict:
    """One collection of a GPU process, an NCCL rank and an HTTP server at once, with ``value``
    everywhere a traced process or its client names something top shows: service, CUDA API,
    kernel, request path, straggler class (and so the findings)."""
    return {
        "version": 1,
        "agent_pid": agent_pid,
        "time_unix_nano": S,
        "metrics_time_unix_nano": S,
        "processes": [
            {
                "resource": {"service.name": value, "process.pid": 10},
                "metrics": [
                    {
                        "name": "cuda.api.calls",
                        "kind": "sum",
                        "points": [{"attributes": {"cuda.api.function": value}, "value": 5}],
                    },
                    {
                        "name": "cuda.kernel.launches.top",
                        "kind": "gauge",
                        "points": [{"attributes": {"cuda.kernel.name": value}, "value": 3}],
                    },
                    {"name": "nccl.collectives", "kind": "sum", "points": [{"attributes": {}, "value": 4}]},
                    {
                        "name": "nccl.straggler",
                        "kind": "sum",
                        "points": [{"attributes": {"nccl.straggler.class": value}, "value": 2}],
                    },
                ],
            }
        ],
        "spans": [
            {
                "name": "GET",
                "scope": "otelbpf.http",
                "kind": 2,
                "trace_id": "1" * 32,
                "span_id": "2" * 16,
                "parent_id": "",
                "start": S,
                "end": S + 1_000_000,
                "error": False,
                "attributes": {"http.request.method": "GET", "url.path": value, "http.response.status_code": 200},
                "pid": 10,
                "service": value,
            }
        ],
    }


def draw(viewer: Viewer) -> str:
    """What a terminal would receive, with no styles: anything but text and newlines came from the values."""
    out = io.StringIO()
    Console(file=out, force_terminal=True, color_system=None, width=200).print(viewer.render())
    return out.getvalue()


def viewer_of(snap: dict) -> Viewer:
    v = Viewer(lambda: snap)
    v.refresh()
    return v


@pytest.mark.parametrize(
    "value",
    [
        "/[/]",  # a request any client can send: MarkupError on every draw
        "/x[/bold]",
        "[link=https://x.example]go[/link]",
        "[blink]urgent[/blink]",
        "[bold red on white]",
    ],
)
def test_markup_in_a_value_is_shown_as_text(value: str) -> None:
    shown = draw(viewer_of(snapshot(value)))
    lines = [line.rstrip() for line in shown.splitlines()]
    for title in ("processes", "NCCL ranks", "CUDA API (latency: recent spans, ms)", "kernels by launches"):
        i = lines.index(title)
        assert value in lines[i + 2], (title, lines[i + 2])  # the first row under the header
    assert f"GET {value}" in shown  # the route
    assert f"{value} (pid 10)" in shown and f"late on 2 collectives ({value})" in shown  # the finding


@pytest.mark.parametrize(
    ("value", "escaped"),
    [
        ("\x1b]0;owned\x07", "\\x1b]0;owned\\x07"),  # retitles root's terminal
        ("\x1b[2J\x1b[H", "\\x1b[2J\\x1b[H"),  # clears it
        ("py\rtorch", "py\\x0dtorch"),
        ("\x9b2J", "\\x9b2J"),  # C1 CSI
        ("\u202etxt.exe", "\\u202etxt.exe"),  # shown right to left
    ],
)
def test_control_characters_in_a_value_are_shown_escaped_never_sent(value: str, escaped: str) -> None:
    shown = draw(viewer_of(snapshot(value, agent_pid=value)))
    assert not CONTROL.search(shown), repr(shown)
    assert shown.count(escaped) >= 6  # service (twice), API, kernel, route, class, finding, agent pid


def test_the_header_error_and_notes_are_text_too() -> None:
    v = Viewer(lambda: (_ for _ in ()).throw(EndpointError("/run/otelbpf/[/]\x1b[2J.sock: refused")))
    v.refresh()
    v.notes.append("warning: pid 7 (\x1b]0;owned\x07) [/]: no symbols")
    shown = draw(v)
    assert "/run/otelbpf/[/]\\x1b[2J.sock: refused" in shown
    assert "warning: pid 7 (\\x1b]0;owned\\x07) [/]: no symbols" in shown
    assert not CONTROL.search(shown)
