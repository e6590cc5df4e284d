"""Validation errors as sentences: ``file:line:col: option.path: message``, with the allowed
keys and a "did you mean" for a typo, and the variable a bad value came from."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel
from pydantic_core import ErrorDetails

from otelbpf.config.errors import STANDARD_ERROR_TYPES, OptionPath, suggest
from otelbpf.config.model import COMPONENT_KINDS, Config, component_type
from otelbpf.config.parse import node_at


def describe(error: ErrorDetails) -> str:
    """One pydantic error as a sentence: the allowed keys for a typo, the got-value otherwise."""
    kind, message, value = error["type"], error["msg"], error.get("input")
    if kind == "extra_forbidden":
        allowed = _allowed_keys(tuple(error["loc"][:-1]))
        key = str(error["loc"][-1])
        return f"unknown option{suggest(key, allowed)}; allowed: {', '.join(allowed)}" if allowed else "unknown option"
    if kind == "missing":
        return "required option is missing"
    if kind == "value_error":
        return message.removeprefix("Value error, ")
    if kind not in STANDARD_ERROR_TYPES:
        return message
    shown = f"a {type(value).__name__}" if isinstance(value, (dict, list)) and len(repr(value)) > 60 else repr(value)
    return f"{message.split(', unable to')[0]}, got {shown}"


def _allowed_keys(path: OptionPath) -> list[str]:
    """The option names of the section at ``path`` (for 'did you mean' on unknown keys)."""
    model: type[BaseModel] | None = Config
    parts = list(path)
    while parts and model is not None:
        part = parts.pop(0)
        if model is Config and part in COMPONENT_KINDS and parts:
            model = COMPONENT_KINDS[str(part)].get(component_type(str(parts.pop(0))))
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
    """``file:line:col: option.path: message``; no position for what the file did not write."""
    if path is None:
        return message
    where = ""
    if root is not None and origins.get(path, "$").startswith("$"):  # not taken from OTEL_*
        mark = node_at(root, path).start_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}: "
    return f"{where}{_format_path(path)}: {message}"
