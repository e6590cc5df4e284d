"""``${env:VAR}`` references in the config's string values.

String values may use ``${env:VAR}``, ``${env:VAR:-default}``, ``${VAR}`` and
``${VAR:-default}`` (the default applies when VAR is unset or empty; ``$$`` writes a literal
``$``); an unset variable without a default is an error naming it and the option that used
it. Each substituted option remembers the reference it came from, for error messages.

Substitution is bounded: the strings that hold a reference, read and written, come to at most
``MAX_SUBSTITUTED_BYTES`` (4 MiB) in all. A 1 MiB file whose one long ``${X:-...}`` string
is repeated 20,000 times through YAML aliases would otherwise build gigabytes (each alias is
substituted on its own); past the bound ``SubstitutionLimit`` names the option reached."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from otelbpf.config.errors import Findings, OptionPath
from otelbpf.config.units import format_size

_REFERENCE = re.compile(r"\$\$|\$\{([^}]*)\}")
_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

#: What substitution may read and write in all (characters of the strings holding a ``$``):
#: a real config substitutes a few hundred bytes.
MAX_SUBSTITUTED_BYTES = 4 << 20


class SubstitutionLimit(Exception):
    """Substitution passed ``MAX_SUBSTITUTED_BYTES`` at ``path``."""

    def __init__(self, path: OptionPath) -> None:
        self.path = path
        super().__init__(
            f"${{...}} substitution reads and writes more than {format_size(MAX_SUBSTITUTED_BYTES)} in all "
            "(a value repeated through YAML aliases counts each time): refused"
        )


@dataclass
class _Budget:
    left: int = MAX_SUBSTITUTED_BYTES

    def spend(self, n: int, path: OptionPath) -> None:
        self.left -= n
        if self.left < 0:
            raise SubstitutionLimit(path)


def substitute(
    value: Any, path: OptionPath, env: Mapping[str, str], found: Findings, budget: _Budget | None = None
) -> Any:
    """``value`` with every ``${env:VAR}``-style reference in its strings replaced. Raises
    SubstitutionLimit past ``MAX_SUBSTITUTED_BYTES``."""
    budget = _Budget() if budget is None else budget
    if isinstance(value, dict):
        return {k: substitute(v, (*path, k), env, found, budget) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, (*path, i), env, found, budget) for i, v in enumerate(value)]
    if not isinstance(value, str) or "$" not in value:
        return value
    budget.spend(len(value), path)

    def replace(match: re.Match[str]) -> str:
        reference = match.group(0)
        if reference == "$$":
            return "$"
        body = match.group(1)
        provider, colon, rest = body.partition(":")
        if colon and not rest.startswith("-"):
            if provider != "env":
                message = f"{reference}: unsupported provider {provider!r}; only ${{env:VAR}} is supported"
                found.issues.append((path, message))
                return ""
            body = rest
        name, _, default = body.partition(":-")
        if not _VAR_NAME.fullmatch(name):
            found.issues.append(
                (
                    path,
                    f"{reference}: {name!r} is not a variable name (write ${{env:NAME}} or "
                    f"${{env:NAME:-default}}; $$ for a literal $)",
                )
            )
            return ""
        found.origins[path] = reference
        current = env.get(name)
        if ":-" in body and not current:
            return default
        if current is None:
            found.issues.append(
                (
                    path,
                    f"environment variable {name} is not set (used as {reference}); "
                    f"set it, or give a default: ${{env:{name}:-value}}",
                )
            )
            return ""
        return current

    result = _REFERENCE.sub(replace, value)
    budget.spend(len(result), path)
    return result
