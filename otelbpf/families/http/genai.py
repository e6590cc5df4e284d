"""OpenAI-compatible inference APIs from captured body bytes: model, token usage, and (only when
configured) the messages, as OpenTelemetry's GenAI semantic conventions name them.

Requests to ``…/v1/chat/completions`` (``chat``) and ``…/v1/completions`` (``text_completion``),
as vLLM, SGLang, TGI, llama.cpp and OpenAI itself serve them, streamed (SSE) or not. The request
body's top-level ``model`` is ``gen_ai.request.model``; the response's ``model``, ``id``,
``choices[].finish_reason`` and ``usage`` (the JSON response, or the final SSE event a client asks
for with ``stream_options.include_usage``) give the rest. A stream without ``usage`` has its
events counted as an estimate of the output tokens, flagged as one.

Bounded: bodies are never buffered. ``JsonScanner`` walks a document as its pieces arrive and
keeps only its container stack (at most ``Limits.json_depth``) and the value it is reading, if that
value sits at a path asked for (at most a value's cap); strings are skipped in C (``re``/``bytes.find``),
and a document longer than ``Limits.json_document`` is given up. A gap (bytes not captured) ends a document's
reading: nothing after it is guessed. The kernel captures at most ``payload_size`` bytes of each
syscall, so a ``model`` written after a long prompt in the same ``send`` is not seen
(``gen_ai.response.model`` then still is, from the response).

Besides OpenAI's API, two other providers' wire formats are read (``API``, ``classify``):
Anthropic's Messages API (``POST …/v1/messages``: ``chat``, provider ``anthropic``; streamed as
``message_start`` (model, id, input tokens), ``content_block_delta`` (the output, one event per
piece), ``message_delta`` (stop reason, output tokens)) and Gemini's ``generateContent`` and
``streamGenerateContent?alt=sse`` (``…/models/{model}:generateContent``: ``generate_content``,
provider ``gcp.gemini``, or ``gcp.vertex_ai`` under ``/projects/``; the model from the path,
``modelVersion``, ``responseId``, ``candidates[].finishReason``, ``usageMetadata``). Client or
server alike: the direction only decides which metrics are recorded (correlator.py).

Prompts and completions are read only when ``capture_content`` is set (the http receiver's
``capture_message_content``, off by default); they are then exported, clipped, as
``gen_ai.input.messages`` and ``gen_ai.output.messages``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from otelbpf.families.http.protocols.limits import DEFAULT, Limits

#: Path suffix → ``gen_ai.operation.name``.
OPERATIONS = (("/v1/chat/completions", "chat"), ("/v1/completions", "text_completion"))
#: ``gen_ai.provider.name``: the API's flavour (OpenAI's), whoever serves it (the semantic
#: conventions call the attribute a discriminator of the telemetry's format).
PROVIDER = "openai"

#: Bytes kept of an object key (a longer key matches no path).
MAX_KEY = 64
#: Bytes kept of a scalar (number, true, false, null).
MAX_SCALAR = 64
#: Values kept per name and document (the messages of a long conversation, say).
MAX_VALUES = 256
#: Largest token count believed.
MAX_TOKENS = 1 << 40

#: The key of an object member whose name was longer than MAX_KEY: matches no path.
_LONG_KEY = "\0"
_STRING_SPECIAL = re.compile(rb'["\\]')
_TOKEN = re.compile(rb'[ \t\r\n]*(?:([{}\[\]:,])|(")|([^ \t\r\n{}\[\]:,"]+))?')
_SCALAR_REST = re.compile(rb'[^ \t\r\n{}\[\]:,"]*')
_INTEGER = re.compile(rb"-?(?:0|[1-9][0-9]*)")
#: Pre-tests on an SSE event's bytes, so that most events are not walked at all.
_USAGE_OBJECT = re.compile(rb'"usage"\s*:\s*\{')
_FINISHED = re.compile(rb'"finish_reason"\s*:\s*"')
_NO_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')

#: A path: object keys from the root, ``*`` for any array element. A target: (name, cap in bytes).
Path = tuple[str, ...]
Targets = dict[Path, tuple[str, int]]


def operation(method: str, path: str) -> str | None:
    """``gen_ai.operation.name`` of a request, or None if it is not an OpenAI-compatible completion."""
    if method != "POST":
        return None
    for suffix, name in OPERATIONS:
        if path.endswith(suffix):
            return name
    return None


@dataclass(frozen=True)
class Api:
    """One provider's wire format: what its request and response bodies say, and where."""

    provider: str
    request: Targets
    request_content: dict[Path, str]
    response: Targets
    response_content: dict[Path, str]
    #: Both token counts come in one usage object, and one without the other is not believed
    #: (OpenAI); else each count is taken where it comes, a later one replacing an earlier
    #: (Anthropic's input tokens at message_start, output tokens at message_delta).
    usage_together: bool


#: Gemini (AI Studio) and Vertex AI: ``…/models/{model}:generateContent`` or ``:streamGenerateContent``.
_GEMINI_PATH = re.compile(r"/v1[a-z0-9]*/(?:projects/[^?]*/)?models/([^/:?]+):(generateContent|streamGenerateContent)$")


def classify(method: str, path: str) -> tuple[str, Api, str | None, bool] | None:
    """(operation name, API, model named by the path, streamed by the path) of a GenAI request,
    or None for any other request."""
    if method != "POST":
        return None
    name = operation(method, path)
    if name is not None:
        return name, OPENAI, None, False
    if path.endswith("/v1/messages"):
        return "chat", ANTHROPIC, None, False
    m = _GEMINI_PATH.search(path)
    if m is not None:
        api = VERTEX if "/projects/" in path else GEMINI
        return "generate_content", api, m.group(1), m.group(2) == "streamGenerateContent"
    return None


class _Frame:
    __slots__ = ("obj", "path", "key", "want_key", "live")

    def __init__(self, obj: bool, path: Path, live: bool) -> None:
        self.obj = obj
        self.path = path
        self.key: str | None = None
        self.want_key = obj
        self.live = live


class JsonScanner:
    """One JSON document fed in pieces; the values at ``targets``' paths, by name, in order.

    ``broken`` says why reading stopped early ("" if it did not); ``done`` that the root closed.
    Values read before a break are kept: a caller that needs a whole document checks ``complete``.
    """

    def __init__(self, targets: Targets, *, limits: Limits = DEFAULT) -> None:
        self._targets = targets
        self._live = {path[:i] for path in targets for i in range(len(path))}
        self._max_bytes = limits.json_document
        self._max_depth = limits.json_depth
        self._stack: list[_Frame] = []
        self._string = 0  # 0: not in a string; 1: a key; 2: a value kept; 3: a value skipped
        self._escape = False  # a backslash ended the last piece
        self._buf = bytearray()  # the key or kept value being read
        self._cap = 0
        self._over = False  # the value was longer than its cap
        self._name = ""  # the kept value's name
        self._scalar: bytearray | None = None  # a scalar that may continue in the next piece
        self._scalar_target: tuple[str, int] | None = None
        self.read = 0
        self.done = False
        self.broken = ""
        self.values: dict[str, list[object]] = {}  # JSON scalars (str, int, float, bool) by key
        self.clipped = False  # some value was longer than its cap, or beyond MAX_VALUES

    @property
    def complete(self) -> bool:
        return self.done and not self.broken

    def gap(self) -> None:
        if not self.done and not self.broken:
            self.broken = "gap"

    def feed(self, data: bytes) -> None:
        if self.done or self.broken:
            return
        self.read += len(data)
        if self.read > self._max_bytes:
            self.broken = "too_large"
            return
        pos, end = 0, len(data)
        if self._scalar is not None:
            pos = self._continue_scalar(data)
        while pos < end and not self.done and not self.broken:
            if self._string:
                pos = self._in_string(data, pos)
                continue
            m = _TOKEN.match(data, pos)
            assert m is not None  # every part of it is optional
            pos = m.end()
            struct, quote, scalar = m.groups()
            if struct:
                self._structural(struct)
            elif quote:
                self._open_string()
            elif scalar:
                target = self._target()
                if pos == end:  # may go on in the next piece
                    self._scalar, self._scalar_target = bytearray(scalar[:MAX_SCALAR]), target
                else:
                    self._value_done(target, scalar)

    # -- structure ---------------------------------------------------------------

    def _value_path(self) -> Path | None:
        """The path of the value about to start, None when no path asked for lies there or below."""
        if not self._stack:
            return ()
        top = self._stack[-1]
        if not top.live:
            return None
        if top.obj:
            if top.want_key or top.key is None:
                self.broken = "bad_json"  # a value where a key belongs
                return None
            return top.path + (top.key,)
        return top.path + ("*",)

    def _target(self) -> tuple[str, int] | None:
        path = self._value_path()
        return None if path is None else self._targets.get(path)

    def _structural(self, c: bytes) -> None:
        stack = self._stack
        if c == b"{" or c == b"[":
            path = self._value_path()
            if self.broken:
                return
            if len(stack) >= self._max_depth:
                self.broken = "too_deep"
                return
            stack.append(_Frame(c == b"{", path or (), path is not None and path in self._live))
        elif c == b"}" or c == b"]":
            if not stack or stack[-1].obj != (c == b"}"):
                self.broken = "bad_json"
                return
            stack.pop()
            if not stack:
                self.done = True
            else:
                self._after_value()
        elif c == b":":
            if not stack or not stack[-1].obj or stack[-1].want_key or stack[-1].key is None:
                self.broken = "bad_json"
        elif stack and stack[-1].obj:  # ","
            stack[-1].want_key, stack[-1].key = True, None
        elif not stack:
            self.broken = "bad_json"

    def _after_value(self) -> None:
        """A value ended: in an object, its key is used up (the next value needs a new one)."""
        if self._stack and self._stack[-1].obj:
            self._stack[-1].key = None

    # -- strings ---------------------------------------------------------------------

    def _open_string(self) -> None:
        top = self._stack[-1] if self._stack else None
        self._buf.clear()
        self._over = False
        if top is not None and top.obj and top.want_key:
            self._string, self._cap = 1, MAX_KEY
            return
        target = self._target()
        if target is None:
            self._string = 3
        else:
            self._string = 2
            self._name, self._cap = target

    def _keep(self, piece: bytes) -> None:
        room = self._cap - len(self._buf)
        if len(piece) > room:
            self._over = True
            piece = piece[: max(room, 0)]
        self._buf += piece

    def _in_string(self, data: bytes, pos: int) -> int:
        keep = self._string != 3
        if self._escape:  # the character a backslash at the end of the last piece escaped
            self._escape = False
            if keep:
                self._keep(data[pos : pos + 1])
            pos += 1
        end = len(data)
        while pos < end:
            m = _STRING_SPECIAL.search(data, pos)
            if m is None:
                if keep:
                    self._keep(data[pos:])
                return end
            at = m.start()
            if data[at] == 0x5C:  # backslash: it and the character it escapes
                if keep:
                    self._keep(data[pos : at + 2])
                if at + 1 >= end:
                    self._escape = True
                pos = at + 2
                continue
            if keep:
                self._keep(data[pos:at])
            self._string_done()
            return at + 1
        return pos

    def _string_done(self) -> None:
        kind, self._string = self._string, 0
        if kind == 1:
            top = self._stack[-1]
            top.key = _LONG_KEY if self._over else _unescape(bytes(self._buf))
            top.want_key = False
            return
        if kind == 2:
            self._record(self._name, _unescape(bytes(self._buf)))
            self.clipped |= self._over
        self._after_value()

    # -- scalars ---------------------------------------------------------------------

    def _continue_scalar(self, data: bytes) -> int:
        m = _SCALAR_REST.match(data)
        scalar = self._scalar
        assert m is not None and scalar is not None  # the pattern matches the empty string; called with one held
        scalar += m.group()[: MAX_SCALAR - len(scalar)]
        if m.end() == len(data):
            return m.end()
        self._scalar = None
        self._value_done(self._scalar_target, bytes(scalar))
        return m.end()

    def _value_done(self, target: tuple[str, int] | None, scalar: bytes) -> None:
        if self._stack and self._stack[-1].obj and (self._stack[-1].want_key or self._stack[-1].key is None):
            self.broken = "bad_json"
            return
        self._after_value()
        if target is None:
            return
        if _INTEGER.fullmatch(scalar):
            value: object = int(scalar)
        elif scalar in (b"true", b"false"):
            value = scalar == b"true"
        elif scalar == b"null":
            return
        else:
            try:
                value = float(scalar)
            except ValueError:
                self.broken = "bad_json"
                return
        self._record(target[0], value)

    def _record(self, name: str, value: object) -> None:
        values = self.values.setdefault(name, [])
        if len(values) < MAX_VALUES:
            values.append(value)
        else:
            self.clipped = True


def _unescape(raw: bytes) -> str:
    """A JSON string's content (as read: possibly cut in the middle of an escape, dropped then)."""
    try:
        return str(json.loads(b'"' + raw + b'"'))  # a JSON string literal loads as a str
    except ValueError:
        cut = raw.rfind(b"\\", max(len(raw) - 6, 0))
        if cut >= 0:
            try:
                return str(json.loads(b'"' + raw[:cut] + b'"'))
            except ValueError:
                pass
        return raw.decode("utf-8", "replace")


#: What the request body says.
_REQUEST: Targets = {("model",): ("model", 256), ("stream",): ("stream", 8)}
_REQUEST_CONTENT = {
    ("messages", "*", "role"): "role",
    ("messages", "*", "content"): "content",
    ("messages", "*", "content", "*", "text"): "content",
    ("prompt",): "prompt",
    ("prompt", "*"): "prompt",
}
#: What a response (the JSON, or each SSE event) says.
_RESPONSE: Targets = {
    ("model",): ("model", 256),
    ("id",): ("id", 256),
    ("choices", "*", "finish_reason"): ("finish_reason", 64),
    ("usage", "prompt_tokens"): ("input_tokens", MAX_SCALAR),
    ("usage", "completion_tokens"): ("output_tokens", MAX_SCALAR),
}
_RESPONSE_CONTENT = {
    ("choices", "*", "delta", "content"): "content",
    ("choices", "*", "text"): "content",
    ("choices", "*", "message", "content"): "content",
}


OPENAI = Api(PROVIDER, _REQUEST, _REQUEST_CONTENT, _RESPONSE, _RESPONSE_CONTENT, usage_together=True)
_ANTHROPIC_USAGE = {
    ("usage", "input_tokens"): ("input_tokens", MAX_SCALAR),
    ("usage", "output_tokens"): ("output_tokens", MAX_SCALAR),
    ("message", "usage", "input_tokens"): ("input_tokens", MAX_SCALAR),
    ("message", "usage", "output_tokens"): ("output_tokens", MAX_SCALAR),
}
ANTHROPIC = Api(
    "anthropic",
    _REQUEST,
    {
        ("system",): "content",
        ("messages", "*", "role"): "role",
        ("messages", "*", "content"): "content",
        ("messages", "*", "content", "*", "text"): "content",
    },
    {
        ("model",): ("model", 256),
        ("id",): ("id", 256),
        ("stop_reason",): ("finish_reason", 64),
        ("message", "model"): ("model", 256),
        ("message", "id"): ("id", 256),
        ("delta", "stop_reason"): ("finish_reason", 64),
        **_ANTHROPIC_USAGE,
    },
    {("content", "*", "text"): "content", ("delta", "text"): "content"},
    usage_together=False,
)
_GEMINI_RESPONSE: Targets = {
    ("modelVersion",): ("model", 256),
    ("responseId",): ("id", 256),
    ("candidates", "*", "finishReason"): ("finish_reason", 64),
    ("usageMetadata", "promptTokenCount"): ("input_tokens", MAX_SCALAR),
    ("usageMetadata", "candidatesTokenCount"): ("output_tokens", MAX_SCALAR),
}
_GEMINI_REQUEST_CONTENT: dict[Path, str] = {
    ("contents", "*", "role"): "role",
    ("contents", "*", "parts", "*", "text"): "content",
}
_GEMINI_RESPONSE_CONTENT: dict[Path, str] = {("candidates", "*", "content", "parts", "*", "text"): "content"}
GEMINI = Api("gcp.gemini", {}, _GEMINI_REQUEST_CONTENT, _GEMINI_RESPONSE, _GEMINI_RESPONSE_CONTENT, False)
VERTEX = Api("gcp.vertex_ai", {}, _GEMINI_REQUEST_CONTENT, _GEMINI_RESPONSE, _GEMINI_RESPONSE_CONTENT, False)
#: An Anthropic SSE event that carries a piece of the output.
_ANTHROPIC_DELTA = re.compile(rb'"type"\s*:\s*"content_block_delta"')


def _with_content(base: Targets, content: dict[Path, str], cap: int) -> Targets:
    return {**base, **{path: (name, cap if name != "role" else 32) for path, name in content.items()}}


class RequestFacts:
    """An OpenAI-compatible request's body, read as it arrives (a ``BodySink``)."""

    wants_bytes = True

    def __init__(
        self,
        operation_name: str,
        *,
        content_cap: int = 0,
        limits: Limits = DEFAULT,
        api: Api | None = None,
        path_model: str | None = None,
        path_stream: bool = False,
    ) -> None:
        self.operation = operation_name
        self.api = api or OPENAI
        self.provider = self.api.provider
        self._path_model = path_model
        self._path_stream = path_stream
        self._content_cap = content_cap
        targets = self.api.request
        self._scanner = JsonScanner(
            _with_content(targets, self.api.request_content, content_cap) if content_cap else targets, limits=limits
        )

    def unit(self, stamp: object) -> None:
        pass

    def data(self, data: bytes, stamp: object) -> None:
        self._scanner.feed(data)

    def gap(self, n: int) -> None:
        self._scanner.gap()

    @property
    def problem(self) -> str:
        """Why the body was not read whole ("" if it was, or if it was cut only by a gap)."""
        broken = self._scanner.broken
        return "" if broken == "gap" else broken

    @property
    def model(self) -> str | None:
        values = self._scanner.values.get("model")
        return values[0] if values and isinstance(values[0], str) and values[0] else self._path_model

    @property
    def stream(self) -> bool | None:
        if self._path_stream:
            return True
        values = self._scanner.values.get("stream")
        return values[0] if values and isinstance(values[0], bool) else None

    def input_messages(self) -> list[dict[str, Any]] | None:
        """``gen_ai.input.messages`` (the semantic conventions' shape: role and text parts), if content is read."""
        if not self._content_cap:
            return None
        values = self._scanner.values
        if "prompt" in values:
            return [
                {"role": "user", "parts": [{"type": "text", "content": p}]}
                for p in values["prompt"]
                if isinstance(p, str)
            ]
        roles = [r for r in values.get("role", []) if isinstance(r, str)]
        contents = [c for c in values.get("content", []) if isinstance(c, str)]
        # Roles and contents come in message order, one content per message but for multi-part ones.
        return [
            {"role": roles[i] if i < len(roles) else "user", "parts": [{"type": "text", "content": c}]}
            for i, c in enumerate(contents)
        ]


@dataclass
class ResponseFacts:
    """An OpenAI-compatible response: one JSON body, or the data of SSE events (``event``)."""

    content_cap: int = 0
    limits: Limits = DEFAULT
    api: Api = OPENAI
    model: str | None = None
    id: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    finish_reasons: list[str] = field(default_factory=list)
    #: SSE events that carried output (not ``[DONE]``, not a usage-only event): the output estimate.
    token_events: int = 0
    #: ns of the first such event.
    first_token_ns: int | None = None
    output: list[str] = field(default_factory=list)
    #: Why some of it could not be read ("" if all was): ``bad_json``, ``bad_usage``, ``gap``, ...
    problem: str = ""
    _body: JsonScanner | None = None
    _output_chars: int = 0

    def _targets(self) -> Targets:
        api = self.api
        return _with_content(api.response, api.response_content, self.content_cap) if self.content_cap else api.response

    # -- a JSON body ---------------------------------------------------------------------

    def data(self, data: bytes, t_ns: int = 0) -> None:
        """A piece of a JSON body (``t_ns``: when it was read; unused by a JSON body)."""
        if self._body is None:
            self._body = JsonScanner(self._targets(), limits=self.limits)
        self._body.feed(data)

    def gap(self) -> None:
        if self._body is not None:
            self._body.gap()

    def body_done(self) -> None:
        """The JSON body ended: take what it said."""
        if self._body is not None:
            self._take(self._body)

    # -- SSE ---------------------------------------------------------------------------

    def event(self, data: bytes, t_ns: int) -> None:
        """One SSE event's data."""
        if data == b"[DONE]":
            return
        if self.api is not OPENAI:
            self._other_event(data, t_ns)
            return
        usage = _USAGE_OBJECT.search(data) is not None
        if not (usage and _NO_CHOICES.search(data)):
            self.token_events += 1
            if self.first_token_ns is None:
                self.first_token_ns = t_ns
        if self.model is None or usage or self.content_cap or _FINISHED.search(data):
            scanner = JsonScanner(self._targets(), limits=self.limits)
            scanner.feed(data)
            if not scanner.done and not scanner.broken:
                scanner.broken = "bad_json"  # an event is a whole document
            self._take(scanner)

    def _other_event(self, data: bytes, t_ns: int) -> None:
        """An Anthropic or Gemini SSE event: Anthropic's output comes in content_block_delta events
        (read only for their text), its facts in the few others; each Gemini event is a chunk of
        output with its facts (usageMetadata as counted so far: the last one stands)."""
        delta = self.api is ANTHROPIC and _ANTHROPIC_DELTA.search(data) is not None
        if delta or self.api is not ANTHROPIC:
            self.token_events += 1
            if self.first_token_ns is None:
                self.first_token_ns = t_ns
        if delta and not self.content_cap:
            return
        scanner = JsonScanner(self._targets(), limits=self.limits)
        scanner.feed(data)
        if not scanner.done and not scanner.broken:
            scanner.broken = "bad_json"
        self._take(scanner)

    def _take(self, s: JsonScanner) -> None:
        values = s.values
        if s.broken and s.broken != "gap":
            self.problem = self.problem or s.broken
        model = values.get("model")
        if self.model is None and model and isinstance(model[0], str) and model[0]:
            self.model = model[0]
        ids = values.get("id")
        if self.id is None and ids and isinstance(ids[0], str) and ids[0]:
            self.id = ids[0]
        for reason in values.get("finish_reason", ()):
            if isinstance(reason, str) and reason not in self.finish_reasons and len(self.finish_reasons) < 16:
                self.finish_reasons.append(reason)
        if not self.api.usage_together:
            for name in ("input_tokens", "output_tokens"):
                if name in values:
                    n = _token_count(values[name][-1:]) if s.complete else None
                    if n is None:
                        self.problem = self.problem or "bad_usage"
                    else:
                        setattr(self, name, n)
        elif "input_tokens" in values or "output_tokens" in values:
            if not s.complete:
                self.problem = self.problem or "bad_usage"  # counts of a document not read whole are not believed
            else:
                tokens = [_token_count(values.get(name)) for name in ("input_tokens", "output_tokens")]
                if None in tokens:
                    self.problem = self.problem or "bad_usage"
                else:
                    self.input_tokens, self.output_tokens = tokens
        for text in values.get("content", ()):
            if isinstance(text, str) and self._output_chars < self.content_cap:
                text = text[: self.content_cap - self._output_chars]
                self._output_chars += len(text)
                self.output.append(text)

    def output_messages(self) -> list[dict[str, Any]] | None:
        if not self.content_cap:
            return None
        message: dict[str, Any] = {"role": "assistant", "parts": [{"type": "text", "content": "".join(self.output)}]}
        if self.finish_reasons:
            message["finish_reason"] = self.finish_reasons[0]
        return [message]


def _token_count(values: list[object] | None) -> int | None:
    if not values or len(values) != 1:
        return None
    n = values[0]
    return n if type(n) is int and 0 <= n < MAX_TOKENS else None


def attributes(request: RequestFacts, response: ResponseFacts | None, clip: Callable[[str], str]) -> dict[str, object]:
    """Span attributes in the GenAI semantic conventions. ``clip``: the correlator's string bound."""
    attrs: dict[str, object] = {"gen_ai.operation.name": request.operation, "gen_ai.provider.name": request.provider}
    if request.model:
        attrs["gen_ai.request.model"] = clip(request.model)
    messages = request.input_messages()
    if messages:
        attrs["gen_ai.input.messages"] = clip(json.dumps(messages, ensure_ascii=False))
    if response is None:
        return attrs
    if response.model:
        attrs["gen_ai.response.model"] = clip(response.model)
    if response.id:
        attrs["gen_ai.response.id"] = clip(response.id)
    if response.finish_reasons:
        attrs["gen_ai.response.finish_reasons"] = [clip(r) for r in response.finish_reasons]
    if response.input_tokens is not None:
        attrs["gen_ai.usage.input_tokens"] = response.input_tokens
    if response.output_tokens is not None:
        attrs["gen_ai.usage.output_tokens"] = response.output_tokens
    elif response.token_events:
        attrs["gen_ai.usage.output_tokens"] = response.token_events
        attrs["otelbpf.gen_ai.usage.output_tokens.estimated"] = True
    output = response.output_messages()
    if output:
        attrs["gen_ai.output.messages"] = clip(json.dumps(output, ensure_ascii=False))
    return attrs


#: The client side's histograms (the GenAI semantic conventions): name -> (unit, description, bounds).
CLIENT_METRICS: dict[str, tuple[str, str, tuple[float, ...]]] = {
    "gen_ai.client.operation.duration": (
        "s",
        "GenAI requests made, request written to the last response byte read",
        (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92),
    ),
    "gen_ai.client.token.usage": (
        "{token}",
        "Tokens of GenAI requests made, by gen_ai.token.type (input, output), as the response counted them",
        (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864),
    ),
    "gen_ai.client.operation.time_to_first_chunk": (
        "s",
        "GenAI streamed requests made, request written to the first response chunk with output read",
        (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0),
    ),
}
