"""gRPC generation streams as GenAI operations: which fields are read, and how tokens are counted.

Known messages (the protobuf fields read; nothing else of a message is looked at):

- Triton's ``inference.GRPCInferenceService`` (also TensorRT-LLM's backend and vLLM's behind
  Triton): ``ModelStreamInfer`` (bidirectional; in decoupled mode one response message per
  generated token) and ``ModelInfer`` (unary). The request's ``ModelInferRequest.model_name``
  (field 1) is ``gen_ai.request.model``; each response's ``ModelInferResponse`` (for the
  stream, inside ``ModelStreamInferResponse.infer_response``, field 2) gives
  ``gen_ai.response.model`` (field 1) and ``gen_ai.response.id`` (field 3); a non-empty
  ``ModelStreamInferResponse.error_message`` (field 1) is an error. Output tokens of a stream:
  the response messages that carry an ``infer_response`` with outputs (field 5), flagged as an
  estimate (``otelbpf.gen_ai.usage.output_tokens.estimated``: a backend may put several tokens
  in one message); the final empty response decoupled models send is not counted. No input
  tokens (Triton does not report them).
- TGI-style generation streams: any gRPC method named ``GenerateStream`` or ``StreamGenerate``
  (TGI's router, and the many services modelled on it): timed, and each response message
  counted as an estimated output token; the messages' fields are not known, so no model.

Operation ``text_completion``; provider ``triton`` or, for the others, the service's package
(``generate.v2``). Time to first token: the first response message that counts as a token.
Bounded: only the first ``PREFIX`` bytes of each message are decoded, with at most ``MAX_FIELDS``
fields; a gap (bytes the kernel did not capture) inside a message is skipped by its length, a gap
in a message's 5-byte header stops the counting (``problem`` ``gap``).
"""

from __future__ import annotations

import re

from otelbpf.families.http.genai import Api, RequestFacts, ResponseFacts

TRITON_SERVICE = "/inference.GRPCInferenceService/"
#: Message bytes decoded, from the start of each message.
PREFIX = 512
MAX_FIELDS = 32
_GENERIC = re.compile(r"/([A-Za-z0-9_.]+)\.[A-Za-z0-9_]+/(?:GenerateStream|StreamGenerate)$")

TRITON = Api("triton", {}, {}, {}, {}, usage_together=False)


def classify(path: str) -> tuple[str, Api, bool] | None:
    """(operation name, API, streamed) of a gRPC generation call's ``:path``, else None."""
    if path.startswith(TRITON_SERVICE):
        method = path[len(TRITON_SERVICE) :]
        if method in ("ModelStreamInfer", "ModelInfer"):
            return "text_completion", TRITON, method == "ModelStreamInfer"
        return None
    m = _GENERIC.match(path)
    if m is not None:
        return "text_completion", Api(m.group(1), {}, {}, {}, {}, usage_together=False), True
    return None


def fields(msg: bytes) -> dict[int, list[bytes | int]]:
    """Top-level fields of a protobuf message (as far as ``msg`` goes): varints as ints,
    length-delimited values as bytes (cut where ``msg`` ends); fixed-width ones skipped."""
    out: dict[int, list[bytes | int]] = {}
    pos, end, n = 0, len(msg), 0
    while pos < end and n < MAX_FIELDS:
        key, pos = _varint(msg, pos)
        if key is None:
            break
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(msg, pos)
            if value is None:
                break
            out.setdefault(number, []).append(value)
        elif wire == 2:
            length, pos = _varint(msg, pos)
            if length is None:
                break
            out.setdefault(number, []).append(msg[pos : pos + length])
            pos += length
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            break  # groups, or not protobuf
        n += 1
    return out


def _varint(data: bytes, pos: int) -> tuple[int | None, int]:
    value, shift = 0, 0
    while pos < len(data) and shift < 64:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
    return None, pos


def _text(values: list[bytes | int] | None) -> str | None:
    if not values or not isinstance(values[0], bytes) or not values[0]:
        return None
    try:
        return values[0].decode()
    except UnicodeDecodeError:
        return None


class _Deframer:
    """gRPC length-prefixed messages from DATA frame payloads: each message's first PREFIX bytes."""

    def __init__(self) -> None:
        self._head = bytearray()
        self._left = 0  # body bytes of the current message still to come
        self._body = bytearray()
        self.broken = ""

    def feed(self, data: bytes) -> list[bytes]:
        done: list[bytes] = []
        pos = 0
        while pos < len(data) and not self.broken:
            if self._left == 0 and len(self._head) < 5:
                take = min(5 - len(self._head), len(data) - pos)
                self._head += data[pos : pos + take]
                pos += take
                if len(self._head) == 5:
                    self._left = int.from_bytes(self._head[1:5], "big")
                    self._body.clear()
                    if self._left == 0:
                        done.append(b"")
                        self._head.clear()
                continue
            take = min(self._left, len(data) - pos)
            if len(self._body) < PREFIX:
                self._body += data[pos : pos + min(take, PREFIX - len(self._body))]
            pos += take
            self._left -= take
            if self._left == 0:
                done.append(bytes(self._body))
                self._head.clear()
        return done

    def gap(self, n: int) -> list[bytes]:
        if self._left and n <= self._left:
            self._left -= n
            if self._left == 0:
                self._head.clear()
                return [bytes(self._body)]
            return []
        self.broken = "gap"
        return []


class GrpcRequestFacts(RequestFacts):
    """A gRPC generation call's request messages (the first one's model name, for Triton)."""

    def __init__(self, operation_name: str, api: Api, streamed: bool) -> None:
        super().__init__(operation_name, api=api, path_stream=streamed)
        self._frames = _Deframer()
        self._model: str | None = None
        self._seen = False

    def data(self, data: bytes, stamp: object) -> None:
        for msg in self._frames.feed(data):
            self._take(msg)

    def gap(self, n: int) -> None:
        for msg in self._frames.gap(n):
            self._take(msg)

    def _take(self, msg: bytes) -> None:
        if self._seen:
            return
        self._seen = True
        if self.api is TRITON:
            self._model = _text(fields(msg).get(1))

    @property
    def problem(self) -> str:
        return ""

    @property
    def model(self) -> str | None:
        return self._model


class GrpcResponseFacts(ResponseFacts):
    """A gRPC generation call's response messages: model, id, errors and tokens (see the module)."""

    def __init__(self, api: Api, streamed: bool) -> None:
        super().__init__(api=api)
        self._streamed = streamed
        self._frames = _Deframer()

    def data(self, data: bytes, t_ns: int = 0) -> None:
        for msg in self._frames.feed(data):
            self._message(msg, t_ns)

    def gap(self) -> None:  # a gap of unknown length, as ResponseWatch reports it
        self._frames.broken = "gap"

    def body_done(self) -> None:
        if self._frames.broken:
            self.problem = self.problem or self._frames.broken

    def _message(self, msg: bytes, t_ns: int) -> None:
        if self.api is not TRITON:
            self._token(t_ns)
            return
        top = fields(msg)
        if self._streamed:
            error = _text(top.get(1))
            if error:
                self.problem = self.problem or "grpc_stream_error"
                self.finish_reasons[:] = ["error"]
                return
            inner_values = top.get(2)
            inner = fields(inner_values[0]) if inner_values and isinstance(inner_values[0], bytes) else None
        else:
            inner = top
        if inner is None:
            return
        model, rid = _text(inner.get(1)), _text(inner.get(3))
        if self.model is None and model:
            self.model = model
        if self.id is None and rid:
            self.id = rid
        if self._streamed and 5 in inner:
            self._token(t_ns)

    def _token(self, t_ns: int) -> None:
        self.token_events += 1
        if self.first_token_ns is None:
            self.first_token_ns = t_ns
