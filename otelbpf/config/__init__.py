"""The agent's configuration: a YAML file in the OpenTelemetry Collector's shape.

``receivers`` are probe families, ``processors`` shape what leaves, ``exporters`` say where it
goes, and ``service.pipelines`` wires them per signal (``traces``, ``metrics``, ``profiles``);
only receivers named in a pipeline are loaded. Components are named ``type`` or ``type/name``
(``otlp/tempo``); receivers take no ``/name`` because one probe family is loaded once.
``otelbpf/config/otelbpf.yaml`` documents every option with its default. Every problem found
is reported at once in one ``ConfigError`` whose lines name the option path
(``receivers.cuda.launch_sample_every: ...``), the file position where known, the allowed
values or keys, and the environment variable a bad value came from.

One module per job:

- ``units``: durations (``"250ms"``, stored as int ns) and sizes (``"4MiB"``, int bytes);
  ``fields``: the ``Section`` base and checks shared by sections; ``signals``: the signals.
- ``receivers/``: what every receiver's options share, and ``ReceiverTypes``, the families'
  models as the loader is handed them (each family's own model is in
  ``otelbpf/families/<name>/config.py``); ``processors``, ``exporters``, ``service`` (targets, pipelines,
  telemetry); ``model``: the root ``Config`` and the checks that span sections.
- ``default``: the built-in default, ``otelbpf.yaml`` (package data) read as it is.
- ``loader``: ``load_config`` / ``load_config_text``, given the receivers' types (the rest of
  the program calls them bound to the families' registry, ``otelbpf/families/registry.py``);
  ``parse``: safe YAML with size, depth and alias limits; ``substitution``: ``${env:VAR}``;
  ``env``: the ``OTEL_*`` / ``PYROSCOPE_*`` variables and their precedence;
  ``selection``: ``--receivers`` / ``OTELBPF_RECEIVERS``;
  ``messages``: errors as sentences with line numbers; ``printable``: ``--print-config``.

Everything other packages use is importable from ``otelbpf.config`` itself.
"""

from otelbpf.config.default import DEFAULT_CONFIG_PATH, DEFAULT_CONFIG_YAML, DEFAULT_SOURCE
from otelbpf.config.errors import ConfigError, OptionPath
from otelbpf.config.exporters import (
    EXPORTER_TYPES,
    BasicAuthConfig,
    Compression,
    ExporterConfig,
    FileExporterConfig,
    HttpTLSConfig,
    Mode,
    OtlpExporterConfig,
    OtlpHttpExporterConfig,
    PrometheusExporterConfig,
    PyroscopeExporterConfig,
    RetryConfig,
    TLSConfig,
)
from otelbpf.config.fields import FilePath, GrpcHeaders, Headers, HeaderValue
from otelbpf.config.model import Config, component_type
from otelbpf.config.parse import MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH, MAX_CONFIG_NODES
from otelbpf.config.printable import printable
from otelbpf.config.processors import (
    PROCESSOR_TYPES,
    AttributeValue,
    BatchProcessorConfig,
    ProcessorConfig,
    ResourceProcessorConfig,
)
from otelbpf.config.receivers import ReceiverConfig, ReceiverType, ReceiverTypes
from otelbpf.config.service import (
    CommandLine,
    PipelineConfig,
    PipelinesConfig,
    SelfProfilingConfig,
    ServiceConfig,
    TargetsConfig,
    TelemetryConfig,
)
from otelbpf.config.signals import PIPELINE_SIGNALS, SIGNALS, Signal
from otelbpf.config.units import (
    MAX_DURATION_NS,
    MAX_RING_BYTES,
    Duration,
    PositiveDuration,
    RingSize,
    Size,
    format_duration,
    format_size,
    parse_duration,
    parse_size,
    to_seconds,
)

__all__ = [
    "DEFAULT_CONFIG_PATH",
    "DEFAULT_CONFIG_YAML",
    "DEFAULT_SOURCE",
    "EXPORTER_TYPES",
    "MAX_CONFIG_BYTES",
    "MAX_CONFIG_DEPTH",
    "MAX_CONFIG_NODES",
    "MAX_DURATION_NS",
    "MAX_RING_BYTES",
    "PIPELINE_SIGNALS",
    "PROCESSOR_TYPES",
    "SIGNALS",
    "AttributeValue",
    "BasicAuthConfig",
    "BatchProcessorConfig",
    "CommandLine",
    "Compression",
    "Config",
    "ConfigError",
    "Duration",
    "ExporterConfig",
    "FileExporterConfig",
    "FilePath",
    "GrpcHeaders",
    "HeaderValue",
    "Headers",
    "HttpTLSConfig",
    "Mode",
    "OptionPath",
    "OtlpExporterConfig",
    "OtlpHttpExporterConfig",
    "PipelineConfig",
    "PipelinesConfig",
    "PositiveDuration",
    "ProcessorConfig",
    "PrometheusExporterConfig",
    "PyroscopeExporterConfig",
    "ReceiverConfig",
    "ReceiverType",
    "ReceiverTypes",
    "ResourceProcessorConfig",
    "RetryConfig",
    "RingSize",
    "SelfProfilingConfig",
    "ServiceConfig",
    "Signal",
    "Size",
    "TLSConfig",
    "TargetsConfig",
    "TelemetryConfig",
    "component_type",
    "format_duration",
    "format_size",
    "parse_duration",
    "parse_size",
    "printable",
    "to_seconds",
]
