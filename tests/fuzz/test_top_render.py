"""Property-based fuzzing of `otelbpf top`'s drawing, briefly, in every run of the suite (as
test_fuzz.py): snapshots whose every name a traced process or its client chooses (service, CUDA
API, kernel, request method and path, gRPC service and method, straggler class, the agent pid, a
socket error, a log note) is any text, markup and terminal escapes favoured. A draw must never
fail, and with styles off (``color_system=None``) what reaches the terminal holds no control
character but newlines: anything else would have come from the values."""

from __future__ import annotations

import io
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from otelbpf.live.endpoint import EndpointError
from otelbpf.top import SORTS, Viewer

S = 1_000_000_000
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
#: Pieces of Rich markup and of terminal escapes, for hypothesis to join with arbitrary text.
FRAGMENTS = [
    "[",
    "]",
    "[/]",
    "[/bold]",
    "[bold]",
    "[link=https://x.example]",
    "[blink]",
    "[@click=quit]",
    "\\[",
    "\\",
    ":smile:",
    "\x1b",
    "\x1b[2J",
    "\x1b]0;t\x07",
    "\x07",
    "\r",
    "\n",
    "\t",
    "\x00",
    "\x7f",
    "\x9b",
    "\u202e",
    "\u2066",
    "\u200b",
    "名",
]
HOSTILE = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=6)), max_size=6).map("".join)


def snapshot(v: dict[str, str], grpc: bool) -> dict:
    """A GPU process that is also an NCCL rank and an HTTP or gRPC server, named by ``v``."""
    attrs = (
        {"rpc.service": v["rpc_service"], "rpc.method": v["rpc_method"]}
        if grpc
        else {"http.request.method": v["method"], "url.path": v["path"], "http.response.status_code": 503}
    )
    return {
        "version": 1,
        "agent_pid": v["agent_pid"],
        "time_unix_nano": 2 * S,
        "metrics_time_unix_nano": S,
        "processes": [
            {
                "resource": {"service.name": v["service"], "process.pid": 10},
                "metrics": [
                    {
                        "name": "cuda.api.calls",
                        "kind": "sum",
                        "points": [{"attributes": {"cuda.api.function": v["api"]}, "value": 7}],
                    },
                    {
                        "name": "cuda.kernel.launches.top",
                        "kind": "gauge",
                        "points": [{"attributes": {"cuda.kernel.name": v["kernel"]}, "value": 3}],
                    },
                    {"name": "nccl.collectives", "kind": "sum", "points": [{"attributes": {}, "value": 4}]},
                    {
                        "name": "nccl.straggler",
                        "kind": "sum",
                        "points": [{"attributes": {"nccl.straggler.class": v["class"]}, "value": 2}],
                    },
                ],
            }
        ],
        "spans": [
            {
                "name": v["api"],
                "scope": "otelbpf.cuda",
                "kind": 1,
                "trace_id": "1" * 32,
                "span_id": "3" * 16,
                "parent_id": "",
                "start": S,
                "end": S + 5_000,
                "error": False,
                "attributes": {"cuda.api.function": v["api"], "thread.id": 7},
                "pid": 10,
                "service": v["service"],
            },
            {
                "name": v["method"],
                "scope": "otelbpf.http",
                "kind": 2,
                "trace_id": "1" * 32,
                "span_id": "2" * 16,
                "parent_id": "",
                "start": S,
                "end": S + 1_000_000,
                "error": True,
                "attributes": attrs,
                "pid": 10,
                "service": v["service"],
            },
        ],
    }


KEYS = ["service", "api", "kernel", "method", "path", "rpc_service", "rpc_method", "class", "agent_pid"]


@settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    values=st.fixed_dictionaries({k: HOSTILE for k in KEYS}),
    grpc=st.booleans(),
    error=HOSTILE,
    note=HOSTILE,
    width=st.integers(20, 220),
    sort=st.sampled_from(SORTS),
)
def test_top_draws_hostile_values_as_inert_text(values, grpc, error, note, width, sort):
    answers = [snapshot(values, grpc)]

    def source() -> dict:
        if answers:
            return answers.pop()
        raise EndpointError(error)

    v = Viewer(source)
    v.sort = sort
    v.refresh()
    v.refresh()  # the socket stops answering: the error shows over the last tables
    v.notes.append(note)
    out = io.StringIO()
    Console(file=out, force_terminal=True, color_system=None, width=width).print(v.render())
    shown = out.getvalue()
    assert "processes" in shown or width < 40
    assert not CONTROL.search(shown), repr(shown)
