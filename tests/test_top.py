"""The `otelbpf top` viewer without a terminal: keys (sort, pid filter, freeze, quit), rates
across collections, an agent that restarts, a socket that stops answering, and what a render
shows (Rich's recording console)."""

from __future__ import annotations

from rich.console import Console

from otelbpf.live.endpoint import EndpointError
from otelbpf.top import SORTS, Viewer

S = 1_000_000_000


def snap(k: int, agent_pid: int = 1, t: int = 0) -> dict:
    """The k-th collection of two processes: pid 10 (GPU, 100 calls per collection) and pid 20."""

    def proc(pid: int, service: str, calls: int) -> dict:
        return {
            "resource": {"service.name": service, "process.pid": pid},
            "metrics": [
                {
                    "name": "cuda.api.calls",
                    "kind": "sum",
                    "points": [{"attributes": {"cuda.api.function": "cudaMemcpy"}, "value": calls}],
                }
            ],
        }

    return {
        "version": 1,
        "agent_pid": agent_pid,
        "time_unix_nano": t or k * S,
        "metrics_time_unix_nano": k * S,
        "processes": [proc(10, "trainer", 100 * k), proc(20, "loader", 5 * k)],
        "spans": [],
    }


class Source:
    def __init__(self, *answers) -> None:
        self.answers, self.calls = list(answers), 0

    def __call__(self) -> dict:
        self.calls += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def text(viewer: Viewer) -> str:
    console = Console(record=True, width=160)
    console.print(viewer.render())
    return console.export_text()


def test_rates_across_collections_and_a_repeated_collection_keeps_them() -> None:
    v = Viewer(Source(snap(1), snap(2), {**snap(2), "time_unix_nano": 2 * S + 5}))
    v.refresh()
    assert v.tables.processes[0].calls_per_s is None  # one collection: no rate yet
    v.refresh()
    v.refresh()  # the same collection again (the agent's interval is longer than the view's)
    assert [(r.pid, r.calls_per_s) for r in v.tables.processes] == [(10, 100.0), (20, 5.0)]
    [row] = [line for line in text(v).splitlines() if "trainer" in line]
    assert row.split()[:4] == ["10", "trainer", "yes", "100"]


def test_keys_sort_filter_freeze_quit() -> None:
    v = Viewer(Source(snap(1), snap(2), snap(3)))
    v.refresh()
    v.refresh()
    for ch in "p20\r":
        assert v.key(ch)
    assert v.pid == 20
    shown = text(v)
    assert "pid filter: 20" in shown and "loader" in shown and "trainer" not in shown
    for ch in "p2\x7f1\x1b":  # typing, a backspace, then Esc: no filter
        v.key(ch)
    assert v.pid is None and v.typing is None
    v.key("s")
    assert v.sort == SORTS[1] and "sort: calls/s" in text(v)
    v.key("f")
    v.refresh()
    assert v.source.calls == 2 and "FROZEN" in text(v)  # frozen: the source is not asked
    v.key("f")
    v.refresh()
    assert v.source.calls == 3
    assert v.key("q") is False


def test_a_silent_socket_is_said_and_the_last_tables_stay_then_a_restarted_agent_counts_afresh() -> None:
    v = Viewer(
        Source(
            snap(1),
            snap(2),
            EndpointError("/run/otelbpf/agent-1.sock: nothing listens (a stale socket)"),
            snap(1, agent_pid=2),
            snap(2, agent_pid=2),
        )
    )
    v.refresh()
    v.refresh()
    v.refresh()
    assert "stale socket" in text(v) and v.tables.processes[0].calls_per_s == 100.0
    v.refresh()  # another agent: its counters started again, so no rate against the old one
    assert v.error == "" and v.tables.processes[0].calls_per_s is None
    v.refresh()
    assert v.tables.processes[0].calls_per_s == 100.0


def test_waiting_for_the_first_snapshot() -> None:
    v = Viewer(Source(EndpointError("no agent socket in /run/otelbpf")))
    v.refresh()
    shown = text(v)
    assert "no agent socket" in shown and "waiting for the first snapshot" in shown


def test_the_agent_line_says_when_head_sampling_keeps_a_share_of_requests() -> None:
    def with_agent(k: int, kept: int, shed: int) -> dict:
        agent = {
            "resource": {"service.name": "otelbpf", "process.pid": 1},
            "metrics": [
                {
                    "name": "otelbpf.http.sampled",
                    "kind": "sum",
                    "points": [
                        {"attributes": {"decision": "kept"}, "value": kept * k},
                        {"attributes": {"decision": "backlog"}, "value": shed * k},
                    ],
                },
                {"name": "otelbpf.events.received", "kind": "sum", "points": [{"attributes": {}, "value": 10 * k}]},
            ],
        }
        s = snap(k)
        return {**s, "processes": [*s["processes"], agent]}

    v = Viewer(Source(with_agent(1, 125, 875), with_agent(2, 125, 875)))
    v.refresh()
    v.refresh()
    assert "HTTP requests traced 12.5% (head sampling)" in text(v)
    calm = Viewer(Source(with_agent(1, 100, 0), with_agent(2, 100, 0)))
    calm.refresh()
    calm.refresh()
    assert "HTTP requests traced 100.0%" in text(calm)
    quiet = Viewer(Source(snap(1), snap(2)))
    quiet.refresh()
    quiet.refresh()
    assert "head sampling" not in text(quiet)
