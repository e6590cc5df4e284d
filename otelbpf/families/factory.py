"""What a probe family's factory is, and what it is handed: how a config entry under
``receivers:`` becomes a probe family for the sensor and a correlator for its events.

In the spirit of the OpenTelemetry Collector's ``receiver/<name>/factory.go``: each family's
``factory.py`` declares a ``Factory`` (its type name, its options' model and so its default
config, the signals it produces, and how to build it); ``registry.py`` lists the factories, and
the agent treats every receiver alike through them. ``Context`` is what every build may use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import numpy as np
from opentelemetry.sdk.metrics.export import Metric
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otelbpf.base.health import Health
from otelbpf.config import ReceiverConfig, ReceiverType
from otelbpf.config.signals import PipelineSignal
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
    #: Rings one family's probes fill and another family's correlator parses (the tls
    #: receiver's plaintext, parsed by the http one), by ring name: the filling family's
    #: correlator hands each batch to these, whatever the order the receivers were built in.
    ring_consumers: dict[str, list[Callable[[np.ndarray], None]]] = field(default_factory=dict)

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


@runtime_checkable
class CutCorrelator(Correlator, Protocol):
    """A correlator that reads several rings and merges each tick's batches by time: the
    sensor's drain tick is a cut (sensor.py ``TICK``), and ``on_tick`` says its family rings'
    batches are all delivered: called before the tick's ``events`` batch (delivered last, and
    what other correlators parent on this one's work) and at its end."""

    def on_tick(self) -> None: ...


@dataclass
class Receiver:
    name: str
    family: ProbeFamily
    correlator: Correlator
    search_globs: list[str]
    ring_buffer_size: int


C = TypeVar("C", bound=ReceiverConfig)


@dataclass(frozen=True)
class Factory(Generic[C]):
    """One probe family, as the registry and the agent know it.

    ``build`` makes both halves at once, the sensor side (its ``ProbeFamily``: C program,
    probes, maps, rings) and its correlator, because they are wired to each other: the
    profiler's ``on_load`` and sched's ``on_unload`` are the family's hooks, and NVML's sampler
    feeds the gpu correlator."""

    #: The type name a config writes under ``receivers:`` and ``--receivers`` accepts.
    name: str
    #: The options' model; ``config()`` with no argument is the default config.
    config: type[C]
    #: The signals it produces; ``profiles`` only for a family that feeds the profiles pipeline alone.
    signals: tuple[PipelineSignal, ...]
    build: Callable[[str, C, Context], Receiver]

    def default_config(self) -> C:
        return self.config()

    def receiver_type(self) -> ReceiverType:
        """What the config layer validates entries against (``config/receivers/registry.py``)."""
        return ReceiverType(self.config, profiles=self.signals == ("profiles",))
