"""Config text for the tests of ``otelbpf.config``: a small valid file that each error test
breaks in one place, and loading it with a given environment."""

from __future__ import annotations

import textwrap

import pytest

from otelbpf.config import Config, ConfigError
from otelbpf.families.registry import load_config_text

# A small valid file the error tests start from; each test breaks one thing.
MINIMAL = """\
receivers:
  cuda:
exporters:
  file:
service:
  pipelines:
    traces: {receivers: [cuda], exporters: [file]}
"""


def load(text: str, **env: str) -> Config:
    """``text`` (dedented) loaded as the file ``test.yaml`` with exactly ``env``."""
    return load_config_text(textwrap.dedent(text), source="test.yaml", env=env)


def errors_of(text: str, **env: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load(text, **env)
    return caught.value.errors


def one_error(text: str, **env: str) -> str:
    errors = errors_of(text, **env)
    assert len(errors) == 1, errors
    return errors[0]


def with_cuda(options: str) -> str:
    """MINIMAL with the cuda receiver's options given as a flow mapping body."""
    return MINIMAL.replace("  cuda:\n", f"  cuda: {{{options}}}\n")


def with_exporter(line: str) -> str:
    """MINIMAL with one more exporter entry (``name: {...}``) after the file exporter."""
    return MINIMAL.replace("  file:\n", f"  file:\n  {line}\n")
