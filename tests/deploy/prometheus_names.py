"""OTLP metric and attribute names as the Collector's `prometheus` exporter writes them.

The rules (opentelemetry-collector-contrib pkg/translator/prometheus, the exporter's default
`add_metric_suffixes: true`), which README.md's Deploy section states for users:

- the name is split on every character outside [A-Za-z0-9] and joined with `_`
  (`cuda.memcpy.host_bytes` -> `cuda_memcpy_host_bytes`);
- the unit becomes a suffix unless the name already has that word: `s` -> `seconds`,
  `By` -> `bytes`, `By/s` -> `bytes_per_second`, `ms` -> `milliseconds`, ...; units in braces
  (`{launch}`, `{call}`) add nothing; `1` adds nothing, except `ratio` on gauges;
- a monotonic Sum gets `_total`; a histogram is `_bucket` (label `le`), `_sum` and `_count`;
- attribute keys become labels with every character outside [A-Za-z0-9_] turned into `_`;
  with `resource_to_telemetry_conversion` the resource's attributes are labels too
  (`service.name` -> `service_name`, `process.pid` -> `process_pid`); `job` and `instance`
  come from `service.name` and `service.instance.id`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

UNITS = {
    "d": "days",
    "h": "hours",
    "min": "minutes",
    "s": "seconds",
    "ms": "milliseconds",
    "us": "microseconds",
    "ns": "nanoseconds",
    "By": "bytes",
    "KiBy": "kibibytes",
    "MiBy": "mebibytes",
    "GiBy": "gibibytes",
    "KBy": "kilobytes",
    "MBy": "megabytes",
    "GBy": "gigabytes",
    "bit": "bits",
    "%": "percent",
    "Hz": "hertz",
    "V": "volts",
    "A": "amperes",
    "J": "joules",
    "W": "watts",
    "Cel": "celsius",
}
PER_UNITS = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week", "mo": "month", "y": "year"}


@dataclass(frozen=True)
class OtlpMetric:
    """One exported OTLP metric, as read from the file exporter's metrics.jsonl."""

    name: str
    unit: str
    kind: str  # sum, gauge, histogram
    monotonic: bool


def label_name(key: str) -> str:
    label = re.sub(r"[^A-Za-z0-9_]", "_", key)
    return f"key_{label}" if label[:1].isdigit() else label


def _tokens(text: str) -> list[str]:
    return [t for t in re.split(r"[^A-Za-z0-9]+", text) if t]


def metric_name(m: OtlpMetric) -> str:
    """The base name (a histogram's series add _bucket, _sum, _count)."""
    tokens = _tokens(m.name)
    main, _, per = m.unit.partition("/")
    main, per = main.strip(), per.strip()
    if main and "{" not in main and "}" not in main:
        suffix = UNITS.get(main, main) if main != "1" else ""
        if suffix:
            suffix_tokens = _tokens(suffix)
            if not all(t in tokens for t in suffix_tokens):
                tokens += suffix_tokens
    if per and "{" not in per:
        per_word = PER_UNITS.get(per, per)
        if per_word not in tokens:
            tokens += ["per", per_word]
    if m.kind == "sum" and m.monotonic:
        tokens = [t for t in tokens if t != "total"] + ["total"]
    if m.kind == "gauge" and main == "1" and "ratio" not in tokens:
        tokens.append("ratio")
    return "_".join(tokens)


def series_names(m: OtlpMetric) -> list[str]:
    """Every Prometheus series name the metric is exposed as."""
    base = metric_name(m)
    return [f"{base}_bucket", f"{base}_sum", f"{base}_count"] if m.kind == "histogram" else [base]
