"""NVML samples (families/gpu/nvml.py) -> OpenTelemetry hardware metrics (``hw.gpu.*``, ``hw.*``).

Names follow the semantic conventions for GPU and common hardware metrics where they exist
(hw.gpu.utilization, hw.gpu.memory.usage, .limit, .utilization, hw.gpu.io, hw.power, hw.energy,
hw.errors, hw.temperature); what they do not name is under ``otelbpf.gpu.*``
(docs/semantic-conventions.md lists both). Every device point carries the device's identity:
``hw.id`` (its UUID), ``hw.type=gpu``, ``hw.name`` (gpu<index>), ``hw.model``, ``hw.vendor``,
``hw.driver_version`` and ``otelbpf.gpu.pci.bus_id``; per-process points add ``process.pid``
and go to that process's resource.

Utilization is exported as the mean of the samples taken since the previous collection (the
sampler reads every second, metrics leave every ten), so that the diagnosis's "how long was the
GPU idle" averages every sample, not one in ten. State is bounded: the latest sample, one
running mean per device and per (device, process) present in it, XID counts per (device, code).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from opentelemetry.sdk.metrics.export import Metric
from opentelemetry.sdk.resources import Resource

from otelbpf.base.health import Health
from otelbpf.correlate import metrics as m
from otelbpf.correlate.metrics import Attrs
from otelbpf.correlate.process_info import ProcessInfo, agent_resource
from otelbpf.correlate.spans import scope
from otelbpf.families.gpu.nvml import Device, DeviceSample, ProcessSample, Sample

#: XID counts kept at most, per (device, code): codes are a few dozen, devices a few.
MAX_XID_SERIES = 1024


def device_attributes(d: Device) -> Attrs:
    return {
        "hw.id": d.uuid,
        "hw.type": "gpu",
        "hw.name": f"gpu{d.index}",
        "hw.model": d.name,
        "hw.vendor": "NVIDIA",
        "hw.driver_version": d.driver_version,
        "otelbpf.gpu.pci.bus_id": d.pci_bus_id,
    }


@dataclass
class _Mean:
    """A running mean of utilization samples, restarted at each collection (kept when none came)."""

    total: float = 0.0
    n: int = 0
    last: float | None = None

    def add(self, value: float | None) -> None:
        if value is not None:
            self.total += value
            self.n += 1

    def take(self) -> float | None:
        if self.n:
            self.last = self.total / self.n
            self.total, self.n = 0.0, 0
        return self.last


class GpuCorrelator:
    """Holds the latest NVML sample and running means; ``collect`` turns them into metrics."""

    scope = scope("otelbpf.gpu")

    def __init__(
        self, process_info: ProcessInfo, health: Health, resource: Callable[[], Resource] = agent_resource
    ) -> None:
        self._process_info = process_info
        self._health = health
        self._resource = resource  # device metrics: the reporting agent's (host) resource
        self._lock = threading.Lock()
        self._latest: Sample | None = None
        self._means: dict[tuple[str, str], _Mean] = {}  # (hw.id, what) -> mean
        self._process_means: dict[tuple[str, int, str], _Mean] = {}  # (hw.id, pid, what) -> mean
        self._xids: Counter[tuple[Device, int]] = Counter()
        self._start_ns = time.time_ns()

    # -- the Correlator protocol: no ring records for this receiver ----------

    def on_events(self, arr: np.ndarray) -> None:
        pass

    def on_strings(self, arr: np.ndarray) -> None:
        pass

    # -- from the sampler thread ---------------------------------------------

    def on_sample(self, sample: Sample) -> None:
        with self._lock:
            self._latest = sample
            for d in sample.devices:
                self._means.setdefault((d.device.uuid, "general"), _Mean()).add(d.utilization)
                self._means.setdefault((d.device.uuid, "memory"), _Mean()).add(d.memory_busy)
            present = {(p.device.uuid, p.pid) for p in sample.processes}
            for key in [k for k in self._process_means if k[:2] not in present]:
                del self._process_means[key]  # the process left the device
            for p in sample.processes:
                self._process_means.setdefault((p.device.uuid, p.pid, "general"), _Mean()).add(p.utilization)
                self._process_means.setdefault((p.device.uuid, p.pid, "memory"), _Mean()).add(p.memory_busy)
            for x in sample.xids:
                if (x.device, x.xid) in self._xids or len(self._xids) < MAX_XID_SERIES:
                    self._xids[(x.device, x.xid)] += 1
                else:
                    self._health.add("otelbpf.gpu.xid.dropped", reason="too_many_series")

    # -- metrics -------------------------------------------------------------

    def collect(self) -> list[tuple[Resource, list[Metric]]]:
        with self._lock:
            sample = self._latest
            if sample is None:
                return []
            means = {k: v.take() for k, v in self._means.items()}
            process_means = {k: v.take() for k, v in self._process_means.items()}
            xids = dict(self._xids)
        now = time.time_ns()
        out: list[tuple[Resource, list[Metric]]] = []
        device_metrics = self._device_metrics(sample.devices, means, xids, now)
        status = self._status(sample, now)
        if status is not None:
            device_metrics.append(status)
        if device_metrics:
            out.append((self._resource(), device_metrics))
        by_pid: dict[int, list[ProcessSample]] = {}
        for p in sample.processes:
            by_pid.setdefault(p.pid, []).append(p)
        for pid, procs in sorted(by_pid.items()):
            metrics = self._process_metrics(procs, process_means, now)
            if metrics:
                out.append((self._process_info.resource(pid), metrics))
        return out

    def _device_metrics(
        self,
        devices: list[DeviceSample],
        means: dict[tuple[str, str], float | None],
        xids: dict[tuple[Device, int], int],
        now: int,
    ) -> list[Metric]:
        def points(value: Callable[[DeviceSample], float | None], **extra: str) -> list[tuple[Attrs, float]]:
            return [({**device_attributes(d.device), **extra}, v) for d in devices if (v := value(d)) is not None]

        def mean(what: str) -> Callable[[DeviceSample], float | None]:
            return lambda d: means.get((d.device.uuid, what))

        start = self._start_ns
        found = [
            m.gauge(
                "hw.gpu.utilization",
                "1",
                "Fraction of time the GPU ran a kernel (NVML), mean of the samples since the last export",
                points(mean("general"), **{"hw.gpu.task": "general"}),
                now,
            ),
            m.gauge(
                "otelbpf.gpu.memory_controller.utilization",
                "1",
                "Fraction of time device memory was read or written (NVML), mean since the last export",
                points(mean("memory")),
                now,
            ),
            m.cumulative_sum(
                "hw.gpu.memory.usage",
                "By",
                "GPU memory used",
                points(lambda d: d.memory_used),
                start,
                now,
                monotonic=False,
            ),
            m.cumulative_sum(
                "hw.gpu.memory.limit",
                "By",
                "Size of the GPU memory",
                points(lambda d: d.memory_total),
                start,
                now,
                monotonic=False,
            ),
            m.gauge(
                "hw.gpu.memory.utilization",
                "1",
                "Fraction of GPU memory used",
                points(
                    lambda d: d.memory_used / d.memory_total if d.memory_used is not None and d.memory_total else None
                ),
                now,
            ),
            m.gauge("hw.power", "W", "Power drawn by the GPU", points(lambda d: d.power_w), now),
            m.cumulative_sum(
                "hw.energy",
                "J",
                "Energy consumed by the GPU since its driver loaded",
                points(lambda d: d.energy_j),
                start,
                now,
            ),
            m.gauge(
                "otelbpf.gpu.clock.frequency",
                "Hz",
                "GPU clock frequency, by clock",
                points(lambda d: d.sm_clock_hz, **{"otelbpf.gpu.clock": "sm"})
                + points(lambda d: d.memory_clock_hz, **{"otelbpf.gpu.clock": "memory"}),
                now,
            ),
            m.gauge(
                "hw.temperature",
                "Cel",
                "GPU die temperature",
                [
                    (
                        {
                            "hw.id": f"{d.device.uuid}/temperature",
                            "hw.type": "temperature",
                            "hw.parent": d.device.uuid,
                            "hw.name": f"gpu{d.device.index} die",
                        },
                        d.temperature_c,
                    )
                    for d in devices
                    if d.temperature_c is not None
                ],
                now,
            ),
            m.gauge(
                "otelbpf.gpu.pcie.throughput",
                "By/s",
                "PCIe throughput (NVML's 20 ms window), by direction",
                points(lambda d: d.pcie_tx_bytes_per_s, **{"network.io.direction": "transmit"})
                + points(lambda d: d.pcie_rx_bytes_per_s, **{"network.io.direction": "receive"}),
                now,
            ),
            m.cumulative_sum(
                "hw.gpu.io",
                "By",
                "NVLink data bytes over all links since the driver loaded",
                points(
                    lambda d: d.nvlink_tx_bytes, **{"network.io.direction": "transmit", "otelbpf.gpu.link": "nvlink"}
                )
                + points(
                    lambda d: d.nvlink_rx_bytes, **{"network.io.direction": "receive", "otelbpf.gpu.link": "nvlink"}
                ),
                start,
                now,
            ),
            m.cumulative_sum(
                "hw.errors",
                "{error}",
                "XID error events reported by the driver",
                [
                    ({**device_attributes(dev), "error.type": "xid", "otelbpf.gpu.xid": xid}, n)
                    for (dev, xid), n in sorted(xids.items(), key=lambda kv: (kv[0][0].index, kv[0][1]))
                ],
                start,
                now,
            ),
        ]
        return [x for x in found if x is not None]

    def _status(self, sample: Sample, now: int) -> Metric | None:
        """``hw.status`` per device: 1 for its state (``ok`` while read, ``failed`` once lost), 0 for the other."""
        states = [(d.device, "ok") for d in sample.devices] + [(d, "failed") for d in sample.lost]
        return m.cumulative_sum(
            "hw.status",
            "1",
            "Operational status of the GPU: 1 for its state, 0 for the other",
            [
                ({**device_attributes(dev), "hw.state": state}, int(state == current))
                for dev, current in sorted(states, key=lambda s: s[0].index)
                for state in ("ok", "failed")
            ],
            self._start_ns,
            now,
            monotonic=False,
        )

    def _process_metrics(
        self, procs: list[ProcessSample], means: dict[tuple[str, int, str], float | None], now: int
    ) -> list[Metric]:
        def points(value: Callable[[ProcessSample], float | None]) -> list[tuple[Attrs, float]]:
            return [
                ({**device_attributes(p.device), "process.pid": p.pid}, v) for p in procs if (v := value(p)) is not None
            ]

        found = [
            m.cumulative_sum(
                "otelbpf.gpu.process.memory.usage",
                "By",
                "GPU memory the process holds",
                points(lambda p: p.memory_used),
                self._start_ns,
                now,
                monotonic=False,
            ),
            m.gauge(
                "otelbpf.gpu.process.utilization",
                "1",
                "Fraction of time the process ran a kernel on the GPU (NVML), mean since the last export",
                points(lambda p: means.get((p.device.uuid, p.pid, "general"))),
                now,
            ),
            m.gauge(
                "otelbpf.gpu.process.memory_controller.utilization",
                "1",
                "Fraction of time the process read or wrote device memory (NVML), mean since the last export",
                points(lambda p: means.get((p.device.uuid, p.pid, "memory"))),
                now,
            ),
        ]
        return [x for x in found if x is not None]
