"""The effective configuration as YAML, with secrets replaced: ``otelbpf run --print-config``."""

from __future__ import annotations

from typing import Any

import yaml

from otelbpf.config.model import Config


def printable(config: Config) -> str:
    """The effective configuration as YAML (sizes in bytes, durations in nanoseconds), with
    header values, passwords and tokens replaced: what ``otelbpf run --print-config`` shows."""

    def scrub(value: Any, key: str = "") -> Any:
        if isinstance(value, dict):
            if key == "headers":
                return {k: "<redacted>" for k in value}
            return {k: scrub(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [scrub(v) for v in value]
        if value is not None and any(w in key for w in ("password", "token")):
            return "<redacted>"
        return value

    return yaml.safe_dump(scrub(config.model_dump(mode="json", exclude_none=True)), sort_keys=False)
