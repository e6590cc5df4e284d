"""The report's per-process timeline over spans the real file exporter wrote: a lane per kind,
in order, on the process's own time axis, and bounded (the longest spans of a lane kept, the
page saying how many of how many)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_diagnose import MS, T0, Trace
from test_report import charts

from otelbpf.analyze import report_timeline
from otelbpf.analyze.report import render
from otelbpf.correlate.spans import make_span, scope


def job(directory: Path, syncs: int) -> None:
    """``syncs`` synchronizes of 10, 20, ... us, a pageable copy, a launch; the thread off the
    CPU on a futex for 3 ms; one NCCL all-reduce."""
    t = Trace(31)
    for i in range(1, syncs + 1):
        t.call("cudaStreamSynchronize", i * 10_000)
    t.call("cudaMemcpy", MS, **{"cuda.memcpy.bytes": 4096, "cuda.memcpy.direction": "H2D"})
    t.call("cudaLaunchKernel", 0, **{"cuda.kernel.name": "gemm"})
    t.spans.append(
        make_span(
            "off_cpu",
            resource=t.res,
            scope=scope("otelbpf.sched"),
            start_ns=t.t,
            end_ns=t.t + 3 * MS,
            attributes={"thread.name": "train", "otelbpf.sched.reason": "futex"},
        )
    )
    t.spans.append(
        make_span(
            "ncclAllReduce",
            resource=t.res,
            scope=scope("otelbpf.nccl"),
            start_ns=t.t + 4 * MS,
            end_ns=t.t + 6 * MS,
            attributes={},
        )
    )
    t.t += 6 * MS
    t.export(directory)


def test_lanes_in_order_on_the_process_time_axis(tmp_path: Path) -> None:
    job(tmp_path, syncs=10)
    page, _f, _p = render(str(tmp_path))
    (tl,) = charts(page)["timelines"]
    assert tl["t0"] == T0 and "Bounded" not in page
    lanes = {lane["name"]: lane for lane in tl["lanes"]}
    assert list(lanes) == ["off-CPU", "CUDA API", "sync", "copies", "NCCL"]
    assert [s[1] for s in lanes["sync"]["spans"]] == [i / 100 for i in range(1, 11)]  # ms, in time order
    assert lanes["copies"]["spans"][0][1:] == [1.0, "cudaMemcpy H2D 4096 B"]
    assert lanes["CUDA API"]["spans"][0][2] == "cudaLaunchKernel gemm"
    assert lanes["off-CPU"]["spans"][0][1:] == [3.0, "train: futex"]
    (nccl,) = lanes["NCCL"]["spans"]
    assert nccl[0] + nccl[1] == pytest.approx(tl["end"])


def test_a_lane_keeps_its_longest_spans_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(report_timeline, "MAX_PER_LANE", 50)
    job(tmp_path, syncs=120)
    page, _f, _p = render(str(tmp_path))
    (tl,) = charts(page)["timelines"]
    (sync,) = [lane for lane in tl["lanes"] if lane["name"] == "sync"]
    assert (sync["total"], sync["shown"]) == (120, 50)
    assert sorted(s[1] for s in sync["spans"]) == [i / 100 for i in range(71, 121)]
    assert "Bounded: sync: the 50 longest of 120 spans." in page
