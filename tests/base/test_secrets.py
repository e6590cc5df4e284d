"""The secret rules shared by command lines, the configuration's output and the HTTP client's logs
(base/secrets.py): each shape a command line gives a secret in, over many command lines built
around it (property-based), and what must survive: the arguments that are not secrets."""

from __future__ import annotations

import logging
import shlex
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otelbpf.base.secrets import (
    REDACTED,
    RedactingFilter,
    is_secret_name,
    redact_command_args,
    redact_text,
    redact_urls,
)

S = "s3cr3tVALUE"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["curl", "-H", f"Authorization: Bearer {S}", "http://h/"],
            ["curl", "-H", "Authorization: REDACTED", "http://h/"],
        ),
        (["curl", "--header", f"X-Api-Key:{S}"], ["curl", "--header", "X-Api-Key:REDACTED"]),
        (["curl", f"--header=Cookie: sid={S}"], ["curl", "--header=Cookie: REDACTED"]),
        (["python", "serve.py", f"--api-key={S}"], ["python", "serve.py", "--api-key=REDACTED"]),
        (
            ["python", "serve.py", "--api_key", S, "--port", "80"],
            ["python", "serve.py", "--api_key", REDACTED, "--port", "80"],
        ),
        (["mysql", "--password", S], ["mysql", "--password", REDACTED]),
        (["app", "--secret", S, "--token", S], ["app", "--secret", REDACTED, "--token", REDACTED]),
        (["psql", f"postgres://user:{S}@db:5432/app"], ["psql", "postgres://user:REDACTED@db:5432/app"]),
        (["psql", f"postgres://user:p@{S}@db/app"], ["psql", "postgres://user:REDACTED@db/app"]),
        (["git", "clone", f"https://{S}@github.com/o/r"], ["git", "clone", "https://REDACTED@github.com/o/r"]),
        (["wget", f"https://h/f?api_key={S}&page=2"], ["wget", "https://h/f?api_key=REDACTED&page=2"]),
        (["wget", f"h/f?a=1&access_token={S}#x"], ["wget", "h/f?a=1&access_token=REDACTED#x"]),
        (["env", f"HF_TOKEN={S}", "python", "t.py"], ["env", "HF_TOKEN=REDACTED", "python", "t.py"]),
        (["docker", "run", "-e", f"DB_PASSWORD={S}", "img"], ["docker", "run", "-e", "DB_PASSWORD=REDACTED", "img"]),
        (
            ["java", f"-Djavax.net.ssl.keyStorePassword={S}", "-jar", "a.jar"],
            ["java", "-Djavax.net.ssl.keyStorePassword=REDACTED", "-jar", "a.jar"],
        ),
        (["curl", "-u", f"admin:{S}", "http://h/"], ["curl", "-u", "admin:REDACTED", "http://h/"]),
        (["curl", f"--user=admin:{S}"], ["curl", "--user=admin:REDACTED"]),
        (
            ["curl", "-d", f'{{"user": "a", "password": "{S}"}}'],
            ["curl", "-d", '{"user": "a", "password": "REDACTED"}'],
        ),
        (["curl", "-d", f"user=a&password={S}"], ["curl", "-d", "user=a&password=REDACTED"]),
        (["openai", "-k", "sk-proj-" + "a1" * 12], ["openai", "-k", REDACTED]),
        (["hf", "download", "hf_" + "Ab" * 17], ["hf", "download", REDACTED]),
        (
            ["sh", "-c", f"curl -s -H 'Authorization: Bearer {S}' http://h/ && echo done"],
            ["sh", "-c", "curl -s -H 'Authorization: REDACTED' http://h/ && echo done"],
        ),
        # a process that rewrote its argv into one string
        ([f"python train.py --lr 3e-4 --wandb-api-key {S}"], ["python train.py --lr 3e-4 --wandb-api-key REDACTED"]),
    ],
)
def test_each_shape_of_a_secret_is_redacted(args, expected):
    assert redact_command_args(args) == expected


@pytest.mark.parametrize(
    "args",
    [
        ["vllm", "serve", "m", "--max-num-batched-tokens", "8192", "--tokenizer", "gpt2", "--max-tokens", "5"],
        ["git", "commit", "--author", "Ann <ann@example.com>", "-m", "fix: the token refresh"],
        ["python", "-u", "train.py", "--config", "conf.yaml", "--lr=3e-4"],
        ["curl", "http://h:8080/v1/models?page=2&limit=10", "-o", "out.json"],
        ["ssh", "-p", "2222", "host"],
        ["python", "-c", "print('a b')", "localhost:8080"],
        [],
    ],
)
def test_command_lines_without_secrets_are_kept_whole(args):
    assert redact_command_args(args) == args


@pytest.mark.parametrize(
    "name",
    [
        "password",
        "--db-passwd",
        "HF_TOKEN",
        "hfToken",
        "X-Api-Key",
        "apikey",
        "Authorization",
        "proxy-authorization",
        "Cookie",
        "Set-Cookie",
        "client_secret",
        "access_token",
        "X-Amz-Signature",
        "sig",
        "private-key",
        "AUTH",
        "oauth2_token",
        "credentials",
        "keyStorePassword",
        "session_id",
        "key",
        "x-auth-token",
    ],
)
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "max_tokens",
        "--max-new-tokens",
        "tokenizer",
        "author",
        "authority",
        "page",
        "model",
        "cache_key",
        "keys",
        "port",
        "user",
        "passes",
        "bypass",
        "compass",
    ],
)
def test_names_that_are_not_secrets(name):
    assert not is_secret_name(name)


def test_a_flag_that_says_there_is_no_secret_takes_no_value():
    assert redact_command_args(["app", "--no-auth", "serve"]) == ["app", "--no-auth", "serve"]
    args = ["app", "--use-auth-token", "--model", "x"]
    assert redact_command_args(args) == args


def test_a_long_argument_is_searched_without_splitting_it():
    """A ``python -c`` script past 16 KiB is not split into words (shlex would take ~30 ms per
    100 KiB of it): secret-named values are found in it by one regex search."""
    script = "x = 1\n" * 4000 + (
        f"run('--password {S}'); h = {{'Authorization': 'Bearer {S}'}}; q = 'a=1&api_key={S}'\n"
        f"os.environ['HF_TOKEN'] = '{S}'; max_tokens = 5; tokenizer = 'gpt2'\n"
    )
    out = redact_command_args(["python", "-c", script])[2]
    assert S not in out
    assert out.endswith(
        "run('--password REDACTED'); h = {'Authorization': 'REDACTED'}; q = 'a=1&api_key=REDACTED'\n"
        "os.environ['HF_TOKEN'] = 'REDACTED'; max_tokens = 5; tokenizer = 'gpt2'\n"
    )


# --- many command lines: property-based ----------------------------------------------------------

#: Arguments that are no secrets (some of them look close), in real programs' shapes.
NEUTRAL = [
    "python",
    "train.py",
    "--lr",
    "3e-4",
    "--max-new-tokens",
    "256",
    "--tokenizer",
    "gpt2",
    "-u",
    "--author",
    "ann",
    "http://host/path?page=2",
    "-p",
    "8080",
    "--config=conf.yaml",
    "serve",
    "MODEL=llama",
]
#: Each shape a secret is given in; {} is the secret.
SHAPES = [
    ["--api-key={}"],
    ["--api-key", "{}"],
    ["--password", "{}"],
    ["--token", "{}"],
    ["--hf-token={}"],
    ["--client_secret", "{}"],
    ["-H", "Authorization: Bearer {}"],
    ["--header", "X-Api-Key: {}"],
    ["-H", "Cookie: session={}"],
    ["postgres://user:{}@db:5432/x"],
    ["https://h/x?api_key={}&page=2"],
    ["https://h/x?a=1&access_token={}"],
    ["HF_TOKEN={}"],
    ["-Dapp.db.password={}"],
    ["--user", "admin:{}"],
    ['{{"password": "{}"}}'],
    ["https://{}@github.com/o/r"],
    ["--auth", "{}"],
    ["OPENAI_API_KEY={}"],
]
secret_values = st.from_regex(r"zq[A-Za-z0-9]{6,20}", fullmatch=True)


@st.composite
def command_lines(draw: st.DrawFn) -> tuple[list[str], list[int], list[str]]:
    """(argv, where the neutral arguments are, the secrets in it)."""
    args: list[str] = []
    neutral_at: list[int] = []
    secrets: list[str] = []
    for _ in range(draw(st.integers(1, 6))):
        if draw(st.booleans()):
            neutral_at.append(len(args))
            args.append(draw(st.sampled_from(NEUTRAL)))
        else:
            secret = draw(secret_values)
            secrets.append(secret)
            args.extend(part.format(secret) for part in draw(st.sampled_from(SHAPES)))
    return args, neutral_at, secrets


@settings(max_examples=400, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(command_lines())
def test_no_secret_survives_in_any_command_line(line):
    args, neutral_at, secrets = line
    redacted = redact_command_args(args)
    assert len(redacted) == len(args)
    assert [redacted[i] for i in neutral_at] == [args[i] for i in neutral_at]  # what is no secret stays
    # the same command run through a shell, or rewritten by the process into one string
    wrapped = [
        redacted,
        redact_command_args(["sh", "-c", shlex.join(args)]),
        redact_command_args([shlex.join(args)]),
    ]
    for out in wrapped:
        for secret in secrets:
            assert secret not in " ".join(out), (args, out)


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.text(alphabet=st.sampled_from("ab -=:'\"\\@/?&#{}tokenpassword\n"), max_size=60), max_size=8))
def test_any_text_is_redacted_without_error(args):
    assert len(redact_command_args(args)) == len(args)


@pytest.mark.parametrize("arg", ["a=" * 40000, "'" * 70000, "--token " * 9000, "x=" * 5000 + "token=" * 5000])
def test_hostile_arguments_cost_little(arg):
    start = time.perf_counter()
    [out] = redact_command_args([arg])
    assert time.perf_counter() - start < 1.0  # ~0.1 s on a loaded CI core
    assert len(out) <= len(arg) * 2


# --- URLs, free text, log lines -------------------------------------------------------------------


def test_urls_lose_userinfo_and_query_values():
    assert redact_urls(f"https://u:{S}@c:4318/v1/traces?api_key={S}&x=1") == (
        "https://u:REDACTED@c:4318/v1/traces?api_key=REDACTED&x=1"
    )
    every = redact_urls(f"https://c/v1/traces?code={S}&x=1 and /v1/metrics?{S}", every_query_value=True)
    assert every == "https://c/v1/traces?code=REDACTED&x=REDACTED and /v1/metrics?REDACTED"
    assert redact_urls("did you mean 'x'? (e.g. localhost:4317)", every_query_value=True) == (
        "did you mean 'x'? (e.g. localhost:4317)"
    )


def test_free_text_loses_quoted_pairs_and_known_token_shapes():
    assert redact_text(f"{{'api_key': '{S}', 'model': 'm'}}") == "{'api_key': 'REDACTED', 'model': 'm'}"
    assert redact_text("key AKIAABCDEFGHIJKLMNOP here") == "key REDACTED here"


def _record(msg: str, *args: object, exc_info=None) -> logging.LogRecord:
    return logging.LogRecord("urllib3.connectionpool", logging.DEBUG, __file__, 1, msg, args, exc_info)


def test_the_log_filter_takes_query_values_out_of_messages_and_tracebacks():
    record = _record(
        '%s://%s:%s "%s %s %s" %s %s', "https", "c", 4318, "POST", f"/v1/traces?api_key={S}", "HTTP/1.1", 200, 2
    )
    assert RedactingFilter().filter(record)
    assert record.getMessage() == 'https://c:4318 "POST /v1/traces?api_key=REDACTED HTTP/1.1" 200 2'

    try:
        raise ConnectionError(f"Max retries exceeded with url: /v1/traces?api_key={S} (Caused by ...)")
    except ConnectionError:
        record = _record("export failed", exc_info=sys.exc_info())
    RedactingFilter().filter(record)
    text = logging.Formatter().format(record)
    assert "Max retries exceeded with url: /v1/traces?api_key=REDACTED" in text and S not in text
