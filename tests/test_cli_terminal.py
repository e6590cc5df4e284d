"""What the commands print on root's terminal holds names the traced processes chose (issue 31):
a process named, or OTEL_SERVICE_NAME'd, ``ESC]0;...BEL`` retitled the window and ``ESC[2J``
cleared it through `summary` and `diagnose`. Through the command line every control character
of theirs comes out as a visible escape: `summary` and `diagnose` over a folder the real file
exporters wrote, `doctor`, `stragglers` and `report` handed streams that clean, and the log of
`run`."""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics.export import MetricsData, ResourceMetrics, ScopeMetrics
from opentelemetry.sdk.resources import Resource

from otelbpf import cli
from otelbpf.correlate import metrics as m
from otelbpf.correlate.spans import make_span, scope
from otelbpf.export.jsonfile import FileMetricExporter, FileSpanExporter

#: What a terminal acts on (newlines are the commands' own).
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
TITLE, CLEAR = "\x1b]0;owned\x07", "\x1b[2J"
SHOWN_TITLE, SHOWN_CLEAR = "\\x1b]0;owned\\x07", "\\x1b[2J"
T0 = 1_700_000_000_000_000_000
MS = 1_000_000


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """What the file exporters wrote for a process named with escapes, whose copies from pageable
    memory (1 ms each, before a 5 ms kernel) make a finding that names it."""
    res = Resource(
        {
            "service.name": f"train{TITLE}",
            "process.pid": 4242,
            "process.command_line": f"python {CLEAR}train.py \u202e--epochs",
        }
    )
    cuda, spans, t = scope("otelbpf.cuda"), [], T0
    for _ in range(100):
        for name, dur, gap, attrs in (
            (
                "cudaMemcpyAsync",
                MS,
                100_000,
                {
                    "cuda.memcpy.bytes": 1 << 20,
                    "cuda.memcpy.direction": "H2D",
                    "cuda.memcpy.async": True,
                    "cuda.memcpy.host_memory": "pageable",
                },
            ),
            ("cudaLaunchKernel", 0, 5 * MS, {"cuda.kernel.name": f"gemm{CLEAR}"}),
        ):
            spans.append(
                make_span(
                    name,
                    resource=res,
                    scope=cuda,
                    start_ns=t,
                    end_ns=t + dur,
                    attributes={"cuda.api.function": name, "thread.id": 7, **attrs},
                )
            )
            t += dur + gap
    exporter = FileSpanExporter(str(tmp_path))
    exporter.export(spans)
    exporter.shutdown()
    top = m.gauge(
        "cuda.kernel.launches.top",
        "{launch}",
        "",
        [({"cuda.api.function": "cudaLaunchKernel", "cuda.kernel.name": f"gemm{CLEAR}"}, 100)],
        t,
    )
    metrics = FileMetricExporter(str(tmp_path))
    metrics.export(MetricsData([ResourceMetrics(res, [ScopeMetrics(cuda, [top], "")], "")]))
    metrics.shutdown()
    return tmp_path


def test_summary_shows_a_hostile_name_command_line_and_kernel_escaped(folder: Path, capsys) -> None:
    assert cli.main(["summary", str(folder)]) == 0
    shown = capsys.readouterr().out
    assert not CONTROL.search(shown), repr(shown)
    assert f"train{SHOWN_TITLE} (pid 4242)" in shown
    assert f"command: python {SHOWN_CLEAR}train.py \\u202e--epochs" in shown
    assert f"gemm{SHOWN_CLEAR}" in shown


def test_diagnose_names_a_hostile_process_escaped_in_text_and_json(folder: Path, capsys) -> None:
    assert cli.main(["diagnose", str(folder)]) == 1
    shown = capsys.readouterr().out
    assert f"pageable_copies: train{SHOWN_TITLE} (pid 4242)" in shown
    assert not CONTROL.search(shown), repr(shown)
    assert cli.main(["diagnose", str(folder), "--json"]) == 1
    shown = capsys.readouterr().out
    assert "train\\u001b]0;owned\\u0007 (pid 4242)" in shown  # JSON's own escapes, unchanged
    assert not CONTROL.search(shown)


@pytest.mark.parametrize(
    ("command", "target", "args"),
    [
        ("doctor", "otelbpf.doctor.run_doctor", []),
        ("stragglers", "otelbpf.analyze.stragglers.run", ["dir"]),
        ("report", "otelbpf.analyze.report.run", ["dir"]),
    ],
)
def test_the_other_readers_print_through_streams_that_clean(command, target, args, monkeypatch, capsys) -> None:
    """Their own output names hosts, processes and libraries' paths; what they write to the
    streams the command line hands them reaches the terminal escaped."""

    def fake(*a, **kw) -> int:
        streams = [s for s in (*a, *kw.values()) if hasattr(s, "write")]
        assert streams, "no stream handed over"
        for s in streams:
            s.write(f"pid 7 ({TITLE}) /lib/{CLEAR}libcuda.so\n")
        return 0

    monkeypatch.setattr(target, fake)
    assert cli.main([command, *args]) == 0
    got = capsys.readouterr()
    assert not CONTROL.search(got.out + got.err), repr(got)
    assert f"pid 7 ({SHOWN_TITLE}) /lib/{SHOWN_CLEAR}libcuda.so" in got.out


@contextlib.contextmanager
def bare_root_logger() -> Iterator[None]:
    """The root logger without pytest's handlers (added as the test's body starts), which would
    make ``basicConfig`` a no-op."""
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    root.handlers[:] = []
    try:
        yield
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers[:] = saved
        root.setLevel(level)


def test_the_run_log_is_cleaned(monkeypatch, capsys) -> None:
    """The agent's log lines name processes, paths and HTTP paths in their arguments."""

    def agent_run(config, **kw) -> int:
        logging.getLogger("otelbpf.agent").warning("pid 7 (%s) exited: %s", TITLE, f"/x{CLEAR}\nforged line")
        return 0

    monkeypatch.setattr("otelbpf.agent.run", agent_run)
    monkeypatch.setattr("otelbpf.base.privileges.drop_unneeded", lambda **kw: None)
    monkeypatch.setattr("otelbpf.analyze.report.after_run", lambda config, err: [])
    monkeypatch.setattr("signal.signal", lambda *a: None)
    with bare_root_logger():
        assert cli.main(["run", "--duration", "0"]) == 0
    err = capsys.readouterr().err
    assert f"WARNING otelbpf.agent: pid 7 ({SHOWN_TITLE}) exited: /x{SHOWN_CLEAR}\\x0aforged line\n" in err
    assert not CONTROL.search(err)


def test_the_mcp_servers_log_is_cleaned(monkeypatch, capsys, tmp_path: Path) -> None:
    """The MCP SDK configures its own logging (a Rich handler on stderr) as the server is built:
    the command line's, configured first, stays, and cleans what the SDK logs."""
    pytest.importorskip("mcp")
    from mcp.server.mcpserver.utilities.logging import configure_logging

    def serve(directory, **kw) -> None:
        configure_logging("WARNING")  # what building the server does
        logging.getLogger("mcp.server").warning("tool call failed: %s", f"{tmp_path}/{TITLE}")

    monkeypatch.setattr("otelbpf.mcp.server.serve", serve)
    with bare_root_logger():
        assert cli.main(["mcp", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert f"WARNING mcp.server: tool call failed: {tmp_path}/{SHOWN_TITLE}\n" in err
    assert not CONTROL.search(err)


def test_a_refused_path_is_named_escaped(monkeypatch, capsys) -> None:
    """A file another user named in a folder root writes to is refused in a message that names it."""
    from otelbpf.base.safe_files import UnsafeOutput

    def agent_run(config, **kw) -> int:
        raise UnsafeOutput(f"/srv/out/{TITLE}traces.jsonl is a symbolic link: refusing to write through it")

    monkeypatch.setattr("otelbpf.agent.run", agent_run)
    monkeypatch.setattr("otelbpf.base.privileges.drop_unneeded", lambda **kw: None)
    with bare_root_logger():
        assert cli.main(["run", "--duration", "0"]) != 0
    err = capsys.readouterr().err
    assert f"otelbpf: /srv/out/{SHOWN_TITLE}traces.jsonl is a symbolic link" in err
    assert not CONTROL.search(err)
