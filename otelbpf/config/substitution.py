"""``${env:VAR}`` references in the config's string values.

String values may use ``${env:VAR}``, ``${env:VAR:-default}``, ``${VAR}`` and
``${VAR:-default}`` (the default applies when VAR is unset or empty; ``$$`` writes a literal
``$``); an unset variable without a default is an error naming it and the option that used
it. Each substituted option remembers the reference it came from, for error messages."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from otelbpf.config.errors import Findings, OptionPath

_REFERENCE = re.compile(r"\$\$|\$\{([^}]*)\}")
_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def substitute(value: Any, path: OptionPath, env: Mapping[str, str], found: Findings) -> Any:
    """``value`` with every ``${env:VAR}``-style reference in its strings replaced."""
    if isinstance(value, dict):
        return {k: substitute(v, (*path, k), env, found) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, (*path, i), env, found) for i, v in enumerate(value)]
    if not isinstance(value, str) or "$" not in value:
        return value

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

    return _REFERENCE.sub(replace, value)
