"""The receiver registry: how a config entry under ``receivers:`` becomes a
probe family for the sensor and a correlator for its events.

Adding a probe family (NCCL, ibverbs, ...) means one builder here plus its
BPF C, its ``sensor/<family>_probes.py`` and its ``correlate/<family>.py``;
the agent treats every receiver alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
from opentelemetry.sdk.metrics.export import Metric
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otelbpf.base.health import Health
from otelbpf.config import (
    CudaReceiverConfig,
    HttpReceiverConfig,
    IbverbsReceiverConfig,
    NcclReceiverConfig,
    ProfilingReceiverConfig,
    ReceiverConfig,
)
from otelbpf.config.receivers.gpu import GpuReceiverConfig
from otelbpf.config.receivers.sched import SchedReceiverConfig
from otelbpf.config.receivers.torch import TorchReceiverConfig
from otelbpf.correlate.base import CorrelatorSettings
from otelbpf.correlate.causality import Causality
from otelbpf.correlate.clock import MonotonicClock
from otelbpf.correlate.process_info import ProcessInfo
from otelbpf.correlate.profile_record import Profile
from otelbpf.correlate.symbolizer import Symbolizer
from otelbpf.sensor.family import MapEntries, MapReader, ProbeFamily


class MapAccess:
    """Late-bound access to the sensor's BPF maps (the sensor is built after
    the receivers that describe its program)."""

    def __init__(self) -> None:
        self.read: MapReader = lambda name: []
        self.forget: Callable[[str, list[object]], None] = lambda name, keys: None
        self.update: Callable[[str, list[tuple[int, int]]], None] = lambda name, items: None
        #: Run a function with the loaded BCC object, under the sensor's lock (None once unloaded).
        self.with_bpf: Callable[[Callable[[Any], Any]], Any] = lambda fn: None


@dataclass(eq=False)  # hashable by identity: its bound methods are handed out as callbacks
class Context:
    """What every correlator may use."""

    process_info: ProcessInfo
    symbolizer: Symbolizer
    clock: MonotonicClock
    health: Health
    emit_spans: Callable[[list[ReadableSpan]], None]
    maps: MapAccess
    traces: bool  # a traces pipeline exists: build spans at all
    #: Open server spans per thread: request receivers add them, every
    #: correlator may ask it for the parent of what a thread did (causality.py).
    causality: Causality = field(default_factory=Causality)
    #: Process every event emitted so far (Agent.sync); called by a correlator
    #: after reading counting maps and before describing what they counted.
    sync: Callable[[], object] = lambda: None
    #: Profiles pipeline: where finished profiles go, and its resource attributes (labels).
    export_profiles: Callable[[list[Profile]], None] = lambda records: None
    profile_attributes: dict[str, str | bool | int | float] = field(default_factory=dict)

    def correlator_settings(self) -> CorrelatorSettings:
        return CorrelatorSettings(self.process_info, self.clock, self.emit_spans)

    # Bound methods, not ``maps.read`` itself: the maps are bound after the correlators are built.
    def read_map(self, name: str) -> MapEntries:
        return self.maps.read(name)

    def forget_keys(self, name: str, keys: list[object]) -> None:
        self.maps.forget(name, keys)

    def span_rate(self, configured: int) -> int:
        """A receiver's span budget: none where no traces pipeline would take the spans."""
        return configured if self.traces else 0

    def counter(self, receiver: str) -> Callable[..., None]:
        """``(metric, n, **attributes)`` into the agent's own counters, labelled with ``receiver``."""
        return lambda metric, n, **attrs: self.health.add(metric, n, receiver=receiver, **attrs)

    def sampled_out(self, receiver: str) -> Callable[[int], None]:
        """Spans the budget dropped, counted for ``receiver``."""
        return lambda n: self.health.add("otelbpf.spans.sampled_out", n, receiver=receiver)


class Correlator(Protocol):
    scope: InstrumentationScope

    def on_events(self, arr: np.ndarray) -> None: ...

    def on_strings(self, arr: np.ndarray) -> None: ...

    def collect(self) -> list[tuple[Resource, list[Metric]]]: ...


@runtime_checkable
class RingCorrelator(Correlator, Protocol):
    """The correlator of a family with rings of its own (ProbeFamily.rings)."""

    def on_ring(self, name: str, arr: np.ndarray) -> None: ...


@dataclass
class Receiver:
    name: str
    family: ProbeFamily
    correlator: Correlator
    search_globs: list[str]
    ring_buffer_size: int


def _cuda(name: str, cfg: CudaReceiverConfig, ctx: Context) -> Receiver:
    from otelbpf.correlate.cuda import CudaCorrelator
    from otelbpf.sensor.cuda_probes import cuda_family

    family = cuda_family(
        cfg.libraries,
        launch_sample_every=cfg.launch_sample_every if ctx.traces else 0,
        launch_errors=cfg.launch_errors,
    )
    correlator = CudaCorrelator(
        ctx.correlator_settings(),
        ctx.symbolizer,
        ctx.read_map,
        ctx.forget_keys,
        min_span_ns=cfg.min_span_duration,
        top_kernels=cfg.top_kernels,
        launch_sample_every=cfg.launch_sample_every,
        max_spans_per_second=ctx.span_rate(cfg.max_spans_per_second),
        on_sampled_out=ctx.sampled_out(name),
        parent_of=ctx.causality.parent,
        in_flight=ctx.causality.in_flight,
        handed=ctx.causality.handed,
        on_handoffs=ctx.causality.woken,
        sync=lambda: ctx.sync(),
    )
    return Receiver(name, family, correlator, list(cfg.search_paths), cfg.events_ring_bytes(ctx.traces))


def _http(name: str, cfg: HttpReceiverConfig, ctx: Context) -> Receiver:
    from otelbpf.correlate.http import HttpCorrelator
    from otelbpf.sensor.socket_probes import socket_family

    family = socket_family(
        cfg.ports,
        payload_bytes=cfg.payload_size,
        ring_bytes=cfg.ring_buffer_size,
        lib_users_only=cfg.processes == "gpu",
        handoffs=cfg.handoffs and ctx.traces,
    )
    correlator = HttpCorrelator(
        ctx.correlator_settings(),
        ctx.counter(name),
        ctx.causality,
        lambda m, items: ctx.maps.update(m, items),
        ports=cfg.ports,
        capture_headers=cfg.capture_headers,
        redact_headers=cfg.redact_headers,
        capture_message_content=cfg.capture_message_content,
        max_spans_per_second=ctx.span_rate(cfg.max_spans_per_second),
        traces=ctx.traces,
    )
    return Receiver(name, family, correlator, [], 256 << 10)


def _nccl(name: str, cfg: NcclReceiverConfig, ctx: Context) -> Receiver:
    from otelbpf.correlate.nccl import NcclCorrelator
    from otelbpf.sensor.nccl_probes import nccl_family

    correlator = NcclCorrelator(
        ctx.correlator_settings(),
        straggler_threshold_ns=cfg.straggler_threshold,
        completion_timeout_ns=cfg.completion_timeout,
        max_spans_per_second=ctx.span_rate(cfg.max_spans_per_second),
        on_sampled_out=ctx.sampled_out(name),
        parent_of=ctx.causality.parent,
    )
    return Receiver(name, nccl_family(), correlator, list(cfg.search_paths), cfg.ring_buffer_size)


#: config model type -> builder
def _profiling(name: str, cfg: ProfilingReceiverConfig, ctx: Context) -> Receiver:
    from otelbpf.config import to_seconds
    from otelbpf.correlate.profiles import CacheSizes, Profiler
    from otelbpf.sensor.profile_probes import profile_family

    profiler = Profiler(
        ctx.process_info,
        ctx.health,
        ctx.export_profiles,
        sample_hz=cfg.sample_rate,
        interval_s=to_seconds(cfg.interval),
        cuda_memory=cfg.cuda_memory,
        python=cfg.python,
        labels=ctx.profile_attributes,
        caches=CacheSizes(
            stacks=cfg.cached_stacks,
            python_stacks=cfg.cached_python_stacks,
            resolved_stacks=cfg.cached_resolved_stacks,
            frames=cfg.cached_frames,
            code_objects=cfg.cached_code_objects,
        ),
    )
    profiler.run_locked = lambda fn: ctx.maps.with_bpf(fn)
    family = profile_family(
        python=cfg.python,
        cuda_memory=cfg.cuda_memory,
        max_python_frames=cfg.max_python_frames,
        stack_entries=cfg.stack_map_entries,
        sample_entries=cfg.sample_map_entries,
        code_entries=cfg.code_map_entries,
        live_entries=cfg.live_allocations,
        on_load=profiler.on_load,
        on_unload=profiler.on_unload,
    )
    return Receiver(name, family, profiler, [], 1 << 20)


def _ibverbs(name: str, cfg: IbverbsReceiverConfig, ctx: Context) -> Receiver:
    from otelbpf.correlate.ibverbs import IbverbsCorrelator
    from otelbpf.sensor.ibverbs_probes import ibverbs_family

    family = ibverbs_family(
        slow_completion_ns=cfg.slow_completion,
        qp_entries=cfg.max_queue_pairs,
        health=ctx.health,
        data_path=cfg.data_path,
    )
    correlator = IbverbsCorrelator(
        ctx.correlator_settings(),
        ctx.read_map,
        ctx.forget_keys,
        traces=ctx.traces,
        max_spans_per_second=ctx.span_rate(cfg.max_spans_per_second),
        on_sampled_out=ctx.sampled_out(name),
        sync=lambda: ctx.sync(),
    )
    return Receiver(name, family, correlator, list(cfg.search_paths), cfg.ring_buffer_size)


def _sched(name: str, cfg: SchedReceiverConfig, ctx: Context) -> Receiver:
    from otelbpf.correlate.sched import SchedCorrelator
    from otelbpf.sensor.sched_probes import sched_family

    correlator = SchedCorrelator(
        ctx.correlator_settings(),
        ctx.read_map,
        ctx.forget_keys,
        lambda fn: ctx.maps.with_bpf(fn),
        ctx.counter(name),
        traces=ctx.traces,
        max_spans_per_second=ctx.span_rate(cfg.max_spans_per_second),
    )
    family = sched_family(
        span_threshold_ns=cfg.span_threshold,
        ring_bytes=cfg.ring_buffer_size,
        thread_entries=cfg.max_threads,
        off_entries=cfg.max_series,
        runq_entries=cfg.max_runqueue_series,
        stack_entries=cfg.stack_map_entries,
        on_unload=correlator.on_unload,
    )
    return Receiver(name, family, correlator, [], cfg.ring_buffer_size)


def _torch(name: str, cfg: TorchReceiverConfig, ctx: Context) -> Receiver:
    from otelbpf.correlate.torch import TorchCorrelator
    from otelbpf.sensor.torch_probes import torch_family

    correlator = TorchCorrelator(
        ctx.correlator_settings(),
        ctx.symbolizer,
        ctx.causality,
        min_span_ns=cfg.min_span_duration,
        max_spans_per_second=ctx.span_rate(cfg.max_spans_per_second),
        on_sampled_out=ctx.sampled_out(name),
    )
    family = torch_family(cfg.operators, max_depth=cfg.max_depth)
    return Receiver(name, family, correlator, list(cfg.search_paths), cfg.ring_buffer_size)


def _gpu(name: str, cfg: GpuReceiverConfig, ctx: Context) -> Receiver:
    """NVML on a timer, no probes: a family without C whose load and unload start and stop the sampler."""
    from otelbpf.config import to_seconds
    from otelbpf.correlate.gpu import GpuCorrelator
    from otelbpf.sensor.nvml import NvmlSampler, nvml_family

    correlator = GpuCorrelator(ctx.process_info, ctx.health)
    sampler = NvmlSampler(
        correlator.on_sample,
        ctx.health,
        interval_s=to_seconds(cfg.interval),
        per_process=cfg.per_process,
        max_processes=cfg.max_processes,
        xid_events=cfg.xid_events,
    )
    return Receiver(name, nvml_family(sampler), correlator, [], 64 << 10)


#: Each builder takes the config class it is keyed by (a dependency Python's types cannot spell: Any).
BUILDERS: dict[type[ReceiverConfig], Callable[[str, Any, Context], Receiver]] = {
    CudaReceiverConfig: _cuda,
    HttpReceiverConfig: _http,
    ProfilingReceiverConfig: _profiling,
    NcclReceiverConfig: _nccl,
    IbverbsReceiverConfig: _ibverbs,
    SchedReceiverConfig: _sched,
    TorchReceiverConfig: _torch,
    GpuReceiverConfig: _gpu,
}


def build(name: str, cfg: ReceiverConfig, ctx: Context) -> Receiver:
    return BUILDERS[type(cfg)](name, cfg, ctx)
