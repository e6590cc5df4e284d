"""Numbers a new user can trust (issue 32, item 6): an NCCL straggler is a finding in
`diagnose`, the report's count and verdict and MCP's findings tool; the agent's own
``otelbpf.finding`` spans are never the process's slowest; shares are capped at the time
the CUDA threads had; the page opens with a verdict, writes values as people read them,
links span ids to a configured trace viewer, and leaves out sections with nothing in them."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from opentelemetry.sdk.resources import Resource
from test_diagnose import MS, T0, Trace, steps

from otelbpf.analyze.diagnose import diagnose, write_report
from otelbpf.analyze.report import TRACE_URL, render
from otelbpf.analyze.summary import AGENT_SCOPE, summarize
from otelbpf.correlate.spans import make_span, scope
from otelbpf.export.jsonfile import FileSpanExporter
from otelbpf.mcp import tools
from otelbpf.mcp.folder import Folder

NCCL = scope("otelbpf.nccl")


def nccl_job(directory: Path, late_ms: float = 20, n: int = 8) -> None:
    """Two ranks of one job on host h; rank 1 enters every all-reduce ``late_ms`` after rank 0,
    which waits for it; both complete 1 ms after rank 1 arrives."""
    spans = []
    for rank, pid in ((0, 300), (1, 301)):
        res = Resource({"service.name": f"rank{rank}", "process.pid": pid, "host.name": "h"})
        for k in range(n):
            t0 = T0 + k * 100 * MS
            arrive = t0 + (int(late_ms * MS) if rank else 0)
            spans.append(
                make_span(
                    "ncclAllReduce",
                    resource=res,
                    scope=NCCL,
                    start_ns=arrive,
                    end_ns=t0 + int(late_ms * MS) + MS,
                    attributes={
                        "nccl.comm.id": "00000000000000aa",
                        "nccl.seq": k + 1,
                        "nccl.rank": rank,
                        "nccl.nranks": 2,
                        "nccl.completion": "observed",
                    },
                )
            )
    ex = FileSpanExporter(str(directory))
    ex.export(spans)
    ex.shutdown()


def text(page: str) -> str:
    return re.sub(r"<[^>]+>", " ", re.sub(r"<script.*?</script>", "", page, flags=re.S))


def test_a_straggler_is_a_finding_in_diagnose_the_report_and_mcp(tmp_path: Path) -> None:
    nccl_job(tmp_path)
    findings = diagnose(str(tmp_path))
    assert [(f.cause, f.process) for f in findings] == [("nccl_straggler", "rank1 (pid 301)")]
    f = findings[0]
    # the others waited ~20 ms on each of 8 collectives, over a ~0.72 s window
    assert f.cost_s == pytest.approx(0.16, rel=0.1) and 0 < f.share <= 1
    assert f.evidence["rank"] == 1 and f.evidence["late_on"] == 8 and f.fix
    out = io.StringIO()
    write_report(findings, out)
    assert out.getvalue().startswith("1. nccl_straggler: rank1 (pid 301): ~") and "collective window" in out.getvalue()

    page, found, _problems = render(str(tmp_path))
    assert [x.cause for x in found] == ["nccl_straggler"]
    verdict = re.search(r"<p class='verdict' id='verdict'>(.*?)</p>", page, re.S)
    assert verdict and "1 finding;" in verdict.group(1)
    assert "costs most: nccl_straggler: rank1 (pid 301)" in verdict.group(1)
    assert "NCCL stragglers" in page

    folder = Folder(str(tmp_path))
    answer = tools.findings(folder, folder.load(), 10)
    assert answer["total"] == 1 and answer["findings"][0]["cause"] == "nccl_straggler"
    assert answer["findings"][0]["evidence"]["spans"], "the collectives it entered latest are cited"
    assert "collective window" in answer["findings"][0]["share_explained"]


def test_a_rank_late_once_is_no_finding(tmp_path: Path) -> None:
    nccl_job(tmp_path, late_ms=0.1)
    assert diagnose(str(tmp_path)) == []
    page, found, _ = render(str(tmp_path))
    assert found == [] and "0 findings; no cause of GPU idle" in text(page)


def test_two_threads_copying_at_once_share_their_time_not_one_window(tmp_path: Path) -> None:
    """Two threads, each in pageable copies most of the same window: the copies sum to about
    twice the window; the share is over both threads' time, so it stays under 100%."""
    a, b = Trace(5), Trace(5)
    copy = {"cuda.memcpy.bytes": 8 << 20, "cuda.memcpy.direction": "H2D", "cuda.memcpy.host_memory": "pageable"}
    for _ in range(50):
        a.call("cudaMemcpy", 5 * MS, **copy)
        b.call("cudaMemcpy", 5 * MS, **copy, **{"thread.id": 8})
    a.spans += b.spans
    (found,) = [f for f in diagnose(str(a.export(tmp_path))) if f.cause == "pageable_copies"]
    window = found.evidence["window_s"]
    assert found.cost_s > window and found.evidence["cuda_threads"] == 2
    assert found.share == pytest.approx(found.cost_s / (2 * window), rel=0.01) and found.share <= 1
    out = io.StringIO()
    write_report([found], out)
    assert "of its 2 CUDA threads' time" in out.getvalue()


def test_the_agents_own_finding_spans_are_kept_apart(tmp_path: Path) -> None:
    t = steps(6, 20, memory="pageable")
    t.spans.append(
        make_span(
            "otelbpf.finding",
            resource=t.res,
            scope=scope(AGENT_SCOPE),
            start_ns=T0,
            end_ns=t.t + 10_000 * MS,  # longer than anything the process did
            attributes={"otelbpf.finding.cause": "pageable_copies"},
        )
    )
    t.export(tmp_path)
    out = io.StringIO()
    assert summarize(str(tmp_path), out) == 0
    lines = out.getvalue().splitlines()
    assert not any("slowest: otelbpf.finding" in line for line in lines)
    spans_line = next(line for line in lines if line.startswith("  spans: "))
    assert "otelbpf.finding" not in spans_line
    assert any("live findings on it" in line and "pageable_copies 1" in line for line in lines)
    page, _found, _ = render(str(tmp_path))
    assert "10.0" not in re.search(r"<p class='verdict'.*?</p>", page, re.S).group(0)  # not the finding span's time
    folder = Folder(str(tmp_path))
    (row,) = tools.list_processes(folder.load(), [], 10)["processes"]
    assert AGENT_SCOPE not in row["spans"] and row["agent_finding_spans"] == 1


def test_the_page_opens_with_a_verdict_and_writes_values_as_people_read_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steps(7, 100, churn=True).export(tmp_path)
    monkeypatch.setenv(TRACE_URL, "http://jaeger:16686/trace/{trace_id}?uiFind={span_id}")
    page, found, _ = render(str(tmp_path))
    assert found[0].cause == "memory_churn"
    body = page[page.index("<body>") : page.index("<script")]
    first = re.search(r"<p class='verdict' id='verdict'>(.*?)</p>", body, re.S).group(1)
    assert first.startswith("<b>job7</b>, traced ") and "costs most: memory_churn: job7 (pid 7)" in first
    assert "Fix: Keep the caching allocator warm" in first
    finding = body[body.index('id="finding-1"') : body.index("</div>", body.index('id="finding-1"'))]
    assert "{" not in text(finding) and "&#x27;" not in finding, "no Python dict on the page"
    assert re.search(r"<th>repeated sizes</th><td>100 × 64.0 MiB</td>", finding)
    assert re.search(r"<th>seconds</th><td>[\d.]+ ms</td>", finding)
    links = re.findall(r"<a href='(http://jaeger:16686/trace/[0-9a-f]{32}\?uiFind=[0-9a-f]{16})'", finding)
    assert len(links) == len(found[0].evidence["span_ids"])
    assert "Where the idle time went" in body
    # sections with nothing in them are left out: no agent heading, no empty process
    assert "<h2>otelbpf" not in body.replace("<h1>otelbpf report", "")


def test_a_trace_url_that_is_not_a_web_address_links_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    steps(8, 100, churn=True).export(tmp_path)
    monkeypatch.setenv(TRACE_URL, "javascript:alert('{trace_id}')")
    page, _found, _ = render(str(tmp_path))
    body = page[: page.index("<script")]
    assert "javascript:" not in body and "<a href" not in body


def test_a_healthy_job_has_no_findings_section(tmp_path: Path) -> None:
    Trace(9).step().step().export(tmp_path)
    page, found, _ = render(str(tmp_path))
    assert found == [] and "<h2>Findings</h2>" not in page and "no cause of GPU idle time" in page
