"""The root of a configuration: ``Config``, its components by kind (``receivers``,
``processors``, ``exporters``, each entry named ``type`` or ``type/name``), and the checks
that span sections (pipelines name defined components, each signal goes only where it can,
every exporter in use has a destination, a receiver's needs are met)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, SerializeAsAny, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import InitErrorDetails

from otelbpf.config.errors import carried, custom_error, suggest
from otelbpf.config.exporters import (
    EXPORTER_TYPES,
    ExporterConfig,
    PrometheusExporterConfig,
    PyroscopeExporterConfig,
    missing_endpoint,
)
from otelbpf.config.fields import Section
from otelbpf.config.processors import PROCESSOR_TYPES, ProcessorConfig, ResourceProcessorConfig
from otelbpf.config.receivers import ReceiverConfig, ReceiverTypes
from otelbpf.config.receivers.registry import from_context
from otelbpf.config.service import PipelineConfig, ServiceConfig, TargetsConfig
from otelbpf.config.signals import PIPELINE_SIGNALS, PipelineSignal

#: The component kinds whose types this package defines; the receivers' come from the loader.
_DEFINED_KINDS: dict[str, Mapping[str, type[BaseModel]]] = {
    "processors": PROCESSOR_TYPES,
    "exporters": EXPORTER_TYPES,
}
COMPONENT_KINDS: tuple[str, ...] = ("receivers", *_DEFINED_KINDS)


def component_types(kind: str, receivers: ReceiverTypes) -> Mapping[str, type[BaseModel]]:
    """The models of one component kind's types, by type name (``receivers``: those handed in)."""
    return receivers.models() if kind == "receivers" else _DEFINED_KINDS[kind]


def component_type(name: str) -> str:
    """The type part of a component name: ``otlp/tempo`` -> ``otlp``."""
    return name.split("/", 1)[0]


class Config(Section):
    """A validated configuration. Build it with ``load_config`` or ``load_config_text``
    (``otelbpf/families/registry.py``: the receivers' types travel in the validation context)."""

    #: Each value is its family's subclass (``otelbpf/families/<name>/config.py``), serialized as such.
    receivers: dict[str, SerializeAsAny[ReceiverConfig]] = {}
    processors: dict[str, ProcessorConfig] = {}
    exporters: dict[str, ExporterConfig] = {}
    targets: TargetsConfig = TargetsConfig()
    service: ServiceConfig

    @field_validator("receivers", "processors", "exporters", mode="before")
    @classmethod
    def _components(cls, value: object, info: ValidationInfo) -> object:
        """Validate each ``type[/name]`` entry against its type's model."""
        kind = str(info.field_name)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            return value
        types = component_types(kind, from_context(info))
        singular = kind.removesuffix("s")
        built: dict[str, BaseModel] = {}
        errors: list[InitErrorDetails] = []
        for name, body in value.items():
            if not isinstance(name, str):
                message = f"{singular} names are strings like 'type' or 'type/name'"
                errors.append(custom_error("component_name", message, (str(name),), name))
                continue
            type_, slash, suffix = name.partition("/")
            if type_ not in types:
                allowed = ", ".join(sorted(types))
                message = f"unknown {singular} type {type_!r}{suggest(type_, types)}; allowed types: {allowed}"
                errors.append(custom_error("unknown_component", message, (name,), body))
                continue
            if slash and (kind == "receivers" or not suffix or suffix.strip() != suffix or "/" in suffix):
                why = (
                    "a probe family is loaded once, so receivers take no /name"
                    if kind == "receivers"
                    else "write type or type/name with a non-empty name"
                )
                errors.append(custom_error("component_name", f"invalid {singular} name {name!r}: {why}", (name,), body))
                continue
            try:
                built[name] = types[type_].model_validate({} if body is None else body)
            except ValidationError as exc:
                errors.extend(carried(e, (name,)) for e in exc.errors())
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        return built

    @model_validator(mode="wrap")
    @classmethod
    def _cross_check(cls, data: Any, handler: Callable[[Any], Config], info: ValidationInfo) -> Config:
        """Pipelines exist and name only defined components (checked on the raw input, so these
        errors are listed with any others), and every OTLP exporter in use has a URL."""
        errors = reference_errors(data) if isinstance(data, Mapping) else []
        undefined = bool(errors)
        try:
            config = handler(data)
        except ValidationError as exc:
            if not errors:
                raise
            nested = [carried(e, ()) for e in exc.errors()]
            raise ValidationError.from_exception_data(cls.__name__, [*nested, *errors]) from None
        for signal in config.pipeline_signals():
            for name in config.pipeline(signal).exporters:  # type: ignore[union-attr]
                missing = missing_endpoint(config.exporters.get(name), signal)
                if missing:
                    message = f"{missing} (the {signal} pipeline uses this exporter)"
                    errors.append(custom_error("missing_endpoint", message, ("exporters", name, "endpoint"), None))
        errors.extend(_profile_pipeline_errors(config, from_context(info)))
        if not undefined:  # these read the pipelines through the accessors, which look each name up
            errors.extend(_needs_errors(config))
            errors.extend(_self_profiling_errors(config))
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        return config

    # --- accessors the agent uses ---

    def pipeline(self, signal: PipelineSignal) -> PipelineConfig | None:
        """The pipeline for ``signal``, or None if the signal is not exported."""
        pipeline: PipelineConfig | None = getattr(self.service.pipelines, signal)
        return pipeline

    def pipeline_signals(self) -> list[PipelineSignal]:
        """The signals that have a pipeline, in ``PIPELINE_SIGNALS`` order."""
        return [s for s in PIPELINE_SIGNALS if self.pipeline(s) is not None]

    def enabled_receivers(self) -> set[str]:
        """Receivers named by at least one pipeline: the probe families to load."""
        return {name for s in self.pipeline_signals() for name, _ in self.pipeline_receivers(s)}

    def pipeline_receivers(self, signal: PipelineSignal) -> list[tuple[str, ReceiverConfig]]:
        pipeline = self.pipeline(signal)
        return [(n, self.receivers[n]) for n in pipeline.receivers] if pipeline else []

    def pipeline_processors(self, signal: PipelineSignal) -> list[tuple[str, ProcessorConfig]]:
        """The pipeline's processors in the order they run."""
        pipeline = self.pipeline(signal)
        return [(n, self.processors[n]) for n in pipeline.processors] if pipeline else []

    def pipeline_exporters(self, signal: PipelineSignal) -> list[tuple[str, ExporterConfig]]:
        pipeline = self.pipeline(signal)
        return [(n, self.exporters[n]) for n in pipeline.exporters] if pipeline else []

    def resource_attributes(self, signal: PipelineSignal) -> dict[str, str | bool | int | float]:
        """Attributes the pipeline's ``resource`` processors add (a later processor wins a key)."""
        merged: dict[str, str | bool | int | float] = {}
        for _, processor in self.pipeline_processors(signal):
            if isinstance(processor, ResourceProcessorConfig):
                merged.update(processor.attributes)
        return merged


def reference_errors(data: Mapping[str, Any]) -> list[InitErrorDetails]:
    """Pipelines that are missing or name components the config does not define."""
    service = data.get("service")
    pipelines = service.get("pipelines") if isinstance(service, Mapping) else None
    if not isinstance(pipelines, Mapping):
        return []  # reported as a missing or mistyped option
    errors: list[InitErrorDetails] = []
    if not any(isinstance(pipelines.get(s), Mapping) for s in PIPELINE_SIGNALS):
        message = "no pipelines: define traces, metrics and/or profiles here"
        errors.append(custom_error("no_pipelines", message, ("service", "pipelines"), None))
    for signal in PIPELINE_SIGNALS:
        pipeline = pipelines.get(signal)
        if not isinstance(pipeline, Mapping):
            continue
        for kind in ("receivers", "processors", "exporters"):
            names = pipeline.get(kind)
            section = data.get(kind)
            defined = sorted(str(n) for n in section) if isinstance(section, Mapping) else []
            for index, name in enumerate(names if isinstance(names, list) else ()):
                if isinstance(name, str) and name not in defined:
                    singular = kind.removesuffix("s")
                    message = (
                        f"{singular} {name!r} is not defined under {kind}{suggest(name, defined)}; "
                        f"defined {kind}: {', '.join(defined) or 'none'}"
                    )
                    where = ("service", "pipelines", signal, kind, index)
                    errors.append(custom_error("undefined_component", message, where, name))
    return errors


def _profile_pipeline_errors(config: Config, types: ReceiverTypes) -> list[InitErrorDetails]:
    """Profiles come only from profile receivers (and go to any exporter: pprof files,
    Pyroscope, OTLP profiles); the other pipelines take neither profile receivers nor
    pyroscope exporters; a prometheus exporter serves metrics only."""
    errors: list[InitErrorDetails] = []
    for signal in config.pipeline_signals():
        pipeline = config.pipeline(signal)
        profiles = signal == "profiles"
        for index, name in enumerate(pipeline.receivers):  # type: ignore[union-attr]
            if name in config.receivers and types.feeds_profiles(component_type(name)) != profiles:
                why = (
                    f"receiver {name!r} produces no profiles"
                    if profiles
                    else f"receiver {name!r} produces profiles only: name it in service.pipelines.profiles"
                )
                where = ("service", "pipelines", signal, "receivers", index)
                errors.append(custom_error("wrong_signal", why, where, name))
        for index, name in enumerate(pipeline.exporters):  # type: ignore[union-attr]
            if not profiles and isinstance(config.exporters.get(name), PyroscopeExporterConfig):
                why = f"exporter {name!r} (pyroscope) exports profiles only: name it in service.pipelines.profiles"
                where = ("service", "pipelines", signal, "exporters", index)
                errors.append(custom_error("wrong_signal", why, where, name))
            if signal != "metrics" and isinstance(config.exporters.get(name), PrometheusExporterConfig):
                why = f"exporter {name!r} (prometheus) serves metrics only: name it in service.pipelines.metrics"
                where = ("service", "pipelines", signal, "exporters", index)
                errors.append(custom_error("wrong_signal", why, where, name))
    return errors


def _self_profiling_errors(config: Config) -> list[InitErrorDetails]:
    """Self-profiling on needs a Pyroscope: its own endpoint or the profiles pipeline's."""
    cfg = config.service.telemetry.self_profiling
    if not cfg.enabled or cfg.endpoint is not None:
        return []
    if any(isinstance(e, PyroscopeExporterConfig) and e.endpoint for _, e in config.pipeline_exporters("profiles")):
        return []
    why = "self_profiling is enabled with no endpoint, and no pyroscope exporter in the profiles pipeline to use"
    return [custom_error("missing_endpoint", why, ("service", "telemetry", "self_profiling", "endpoint"), None)]


def _needs_errors(config: Config) -> list[InitErrorDetails]:
    """Settings of a receiver in use that rely on a receiver no pipeline names
    (``ReceiverConfig.needs``: CUDA memory profiles need the cuda receiver's probes)."""
    enabled = config.enabled_receivers()
    in_use = {name: cfg for s in config.pipeline_signals() for name, cfg in config.pipeline_receivers(s)}
    errors: list[InitErrorDetails] = []
    for name, cfg in in_use.items():
        for need in cfg.needs():
            if need.receiver not in enabled:
                value = getattr(cfg, need.option)
                errors.append(custom_error("needs_receiver", need.why, ("receivers", name, need.option), value))
    return errors
