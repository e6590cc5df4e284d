"""The ``gpu`` receiver's options: the GPU's own account, read from NVML (the driver's
management library, through nvidia-ml-py) on a timer. No probes: nothing in the kernel."""

from __future__ import annotations

from pydantic import Field

from otelbpf.config.receivers.base import ReceiverConfig
from otelbpf.config.units import PositiveDuration


class GpuReceiverConfig(ReceiverConfig):
    """Device utilization, memory, power, clocks, temperature, PCIe and NVLink throughput, per
    process memory and utilization, and XID error events, sampled every ``interval``."""

    #: How often NVML is read (utilization is exported as the mean of the samples taken in
    #: each metrics interval). NVML itself averages utilization over 1/6 s to 1 s.
    interval: PositiveDuration = Field(1_000_000_000, ge=10_000_000)
    #: Per-process GPU memory and utilization (process.pid), at most ``max_processes`` series.
    per_process: bool = True
    max_processes: int = Field(1024, ge=1, le=65536)
    #: XID error events (nvmlEventTypeXidCriticalError), polled without blocking each interval.
    xid_events: bool = True
