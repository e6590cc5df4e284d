"""Validation errors as sentences: ``file:line:col: option.path: message``, with the allowed
keys and a "did you mean" for a typo, and the variable a bad value came from.

An error never shows a secret: not a value substituted from ``${env:...}`` (``concealed``), not
a header value or an option with a secret name (``password``, ``bearer_token``, ``tenant_id``),
and of a URL neither the userinfo nor a query value (``format_issue``); the rules are
``base/secrets.py``'s."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel
from pydantic_core import ErrorDetails

from otelbpf.base.secrets import REDACTED, is_secret_name, redact_urls
from otelbpf.config.errors import STANDARD_ERROR_TYPES, OptionPath, suggest
from otelbpf.config.model import COMPONENT_KINDS, Config, component_type, component_types
from otelbpf.config.parse import node_at
from otelbpf.config.receivers import ReceiverTypes

#: Options concealed though their names are not secret-looking: a Pyroscope tenant id is what
#: a multi-tenant server authorizes by.
_CONCEALED_OPTIONS = frozenset({"tenant_id"})


def secret_option(name: str) -> bool:
    """Whether an option's value is a secret by its name: ``headers`` (all their values),
    ``password``, ``bearer_token``, ``basic_auth``, ``tenant_id``..."""
    return name == "headers" or name in _CONCEALED_OPTIONS or is_secret_name(name)


def describe(error: ErrorDetails, types: ReceiverTypes, hidden: Collection[str] | None = None) -> str:
    """One pydantic error as a sentence: the allowed keys for a typo, the got-value otherwise.
    ``types``: the receivers' (for their options); ``hidden`` (from ``concealed``): the value
    must not be shown, nor these strings in it."""
    kind, message, value = error["type"], error["msg"], error.get("input")
    if kind == "extra_forbidden":
        allowed = _allowed_keys(tuple(error["loc"][:-1]), types)
        key = str(error["loc"][-1])
        return f"unknown option{suggest(key, allowed)}; allowed: {', '.join(allowed)}" if allowed else "unknown option"
    if kind == "missing":
        return "required option is missing"
    if kind == "value_error":
        text = message.removeprefix("Value error, ")
    elif kind not in STANDARD_ERROR_TYPES:
        text = message
    elif hidden is not None:
        return message.split(", unable to")[0]
    else:
        big = isinstance(value, (dict, list)) and len(repr(value)) > 60
        return f"{message.split(', unable to')[0]}, got {f'a {type(value).__name__}' if big else repr(value)}"
    for secret in sorted(hidden or (), key=len, reverse=True):
        text = text.replace(repr(secret), REDACTED)
        if len(secret) >= 4:  # a shorter one would clobber the sentence; messages quote values
            text = text.replace(secret, REDACTED)
    return text


def concealed(data: Any, path: OptionPath, origins: Mapping[OptionPath, str], value: Any) -> list[str] | None:
    """What an error at ``path`` about ``value`` must not show (None: nothing): the values
    substituted from ``${env:...}`` at or under ``path`` (a model's error may quote its fields),
    and ``value`` itself under a secret option (``headers``, ``password``, ``bearer_token``,
    ``tenant_id``...). ``data``: the raw config after substitution."""
    substituted = [
        found
        for where, reference in origins.items()
        if reference.startswith("$") and where[: len(path)] == path
        for found in _strings(_value_at(data, where))
    ]
    secret = any(isinstance(part, str) and secret_option(part) for part in path)
    if not substituted and not secret:
        return None
    return [*substituted, *(_strings(value) if secret else ())]


def _value_at(data: Any, path: OptionPath) -> Any:
    for part in path:
        if isinstance(data, dict):
            data = data.get(part)
        elif isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data):
            data = data[part]
        else:
            return None
    return data


def _strings(value: Any) -> list[str]:
    """The scalars in ``value`` as a message would spell them (a list's items, a mapping's values)."""
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    if isinstance(value, str):
        return [value] if value else []
    return [] if value is None or isinstance(value, bool) else [str(value)]


def _allowed_keys(path: OptionPath, types: ReceiverTypes) -> list[str]:
    """The option names of the section at ``path`` (for 'did you mean' on unknown keys)."""
    model: type[BaseModel] | None = Config
    parts = list(path)
    while parts and model is not None:
        part = parts.pop(0)
        if model is Config and part in COMPONENT_KINDS and parts:
            model = component_types(str(part), types).get(component_type(str(parts.pop(0))))
            continue
        spec = model.model_fields.get(str(part))
        model = _model_in(spec.annotation) if spec else None
    return list(model.model_fields) if model else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, type(int | None)):
        for member in get_args(annotation):
            found = _model_in(member)
            if found:
                return found
    return None


def _format_path(path: OptionPath) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def format_issue(
    path: OptionPath | None, message: str, source: str, root: yaml.Node | None, origins: Mapping[OptionPath, str]
) -> str:
    """``file:line:col: option.path: message``; no position for what the file did not write.
    No URL in it keeps its userinfo or a query value."""
    message = redact_urls(message, every_query_value=True)  # an endpoint's userinfo and query
    if path is None:
        return message
    where = ""
    if root is not None and origins.get(path, "$").startswith("$"):  # not taken from OTEL_*
        mark = node_at(root, path).start_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}: "
    return f"{where}{_format_path(path)}: {message}"
