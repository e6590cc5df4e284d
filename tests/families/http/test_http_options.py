"""The http receiver's options: defaults as documented, and clear errors."""

from __future__ import annotations

import pytest

from otelbpf.config import DEFAULT_CONFIG_PATH, ConfigError
from otelbpf.families.http.config import HttpReceiverConfig
from otelbpf.families.registry import load_config, load_config_text

PIPELINES = "service: {pipelines: {traces: {receivers: [http], exporters: [file]}}}\nexporters: {file: }\n"


def test_documented_defaults():
    documented = load_config(DEFAULT_CONFIG_PATH, env={})
    assert documented.receivers["http"] == HttpReceiverConfig()
    http = HttpReceiverConfig()
    assert (http.ports, http.payload_size, http.ring_buffer_size) == ([], 4096, 16 << 20)
    assert http.processes == "gpu"  # host mode: the processes that use a GPU library, and their workers
    assert "http" in documented.enabled_receivers()


def test_options_read_and_header_names_are_lower_cased():
    cfg = load_config_text(
        "receivers: {http: {ports: [8080, 50051], payload_size: 1KiB, capture_headers: [X-Request-Id]}}\n" + PIPELINES,
        env={},
    )
    http = cfg.receivers["http"]
    assert (http.ports, http.payload_size, http.capture_headers) == ([8080, 50051], 1024, ["x-request-id"])
    assert cfg.enabled_receivers() == {"http"}


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("payload_size: 3000", "payload_size must be a power of two from 64B to 8KiB"),
        ("payload_size: 16KiB", "payload_size must be a power of two from 64B to 8KiB"),
        ("ports: [80, 80]", "port listed more than once: 80"),
        ("ports: [70000]", "receivers.http.ports[0]"),
        ("ring_buffer_size: 1000", "power of two"),
        ("capture_headers: ['bad header']", "not HTTP header names: 'bad header'"),
    ],
)
def test_bad_values_name_the_option(option, message):
    with pytest.raises(ConfigError) as err:
        load_config_text(f"receivers: {{http: {{{option}}}}}\n" + PIPELINES, env={})
    assert message in str(err.value)


def test_message_content_is_off_unless_asked_for():
    assert HttpReceiverConfig().capture_message_content is False
    cfg = load_config_text("receivers: {http: {capture_message_content: true}}\n" + PIPELINES, env={})
    assert cfg.receivers["http"].capture_message_content is True


def test_at_most_1024_ports():
    """20,000 ports made BCC's clang segfault compiling the port filter; 1,024 compile."""
    ports = ", ".join(str(p) for p in range(1, 20_001))
    with pytest.raises(ConfigError) as caught:
        load_config_text(f"receivers: {{http: {{ports: [{ports}]}}}}\n" + PIPELINES, source="t.yaml", env={})

    assert caught.value.errors == [
        "t.yaml:1:20: receivers.http.ports: at most 1024 ports (one comparison each in the kernel), got 20000"
    ]
    most = ", ".join(str(p) for p in range(1, 1025))
    cfg = load_config_text(f"receivers: {{http: {{ports: [{most}]}}}}\n" + PIPELINES, env={})
    assert len(cfg.receivers["http"].ports) == 1024
