"""What of a request target or a Host may leave the agent: never credentials.

A request target is exported as ``url.path`` and a Host (``:authority``) as
``server.address``; both can carry secrets a client put there:
- userinfo, ``http://user:password@host/...`` in an absolute-form target (as
  proxies receive them) or ``user:password@host`` in a Host header: removed;
- path parameters, ``/cart;jsessionid=...`` (servlet session ids and the
  like): each parameter's value becomes ``REDACTED``, its name stays;
- the query string and fragment (``?access_token=...``): never exported at all.

What a value is replaced with, and what else counts as a secret (in command lines, the
configuration, log lines), is ``base/secrets.py``'s: one set of rules.

Third-party libraries that see the same bytes must not log them either:
``quiet_payload_loggers`` (called where the HTTP receiver starts) sets their
levels explicitly, whatever the agent's own ``log_level``.
"""

from __future__ import annotations

import logging
import re

from otelbpf.base.secrets import REDACTED

log = logging.getLogger(__name__)

#: An absolute-form target: scheme, then the authority, then the rest.
_ABSOLUTE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://([^/?#]*)(.*)", re.S)
#: Libraries that log decoded headers or payloads at DEBUG (hpack logs every header it decodes,
#: h2 every frame) and the level they are held at; grpc logs connection errors worth keeping.
_PAYLOAD_LOGGERS = {"hpack": logging.CRITICAL + 1, "h2": logging.CRITICAL + 1, "grpc": logging.WARNING}


def split_target(target: str) -> tuple[str, str | None]:
    """(path, authority) of a request target: the path without query, fragment or path parameter
    values; the authority of an absolute-form target (None for the other forms) without userinfo."""
    if target[:1] == "/":  # origin-form, the usual case: no regex
        path = target.split("?", 1)[0]
        if "#" in path:
            path = path.split("#", 1)[0]
        return (redact_path(path) if ";" in path else path), None
    m = _ABSOLUTE.match(target)
    authority = None
    if m is not None:
        authority, target = strip_userinfo(m.group(1)), m.group(2) or "/"
    elif not target.startswith("/"):  # authority-form (CONNECT) or "*"
        target = strip_userinfo(target)
    path = target.split("?", 1)[0].split("#", 1)[0]
    return redact_path(path), authority


def strip_userinfo(host: str) -> str:
    """``host[:port]`` of an authority that may begin with ``userinfo@``."""
    return host.rpartition("@")[2]


def redact_path(path: str) -> str:
    """The path with each ``;name=value`` parameter's value replaced by REDACTED."""
    if ";" not in path:
        return path
    return "/".join(_redact_params(segment) if ";" in segment else segment for segment in path.split("/"))


def _redact_params(segment: str) -> str:
    name, _, params = segment.partition(";")
    out = [name]
    for param in params.split(";"):
        key, eq, _ = param.partition("=")
        out.append(f"{key}={REDACTED}" if eq else key)
    return ";".join(out)


def quiet_payload_loggers() -> None:
    """Hold the loggers of libraries that log decoded headers at levels where they log none of them,
    whatever the root logger's level (``log_level: debug`` would otherwise print every Authorization
    and Cookie hpack decodes)."""
    for name, level in _PAYLOAD_LOGGERS.items():
        logging.getLogger(name).setLevel(level)
    log.debug(
        "loggers that would log payloads held quiet: %s",
        ", ".join(f"{name} at {logging.getLevelName(level)}" for name, level in _PAYLOAD_LOGGERS.items()),
    )
