"""otelbpf.config.selection: ``--receivers`` / ``OTELBPF_RECEIVERS`` replace the receivers the
pipelines name, each registered receiver going to the pipelines it feeds (receivers/registry.py)."""

from __future__ import annotations

import pytest

from harness.config_text import MINIMAL
from otelbpf.config import ConfigError
from otelbpf.families.registry import RECEIVER_TYPES, load_config


def pipelines(config) -> dict[str, list[str]]:
    return {s: config.pipeline(s).receivers for s in config.pipeline_signals()}


def test_the_choice_replaces_the_default_pipelines_receivers():
    config = load_config(None, env={"OTELBPF_RECEIVERS": "http, cuda,http"})

    assert pipelines(config) == {"traces": ["http", "cuda"], "metrics": ["http", "cuda"]}
    assert config.enabled_receivers() == {"http", "cuda"}


def test_profile_receivers_get_the_profiles_pipeline_and_only_it(tmp_path):
    """A file without a profiles pipeline gains one (to its file exporter) when a profile
    receiver is chosen; the signal pipelines keep the other chosen receivers."""
    path = tmp_path / "c.yaml"
    path.write_text(MINIMAL)
    profile = next(name for name, entry in RECEIVER_TYPES.entries.items() if entry.profiles)

    config = load_config(path, env={}, receivers=f"cuda,{profile}")

    assert pipelines(config) == {"traces": ["cuda"], "profiles": [profile]}
    assert [name for name, _ in config.pipeline_exporters("profiles")] == ["file"]


def test_a_chosen_receiver_the_file_does_not_define_runs_with_its_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(MINIMAL)

    config = load_config(path, env={}, receivers="nccl")

    assert pipelines(config) == {"traces": ["nccl"]}
    assert config.receivers["nccl"] == RECEIVER_TYPES.entries["nccl"].model()


@pytest.mark.parametrize("chosen", ["cuda,tpu", " , "])
def test_unknown_or_empty_choices_list_every_registered_receiver(chosen):
    with pytest.raises(ConfigError) as caught:
        load_config(None, env={}, receivers=chosen)

    assert caught.value.errors[0].endswith(f"name some of {', '.join(RECEIVER_TYPES.names())}")
