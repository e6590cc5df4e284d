"""``otelbpf report``: the HTML page over a folder the real exporters wrote (OTLP-JSON spans
and metrics, pprof CPU and CUDA memory profiles through the profiling receiver's file
exporter), bad input included: the HTML and the JSON its charts are drawn from. The page
drawn in a real browser: tests/test_report_chromium.py; the real agent's folder is rendered
in test_diagnose_sched_agent.py."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

from test_diagnose import T0, steps

from harness.agent import REPO
from otelbpf.analyze import report_timeline
from otelbpf.analyze.report import read_profile, render, run
from otelbpf.base.health import Health
from otelbpf.correlate.profile_record import CPU_SAMPLE_TYPES, Profile, Sample
from otelbpf.correlate.stacks import Frame
from otelbpf.export.encoded_profile import encoded
from otelbpf.export.profile_export import PprofFileExporter


def cpu_profile(pid: int, stacks: dict[tuple[str, ...], int], end_ms: int) -> Profile:
    """``stacks``: root-first function names -> samples (10 ms each)."""
    p = Profile(
        "process_cpu", "cpu", {"service_name": f"job{pid}"}, pid, T0, end_ms * 1_000_000, 99, CPU_SAMPLE_TYPES, "cpu"
    )
    for names, n in stacks.items():
        frames = [
            Frame(f, "python", "train.py", 10 + i) if f.startswith("py:") else Frame(f) for i, f in enumerate(names)
        ]
        p.samples.append(Sample(frames[::-1], [n, n * 10_000_000], {}))
    return p


def write_profiles(directory: Path, pid: int) -> None:
    ex = PprofFileExporter(str(directory), Health())
    ex.export(
        [
            encoded(
                cpu_profile(
                    pid,
                    {
                        ("main", "py:train_step", "gemm_cpu"): 60,
                        ("main", "py:load_batch"): 30,
                        ("main", "py:train_step", "memcpy"): 10,
                    },
                    1000,
                )
            ),
            encoded(cpu_profile(pid, {("main", "py:load_batch"): 100}, 2000)),
        ]
    )
    ex.shutdown()


def charts(page: str) -> dict:
    """The JSON block the page's script draws from."""
    m = re.search(r"<script type='application/json' id='otelbpf-data'>(.*?)</script>", page, re.S)
    assert m, "no chart data"
    return json.loads(m.group(1))


def flame(page: str, key: str) -> dict:
    """The first flame graph whose first weight is ``key`` (cpu, off_cpu, launches, ...)."""
    (f,) = [f for f in charts(page)["flames"] if f["weights"][0]["key"] == key][:1]
    return f


def node(tree: dict, *names: str) -> dict:
    for name in names:
        (tree,) = [c for c in tree["children"] if c["name"] == name]
    return tree


class _Checker(HTMLParser):
    """Well-formed enough for a browser: every opened element closed, in order; no external URL."""

    VOID = {"meta", "br", "img", "input", "link", "hr"}

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.urls += [v for k, v in attrs if k in ("src", "href") and v]
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()


def test_the_page_shows_findings_processes_api_time_and_flame_graphs(tmp_path: Path) -> None:
    steps(11, memory="pageable", sync=True).export(tmp_path)
    write_profiles(tmp_path, 11)
    page, findings, problems = render(str(tmp_path))
    assert problems == [] and "pageable_copies" in [f.cause for f in findings]
    checker = _Checker()
    checker.feed(page)
    assert checker.errors == [] and checker.stack == [] and checker.urls == []
    # findings first, in their order, each with its fix
    positions = [page.index(f'id="finding-{i}"') for i in range(1, len(findings) + 1)]
    assert positions == sorted(positions) and positions[-1] < page.index("<h2>job11 (pid 11)</h2>")
    assert "Allocate host buffers pinned" in page
    # CUDA API time per call: 2,000 synchronizes of 200 us (20 a step)
    row = re.search(
        r"<tr><td>cudaStreamSynchronize</td><td class='n'>(\d+)</td><td class='n'>(\d+)</td>"
        r"<td class='n'>([\d.]+)</td><td class='n'>([\d.]+)</td>",
        page,
    )
    assert row and row.groups() == ("2000", "2000", "400.000", "200.0")
    # one flame graph merging both intervals: 200 samples of 10 ms, load_batch 130 of them
    assert "cpu profile: 2.000s cpu (2 intervals" in page
    tree = flame(page, "cpu")["weights"][0]["tree"]
    assert tree["value"] == 2_000_000_000 and node(tree, "main", "py:load_batch")["value"] == 1_300_000_000
    assert node(tree, "main", "py:train_step", "gemm_cpu")["value"] == 600_000_000
    # the vendored component, inlined: no URL, and the page's own script after it
    assert (
        "d3js.org v7.9.2" in page
        and "flamegraph" in page
        and page.index("d3js.org") < page.index("data.flames.forEach")
    )


def test_a_host_of_many_processes_draws_those_with_findings_and_the_busiest_and_lists_the_rest(
    tmp_path: Path, monkeypatch
) -> None:
    """Under process churn a folder holds hundreds of processes: the page draws ``MAX_DETAILED``
    of them in full and gives the others a row each, busiest first."""
    from otelbpf.analyze import report

    monkeypatch.setattr(report, "MAX_DETAILED", 2)
    steps(11, memory="pageable").export(tmp_path)  # 0.1 s of CUDA API time, and a finding
    ex = PprofFileExporter(str(tmp_path), Health())
    for pid, samples in ((20, 20), (21, 50), (22, 100)):  # 0.2, 0.5 and 1 s of CPU, no finding
        steps(pid, n=3).export(tmp_path)
        ex.export([encoded(cpu_profile(pid, {("main", "py:train_step"): samples}, 1000))])
    ex.shutdown()
    page, findings, problems = render(str(tmp_path))
    assert problems == [] and {f.process for f in findings} == {"job11 (pid 11)"}
    drawn = re.findall(r"<h2>(job\d+) \(pid \d+\)</h2>", page)
    assert sorted(drawn) == ["job11", "job22"]  # the one with a finding though the least busy, and the busiest
    assert "<h2>2 more processes</h2>" in page
    rows = re.findall(r"<tr><td>(job\d+)</td><td class='n'>\d+</td><td class='n'>([\d.]+)</td>", page)
    assert rows == [("job21", "0.500"), ("job20", "0.200")]
    assert len([f for f in charts(page)["flames"] if f["weights"][0]["key"] == "cpu"]) == 1  # job22's alone
    checker = _Checker()
    checker.feed(page)
    assert checker.errors == [] and checker.stack == []


def test_read_profile_gives_root_first_stacks(tmp_path: Path) -> None:
    write_profiles(tmp_path, 12)
    [first, _] = sorted((tmp_path / "profiles").iterdir())
    unit, samples = read_profile(str(first))
    assert unit == "cpu/nanoseconds"  # the CPU time, as pprof shows it by default
    assert sorted(samples) == [
        (["main", "py:load_batch"], 300_000_000),
        (["main", "py:train_step", "gemm_cpu"], 600_000_000),
        (["main", "py:train_step", "memcpy"], 100_000_000),
    ]


def test_bad_input_gives_a_partial_page_and_a_clear_message(tmp_path: Path) -> None:
    steps(13, sync=True).export(tmp_path)
    write_profiles(tmp_path, 13)
    (tmp_path / "profiles" / "job13-13-cpu-3000.pb.gz").write_bytes(b"\x1f\x8b\x08\x00truncated")
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write("{not json\n")
    with open(tmp_path / "traces.jsonl", "a") as f:
        f.write('{"resourceSpans": [')  # the agent was killed mid-line
    out, err = io.StringIO(), io.StringIO()
    assert run(str(tmp_path), str(tmp_path / "r.html"), out, err) == 0
    page = (tmp_path / "r.html").read_text()
    assert "metrics.jsonl:2: not OTLP-JSON" in err.getvalue()
    assert re.search(r"traces.jsonl:\d+: an incomplete last line, skipped", err.getvalue())
    assert "job13-13-cpu-3000.pb.gz: not a readable pprof" in err.getvalue()
    assert "class='problem'" in page and "cudaStreamSynchronize" in page and "cpu profile: 2.000s cpu" in page
    assert run(str(tmp_path / "absent"), str(tmp_path / "x.html"), out, err) == 2
    assert "does not exist" in err.getvalue() and not (tmp_path / "x.html").exists()


def test_cli(tmp_path: Path) -> None:
    steps(14, memory="pageable").export(tmp_path)
    cli = subprocess.run(
        [sys.executable, "-m", "otelbpf.cli", "report", str(tmp_path), "-o", str(tmp_path / "r.html")],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.startswith(f"wrote {tmp_path / 'r.html'}: 1 finding")
    assert "pageable_copies" in (tmp_path / "r.html").read_text()


def test_an_off_cpu_flame_graph_from_the_sched_spans(tmp_path: Path) -> None:
    from test_diagnose_sched import FUTEX, job

    job(15, n=20, starved=True).export(tmp_path)
    page, findings, _problems = render(str(tmp_path))
    assert findings[0].cause == "input_starvation"
    assert "off_cpu profile: 0.400s off_cpu (off_cpu spans: thread, reason, kernel stack" in page
    # thread, then reason, then the stack from its outermost frame
    tree = flame(page, "off_cpu")["weights"][0]["tree"]
    leaf = node(tree, "thread train", "futex", *reversed(FUTEX))
    assert leaf["value"] == tree["value"] and round(leaf["value"] / 1e9, 3) == 0.4  # all of it, in one path


def test_after_run_writes_the_page_into_the_file_exporters_folder_unless_told_not_to(tmp_path: Path) -> None:
    from otelbpf.analyze.report import after_run
    from otelbpf.families.registry import load_config_text

    on, off = tmp_path / "on", tmp_path / "off"
    for d in (on, off):
        steps(16, memory="pageable").export(d)
    text = f"""
receivers: {{cuda: {{}}}}
exporters:
  file: {{directory: {on}}}
  file/quiet: {{directory: {off}, report: false}}
  file/absent: {{directory: {tmp_path / "never-written"}}}
service:
  pipelines:
    traces: {{receivers: [cuda], exporters: [file, file/quiet, file/absent]}}
"""
    err = io.StringIO()
    assert after_run(load_config_text(text, env={}), err) == [str(on / "report.html")]
    page = (on / "report.html").read_text()
    assert (on / "report.html").stat().st_mode & 0o777 == 0o600  # as the exporter writes its files
    assert 'id="finding-1"><h3>1. pageable_copies: job16' in page
    assert err.getvalue() == (
        f"otelbpf: stopped; writing {on / 'report.html'} (Ctrl-C skips it)\n"
        f"otelbpf: wrote {on / 'report.html'}: 1 finding\n"
    )
    assert not (off / "report.html").exists() and not (tmp_path / "never-written").exists()
    # a link where the page goes is replaced, never written through
    (on / "report.html").unlink()
    (on / "report.html").symlink_to(tmp_path / "elsewhere.html")
    assert after_run(load_config_text(text, env={}), io.StringIO()) == [str(on / "report.html")]
    assert not (on / "report.html").is_symlink() and not (tmp_path / "elsewhere.html").exists()
    # a folder that cannot be read: said, and the run is not failed for it
    (on / "traces.jsonl").write_text("{not json\n")
    (on / "metrics.jsonl").unlink()
    err = io.StringIO()
    assert after_run(load_config_text(text, env={}), err) == [str(on / "report.html")]
    assert "(2 problems reading the folder)" in err.getvalue(), err.getvalue()
    # an output folder that is a link (as the exporter refuses it): no page, said, no traceback
    (on / "report.html").unlink()
    on.rename(tmp_path / "real")
    on.symlink_to(tmp_path / "real")
    err = io.StringIO()
    assert after_run(load_config_text(text, env={}), err) == []
    assert err.getvalue().splitlines()[-1].startswith(f"otelbpf: no {on / 'report.html'}: UnsafeOutput: "), (
        err.getvalue()
    )
    assert not (tmp_path / "real" / "report.html").exists()


def test_after_run_leaves_the_page_to_otelbpf_report_past_report_max_input(tmp_path: Path) -> None:
    """The page is built in the stopping agent's memory (about half the files' size): past
    ``report_max_input`` the agent says so and names the command, and writes nothing."""
    from otelbpf.analyze.report import after_run
    from otelbpf.families.registry import load_config_text

    out = tmp_path / "out"
    steps(16, memory="pageable").export(out)
    size = sum(p.stat().st_size for p in out.glob("*.jsonl"))
    assert size > 4096

    def config(limit: int) -> str:
        return f"""
receivers: {{cuda: {{}}}}
exporters:
  file: {{directory: {out}, report_max_input: {limit}}}
service:
  pipelines:
    traces: {{receivers: [cuda], exporters: [file]}}
"""

    err = io.StringIO()
    assert after_run(load_config_text(config(4096), env={}), err) == []
    assert err.getvalue() == (
        f"otelbpf: stopped; no {out / 'report.html'}: the run wrote {size / 2**20:.1f} MiB of telemetry there, "
        f"over the file exporter's report_max_input (4KiB); `otelbpf report {out} -o {out / 'report.html'}` writes it\n"
    )
    assert not (out / "report.html").exists()
    assert after_run(load_config_text(config(size), env={}), io.StringIO()) == [str(out / "report.html")]
