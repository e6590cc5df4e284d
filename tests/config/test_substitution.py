"""otelbpf.config.substitution: ${env:VAR} references in string values."""

from __future__ import annotations

from harness.config_text import MINIMAL, load, one_error, with_cuda, with_exporter


def test_env_substitution_forms():
    text = MINIMAL.replace(
        "  file:\n",
        "  file:\n"
        "  otlp:\n"
        "    endpoint: ${env:COLLECTOR}:${PORT}\n"
        "    headers:\n"
        "      authorization: Bearer ${env:TOKEN:-none}\n"
        "      x-empty: ${env:EMPTY:-fallback}\n"
        "      x-price: $$5 ${DOLLARS:-}\n",
    ).replace("[file]", "[otlp]")
    config = load(text, COLLECTOR="collector.svc", PORT="4317", EMPTY="")

    otlp = config.exporters["otlp"]
    assert otlp.endpoint == "collector.svc:4317"
    assert otlp.headers == {"authorization": "Bearer none", "x-empty": "fallback", "x-price": "$5 "}


def test_env_substitution_feeds_typed_options():
    config = load(with_cuda("launch_sample_every: '${env:EVERY}', ring_buffer_size: '${SIZE:-1MiB}'"), EVERY="100")

    assert config.receivers["cuda"].launch_sample_every == 100
    assert config.receivers["cuda"].ring_buffer_size == 1 << 20


def test_unset_variable_without_default_names_it_and_where_it_was_used():
    error = one_error(MINIMAL.replace("  file:\n", "  file: {directory: '${env:OUT_DIR}/spans'}\n"))

    assert error == (
        "test.yaml:4:10: exporters.file.directory: environment variable OUT_DIR is not set (used as ${env:OUT_DIR}); "
        "set it, or give a default: ${env:OUT_DIR:-value}"
    )


def test_invalid_value_from_a_variable_says_so_without_showing_it():
    error = one_error(with_cuda("launch_sample_every: '${EVERY}'"), EVERY="often")

    assert error.endswith("receivers.cuda.launch_sample_every: Input should be a valid integer (value from ${EVERY})")


def test_unsupported_provider_and_bad_names():
    assert "unsupported provider 'file'" in one_error(with_exporter("file/b: {directory: '${file:/x}'}"))
    assert "'1X' is not a variable name" in one_error(with_exporter("file/b: {directory: '${1X}'}"))


def test_a_long_value_substituted_once_is_fine():
    token = "t" * 200_000
    config = load(with_exporter("otlp: {endpoint: 'c:4317', headers: {authorization: '${TOKEN}'}}"), TOKEN=token)

    assert config.exporters["otlp"].headers["authorization"] == token


def test_a_huge_variable_is_bounded_too():
    assert "substitution reads and writes more than 4MiB" in one_error(
        with_exporter("otlp: {endpoint: 'c:4317', headers: {authorization: '${TOKEN}'}}"), TOKEN="t" * (5 << 20)
    )
