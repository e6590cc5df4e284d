"""Every registered probe family, the same way, as the OpenTelemetry Collector generates a test
for each of its components: its default config validates (what ``otelbpf validate`` does), its
factory builds a receiver from it, and it starts and stops: in this tier the families without C
(their ``on_load``/``on_unload`` start and stop them), in the bpf tier every family in a real
agent. A new family is covered by registering it."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.agent import AgentProcess
from otelbpf.base.health import Health
from otelbpf.correlate.clock import MonotonicClock
from otelbpf.correlate.process_info import ProcessInfo
from otelbpf.correlate.symbolizer import Symbolizer
from otelbpf.families.factory import Context, Factory, MapAccess
from otelbpf.families.registry import FACTORIES, RECEIVER_TYPES, factory, load_config_text

FAMILIES = [pytest.param(f, id=f.name) for f in FACTORIES]


def _config(family: Factory[Any], directory: Path) -> dict[str, Any]:
    """The family with its default options, and the receivers its defaults rely on
    (``ReceiverConfig.needs``), each in the pipelines of the signals it produces."""
    names = [family.name, *(n.receiver for n in family.default_config().needs())]
    pipelines = {
        signal: {"receivers": receivers, "exporters": ["file"]}
        for signal in ("traces", "metrics", "profiles")
        if (receivers := [n for n in names if signal in factory(n).signals])
    }
    return {
        "receivers": {n: {} for n in names},
        "exporters": {"file": {"directory": str(directory)}},
        "service": {"pipelines": pipelines},
    }


def _context() -> Context:
    return Context(ProcessInfo(), Symbolizer(), MonotonicClock(), Health(), lambda spans: None, MapAccess(), True)


def test_the_registry_names_each_family_once_and_hands_the_config_layer_every_model() -> None:
    names = [f.name for f in FACTORIES]
    assert len(set(names)) == len(names)
    assert RECEIVER_TYPES.models() == {f.name: f.config for f in FACTORIES}
    assert [n for n in names if RECEIVER_TYPES.feeds_profiles(n)] == [
        f.name for f in FACTORIES if "profiles" in f.signals
    ]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_default_config_validates(family: Factory[Any], tmp_path: Path) -> None:
    text = yaml.safe_dump(_config(family, tmp_path))
    config = load_config_text(textwrap.dedent(text), source="family.yaml", env={})
    assert config.receivers[family.name] == family.default_config()
    assert family.name in config.enabled_receivers()


@pytest.mark.parametrize("family", FAMILIES)
def test_the_factory_builds_a_receiver_from_the_default_config(family: Factory[Any]) -> None:
    receiver = family.build(family.name, family.default_config(), _context())
    assert receiver.name == family.name
    assert receiver.ring_buffer_size > 0
    assert receiver.correlator.scope.name.startswith("otelbpf.")
    assert isinstance(receiver.correlator.collect(), list)  # nothing seen yet, nothing to fail on


#: The families with no C of their own (gpu: NVML, polled): they start and stop without BPF.
#: Those with C are started in a real agent below (bpf tier).
WITHOUT_C = [
    pytest.param(f, id=f.name) for f in FACTORIES if not f.build(f.name, f.default_config(), _context()).family.c_file
]


def test_some_family_has_no_c() -> None:
    assert [p.values[0].name for p in WITHOUT_C] == ["gpu"]


@pytest.mark.parametrize("family", WITHOUT_C)
def test_a_family_without_c_starts_and_stops_without_bpf(family: Factory[Any]) -> None:
    receiver = family.build(family.name, family.default_config(), _context())
    assert receiver.family.on_load is not None and receiver.family.on_unload is not None
    receiver.family.on_load(None)
    receiver.family.on_unload(None)


@pytest.mark.bpf
@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_starts_and_stops_in_a_real_agent(family: Factory[Any], tmp_path: Path) -> None:
    path = tmp_path / "family.yaml"
    path.write_text(yaml.safe_dump(_config(family, tmp_path / "out")))
    with AgentProcess(["-c", str(path)]) as agent:
        agent.wait_ready()
        assert agent.stop() == 0, agent.output
