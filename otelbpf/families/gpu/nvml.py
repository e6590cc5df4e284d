"""NVML, the GPU driver's management library, read through nvidia-ml-py (``pynvml``): the source
of the ``gpu`` receiver.

The GPU's own account of itself, which no probe sees: how busy it was, its memory, power,
clocks, temperature, PCIe and NVLink traffic, which processes hold memory on it and how busy
each kept it, and XID error events. A sampler thread reads every device each ``interval`` and
hands one ``Sample`` to ``deliver``; nothing here knows of OpenTelemetry (families/gpu/correlator.py
builds the metrics).

The receiver has no BPF: ``nvml_family`` is a probe family without C or probes whose load and
unload hooks start and stop the sampler, so the agent and the sensor treat it like any other.

Nothing here may stop the agent. Without a driver (``nvmlInit`` fails: no libnvidia-ml.so.1, or
the kernel module is not loaded) the sampler logs once, counts it and ends. A call that fails is
counted in ``otelbpf.gpu.nvml.failures{function, reason}`` and its value left out of the sample:
one a device does not support (``NOT_SUPPORTED``) is not asked again; a device that is gone
(``GPU_IS_LOST``) is not read again.
"""

from __future__ import annotations

import ctypes
import logging
import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from otelbpf.base.health import Health
from otelbpf.base.threadname import name_os_thread
from otelbpf.sensor.family import ProbeFamily

log = logging.getLogger(__name__)

#: NVML return codes this module tells apart (nvml.h; pynvml's NVML_ERROR_* have the same values).
NOT_SUPPORTED, NOT_FOUND, TIMEOUT, GPU_IS_LOST = 3, 6, 10, 15
#: NVLink data throughput counters (cumulative KiB since the driver loaded); scope UINT_MAX: all links.
NVLINK_DATA_TX, NVLINK_DATA_RX, ALL_LINKS = 138, 139, 0xFFFFFFFF
#: nvmlEventTypeXidCriticalError
XID_CRITICAL_ERROR = 0x8
#: XID events read per sample at most: a storm is left in NVML's queue for the next sample.
MAX_EVENTS_PER_SAMPLE = 64
#: nvmlValue_t member by nvmlValueType_t
_VALUE_FIELD = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
#: NVML reports PCIe throughput in KB/s, 1 KB being 1024 bytes.
KB = 1024
FAILURES = "otelbpf.gpu.nvml.failures"


@dataclass(frozen=True)
class Device:
    """One GPU as NVML names it, read once at start."""

    index: int
    uuid: str  # GPU-xxxxxxxx-...: the hw.id, stable across reboots and index changes
    name: str  # the model, e.g. "NVIDIA H100 80GB HBM3"
    pci_bus_id: str  # 00000000:3B:00.0
    driver_version: str


@dataclass
class DeviceSample:
    """One device's readings; None where NVML could not say (unsupported, failed)."""

    device: Device
    utilization: float | None = None  # fraction of the sample period a kernel ran
    memory_busy: float | None = None  # fraction of it device memory was read or written
    memory_used: int | None = None  # bytes
    memory_total: int | None = None
    power_w: float | None = None
    energy_j: float | None = None  # since the driver loaded
    sm_clock_hz: int | None = None
    memory_clock_hz: int | None = None
    temperature_c: float | None = None
    pcie_tx_bytes_per_s: float | None = None  # NVML's own 20 ms window
    pcie_rx_bytes_per_s: float | None = None
    nvlink_tx_bytes: int | None = None  # cumulative, all links
    nvlink_rx_bytes: int | None = None


@dataclass(frozen=True)
class ProcessSample:
    """A process on a device: the memory it holds, and the mean of NVML's utilization samples
    of it since the previous read (None when NVML had none)."""

    pid: int
    device: Device
    memory_used: int | None
    utilization: float | None
    memory_busy: float | None


@dataclass(frozen=True)
class XidEvent:
    device: Device
    xid: int


@dataclass
class Sample:
    time_ns: int  # wall clock
    devices: list[DeviceSample] = field(default_factory=list)
    processes: list[ProcessSample] = field(default_factory=list)
    xids: list[XidEvent] = field(default_factory=list)
    lost: list[Device] = field(default_factory=list)  # NVML_ERROR_GPU_IS_LOST: no longer read


def _reason(exc: BaseException) -> str:
    """``NVMLError_GpuIsLost`` -> ``gpu_is_lost``: a low-cardinality label that needs no call
    into the library (pynvml's ``str()`` asks NVML for the text)."""
    name = type(exc).__name__.removeprefix("NVMLError_").removeprefix("NVMLError")
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower() or f"code_{getattr(exc, 'value', '?')}"


#: The library pynvml loads (by this name, through the loader's search path).
LIBRARY = "libnvidia-ml.so.1"


class _NoLibrary(Exception):
    """No libnvidia-ml.so.1 on the loader's path: no driver installed."""


def _text(value: str | bytes) -> str:
    """pynvml hands back str for most strings, bytes inside structs (nvmlPciInfo_t.busId)."""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _nvml() -> Any:
    """pynvml, once the driver's library is known to load: without a driver the receiver
    costs one failed dlopen (~0.3 ms), not pynvml's import (17 ms of CPU, 3.4 MiB resident)."""
    try:
        ctypes.CDLL(LIBRARY)  # the loader keeps it: pynvml's own CDLL gets the same handle
    except OSError as exc:
        raise _NoLibrary(str(exc)) from exc
    import pynvml  # untyped: its module is Any here

    return pynvml


def probe() -> tuple[bool, str]:
    """Can NVML be opened here? (True, "driver 580.65.06, 8 GPUs") or (False, why): the doctor's
    check, and nothing else (the sampler opens NVML on its own thread)."""
    try:
        nvml = _nvml()
        nvml.nvmlInit()
    except _NoLibrary:
        return False, "library_not_found"
    except nvml.NVMLError as exc:
        return False, _reason(exc)
    try:
        version = nvml.nvmlSystemGetDriverVersion()
        return True, f"driver {version}, {nvml.nvmlDeviceGetCount()} GPU(s)"
    except nvml.NVMLError as exc:
        return False, _reason(exc)
    finally:
        nvml.nvmlShutdown()


class NvmlSampler:
    """Reads every device each ``interval_s`` on its own thread, hands each ``Sample`` to ``deliver``.

    State is bounded: per device its handle, last process-utilization timestamp, what it does not
    support; processes are cut at ``max_processes`` per sample (the rest counted in
    ``otelbpf.gpu.processes.dropped``).
    """

    def __init__(
        self,
        deliver: Callable[[Sample], None],
        health: Health,
        *,
        interval_s: float = 1.0,
        per_process: bool = True,
        max_processes: int = 1024,
        xid_events: bool = True,
    ) -> None:
        self._deliver = deliver
        self._health = health
        self._interval_s = interval_s
        self._per_process = per_process
        self._max_processes = max_processes
        self._xid_events = xid_events
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: Any = None
        self._handles: list[tuple[Device, Any]] = []
        self._by_handle: dict[int | None, Device] = {}
        self._unsupported: set[tuple[int, str]] = set()
        self._lost: set[int] = set()
        self._last_seen_us: dict[int, int] = defaultdict(int)
        self._events: Any = None
        #: Why NVML could not be opened ("library_not_found", "driver_not_loaded", ...), None if it was.
        self.unavailable: str | None = None
        self.devices: list[Device] = []
        #: Set once NVML was opened (or could not be) and the first sample delivered.
        self.ready = threading.Event()

    # -- life cycle -----------------------------------------------------

    def start(self) -> None:
        """Returns at once: NVML is opened on the sampler's thread (nvmlInit takes seconds on
        a host with many GPUs)."""
        self._thread = threading.Thread(target=self._run, name="otelbpf-gpu", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._nvml is None or (self._thread is not None and self._thread.is_alive()):
            return  # never opened, or stuck in a call: NVML is left to the process's exit
        if self._events is not None:
            self._call(None, "nvmlEventSetFree", self._nvml.nvmlEventSetFree, self._events)
            self._events = None
        self._call(None, "nvmlShutdown", self._nvml.nvmlShutdown)
        self._nvml = None

    def _run(self) -> None:
        name_os_thread("otelbpf-gpu")
        try:
            try:
                opened = self._open()
            except Exception:  # enumerating the devices went wrong in a way not foreseen: idle, counted
                log.exception("gpu: opening NVML failed; the gpu receiver stays idle")
                self._health.add(FAILURES, function="open", reason="exception")
                opened = False
            if not opened:
                return
            next_at = time.monotonic()
            while True:
                try:
                    self._deliver(self.sample())
                except Exception:  # a reading this module did not foresee: counted, the next one tried
                    log.exception("gpu: an NVML sample failed")
                    self._health.add(FAILURES, function="sample", reason="exception")
                self.ready.set()
                # on the interval's grid; a read slower than the interval skips ticks, never bursts
                next_at = max(next_at + self._interval_s, time.monotonic())
                if self._stop.wait(next_at - time.monotonic()):
                    return
        finally:
            self.ready.set()

    def _open(self) -> bool:
        try:
            nvml = _nvml()
            nvml.nvmlInit()
        except Exception as exc:  # _NoLibrary, or pynvml's NVMLError (or its import failing): never fatal
            self.unavailable = "library_not_found" if isinstance(exc, _NoLibrary) else _reason(exc)
            self._health.add(FAILURES, function="nvmlInit", reason=self.unavailable)
            log.info(
                "gpu: NVML cannot be opened (%s): no GPU driver here, the gpu receiver stays idle", self.unavailable
            )
            return False
        self._nvml = nvml
        version = self._call(None, "nvmlSystemGetDriverVersion", nvml.nvmlSystemGetDriverVersion) or ""
        count = self._call(None, "nvmlDeviceGetCount", nvml.nvmlDeviceGetCount) or 0
        for index in range(count):
            handle = self._call(None, "nvmlDeviceGetHandleByIndex", nvml.nvmlDeviceGetHandleByIndex, index)
            if handle is None:
                continue
            uuid = self._call(None, "nvmlDeviceGetUUID", nvml.nvmlDeviceGetUUID, handle)
            if uuid is None:  # no identity, no series
                continue
            name = self._call(None, "nvmlDeviceGetName", nvml.nvmlDeviceGetName, handle) or ""
            pci = self._call(None, "nvmlDeviceGetPciInfo", nvml.nvmlDeviceGetPciInfo, handle)
            bus_id = _text(pci.busId) if pci is not None else ""
            device = Device(index, uuid, name, bus_id, version)
            self._handles.append((device, handle))
            self._by_handle[ctypes.cast(handle, ctypes.c_void_p).value] = device
        self.devices = [d for d, _h in self._handles]
        if self._xid_events and self._handles:
            self._events = self._call(None, "nvmlEventSetCreate", nvml.nvmlEventSetCreate)
            if self._events is not None:
                for device, handle in self._handles:
                    self._call(
                        device,
                        "nvmlDeviceRegisterEvents",
                        nvml.nvmlDeviceRegisterEvents,
                        handle,
                        XID_CRITICAL_ERROR,
                        self._events,
                    )
        log.info(
            "gpu: NVML driver %s, %d GPU(s): %s",
            version,
            len(self.devices),
            ", ".join(f"{d.index} {d.name} {d.pci_bus_id}" for d in self.devices) or "none",
        )
        return True

    # -- reading ----------------------------------------------------------

    def _call(self, device: Device | None, function: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, or None where it fails: counted, and remembered where the answer will not change."""
        key = (device.index if device is not None else -1, function)
        if key in self._unsupported or (device is not None and device.index in self._lost):
            return None
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            self._failed(device, function, exc)
            return None

    def _failed(self, device: Device | None, function: str, exc: BaseException) -> None:
        code = getattr(exc, "value", None)
        if code == NOT_SUPPORTED:
            self._unsupported.add((device.index if device is not None else -1, function))
        elif code == GPU_IS_LOST and device is not None:
            self._lost.add(device.index)
            log.error("gpu: GPU %d (%s, %s) is lost: no longer read", device.index, device.uuid, device.pci_bus_id)
        self._health.add(FAILURES, function=function, reason=_reason(exc))

    def sample(self) -> Sample:
        """Read every device once (the sampler thread's work; callable directly)."""
        out = Sample(time.time_ns())
        for device, handle in self._handles:
            reading = None if device.index in self._lost else self._device(device, handle)
            if reading is None or device.index in self._lost:  # lost, maybe while being read
                out.lost.append(device)
                continue
            out.devices.append(reading)
            if self._per_process:
                out.processes.extend(self._processes(device, handle))
        if len(out.processes) > self._max_processes:
            self._health.add("otelbpf.gpu.processes.dropped", len(out.processes) - self._max_processes)
            del out.processes[self._max_processes :]
        if self._events is not None:
            out.xids = self._xids()
        return out

    def _device(self, device: Device, h: Any) -> DeviceSample:
        nvml, call = self._nvml, self._call
        s = DeviceSample(device)
        util = call(device, "nvmlDeviceGetUtilizationRates", nvml.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            s.utilization, s.memory_busy = util.gpu / 100, util.memory / 100
        mem = call(device, "nvmlDeviceGetMemoryInfo", nvml.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            s.memory_used, s.memory_total = int(mem.used), int(mem.total)
        milliwatts = call(device, "nvmlDeviceGetPowerUsage", nvml.nvmlDeviceGetPowerUsage, h)
        s.power_w = milliwatts / 1000 if milliwatts is not None else None
        millijoules = call(device, "nvmlDeviceGetTotalEnergyConsumption", nvml.nvmlDeviceGetTotalEnergyConsumption, h)
        s.energy_j = millijoules / 1000 if millijoules is not None else None
        sm = call(device, "nvmlDeviceGetClockInfo.sm", nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM)
        s.sm_clock_hz = sm * 1_000_000 if sm is not None else None
        memclk = call(device, "nvmlDeviceGetClockInfo.mem", nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_MEM)
        s.memory_clock_hz = memclk * 1_000_000 if memclk is not None else None
        temp = call(device, "nvmlDeviceGetTemperature", nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)
        s.temperature_c = float(temp) if temp is not None else None
        tx = call(
            device, "nvmlDeviceGetPcieThroughput.tx", nvml.nvmlDeviceGetPcieThroughput, h, nvml.NVML_PCIE_UTIL_TX_BYTES
        )
        s.pcie_tx_bytes_per_s = tx * KB if tx is not None else None
        rx = call(
            device, "nvmlDeviceGetPcieThroughput.rx", nvml.nvmlDeviceGetPcieThroughput, h, nvml.NVML_PCIE_UTIL_RX_BYTES
        )
        s.pcie_rx_bytes_per_s = rx * KB if rx is not None else None
        s.nvlink_tx_bytes, s.nvlink_rx_bytes = self._nvlink(device, h)
        return s

    def _nvlink(self, device: Device, h: Any) -> tuple[int | None, int | None]:
        """Cumulative NVLink data bytes (tx, rx) over all links; (None, None) without NVLink."""
        values = self._call(
            device,
            "nvmlDeviceGetFieldValues",
            self._nvml.nvmlDeviceGetFieldValues,
            h,
            [(NVLINK_DATA_TX, ALL_LINKS), (NVLINK_DATA_RX, ALL_LINKS)],
        )
        if values is None:
            return None, None
        out: list[int | None] = []
        for v in values:
            if v.nvmlReturn != 0:
                if v.nvmlReturn == NOT_SUPPORTED:  # no NVLink on this device: not asked again
                    self._unsupported.add((device.index, "nvmlDeviceGetFieldValues"))
                self._health.add(
                    FAILURES,
                    function="nvmlDeviceGetFieldValues.nvlink",
                    reason="not_supported" if v.nvmlReturn == NOT_SUPPORTED else f"code_{v.nvmlReturn}",
                )
                out.append(None)
                continue
            kib = getattr(v.value, _VALUE_FIELD.get(int(v.valueType), "ullVal"))
            out.append(int(kib) * 1024)
        return out[0], out[1]

    def _processes(self, device: Device, h: Any) -> list[ProcessSample]:
        nvml = self._nvml
        running = (
            self._call(device, "nvmlDeviceGetComputeRunningProcesses", nvml.nvmlDeviceGetComputeRunningProcesses, h)
            or []
        )
        memory = {int(p.pid): (int(p.usedGpuMemory) if p.usedGpuMemory is not None else None) for p in running}
        util: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for s in self._process_utilization(device, h):
            util[int(s.pid)].append((int(s.smUtil), int(s.memUtil)))
        out = []
        for pid in sorted(memory.keys() | util.keys()):
            samples = util.get(pid)
            sm = sum(u for u, _m in samples) / len(samples) / 100 if samples else None
            busy = sum(m for _u, m in samples) / len(samples) / 100 if samples else None
            out.append(ProcessSample(pid, device, memory.get(pid), sm, busy))
        return out

    def _process_utilization(self, device: Device, h: Any) -> list[Any]:
        """NVML's per-process utilization samples newer than the last ones read from this device."""
        nvml = self._nvml
        key = (device.index, "nvmlDeviceGetProcessUtilization")
        if key in self._unsupported or device.index in self._lost:
            return []
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(h, self._last_seen_us[device.index])
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) != NOT_FOUND:  # NOT_FOUND: no process ran a kernel since then
                self._failed(device, "nvmlDeviceGetProcessUtilization", exc)
            return []
        if samples:
            self._last_seen_us[device.index] = max(int(s.timeStamp) for s in samples)
        return list(samples)

    def _xids(self) -> list[XidEvent]:
        """XID error events waiting in the event set, without blocking (timeout 0)."""
        nvml, out = self._nvml, []
        for _ in range(MAX_EVENTS_PER_SAMPLE):
            try:
                data = nvml.nvmlEventSetWait(self._events, 0)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) != TIMEOUT:
                    self._health.add(FAILURES, function="nvmlEventSetWait", reason=_reason(exc))
                break
            device = self._by_handle.get(ctypes.cast(data.device, ctypes.c_void_p).value)
            if device is None or not data.eventType & XID_CRITICAL_ERROR:
                self._health.add(FAILURES, function="nvmlEventSetWait", reason="unknown_event")
                continue
            log.warning("gpu: XID %d on GPU %d (%s, %s)", data.eventData, device.index, device.uuid, device.pci_bus_id)
            out.append(XidEvent(device, int(data.eventData)))
        return out


def nvml_family(sampler: NvmlSampler) -> ProbeFamily:
    """The gpu receiver as the sensor sees it: no C, no library, no probe; the sampler starts
    once the sensor has loaded and stops before it unloads, so the final metrics export still
    has the last sample."""
    return ProbeFamily(
        name="gpu",
        c_file="",
        libraries=(),
        on_load=lambda _bpf: sampler.start(),
        on_unload=lambda _bpf: sampler.stop(),
    )
