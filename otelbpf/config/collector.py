"""Telling an OpenTelemetry Collector's configuration from otelbpf's.

Both have the Collector's shape (``receivers``, ``processors``, ``exporters``, ``service``), and
the repository ships Collector configs beside otelbpf's (``examples/collector/``, the
deployments'), so ``otelbpf validate -c`` on the wrong one is an easy mistake. Validated as
otelbpf's, such a file gives four to seven unrelated errors (unknown receiver ``otlp``, unknown
processor ``memory_limiter``, ...); one line that says what the file is helps more."""

from __future__ import annotations

from typing import Any

from otelbpf.config.receivers import ReceiverTypes

#: Top-level sections only a Collector config has.
_COLLECTOR_SECTIONS = ("extensions", "connectors")


def collector_config(data: dict[str, Any], source: str, types: ReceiverTypes) -> str | None:
    """The message for a file that is a Collector's config, or None when it may be otelbpf's.

    A Collector config is one whose receivers name none of otelbpf's probe families but
    some other receiver (``otlp``, ``otlpjsonfile``, ...), or one with a section otelbpf has
    not (``extensions``, ``connectors``) and none of its receivers."""
    receivers = data.get("receivers")
    names = [str(n).split("/", 1)[0] for n in receivers] if isinstance(receivers, dict) else []
    if any(n in types.entries for n in names):
        return None
    if not names and not any(s in data for s in _COLLECTOR_SECTIONS):
        return None
    others = ", ".join(sorted(set(names))) or "none"
    return (
        f"{source} is an OpenTelemetry Collector configuration, not otelbpf's: its receivers ({others}) "
        f"are the Collector's and none is an otelbpf probe family ({', '.join(sorted(types.entries))}). "
        f"Check it with `otelcol validate --config {source}`; otelbpf's own config is like "
        f"otelbpf/config/otelbpf.yaml (`otelbpf run --print-config` prints the effective one)"
    )
