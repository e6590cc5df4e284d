"""otelbpf.config.loader: loading the built-in default, a file or a text."""

from __future__ import annotations

from otelbpf.config import FileExporterConfig
from otelbpf.families.registry import load_config


def test_default_config_is_valid_and_writes_files():
    config = load_config(None, env={})

    # every receiver that costs nothing while unused; requests (plain and over OpenSSL) of the
    # processes that use a GPU
    assert config.enabled_receivers() == {"cuda", "profiling", "http", "tls", "nccl", "ibverbs", "gpu"}
    assert config.receivers["http"].processes == "gpu" and config.receivers["tls"].processes == "gpu"
    assert config.pipeline_signals() == ["traces", "metrics", "profiles"]
    assert config.pipeline_exporters("profiles") == [("file", FileExporterConfig())]
    for signal in ("traces", "metrics"):
        assert config.pipeline_exporters(signal) == [("file", FileExporterConfig())]
        assert [name for name, _ in config.pipeline_processors(signal)] == ["batch", "resource"]
        assert config.resource_attributes(signal) == {}
    assert config.targets.pids == []


def test_default_values_read_as_documented():
    cuda = load_config(None, env={}).receivers["cuda"]

    assert cuda.libraries == ["cudart", "cuda"]
    assert cuda.ring_buffer_size == "auto"
    assert (cuda.events_ring_bytes(traces=True), cuda.events_ring_bytes(traces=False)) == (4 << 20, 4 << 20)
    assert cuda.min_span_duration == 0
    assert "/usr/local/cuda*/lib64/libcudart.so*" in cuda.search_paths
