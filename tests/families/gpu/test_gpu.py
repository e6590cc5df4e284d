"""GpuCorrelator on NVML samples built by hand, so every number is known: semantic-convention
names, units and kinds, each device's identity on every point, utilization as the mean of the
samples since the previous collection, values NVML could not give left out, per-process
series on the process's resource with process.pid, XID counts, and bounded state."""

from __future__ import annotations

import os

import pytest
from opentelemetry.sdk.metrics.export import Gauge, Sum
from opentelemetry.sdk.resources import Resource

from otelbpf.base.health import Health
from otelbpf.correlate.process_info import ProcessInfo
from otelbpf.families.gpu import correlator as gpu
from otelbpf.families.gpu.correlator import GpuCorrelator
from otelbpf.families.gpu.nvml import Device, DeviceSample, ProcessSample, Sample, XidEvent

ME = os.getpid()
GPU0 = Device(0, "GPU-aaaa", "NVIDIA H100 80GB HBM3", "00000000:3B:00.0", "580.65.06")
GPU1 = Device(1, "GPU-bbbb", "NVIDIA H100 80GB HBM3", "00000000:86:00.0", "580.65.06")
HOST = Resource({"host.name": "node-1"})


def full(device: Device, utilization: float, **kw) -> DeviceSample:
    values = dict(
        memory_busy=utilization / 2,
        memory_used=3 << 30,
        memory_total=80 << 30,
        power_w=300.0,
        energy_j=1500.0,
        sm_clock_hz=1_980_000_000,
        memory_clock_hz=2_619_000_000,
        temperature_c=45.0,
        pcie_tx_bytes_per_s=1_024_000.0,
        pcie_rx_bytes_per_s=2_048_000.0,
        nvlink_tx_bytes=1 << 20,
        nvlink_rx_bytes=2 << 20,
    )
    values.update(kw)
    return DeviceSample(device, utilization=utilization, **values)


def correlator() -> tuple[GpuCorrelator, Health]:
    health = Health()
    return GpuCorrelator(ProcessInfo(), health, resource=lambda: HOST), health


def by_name(collected) -> dict[str, list]:
    """metric name -> [(resource, metric)]"""
    out: dict[str, list] = {}
    for resource, metrics in collected:
        for metric in metrics:
            out.setdefault(metric.name, []).append((resource, metric))
    return out


def points(collected, name: str) -> list[tuple[dict, float]]:
    return [
        (dict(p.attributes), p.value)
        for _r, metric in by_name(collected).get(name, [])
        for p in metric.data.data_points
    ]


def test_every_device_metric_with_its_convention_name_unit_kind_and_identity():
    c, _health = correlator()
    c.on_sample(
        Sample(1, devices=[full(GPU0, 0.75), full(GPU1, 0.0, power_w=None, nvlink_tx_bytes=None, nvlink_rx_bytes=None)])
    )
    got = by_name(c.collect())

    expected = {  # name: (unit, kind, monotonic)
        "hw.gpu.utilization": ("1", Gauge, None),
        "otelbpf.gpu.memory_controller.utilization": ("1", Gauge, None),
        "hw.gpu.memory.usage": ("By", Sum, False),
        "hw.gpu.memory.limit": ("By", Sum, False),
        "hw.gpu.memory.utilization": ("1", Gauge, None),
        "hw.power": ("W", Gauge, None),
        "hw.energy": ("J", Sum, True),
        "otelbpf.gpu.clock.frequency": ("Hz", Gauge, None),
        "hw.temperature": ("Cel", Gauge, None),
        "otelbpf.gpu.pcie.throughput": ("By/s", Gauge, None),
        "hw.gpu.io": ("By", Sum, True),
        "hw.status": ("1", Sum, False),
    }
    assert set(got) == set(expected)
    for name, (unit, kind, monotonic) in expected.items():
        [(resource, metric)] = got[name]
        assert resource is HOST
        assert metric.unit == unit and isinstance(metric.data, kind), name
        if monotonic is not None:
            assert metric.data.is_monotonic is monotonic, name
    identity = {
        "hw.id": "GPU-aaaa",
        "hw.type": "gpu",
        "hw.name": "gpu0",
        "hw.model": "NVIDIA H100 80GB HBM3",
        "hw.vendor": "NVIDIA",
        "hw.driver_version": "580.65.06",
        "otelbpf.gpu.pci.bus_id": "00000000:3B:00.0",
    }
    c2, _ = correlator()
    c2.on_sample(Sample(1, devices=[full(GPU0, 0.75)]))
    collected = c2.collect()
    assert points(collected, "hw.gpu.utilization") == [({**identity, "hw.gpu.task": "general"}, 0.75)]
    assert points(collected, "otelbpf.gpu.memory_controller.utilization") == [(identity, 0.375)]
    assert points(collected, "hw.gpu.memory.usage") == [(identity, 3 << 30)]
    assert points(collected, "hw.gpu.memory.limit") == [(identity, 80 << 30)]
    assert points(collected, "hw.gpu.memory.utilization") == [(identity, 3 / 80)]
    assert points(collected, "hw.power") == [(identity, 300.0)]
    assert points(collected, "hw.energy") == [(identity, 1500.0)]
    assert sorted(points(collected, "otelbpf.gpu.clock.frequency"), key=lambda p: p[1]) == [
        ({**identity, "otelbpf.gpu.clock": "sm"}, 1_980_000_000),
        ({**identity, "otelbpf.gpu.clock": "memory"}, 2_619_000_000),
    ]
    assert points(collected, "hw.temperature") == [
        (
            {"hw.id": "GPU-aaaa/temperature", "hw.type": "temperature", "hw.parent": "GPU-aaaa", "hw.name": "gpu0 die"},
            45.0,
        )
    ]
    assert points(collected, "otelbpf.gpu.pcie.throughput") == [
        ({**identity, "network.io.direction": "transmit"}, 1_024_000.0),
        ({**identity, "network.io.direction": "receive"}, 2_048_000.0),
    ]
    assert points(collected, "hw.gpu.io") == [
        ({**identity, "network.io.direction": "transmit", "otelbpf.gpu.link": "nvlink"}, 1 << 20),
        ({**identity, "network.io.direction": "receive", "otelbpf.gpu.link": "nvlink"}, 2 << 20),
    ]


def test_values_nvml_could_not_give_are_left_out_not_zero():
    c, _ = correlator()
    c.on_sample(Sample(1, devices=[DeviceSample(GPU1, utilization=0.0, memory_used=0, memory_total=80 << 30)]))
    collected = c.collect()
    assert set(by_name(collected)) == {
        "hw.gpu.utilization",
        "hw.gpu.memory.usage",
        "hw.gpu.memory.limit",
        "hw.gpu.memory.utilization",
        "hw.status",
    }
    assert [v for _a, v in points(collected, "hw.gpu.utilization")] == [0.0]


def test_utilization_is_the_mean_of_the_samples_since_the_last_collection():
    c, _ = correlator()
    for u in (0.0, 0.5, 1.0, 0.5):
        c.on_sample(Sample(1, devices=[full(GPU0, u)]))
    assert [v for _a, v in points(c.collect(), "hw.gpu.utilization")] == [0.5]
    c.on_sample(Sample(2, devices=[full(GPU0, 0.9)]))
    c.on_sample(Sample(3, devices=[full(GPU0, 0.7)]))
    assert [v for _a, v in points(c.collect(), "hw.gpu.utilization")] == [pytest.approx(0.8)]
    # no sample in between (a slow sampler): the last mean again, not nothing
    assert [v for _a, v in points(c.collect(), "hw.gpu.utilization")] == [pytest.approx(0.8)]
    # the other gauges are the latest reading
    c.on_sample(Sample(4, devices=[full(GPU0, 0.1, power_w=120.0)]))
    assert [v for _a, v in points(c.collect(), "hw.power")] == [120.0]


def test_nothing_before_the_first_sample():
    c, _ = correlator()
    assert c.collect() == []


def test_per_process_series_on_the_process_resource_with_process_pid():
    c, _ = correlator()
    c.on_sample(
        Sample(
            1,
            devices=[full(GPU0, 0.6)],
            processes=[ProcessSample(ME, GPU0, 3 << 30, 0.6, 0.3), ProcessSample(ME, GPU1, 1 << 30, None, None)],
        )
    )
    c.on_sample(
        Sample(
            2,
            devices=[full(GPU0, 0.8)],
            processes=[ProcessSample(ME, GPU0, 3 << 30, 0.8, 0.4), ProcessSample(ME, GPU1, 1 << 30, None, None)],
        )
    )
    collected = c.collect()
    got = by_name(collected)
    [(resource, memory)] = got["otelbpf.gpu.process.memory.usage"]
    assert resource.attributes["process.pid"] == ME and resource is not HOST
    assert sorted((p.attributes["hw.id"], p.attributes["process.pid"], p.value) for p in memory.data.data_points) == [
        ("GPU-aaaa", ME, 3 << 30),
        ("GPU-bbbb", ME, 1 << 30),
    ]
    assert [(a["hw.id"], v) for a, v in points(collected, "otelbpf.gpu.process.utilization")] == [
        ("GPU-aaaa", pytest.approx(0.7))
    ]
    assert [(a["hw.id"], v) for a, v in points(collected, "otelbpf.gpu.process.memory_controller.utilization")] == [
        ("GPU-aaaa", pytest.approx(0.35))
    ]
    # the process left the GPU: its series go, and so does its running mean
    c.on_sample(Sample(3, devices=[full(GPU0, 0.0)]))
    assert "otelbpf.gpu.process.memory.usage" not in by_name(c.collect())
    assert c._process_means == {}


def test_xid_events_are_counted_per_device_and_code():
    c, _ = correlator()
    c.on_sample(Sample(1, devices=[full(GPU1, 0.0)], xids=[XidEvent(GPU1, 79)]))
    c.on_sample(Sample(2, devices=[full(GPU1, 0.0)], xids=[XidEvent(GPU1, 79), XidEvent(GPU1, 48)]))
    errors = points(c.collect(), "hw.errors")
    assert sorted((a["hw.id"], a["error.type"], a["otelbpf.gpu.xid"], v) for a, v in errors) == [
        ("GPU-bbbb", "xid", 48, 1),
        ("GPU-bbbb", "xid", 79, 2),
    ]
    [(_r, metric)] = by_name(c.collect())["hw.errors"]
    assert isinstance(metric.data, Sum) and metric.data.is_monotonic and metric.unit == "{error}"


def test_xid_series_are_bounded_and_the_excess_counted(monkeypatch):
    monkeypatch.setattr(gpu, "MAX_XID_SERIES", 2)
    c, health = correlator()
    c.on_sample(
        Sample(1, devices=[], xids=[XidEvent(GPU0, 13), XidEvent(GPU0, 31), XidEvent(GPU0, 43), XidEvent(GPU0, 13)])
    )
    assert sorted(a["otelbpf.gpu.xid"] for a, _v in points(c.collect(), "hw.errors")) == [13, 31]
    assert health.get("otelbpf.gpu.xid.dropped") == 1


def test_a_lost_gpu_is_failed_in_hw_status_and_its_readings_stop():
    c, _ = correlator()
    c.on_sample(Sample(1, devices=[full(GPU0, 0.5), full(GPU1, 0.5)]))
    before = points(c.collect(), "hw.status")
    assert sorted((a["hw.id"], a["hw.state"], v) for a, v in before) == [
        ("GPU-aaaa", "failed", 0),
        ("GPU-aaaa", "ok", 1),
        ("GPU-bbbb", "failed", 0),
        ("GPU-bbbb", "ok", 1),
    ]
    c.on_sample(Sample(2, devices=[full(GPU0, 0.5)], lost=[GPU1]))
    collected = c.collect()
    assert sorted((a["hw.id"], a["hw.state"], v) for a, v in points(collected, "hw.status")) == [
        ("GPU-aaaa", "failed", 0),
        ("GPU-aaaa", "ok", 1),
        ("GPU-bbbb", "failed", 1),
        ("GPU-bbbb", "ok", 0),
    ]
    assert {a["hw.id"] for a, _v in points(collected, "hw.gpu.utilization")} == {"GPU-aaaa"}
    assert all(a["hw.type"] == "gpu" for a, _v in points(collected, "hw.status"))
