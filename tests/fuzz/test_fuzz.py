"""Property-based fuzzing, briefly, in every run of the suite: each target of targets.py on random
bytes and on inputs built to reach deep (valid framing around hostile numbers and values). Each
input must finish within 2 s (a parse position that moves backwards spins forever); the invariants
are the targets' own. bench/fuzz.py runs the same targets for millions of inputs."""

from __future__ import annotations

import json
import signal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz.targets import TARGETS, encode_chunks, grpc_target, http1_target, seeds
from otelbpf.families.http.genai import ResponseFacts

#: No example database in the working tree; short runs; a slow input is the alarm's to judge.
FUZZ = settings(
    max_examples=1000,
    deadline=None,
    database=None,
    derandomize=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def bounded(target, data: bytes, seconds: int = 2) -> None:
    """``target(data)``, failing if it takes longer than ``seconds``."""

    def hang(*_):
        raise TimeoutError(f"input still running after {seconds}s: {data!r}")

    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(seconds)
    try:
        target(data)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _mutated(name: str):
    """Seeds with random bytes spliced in, cut or overwritten: mutation from valid input."""
    return st.tuples(
        st.sampled_from(seeds()[name]), st.integers(0, 10_000), st.integers(0, 64), st.binary(max_size=64)
    ).map(lambda t: t[0][: t[1] % (len(t[0]) + 1)] + t[3] + t[0][t[1] % (len(t[0]) + 1) + t[2] :])


@FUZZ
@given(data=st.one_of(st.binary(max_size=2048), _mutated("http1")))
def test_http1(data):
    bounded(TARGETS["http1"], data)


_HEX = st.text("0123456789abcdefABCDEF", min_size=0, max_size=40)
_NOISE = st.text(" \t_+-;=x0\r", max_size=4)


@FUZZ
@given(
    parts=st.lists(st.tuples(_NOISE, _HEX, _NOISE, st.binary(max_size=40)), max_size=6),
    length=st.one_of(st.none(), st.from_regex(r"\A[ +\-0-9,_]{0,24}\Z")),
)
def test_http1_framing_numbers(parts, length):
    """Chunk-size lines and Content-Length values from the characters ``int()`` tolerates and HTTP
    does not, in otherwise valid messages, split at random."""
    if length is None:
        head = b"POST /u HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        body = b"".join(f"{a}{h}{b}\r\n".encode() + payload + b"\r\n" for a, h, b, payload in parts) + b"0\r\n\r\n"
    else:
        head = f"POST /u HTTP/1.1\r\nContent-Length: {length}\r\n\r\n".encode()
        body = b"".join(p[3] for p in parts)
    stream = head + body
    cut = len(stream) // 2
    bounded(
        http1_target,
        encode_chunks(
            [
                (True, stream[:cut], 0),
                (True, stream[cut:], 0),
                (False, b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", 0),
            ]
        ),
    )


@FUZZ
@given(data=st.one_of(st.binary(max_size=2048), _mutated("http2")))
def test_http2(data):
    bounded(TARGETS["http2"], data)


@FUZZ
@given(data=st.one_of(st.binary(max_size=512), _mutated("hpack")))
def test_hpack(data):
    bounded(TARGETS["hpack"], data)


_VALUE = st.one_of(
    st.text(max_size=30),
    st.from_regex(r"\A/[a-z.]{0,8}(/[a-z;=]{0,8}){0,3}\Z"),
    st.integers(-(10**30), 10**30).map(str),
)


@settings(FUZZ, max_examples=200)
@given(values=st.lists(_VALUE, min_size=5, max_size=5), tail=st.binary(max_size=64))
def test_grpc(values, tail):
    """Header values (:path, :status, grpc-status, :authority, metadata) of any shape, through the
    real correlator; the spans it makes must encode."""
    data = b"\0".join(v.encode("utf-8").replace(b"\0", b"") for v in values) + b"\0" + tail
    bounded(grpc_target, data)


@FUZZ
@given(data=st.one_of(st.binary(max_size=1024), _mutated("otlp")))
def test_otlp_encoders(data):
    bounded(TARGETS["otlp"], data)


@FUZZ
@given(data=st.one_of(st.binary(max_size=2048), _mutated("sse")))
def test_sse(data):
    bounded(TARGETS["sse"], data)


@FUZZ
@given(data=st.one_of(st.binary(max_size=2048), _mutated("genai")))
def test_genai(data):
    bounded(TARGETS["genai"], data)


@settings(FUZZ, max_examples=300)
@given(data=st.one_of(st.binary(max_size=512), _mutated("config")))
def test_config(data):
    """Any bytes as a config file: ConfigError (exit 2) or a config, never another exception."""
    bounded(TARGETS["config"], data)


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["model", "usage", "prompt_tokens", "completion_tokens", "id", "choices", "x", '\\"']),
            inner,
            max_size=4,
        )
    ),
    max_leaves=20,
)


@settings(FUZZ, max_examples=500)
@given(
    doc=st.dictionaries(st.sampled_from(["model", "usage", "id", "choices", "x"]), _JSON, max_size=5),
    cuts=st.lists(st.integers(0, 10_000), max_size=4),
)
def test_genai_agrees_with_json_loads(doc, cuts):
    """Any JSON document, split anywhere: what the scanner reads is what ``json.loads`` says is there."""
    raw = json.dumps(doc).encode()
    points = sorted({c % (len(raw) + 1) for c in cuts})
    facts = ResponseFacts()
    for a, b in zip([0, *points], [*points, len(raw)]):
        facts.data(raw[a:b])
    facts.body_done()
    assert facts.problem in ("", "bad_usage")
    model = doc.get("model")
    assert facts.model == (model if isinstance(model, str) and model else None)
    usage = doc.get("usage")
    counts = [usage.get(k) for k in ("prompt_tokens", "completion_tokens")] if isinstance(usage, dict) else []
    if counts and all(type(n) is int and 0 <= n < 1 << 40 for n in counts):
        assert (facts.input_tokens, facts.output_tokens) == tuple(counts)
    else:
        assert facts.input_tokens is None and facts.output_tokens is None
