"""Loading a configuration: read the file (or take the built-in default), parse it safely,
substitute ``${env:...}``, apply ``--receivers`` and the standard variables, validate, and
report every problem at once in one ``ConfigError``.

Each function takes the receivers' types (``ReceiverTypes``): the families' registry
(``otelbpf/families/registry.py``) hands them in and offers these functions bound to them, which
is what the rest of the program calls (``receivers/registry.py`` says why)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import ValidationError

from otelbpf.config.collector import collector_config
from otelbpf.config.default import DEFAULT_CONFIG_YAML, DEFAULT_SOURCE, EXAMPLE_HINT
from otelbpf.config.env import overlay
from otelbpf.config.errors import ConfigError, Findings
from otelbpf.config.messages import concealed, describe, format_issue
from otelbpf.config.model import Config
from otelbpf.config.parse import MAX_CONFIG_BYTES, parse_yaml
from otelbpf.config.receivers import ReceiverTypes
from otelbpf.config.selection import choose_receivers
from otelbpf.config.substitution import SubstitutionLimit, substitute


def load_config(
    path: str | os.PathLike[str] | None,
    types: ReceiverTypes,
    env: Mapping[str, str] = os.environ,
    receivers: str | None = None,
) -> Config:
    """The configuration from the YAML file at ``path``, or the built-in default when ``path``
    is None; ``env`` supplies ``${env:...}`` substitutions and the ``OTEL_*`` variables.
    ``receivers`` (``--receivers``), else ``OTELBPF_RECEIVERS`` in ``env``: a comma-separated
    choice of receivers that replaces the pipelines' (see ``choose_receivers``).
    Raises ConfigError listing every problem."""
    chosen = receivers if receivers is not None else env.get("OTELBPF_RECEIVERS") or None
    if path is None:
        return _build(DEFAULT_CONFIG_YAML, DEFAULT_SOURCE, env, types, from_file=False, receivers=chosen)
    source = os.fspath(path)
    try:
        with open(source, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)  # never more: it may be /dev/zero or 60 MB
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(source, [f"{source}: no such file; {EXAMPLE_HINT}"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(source, [f"{source}: cannot read: {exc}"]) from None
    return _build(text, source, env, types, from_file=True, receivers=chosen)


def load_config_text(
    text: str, types: ReceiverTypes, *, source: str = "<string>", env: Mapping[str, str] = os.environ
) -> Config:
    """Like ``load_config`` for a file whose contents are ``text``; ``source`` names it in errors."""
    return _build(text, source, env, types, from_file=True)


def _build(
    text: str,
    source: str,
    env: Mapping[str, str],
    types: ReceiverTypes,
    *,
    from_file: bool,
    receivers: str | None = None,
) -> Config:
    data, root = parse_yaml(text, source)
    if from_file and (collector := collector_config(data, source, types)) is not None:
        raise ConfigError(source, [collector])
    found = Findings()
    file_root = root if from_file else None  # positions in the built-in default would only confuse
    try:
        data = substitute(data, (), env, found)
    except SubstitutionLimit as exc:
        raise ConfigError(source, [format_issue(exc.path, str(exc), source, file_root, found.origins)]) from None
    if receivers is not None:
        choose_receivers(data, receivers, found, types)
    overlay(data, env, found, from_file=from_file)
    try:
        config = Config.model_validate(data, context=types.context())
    except ValidationError as exc:
        reported = [p for p, _ in found.issues if p is not None]
        for error in exc.errors():
            path = tuple(error["loc"])
            if any(path[: len(p)] == p for p in reported):
                continue  # a value already reported (an unset ${env:VAR}) fails again: say it once
            origin = found.origins.get(path)
            hidden = concealed(data, path, found.origins, error.get("input"))
            found.issues.append((path, describe(error, types, hidden) + (f" (value from {origin})" if origin else "")))
    else:
        if not found.issues:
            return config
    lines = [format_issue(path, message, source, file_root, found.origins) for path, message in found.issues]
    raise ConfigError(source, list(dict.fromkeys(lines)))
