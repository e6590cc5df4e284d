"""How a problem in a configuration is reported: every problem at once, each at its option
path (``receivers.cuda.launch_sample_every: ...``), with a "did you mean" where one is close.

Validators raise pydantic errors; ``custom_error`` makes one of our own kind and ``carried``
moves a nested one up a level, so that the loader can turn them all into the lines of one
``ConfigError`` (``messages.py``)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias, get_args

from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError
from pydantic_core.core_schema import ErrorType

OptionPath: TypeAlias = tuple[str | int, ...]  # keys and list indexes from the top of the config


class ConfigError(Exception):
    """The configuration is invalid; ``errors`` holds one line per problem, all of them."""

    def __init__(self, source: str, errors: Sequence[str]) -> None:
        self.source = source
        self.errors = list(errors)
        count = f"{len(self.errors)} error{'s' if len(self.errors) != 1 else ''}"
        lines = "\n".join(f"  {e}" for e in self.errors)
        super().__init__(f"invalid otelbpf configuration ({source}, {count}):\n{lines}")


def custom_error(kind: str, message: str, loc: OptionPath, value: object) -> InitErrorDetails:
    """A validation error of our own ``kind`` (braces escaped: pydantic formats messages)."""
    template = message.replace("{", "{{").replace("}", "}}")
    return {"type": PydanticCustomError(kind, template), "loc": loc, "input": value}


STANDARD_ERROR_TYPES = frozenset(get_args(ErrorType))  # pydantic's own; others are ours


def carried(error: ErrorDetails, prefix: OptionPath) -> InitErrorDetails:
    """A nested validation error re-raised one level up, its location prefixed."""
    loc = (*prefix, *error["loc"])
    if error["type"] not in STANDARD_ERROR_TYPES:
        return custom_error(error["type"], error["msg"], loc, error["input"])
    kept: InitErrorDetails = {"type": error["type"], "loc": loc, "input": error["input"]}
    if "ctx" in error:
        kept["ctx"] = error["ctx"]
    return kept


def suggest(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


@dataclass
class Findings:
    """What assembling the raw config found: problems at option paths (None: not in the file)
    and, per option path, the variable or ``${env:...}`` reference its value came from."""

    issues: list[tuple[OptionPath | None, str]] = field(default_factory=list)
    origins: dict[OptionPath, str] = field(default_factory=dict)
