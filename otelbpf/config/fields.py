"""What every section of the config shares: the ``Section`` base (unknown keys are errors,
loaded configs are frozen), and the checks that more than one section runs on its values
(repeated items, absolute search globs, http(s) URLs, HTTP header names and values, file paths)."""

from __future__ import annotations

import os
import re
import stat
import urllib.parse
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict


class Section(BaseModel):
    """Unknown keys are errors (typos must not pass silently); loaded configs are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def unique(items: list[Any], what: str) -> list[Any]:
    """``items`` as they are, or an error naming those written more than once."""
    repeated = sorted({str(i) for i in items if items.count(i) > 1})
    if repeated:
        raise ValueError(f"{what} listed more than once: {', '.join(repeated)}")
    return items


def absolute_glob(pattern: str) -> str:
    if not pattern.startswith("/"):
        raise ValueError(f"{pattern!r} is relative: search paths are absolute globs (the working directory varies)")
    return pattern


def http_url(value: str | None, example: str) -> str | None:
    """``value`` as it is when unset or an http(s):// URL with a host, else an error showing ``example``."""
    if value is not None:
        endpoint_text(value)
        parts = urllib.parse.urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{value!r} is not an http(s):// URL with a host (like {example})")
        endpoint_port(value, parts)
    return value


def has_userinfo(url: str | None) -> bool:
    """Whether an http(s) URL carries ``user[:password]@``: the HTTP client (requests) sends it
    as basic auth, in place of any ``Authorization`` the exporter was given otherwise."""
    return url is not None and "@" in urllib.parse.urlsplit(url).netloc


_ENDPOINT_TEXT = re.compile(r"[\x21-\x7e]+")


def endpoint_text(endpoint: str) -> None:
    """An endpoint is printable ASCII without spaces: urllib takes ``"a b:4317"`` or a control
    character in a host as they are, and every export then fails (or goes elsewhere)."""
    if not _ENDPOINT_TEXT.fullmatch(endpoint):
        bad = next((c for c in endpoint if not _ENDPOINT_TEXT.fullmatch(c)), "")
        what = f"{bad!r} is not allowed" if bad else "it is empty"
        raise ValueError(f"endpoint {endpoint!r}: {what}: printable ASCII, no spaces or control characters")


def endpoint_port(endpoint: str, parts: urllib.parse.SplitResult) -> int | None:
    """The port written in ``parts`` (of ``endpoint``), 1 to 65535 in digits, or None if none is."""
    hostport = parts.netloc.rpartition("@")[2]
    _, bracket, after = hostport.rpartition("]")  # an IPv6 literal: the port follows its bracket
    tail = after if bracket else hostport
    if ":" not in tail:
        return None
    text = tail.rpartition(":")[2]
    if not (text.isascii() and text.isdigit() and len(text) <= 5 and 1 <= int(text) <= 65535):
        raise ValueError(f"endpoint {endpoint!r}: port {text!r} is not a number from 1 to 65535")
    return int(text)


#: A library search path: an absolute glob (``/usr/lib/*/libnccl.so*``).
SearchPath = Annotated[str, AfterValidator(absolute_glob)]

HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HEADER_VALUE = re.compile(r"[\x20-\x7e]*")


def _header_value(value: str) -> str:
    """What both transports send: gRPC refuses any control or non-ASCII byte in metadata
    (every export then fails with "Invalid metadata"), and CR/LF would split an HTTP header."""
    if not _HEADER_VALUE.fullmatch(value):
        bad = next(c for c in value if not _HEADER_VALUE.fullmatch(c))
        raise ValueError(f"{bad!r} is not allowed in a header value: printable ASCII only (no CR, LF, NUL, tab)")
    return value


def _header_name(name: str) -> str:
    if not HEADER_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a header name (letters, digits and !#$%&'*+.^_`|~-)")
    return name


def _unique_names(value: dict[str, str]) -> dict[str, str]:
    seen: set[str] = set()
    for name in value:
        if name.lower() in seen:
            raise ValueError(f"header {name!r} is written twice (names are case-insensitive)")
        seen.add(name.lower())
    return value


def _grpc_names(value: dict[str, str]) -> dict[str, str]:
    """gRPC metadata keys are lowercase (an upper-case one fails every export), and a ``-bin``
    key carries bytes: grpc raises TypeError at every export given a str value for it."""
    binary = [name for name in value if name.lower().endswith("-bin")]
    if binary:
        raise ValueError(
            f"{', '.join(map(repr, binary))}: gRPC metadata names ending in -bin carry binary values, "
            "which a config cannot give: rename the header"
        )
    return {name.lower(): text for name, text in _unique_names(value).items()}


HeaderValue = Annotated[str, AfterValidator(_header_value)]
_HeaderName = Annotated[str, AfterValidator(_header_name)]
Headers = Annotated[dict[_HeaderName, HeaderValue], AfterValidator(_unique_names)]
GrpcHeaders = Annotated[dict[_HeaderName, HeaderValue], AfterValidator(_grpc_names)]


def _no_nul(value: str) -> str:
    if "\0" in value:
        raise ValueError("a path must not contain a NUL character")
    return value


FilePath = Annotated[str, AfterValidator(_no_nul)]


def _readable_file(path: str) -> str:
    """What an exporter reads when it starts (a TLS CA, certificate or key): checked when the
    config is loaded, so that ``validate`` fails where ``run`` would (relative paths are read
    from the working directory, as ``run`` reads them)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ValueError(f"cannot read {path!r}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{path!r} is not a regular file")
    if not os.access(path, os.R_OK):
        raise ValueError(f"cannot read {path!r}: permission denied")
    return path


#: A file the agent reads at start: it must exist and be readable then.
ReadableFile = Annotated[str, AfterValidator(_no_nul), AfterValidator(_readable_file)]
