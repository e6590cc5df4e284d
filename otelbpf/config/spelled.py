"""A loaded configuration with its durations and sizes spelled as a user writes them.

A loaded ``Config`` keeps durations in int nanoseconds and sizes in int bytes (exact and
comparable), so a plain dump shows ``interval: 10000000000`` for ``10s``. ``spelled`` dumps it
as ``--print-config`` shows it, with each duration and size field back in its unit
(``10s``, ``16MiB``), which the loader reads back to the same values. A field is recognised by
the validator its type carries (``units.Duration``, ``Size``, ``RingSize``, ``AutoRingSize``),
so a new option of those types is spelled with no change here."""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic.functional_validators import BeforeValidator

from otelbpf.config import units

#: The parsers whose fields are durations or sizes, and how to spell their int values back.
_SPELLERS: dict[Callable[..., Any], Callable[[int], str]] = {
    units.parse_duration: units.format_duration,
    units.parse_size: units.format_size,
    units._auto_or_ring: units.format_size,  # "auto" stays as is: only ints are spelled
}


def spelled(model: BaseModel) -> dict[str, Any]:
    """``model.model_dump(mode="json", exclude_none=True)`` with durations and sizes in units."""
    dumped = model.model_dump(mode="json", exclude_none=True)
    return typing.cast(dict[str, Any], _walk(model, dumped))


def _walk(value: Any, dumped: Any) -> Any:
    if isinstance(value, BaseModel) and isinstance(dumped, dict):
        fields = type(value).model_fields
        out = {}
        for key, item in dumped.items():
            field = fields.get(key)
            speller = _speller(field) if field is not None else None
            if speller is not None and isinstance(item, int) and not isinstance(item, bool):
                out[key] = speller(item)
            else:
                out[key] = _walk(getattr(value, key, None), item)
        return out
    if isinstance(value, dict) and isinstance(dumped, dict):
        return {k: _walk(value.get(k), v) for k, v in dumped.items()}
    if isinstance(value, (list, tuple)) and isinstance(dumped, list) and len(value) == len(dumped):
        return [_walk(v, d) for v, d in zip(value, dumped, strict=True)]
    return dumped


def _speller(field: FieldInfo) -> Callable[[int], str] | None:
    """The speller for a field typed as a duration or a size, also under ``| None``."""
    metadata: list[Any] = list(field.metadata)
    for arg in typing.get_args(field.annotation):
        metadata.extend(getattr(arg, "__metadata__", ()))
    for item in metadata:
        if isinstance(item, BeforeValidator) and item.func in _SPELLERS:
            return _SPELLERS[item.func]
    return None
