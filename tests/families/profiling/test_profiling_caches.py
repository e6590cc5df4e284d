"""The profiling receiver's cache bounds (``cached_*``): documented defaults, read into the
profiler, and clear errors."""

from __future__ import annotations

import pytest

from otelbpf.config import DEFAULT_CONFIG_PATH, ConfigError
from otelbpf.families.profiling.config import ProfilingReceiverConfig
from otelbpf.families.profiling.profiler import CacheSizes
from otelbpf.families.registry import load_config, load_config_text

PIPELINES = "service: {pipelines: {profiles: {receivers: [profiling], exporters: [file]}}}\nexporters: {file: }\n"
OPTIONS = ("cached_stacks", "cached_python_stacks", "cached_resolved_stacks", "cached_frames", "cached_code_objects")


def test_documented_defaults_are_the_models_and_the_profilers():
    documented = load_config(DEFAULT_CONFIG_PATH, env={}).receivers["profiling"]
    model = ProfilingReceiverConfig()
    assert [getattr(documented, o) for o in OPTIONS] == [getattr(model, o) for o in OPTIONS]
    sizes = CacheSizes()
    assert [getattr(model, o) for o in OPTIONS] == [
        sizes.stacks,
        sizes.python_stacks,
        sizes.resolved_stacks,
        sizes.frames,
        sizes.code_objects,
    ]


def test_sizes_are_read():
    text = "receivers: {profiling: {cuda_memory: false, cached_stacks: 4096, cached_code_objects: 1000}}\n"
    profiling = load_config_text(text + PIPELINES, env={}).receivers["profiling"]
    assert (profiling.cached_stacks, profiling.cached_code_objects) == (4096, 1000)


@pytest.mark.parametrize("option", OPTIONS)
def test_a_size_out_of_range_names_the_option(option):
    with pytest.raises(ConfigError) as err:
        load_config_text(f"receivers: {{profiling: {{cuda_memory: false, {option}: 0}}}}\n" + PIPELINES, env={})
    assert f"receivers.profiling.{option}" in str(err.value)
