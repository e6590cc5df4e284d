"""`otelbpf summary` over files the real file exporters wrote from known spans and metrics."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from opentelemetry.sdk.metrics.export import MetricsData, ResourceMetrics, ScopeMetrics
from opentelemetry.sdk.resources import Resource

from harness.agent import REPO
from otelbpf.analyze.summary import summarize
from otelbpf.base.losses import explain
from otelbpf.correlate import metrics as m
from otelbpf.correlate.spans import make_span, scope
from otelbpf.export.jsonfile import FileMetricExporter, FileSpanExporter

JOB = Resource({"service.name": "trainer", "process.pid": 4242, "process.command_line": "python train.py --epochs 2"})
IDLE = Resource({"service.name": "idle", "process.pid": 77})
AGENT = Resource({"service.name": "otelbpf", "process.pid": 1})
CUDA, OWN = scope("otelbpf.cuda"), scope("otelbpf")
T0 = 1_700_000_000_000_000_000


def job_metrics(now: int, launches: int) -> list:
    sync = m.HistogramState()
    sync.add(np.array([0.001, 0.003]))
    fn = {"cuda.api.function": "cudaLaunchKernel"}
    return [
        m.cumulative_sum(
            "cuda.kernel.launches",
            "{launch}",
            "",
            [(fn, launches), ({"cuda.api.function": "cudaGraphLaunch"}, 2)],
            T0,
            now,
        ),
        m.gauge(
            "cuda.kernel.launches.top",
            "{launch}",
            "",
            [
                ({**fn, "cuda.kernel.name": "vector_add(float*, float*, float*, int)"}, launches - 4),
                ({**fn, "cuda.kernel.name": "ml::softmax_forward(float*, float const*, int)"}, 4),
            ],
            now,
        ),
        m.cumulative_sum(
            "otelbpf.cuda.kernel_launches.named",
            "{launch}",
            "",
            [
                ({"otelbpf.name_source": "registration"}, launches - 2),
                ({"otelbpf.name_source": "launch_site"}, 2),
            ],
            T0,
            now,
        ),
        m.cumulative_sum(
            "cuda.memcpy.bytes",
            "By",
            "",
            [
                ({"cuda.memcpy.direction": "H2D"}, 3 << 20),
                ({"cuda.memcpy.direction": "D2H"}, 2048),
            ],
            T0,
            now,
        ),
        m.gauge("cuda.memory.in_use", "By", "", [({}, 512 << 10)], now),
        m.gauge("cuda.memory.high_water", "By", "", [({}, 3 << 19)], now),
        m.histogram(
            "cuda.sync.duration", "s", "", [sync.point({"cuda.api.function": "cudaStreamSynchronize"}, T0, now)]
        ),
        m.cumulative_sum(
            "cuda.api.errors",
            "{call}",
            "",
            [
                (
                    {
                        "cuda.api.function": "cudaMalloc",
                        "cuda.error.code": 2,
                        "cuda.error.name": "cudaErrorMemoryAllocation",
                    },
                    1,
                ),
                (
                    {
                        "cuda.api.function": "cudaMemcpy",
                        "cuda.error.code": 35,
                        "cuda.error.name": "cudaErrorInsufficientDriver",
                    },
                    6,
                ),
            ],
            T0,
            now,
        ),
    ]


def agent_metrics(now: int) -> list:
    return [
        m.cumulative_sum("otelbpf.events.received", "1", "", [({"ring": "events"}, 120)], T0, now),
        m.cumulative_sum("otelbpf.events.lost", "1", "", [({"reason": "string_ring_full"}, 3)], T0, now),
        m.cumulative_sum(
            "otelbpf.export.dropped", "1", "", [({"reason": "queue_full", "signal": "traces"}, 9)], T0, now
        ),
    ]


def export_metrics(directory: Path, *entries: tuple[Resource, object, list], rotate_bytes: int = 64 << 20) -> None:
    exporter = FileMetricExporter(str(directory), rotate_bytes=rotate_bytes)
    exporter.export(MetricsData([ResourceMetrics(res, [ScopeMetrics(sc, ms, "")], "") for res, sc, ms in entries]))
    exporter.shutdown()


def span(name: str, start: int, duration_ns: int, error: str | None = None, resource: Resource = JOB):
    return make_span(
        name,
        resource=resource,
        scope=CUDA,
        start_ns=start,
        end_ns=start + duration_ns,
        attributes={"cuda.api.function": name},
        error=error,
    )


@pytest.fixture
def telemetry(tmp_path: Path) -> Path:
    export_metrics(tmp_path, (JOB, CUDA, job_metrics(T0 + 10**9, launches=10)), (AGENT, OWN, agent_metrics(T0 + 10**9)))
    # A later export carries the totals the summary must show.
    export_metrics(tmp_path, (JOB, CUDA, job_metrics(T0 + 2 * 10**9, launches=20)))
    spans = FileSpanExporter(str(tmp_path))
    spans.export(
        [
            span("cudaMemcpy", T0, 2_000_000),
            span("cudaMemcpy", T0, 500_000, error="cudaErrorInsufficientDriver (35)"),
            span("cudaStreamSynchronize", T0, 7_500_000),
        ]
    )
    spans.export([span("cudaMemcpy", T0, 1_000), span("cudaFree", T0, 10, resource=IDLE)])
    spans.shutdown()
    return tmp_path


def run(directory: Path) -> tuple[int, str]:
    out = io.StringIO()
    return summarize(str(directory), out), out.getvalue()


def test_summary_reports_each_process_then_the_agent(telemetry: Path) -> None:
    rc, text = run(telemetry)
    assert rc == 0
    assert text == (
        "otelbpf lost 3 records (string_ring_full 3): what follows may lack names or calls; the causes "
        "and fixes are under the otelbpf block at the end\n"
        "\n"
        "idle (pid 77)\n"
        "  spans: cudaFree 1\n"
        "    slowest: cudaFree 0.000 ms\n"
        "\n"
        "trainer (pid 4242)\n"
        "  command: python train.py --epochs 2\n"
        "  kernel launches: 22 (cudaLaunchKernel 20, cudaGraphLaunch 2)\n"
        "  kernel names: 90.0% of launches named (registration 90.0%, launch_site 10.0%)\n"
        "  top kernels:\n"
        "            16  vector_add(float*, float*, float*, int)  [cudaLaunchKernel]\n"
        "             4  ml::softmax_forward(float*, float const*, int)  [cudaLaunchKernel]\n"
        "  bytes copied: D2H 2.0 KiB, H2D 3.0 MiB\n"
        "  device memory: high-water 1.5 MiB, in use at last export 512.0 KiB\n"
        "  cudaStreamSynchronize: 2 waits, mean 2.000 ms, max 3.000 ms\n"
        "  errors:\n"
        "             6  cudaMemcpy -> cudaErrorInsufficientDriver (35)\n"
        "             1  cudaMalloc -> cudaErrorMemoryAllocation (2)\n"
        "  spans: cudaMemcpy 3 (1 errors), cudaStreamSynchronize 1\n"
        "    slowest: cudaStreamSynchronize 7.500 ms\n"
        "    slowest: cudaMemcpy 2.000 ms\n"
        "    slowest: cudaMemcpy 0.500 ms\n"
        "\n"
        "otelbpf (pid 1)\n"
        "  otelbpf.events.received{ring=events}: 120\n"
        "  otelbpf.events.lost{reason=string_ring_full}: 3\n"
        f"    {explain('string_ring_full')}\n"
        "  otelbpf.export.dropped{reason=queue_full,signal=traces}: 9\n"
        "\n"
    )


def test_rotated_files_are_read_too(tmp_path: Path) -> None:
    # ~0.6 MiB per request into 1 MiB files: the first two requests end up in a rotated file.
    for i in range(3):
        export_metrics(
            tmp_path,
            (JOB, CUDA, job_metrics(T0 + i * 10**9, launches=10 + i)),
            (AGENT, OWN, [m.gauge("padding", "1", "x" * 600_000, [({}, 0)], T0)]),
            rotate_bytes=1 << 20,
        )
    assert len(list(tmp_path.glob("metrics-*.jsonl"))) == 1
    rc, text = run(tmp_path)
    assert rc == 0
    assert "  kernel launches: 14 (cudaLaunchKernel 12, cudaGraphLaunch 2)\n" in text


def test_a_malformed_line_is_exit_2_naming_file_and_line(telemetry: Path) -> None:
    with open(telemetry / "traces.jsonl", "a") as f:
        f.write('{"resourceSpans": [\n')
    rc, text = run(telemetry)
    assert rc == 2
    assert text.startswith(f"otelbpf summary: {telemetry / 'traces.jsonl'}:3: not OTLP-JSON: ")


@pytest.mark.parametrize(
    ("name", "line", "reason"),
    [
        ("traces.jsonl", "[1, 2]", "a JSON list, not an object"),
        (
            "traces.jsonl",
            '{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "x"}]}]}]}',
            "no field 'endTimeUnixNano'",
        ),
        ("metrics.jsonl", '{"resourceMetrics": 5}', "'int' object is not iterable"),
    ],
    ids=["not-an-object", "span-without-times", "wrong-type"],
)
def test_json_that_is_not_otlp_is_exit_2_naming_file_and_line(
    telemetry: Path, name: str, line: str, reason: str
) -> None:
    with open(telemetry / name, "a") as f:
        f.write(line + "\n")
    rc, text = run(telemetry)
    assert (rc, text) == (2, f"otelbpf summary: {telemetry / name}:3: not OTLP-JSON: {reason}\n")


def test_missing_and_empty_directories(tmp_path: Path) -> None:
    rc, text = run(tmp_path / "absent")
    assert rc == 2
    assert (
        text == f"otelbpf summary: {tmp_path / 'absent'} does not exist (run the agent with the file exporter first)\n"
    )
    rc, text = run(tmp_path)
    assert (rc, text) == (1, f"otelbpf summary: no telemetry in {tmp_path}\n")


def test_cli_prints_the_summary(telemetry: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "otelbpf.cli", "summary", str(telemetry)], capture_output=True, text=True, cwd=REPO
    )
    assert out.returncode == 0, out.stderr
    assert "trainer (pid 4242)\n" in out.stdout
    assert "  kernel launches: 22 (cudaLaunchKernel 20, cudaGraphLaunch 2)\n" in out.stdout
