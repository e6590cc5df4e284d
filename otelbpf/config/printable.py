"""The effective configuration as YAML, with secrets replaced: ``otelbpf run --print-config``."""

from __future__ import annotations

from typing import Any

import yaml

from otelbpf.config.model import Config
from otelbpf.config.spelled import spelled


def printable(config: Config) -> str:
    """The effective configuration as YAML (durations and sizes spelled in units, as written), with
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

    return yaml.safe_dump(scrub(spelled(config)), sort_keys=False)
