"""otelbpf.analyze.gpu_idle over what the agent writes: the gpu correlator's metrics, through the
real file exporter, read back as the diagnosis reads them; and `otelbpf diagnose` printing the
GPUs' idle time above its findings."""

from __future__ import annotations

import io
import time

import pytest
from opentelemetry.sdk.metrics.export import MetricsData, ResourceMetrics, ScopeMetrics

from otelbpf.analyze import diagnose
from otelbpf.analyze.gpu_idle import gpu_idle, write_gpu_idle
from otelbpf.base.health import Health
from otelbpf.correlate.process_info import ProcessInfo
from otelbpf.export.jsonfile import FileMetricExporter
from otelbpf.families.gpu.correlator import GpuCorrelator
from otelbpf.families.gpu.nvml import Device, DeviceSample, Sample

GPU0 = Device(0, "GPU-aaaa", "NVIDIA H100 80GB HBM3", "00000000:3B:00.0", "580")
GPU1 = Device(1, "GPU-bbbb", "NVIDIA H100 80GB HBM3", "00000000:86:00.0", "580")


def export_run(directory, intervals: list[list[tuple[float, float]]]) -> None:
    """One export per interval; each interval's samples are (GPU 0, GPU 1) utilizations."""
    correlator = GpuCorrelator(ProcessInfo(), Health())
    exporter = FileMetricExporter(str(directory))
    for samples in intervals:
        for u0, u1 in samples:
            correlator.on_sample(
                Sample(time.time_ns(), devices=[DeviceSample(GPU0, utilization=u0), DeviceSample(GPU1, utilization=u1)])
            )
        resource_metrics = [
            ResourceMetrics(resource, [ScopeMetrics(correlator.scope, metrics, "")], "")
            for resource, metrics in correlator.collect()
        ]
        exporter.export(MetricsData(resource_metrics))
        time.sleep(0.01)
    exporter.shutdown()


def test_idle_share_is_one_minus_the_mean_over_the_run_per_gpu(tmp_path):
    # GPU 0: interval means 0.2 (0.0 and 0.4) and 0.6; GPU 1 idle throughout
    export_run(tmp_path, [[(0.0, 0.0), (0.4, 0.0)], [(0.6, 0.0)]])
    gpu0, gpu1 = gpu_idle(str(tmp_path))
    assert (gpu0.hw_id, gpu0.name, gpu0.points) == ("GPU-aaaa", "gpu0 NVIDIA H100 80GB HBM3", 2)
    assert gpu0.mean_utilization == pytest.approx(0.4) and gpu0.idle == pytest.approx(0.6)
    assert (gpu1.hw_id, gpu1.idle, gpu1.points) == ("GPU-bbbb", 1.0, 2)
    assert 0 < gpu0.seconds < 5

    out = io.StringIO()
    write_gpu_idle([gpu0, gpu1], out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "GPU idle time (NVML, 1 - mean utilization over the run):"
    assert lines[1].startswith("  gpu0 NVIDIA H100 80GB HBM3 (GPU-aaaa): idle 60% of ")
    assert lines[1].endswith("(mean utilization 40% over 2 metrics intervals)")
    assert "(GPU-bbbb): idle 100% of" in lines[2]


def test_a_folder_without_nvml_readings_gives_nothing_and_prints_nothing(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"resourceMetrics": []}\n')
    assert gpu_idle(str(tmp_path)) == []
    out = io.StringIO()
    write_gpu_idle([], out)
    assert out.getvalue() == ""


def test_diagnose_states_the_idle_time_before_the_causes(tmp_path):
    export_run(tmp_path, [[(0.25, 0.0)]])
    out, err = io.StringIO(), io.StringIO()
    assert diagnose.run(str(tmp_path), out, err) == 0, err.getvalue()
    text = out.getvalue()
    assert text.startswith("GPU idle time (NVML, 1 - mean utilization over the run):\n  gpu0 ")
    assert "idle 75%" in text and text.index("idle 75%") < text.index("no cause of GPU idle time")
