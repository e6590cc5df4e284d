"""The effective configuration as YAML, with secrets replaced: ``otelbpf run --print-config``."""

from __future__ import annotations

from typing import Any

import yaml

from otelbpf.base.secrets import REDACTED, redact_urls
from otelbpf.config.messages import secret_option
from otelbpf.config.model import Config
from otelbpf.config.spelled import spelled


def printable(config: Config) -> str:
    """The effective configuration as YAML (durations and sizes spelled in units, as written), with
    secrets replaced by ``REDACTED`` (``base/secrets.py``): header values, options with secret
    names (``password``, ``bearer_token``) and ``tenant_id``, and in URLs the userinfo and every
    query value. What ``otelbpf run --print-config`` shows; it loads back to the same config but
    for those values."""

    def scrub(value: Any, key: str = "") -> Any:
        if isinstance(value, dict):
            if key == "headers":
                return {k: REDACTED for k in value}
            return {k: scrub(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [scrub(v) for v in value]
        if value is not None and secret_option(key):
            return REDACTED
        if isinstance(value, str) and "://" in value:
            return redact_urls(value, every_query_value=True)
        return value

    return yaml.safe_dump(scrub(spelled(config)), sort_keys=False)
