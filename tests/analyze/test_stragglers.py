"""`otelbpf stragglers` on small OTLP-JSON inputs: what it accepts, how it fails, and the clock
offset method on numbers whose answer is known. The agent-made inputs are in
tests/test_nccl_agent.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from harness.agent import REPO
from otelbpf.analyze import clock_offsets


def cli(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "otelbpf.cli", "stragglers", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )


def span(name: str, rank: int, seq: int, start: int, end: int, comm: str = "00000000000000aa", **extra) -> dict:
    attrs = {
        "nccl.comm.id": {"stringValue": comm},
        "nccl.seq": {"intValue": str(seq)},
        "nccl.rank": {"intValue": str(rank)},
        "nccl.nranks": {"intValue": "2"},
        "nccl.completion": {"stringValue": "observed"},
        **extra,
    }
    return {
        "name": name,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(end),
        "attributes": [{"key": k, "value": v} for k, v in attrs.items()],
    }


def request(pid: int, spans: list[dict], host: str = "h") -> dict:
    res = [
        {"key": "host.name", "value": {"stringValue": host}},
        {"key": "process.pid", "value": {"intValue": str(pid)}},
    ]
    return {"resourceSpans": [{"resource": {"attributes": res}, "scopeSpans": [{"spans": spans}]}]}


def two_ranks(late_ms: float, n: int = 6) -> tuple[dict, dict]:
    """Rank 1 enters every all-reduce late_ms after rank 0; both see completion 1 ms later."""
    a, b = [], []
    for k in range(n):
        t0 = 10**12 + k * 100_000_000
        t1 = t0 + int(late_ms * 1e6)
        a.append(span("ncclAllReduce", 0, k + 1, t0, t1 + 1_000_000))
        b.append(span("ncclAllReduce", 1, k + 1, t1, t1 + 1_000_000))
    return request(100, a), request(101, b)


def test_reads_jsonl_and_json_files_and_skips_metrics(tmp_path: Path) -> None:
    a, b = two_ranks(20)
    (tmp_path / "traces.jsonl").write_text(json.dumps(a) + "\n\n")
    (tmp_path / "export.json").write_text(json.dumps(b, indent=2))  # one request, pretty-printed
    (tmp_path / "metrics.jsonl").write_text("not even json\n")
    out = cli(tmp_path, "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["files"] == 2 and report["spans"] == 12
    assert [(r["rank"], r["straggled"], r["collectives"]) for r in report["stragglers"]] == [(1, 6, 6)]
    text = cli(tmp_path)
    assert "1. rank 1 (h, pid 101" in text.stdout and "last in 6 of 6 collectives" in text.stdout


def test_errors_name_the_cause(tmp_path: Path) -> None:
    out = cli(tmp_path / "missing")
    assert out.returncode == 2 and "no such file or directory" in out.stderr
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "traces.jsonl").write_text(json.dumps(request(1, [])) + "\n{truncated\n")
    out = cli(bad)
    assert out.returncode == 2 and "traces.jsonl:2: not an OTLP-JSON trace request" in out.stderr
    empty = tmp_path / "cuda-only"
    empty.mkdir()
    (empty / "traces.jsonl").write_text(json.dumps(request(1, [{"name": "cudaMemcpy"}])) + "\n")
    out = cli(empty)
    assert out.returncode == 1 and "no NCCL collective spans" in out.stderr and "nccl receiver" in out.stderr
    out = cli(empty, "--min-share", "2")
    assert out.returncode == 2 and "share from 0 to 1" in out.stderr


def test_a_link_in_the_folder_is_never_read_a_file_named_is(tmp_path: Path) -> None:
    """Issue 31: a folder read as root (``stragglers``, MCP's tool) is read without following a
    link put there (another user's ``rank1.jsonl`` linked to a root-only job's spans); a file
    the operator names is taken as given, link or not."""
    a, b = two_ranks(20)
    private = tmp_path / "root-only"
    private.mkdir(mode=0o700)
    (private / "traces.jsonl").write_text(json.dumps(b) + "\n")
    served = tmp_path / "served"
    served.mkdir()
    (served / "traces.jsonl").write_text(json.dumps(a) + "\n")
    (served / "rank1.jsonl").symlink_to(private / "traces.jsonl")
    out = cli(served, "--json")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"{served / 'rank1.jsonl'} is a symbolic link: refusing to read it" in out.stderr
    named = cli(served / "traces.jsonl", served / "rank1.jsonl", "--json")
    assert named.returncode == 0, named.stderr
    assert json.loads(named.stdout)["spans"] == 12


def test_a_below_threshold_rank_is_not_a_straggler(tmp_path: Path) -> None:
    a, b = two_ranks(5)
    (tmp_path / "traces.jsonl").write_text(json.dumps(a) + "\n" + json.dumps(b) + "\n")
    report = json.loads(cli(tmp_path, "--json", "--threshold", "10ms").stdout)
    assert report["stragglers"] == [] and report["ranks"][0]["straggled"] == 0
    report = json.loads(cli(tmp_path, "--json", "--threshold", "4ms").stdout)
    assert [r["rank"] for r in report["stragglers"]] == [1]


def test_clock_offset_bounds_hold_and_the_estimate_follows_completions() -> None:
    """Host 1's clock is 250 ms ahead; its rank is always 30 ms late (so one bound is loose:
    the estimate, from completions, must not drift towards the middle of the bounds)."""
    n, skew, late = 200, 250_000_000, 30_000_000
    rng = np.random.default_rng(3)
    starts = np.arange(n) * 100_000_000 + 10**12
    enter0 = starts + rng.integers(0, 100_000, n)
    enter1 = starts + late + rng.integers(0, 100_000, n)
    done = np.maximum(enter0, enter1) + 50_000
    host = np.r_[np.zeros(n, int), np.ones(n, int)]
    group = np.r_[np.arange(n), np.arange(n)]
    enter = np.r_[enter0, enter1 + skew]
    completion = np.r_[done + rng.integers(0, 20_000, n), done + skew + rng.integers(0, 20_000, n)]
    ref, other = clock_offsets.estimate(["a", "b"], host, group, enter, completion, np.ones(2 * n, bool), 0)
    assert ref.via == "reference" and ref.offset_ns == 0
    assert other.via == "direct" and other.consistent and other.collectives == n
    assert other.low_ns <= skew <= other.high_ns
    assert abs(other.offset_ns - skew) < 50_000
    assert other.high_ns - other.low_ns > late, "a loose bound: the midpoint would be off by ~15 ms"
