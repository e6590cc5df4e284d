"""What counts as a secret in text the agent did not write, and how it is taken out.

One set of rules for every place that shows such text: the command lines of watched processes
(``process.command_line`` / ``process.command_args``, read from /proc/PID/cmdline), the
configuration as ``--print-config`` and its errors show it, and the log lines of the exporters'
HTTP client. A secret is replaced with ``REDACTED`` (OpenTelemetry's replacement in
``url.full``), the name it was given under kept, so that a reader still sees what was there:

- a value given under a secret-looking name (``is_secret_name``: password, token, secret, API
  key, auth, credential, cookie, private key, signature...), in every shape a command line
  gives one: ``--api-key=X``, ``--api-key X``, ``HF_TOKEN=X`` (``env``, ``docker -e``,
  ``-Dx.password=X``), ``Authorization: Bearer X`` (``curl -H``), ``?token=X&...`` in a URL or
  a form body, ``{"password": "X"}``;
- the password of a URL's userinfo (``postgres://user:X@host``; userinfo without a colon is a
  token as a whole: ``https://X@github.com``) and of ``curl -u user:X``;
- tokens of well-known shapes wherever they stand (``hf_...``, ``sk-...``, ``ghp_...``,
  ``AKIA...``, JWTs);
- an argument holding a command line of its own (``sh -c '...'``, a process that rewrote its
  argv into one string) is split as a shell would and redacted by the same rules; one past
  16 KiB (a ``python -c`` script) is searched for secret-named values instead, so that a
  hostile command line costs the agent milliseconds, not seconds.

Log lines of HTTP clients (``RedactingFilter``) lose every URL's userinfo and query values.

Redaction errs towards hiding: the argument after any secret-named flag is replaced unless it
is a long option itself (``--use-auth-token --model x`` keeps ``--model``), so a boolean flag
may cost the next argument. Short flags are left alone (``-p`` is a password to mysql and a
port to most others); ``mysql -pX`` is one shape this cannot tell.
"""

from __future__ import annotations

import logging
import re
import shlex
import urllib.parse
from collections.abc import Callable, Sequence

#: What a redacted value is replaced with (OpenTelemetry's convention for url.full).
REDACTED = "REDACTED"

#: Matched against a name lowercased with ``-``, ``.`` and spaces as ``_``. Words like
#: ``token`` must end a word (``hf_token``, ``accesstoken``), so ``max_tokens``, ``tokenizer``
#: and ``--max-num-batched-tokens`` are not secrets; ``auth`` is not ``author``/``authority``.
_SECRET_NAME = re.compile(
    r"passw(?:or)?d|passphrase|(?:^|_)pass(?:$|_|in$|out$)|(?:store|key)pass|(?:^|_)pwd(?:$|_)"
    r"|secret|token(?:$|_)|api_?key|credential|(?:^|_)creds?(?:$|_)"
    r"|(?:private|access|signing|encryption|master|client|account|storage|session)_?key"
    r"|(?:^|_)o?auth(?:$|_|n$|z$|2|orization|entication)|bearer|cookie|session_?id"
    r"|(?:^|_)sig(?:$|_)|signature|(?:^|_)jwt(?:$|_)|^key$"
)
_SEPARATORS = re.compile(r"[-.\s]+")
#: Flags whose value is ``user:password`` (curl's ``-u``/``--user``, ``--proxy-user``).
_USER_FLAGS = frozenset({"u", "user", "proxy_user"})
#: A flag named as a secret but saying there is none: it takes no value.
_NEGATED = ("no_", "disable_", "without_", "skip_")
#: How deep arguments holding command lines (``sh -c "bash -c '...'"``) are split, and values
#: of assignments (``--opt=KEY=value``) looked into.
_MAX_DEPTH = 3
#: The longest argument split into words (shlex is Python: ~30 ms per 100 KiB); a longer one (a
#: ``python -c`` script) is searched by ``_INLINE`` instead, at the regex engine's speed.
_MAX_SPLIT = 16 << 10
#: Shell operators, written back unquoted when words are joined again.
_OPERATORS = frozenset({"&&", "||", "|", "&", ";", ">", ">>", "<", "2>&1", "2>", "|&"})

#: ``-flag``/``--flag`` with its value in the next argument.
_FLAG = re.compile(r"-{1,2}([A-Za-z][A-Za-z0-9_.-]*)")
#: ``--name=value``, ``-Dname=value``, ``NAME=value``: the name, then all the rest is the value.
_ASSIGNMENT = re.compile(r"(-{0,2})([A-Za-z_][A-Za-z0-9_.-]*)=(.*)", re.S)
#: ``Name: value`` as curl's -H takes a header (an HTTP token, a colon, a value).
_HEADER = re.compile(r"(\s*)([!#$%&'*+^_`|~0-9A-Za-z.-]+)(\s*:\s*)(\S.*)", re.S)
#: ``scheme://userinfo@``: the userinfo runs to the authority's last ``@``.
_USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)([^/?#\s\"'<>]*)@")
#: ``name=value`` after ``?``, ``&``, ``#`` or ``;``: URL queries and fragments, form bodies.
_PAIR = re.compile(r"([?&#;])([^=&#?;\s\"'<>]+)=([^&#;\s\"'<>]*)")
#: A query without pairs (``/v1/traces?abc``), after a path or host character.
_BARE_QUERY = re.compile(r"(?<=[\w/])\?([^=&#\s\"'<>()]+)(?=$|[&#\s\"'<>)])")
#: ``"name": "value"`` (JSON, a Python dict), either quote.
_QUOTED_PAIR = re.compile(r"([\"'])([^\"'\\]{1,100})\1(\s*:\s*)([\"'])((?:\\.|(?!\4).)*)\4", re.S)
#: A secret-looking name and its value inside a long text: ``--token X``, ``password=X``,
#: ``"api_key": "X"``, ``Authorization: Bearer X``. The stems pre-select candidates; each name
#: found is then checked by ``is_secret_name``.
_STEMS = (
    r"passw|passphrase|secret|token|api_?key|auth|credential|cookie|private_?key|access_?key|signature|bearer"
    r"|session_?id"
)
_INLINE = re.compile(
    rf"(?<![\w.-])(?P<name>[A-Za-z_]?[\w.-]*?(?:{_STEMS})[\w.-]*)(?P<sep>[\"'\]]{{0,2}}\s*[:=]\s*[\"']?|\s+)"
    r"(?P<value>(?:bearer|basic|token|digest)\s+[^\s\"',;&]+|[^\s\"',;&]+)",
    re.I,
)
#: The same stems in lowercase text: a case-insensitive search is 40 times slower, so a long
#: text is first lowered and searched for any of them.
_ANY_STEM = re.compile(_STEMS)
#: Tokens whose shape says what they are, wherever they stand.
_TOKEN_SHAPES = re.compile(
    r"\b(?:sk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}|hf_[A-Za-z0-9]{30,}|gh[pousr]_[A-Za-z0-9]{30,}"
    r"|github_pat_[A-Za-z0-9_]{40,}|glpat-[A-Za-z0-9_-]{20,}|xox[abposr]-[A-Za-z0-9-]{10,}"
    r"|AKIA[0-9A-Z]{16}|eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]*)"
)


def is_secret_name(name: str) -> bool:
    """Whether a value given under ``name`` (a flag, a variable, a header, a query key, a config
    option) is taken for a secret: ``--api-key``, ``HF_TOKEN``, ``X-Auth-Token``, ``Cookie``,
    ``access_token``, ``-Djavax.net.ssl.keyStorePassword``; not ``--max-tokens`` or ``--author``."""
    return _SECRET_NAME.search(_normalized(name)) is not None


def _normalized(name: str) -> str:
    return _SEPARATORS.sub("_", urllib.parse.unquote(name).lower().lstrip("-"))


def redact_urls(text: str, *, every_query_value: bool = False) -> str:
    """``text`` with the userinfo of each URL in it and the values of secret-named query
    parameters (``every_query_value``: of all of them, and queries without pairs) replaced.
    What reads a URL only to show it (a config, a log line) takes ``every_query_value``: an
    endpoint's query is a credential more often than not (``?code=``, ``?sig=``)."""
    text = _USERINFO.sub(_redact_userinfo, text)
    if every_query_value:
        text = _BARE_QUERY.sub(f"?{REDACTED}", text)
    return _PAIR.sub(lambda m: _redact_pair(m, every_query_value), text)


def _redact_userinfo(m: re.Match[str]) -> str:
    userinfo = m.group(2)
    if not userinfo:
        return m.group(0)
    user, colon, _ = userinfo.partition(":")
    return f"{m.group(1)}{user}:{REDACTED}@" if colon else f"{m.group(1)}{REDACTED}@"


def _redact_pair(m: re.Match[str], every: bool) -> str:
    lead, name, value = m.groups()
    if value and (every or is_secret_name(name)):
        return f"{lead}{name}={REDACTED}"
    return m.group(0)


def redact_text(text: str) -> str:
    """The secrets in free text: URL userinfo, secret-named query and quoted pairs, tokens of
    known shapes (what ``redact_command_args`` applies within each argument)."""
    text = redact_urls(text)
    text = _QUOTED_PAIR.sub(_redact_quoted, text)
    return _TOKEN_SHAPES.sub(REDACTED, text)


def _redact_quoted(m: re.Match[str]) -> str:
    quote, name, sep, value_quote, value = m.groups()
    if value and is_secret_name(name):
        return f"{quote}{name}{quote}{sep}{value_quote}{REDACTED}{value_quote}"
    return m.group(0)


def redact_command_args(args: Sequence[str]) -> list[str]:
    """A command line's arguments with every secret the rules find replaced (module docstring);
    as many arguments as given, in order."""
    return _redact_args(args, 0)


def _redact_args(args: Sequence[str], depth: int) -> list[str]:
    out: list[str] = []
    value_rule: Callable[[str], str] | None = None  # what the previous flag says of this argument
    for arg in args:
        redacted = _redact_arg(arg, depth)
        if value_rule is not None and not arg.startswith("--"):
            out.append(value_rule(redacted))
            value_rule = None
            continue
        value_rule = _value_rule(arg)
        out.append(redacted)
    return out


def _value_rule(arg: str) -> Callable[[str], str] | None:
    """How the argument after ``arg`` is redacted when ``arg`` is a flag whose value it is."""
    m = _FLAG.fullmatch(arg)
    if m is None:
        return None
    name = _normalized(m.group(1))
    if name in _USER_FLAGS:
        return _redact_user
    if is_secret_name(name) and not name.startswith(_NEGATED):
        return lambda _: REDACTED
    return None


def _redact_user(value: str) -> str:
    """``user:password`` as curl's ``-u`` takes it: the user stays (a URL is no such value:
    ``python -u http://...``; its userinfo is ``redact_urls``'s)."""
    user, colon, password = value.partition(":")
    return f"{user}:{REDACTED}" if colon and password and "://" not in value else value


def _redact_arg(arg: str, depth: int) -> str:
    if depth > _MAX_DEPTH:  # a=b=c=... nested past reason: what any text gets
        return redact_text(arg)
    m = _ASSIGNMENT.fullmatch(arg)
    if m is not None:
        dashes, name, value = m.groups()
        if is_secret_name(name):
            return f"{dashes}{name}={REDACTED}" if value else arg
        value = _redact_arg(value, depth + 1)  # --url=postgres://..., --header=Authorization: ...
        return f"{dashes}{name}={_redact_user(value) if dashes and _normalized(name) in _USER_FLAGS else value}"
    m = _HEADER.fullmatch(arg)
    if m is not None and is_secret_name(m.group(2)):
        return f"{m.group(1)}{m.group(2)}{m.group(3)}{REDACTED}"
    if len(arg) > _MAX_SPLIT:
        if _ANY_STEM.search(arg.lower()):
            arg = _INLINE.sub(_redact_inline, arg)
    elif depth < _MAX_DEPTH and any(c.isspace() for c in arg):
        arg = _redact_shell(arg, depth + 1)
    return redact_text(arg)


def _redact_inline(m: re.Match[str]) -> str:
    name = _normalized(m.group("name"))
    if is_secret_name(name) and not name.startswith(_NEGATED):
        return f"{m.group('name')}{m.group('sep')}{REDACTED}"
    return m.group(0)


def _redact_shell(text: str, depth: int) -> str:
    """An argument that holds words (``sh -c 'curl -H "Authorization: ..." ...'``), its words
    redacted as arguments; as it was when none needed it."""
    try:
        words = shlex.split(text)
        quote: Callable[[str], str] = shlex.quote
    except ValueError:  # unbalanced quotes: words as the blanks separate them
        words, quote = text.split(), str
    redacted = _redact_args(words, depth)
    if redacted == words:
        return text
    return " ".join(w if w in _OPERATORS else quote(w) for w in redacted)


class RedactingFilter(logging.Filter):
    """A logger filter that takes URL userinfo and every query value out of each record's
    message and traceback (``redact_urls``): for the loggers of HTTP clients, which write the
    request target (``"POST /v1/traces?api_key=... HTTP/1.1" 200``) or quote it in errors."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact_urls(message, every_query_value=True)
        if redacted != message:
            record.msg, record.args = redacted, ()
        if record.exc_info and not record.exc_text:
            record.exc_text = redact_urls(logging.Formatter().formatException(record.exc_info), every_query_value=True)
        return True


def redact_logs_of(names: Sequence[str]) -> None:
    """Put a ``RedactingFilter`` on each named logger (once). A logger's filter sees only the
    records logged on that very logger, not its children's: name each one that logs."""
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactingFilter) for f in logger.filters):
            logger.addFilter(RedactingFilter())
