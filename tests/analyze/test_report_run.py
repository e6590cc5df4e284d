"""``otelbpf run -- CMD`` on the embedded default config ends by writing the report into the file
exporter's folder (``./otelbpf-out/report.html``): the real agent, the stand-in CUDA runtime's
workload (a malloc and free per iteration), the page read back. Most of its half minute is the
probes' detach (tests wait for it: OTELBPF_DETACH=wait). The option
that turns it off is covered without BPF (test_report.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_report import charts

from harness.agent import FAKE_CUDART, REPO, WORKLOAD

pytestmark = pytest.mark.bpf


def test_run_ends_with_the_report_in_the_output_folder(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OTELBPF_RECEIVERS": "cuda"}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "otelbpf.cli",
            "run",
            "--",
            str(WORKLOAD),
            "--lib",
            str(FAKE_CUDART),
            "--iterations",
            "30",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    page_path = tmp_path / "otelbpf-out" / "report.html"
    assert "otelbpf: wrote ./otelbpf-out/report.html: " in out.stderr, out.stderr[-2000:]
    assert page_path.stat().st_mode & 0o777 == 0o600
    page = page_path.read_text()
    assert "<h2>cuda_workload (pid " in page and "cudaMemcpy" in page
    # the workload allocates and frees device memory and copies from pageable memory every
    # iteration: its two habits, ranked by the time each took (close here: 38 and 29 ms in one
    # run, the other way round in another under load)
    heads = re.findall(r'id="finding-(\d)"><h3>\d\. (\w+): cuda_workload \(pid \d+\): ~([\d.]+) (ms|µs|s) ', page)
    seconds = [float(v) * {"s": 1, "ms": 1e-3, "µs": 1e-6}[unit] for _, _, v, unit in heads[:2]]
    assert {h[1] for h in heads[:2]} == {"memory_churn", "pageable_copies"}, heads
    assert [h[0] for h in heads[:2]] == ["1", "2"] and seconds[0] >= seconds[1], heads
    # the AI flame graph from the agent's spans: 30 x (1 MiB in, 1 MiB out), every copy and sync a span
    (ai,) = [{w["key"]: w for w in f["weights"]} for f in charts(page)["flames"] if f["weights"][0]["key"] == "copied"]
    assert ai["copied"]["tree"]["value"] == 60 << 20
    assert ai["copied"]["coverage"] == "The spans hold 100% of what the metrics counted (60.0 MiB copied)"
    assert ai["sync"]["coverage"].startswith("Its synchronize calls hold 100% of what the metrics counted")
    (tl,) = charts(page)["timelines"][:1]
    assert {lane["name"] for lane in tl["lanes"]} >= {"CUDA API", "copies"}
