"""The processing queue between the drain and processing threads (no BPF: an agent built from
the embedded default, never started): where the drain pauses, what is dropped, what is told."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest

from otelbpf.agent import QUEUE_PAUSE_DIVISOR, Agent
from otelbpf.base.events import EVENT_DTYPE, SOCK_RECORD_DTYPE
from otelbpf.config.default import DEFAULT_CONFIG_YAML
from otelbpf.families.factory import Receiver
from otelbpf.families.registry import load_config_text
from otelbpf.sensor.family import RingSpec
from otelbpf.sensor.sensor import TICK


@pytest.fixture
def agent(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # the default file exporter's ./otelbpf-out
    text = DEFAULT_CONFIG_YAML.replace("processing_queue_size: 16MiB", "processing_queue_size: 1MiB", 1)
    assert text != DEFAULT_CONFIG_YAML
    return Agent(load_config_text(text))


def _metric(agent: Agent, name: str) -> dict[tuple, float]:
    [(_, _, metrics)] = agent._health_metrics()
    [metric] = [x for x in metrics if x.name == name]
    return {tuple(sorted(p.attributes.items())): p.value for p in metric.data.data_points}


def test_the_drain_pauses_past_an_eighth_of_the_queue_and_the_peak_is_told(agent):
    events = np.zeros(1024, dtype=EVENT_DTYPE)  # 64 KiB
    pause_at = (1 << 20) // QUEUE_PAUSE_DIVISOR
    delivered = 0
    while delivered <= pause_at:
        assert not agent._backlogged()
        agent._deliver("events", events)
        delivered += events.nbytes
    assert agent._backlogged()
    queued = _metric(agent, "otelbpf.processing.queued")
    assert queued == {(("state", "current"),): delivered, (("state", "peak"),): delivered}
    while not agent._work.empty():  # what the processing thread does with each batch
        item = agent._work.get_nowait()
        with agent._queued_lock:
            agent._queued -= len(item[1])
    assert not agent._backlogged()
    # The peak of an interval counts the level it began with; the next one starts empty.
    assert _metric(agent, "otelbpf.processing.queued") == {(("state", "current"),): 0, (("state", "peak"),): delivered}
    assert _metric(agent, "otelbpf.processing.queued") == {(("state", "current"),): 0, (("state", "peak"),): 0}


def test_a_forced_drain_past_the_full_queue_is_dropped_and_counted(agent):
    events = np.zeros(1024, dtype=EVENT_DTYPE)
    for _ in range(16):  # 1 MiB: the whole queue (a sync or the stop drains whatever is there)
        agent._deliver("events", events)
    assert agent.health.get("otelbpf.events.dropped") == 0
    agent._deliver("events", events)
    assert agent.health.get("otelbpf.events.dropped") == 1024


class _Recorder:
    """A correlator that writes down what it is handed, in order."""

    scope = None

    def __init__(self, name: str, log: list[tuple[str, str]]) -> None:
        self.name, self.log = name, log

    def on_events(self, arr) -> None:
        self.log.append((self.name, "events"))

    def on_strings(self, arr) -> None:
        pass

    def collect(self):
        return []


class _Merging(_Recorder):
    def on_ring(self, name: str, arr) -> None:
        self.log.append((self.name, name))

    def on_tick(self) -> None:
        self.log.append((self.name, "tick"))


def test_a_tick_s_family_batches_are_merged_before_its_events_are_processed(agent):
    """The events ring is delivered last in a drain tick (sensor.py): a correlator that merges its
    rings (CutCorrelator) is told the tick is in before any correlator sees the events, so that
    the requests they parent on are open; TICK ends the tick again (nothing pending then)."""
    log: list[tuple[str, str]] = []
    rings = SimpleNamespace(rings=(RingSpec("sockdata", SOCK_RECORD_DTYPE, 4096, cut=True),))
    cuda = Receiver("cuda", SimpleNamespace(rings=()), _Recorder("cuda", log), [], 0)  # type: ignore[arg-type]
    http = Receiver("http", rings, _Merging("http", log), [], 0)  # type: ignore[arg-type]
    agent.receivers = [cuda, http]  # the one that parents on http's work comes first
    loop = threading.Thread(target=agent._process_loop, daemon=True)
    loop.start()
    socks = np.zeros(2, SOCK_RECORD_DTYPE)
    socks["data"] = [b"", b""]
    for ring, arr in (("sockdata", socks), ("events", np.zeros(1, EVENT_DTYPE))):
        agent._deliver(ring, arr)
    agent._deliver(TICK, np.zeros(0, EVENT_DTYPE))
    agent._work.put(None)
    loop.join(10)
    assert log == [
        ("http", "sockdata"),
        ("http", "tick"),
        ("cuda", "events"),
        ("http", "events"),
        ("http", "tick"),
    ]
