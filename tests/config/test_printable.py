"""``otelbpf run --print-config`` (config/printable.py): the effective configuration without its
secrets, which still loads back."""

from __future__ import annotations

import yaml

from harness.config_text import MINIMAL, load
from otelbpf.config import printable
from otelbpf.families.registry import load_config_text

SECRET = "s3cr3tVALUE"

WITH_SECRETS = MINIMAL.replace(
    "  file:\n",
    "  file:\n"
    "  otlphttp:\n"
    f"    endpoint: https://agent:{SECRET}@collector:4318\n"
    f"    traces_endpoint: https://collector:4318/v1/traces?api_key={SECRET}&region=eu\n"
    f"    headers: {{x-api-key: {SECRET}}}\n"
    "  pyroscope:\n"
    "    endpoint: https://pyroscope:4040\n"
    f"    tenant_id: {SECRET}\n"
    f"    bearer_token: '${{TOKEN}}'\n",
).replace(
    "  pipelines:\n",
    "  telemetry:\n    self_profiling: {endpoint: 'https://" + SECRET + "@pyroscope:4040'}\n  pipelines:\n",
)


def test_print_config_shows_no_userinfo_query_value_tenant_or_token():
    shown = printable(load(WITH_SECRETS, TOKEN=SECRET))

    assert SECRET not in shown
    doc = yaml.safe_load(shown)
    http, pyroscope = doc["exporters"]["otlphttp"], doc["exporters"]["pyroscope"]
    assert http["endpoint"] == "https://agent:REDACTED@collector:4318"
    assert http["traces_endpoint"] == "https://collector:4318/v1/traces?api_key=REDACTED&region=REDACTED"
    assert http["headers"] == {"x-api-key": "REDACTED"}
    assert (pyroscope["tenant_id"], pyroscope["bearer_token"]) == ("REDACTED", "REDACTED")
    assert doc["service"]["telemetry"]["self_profiling"]["endpoint"] == "https://REDACTED@pyroscope:4040"
    assert load_config_text(shown, env={}).exporters["otlphttp"].metrics_endpoint is None  # loads back
