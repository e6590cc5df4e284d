"""Suite-wide pytest wiring; the logic lives in tests/harness/."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from harness.bpf_gate import bpf_required, bpf_unavailable_reason
from harness.otlp import OtlpCollector

# Agents started by tests release their probes before they exit, as before the background
# release existed: the next test's agent would otherwise attach while the last one's probes
# are still being released (the kernel does both one probe at a time, under one mutex) and
# tests that time an attach would wait on it. tests/test_agent.py's signal test runs the
# background release, the default, explicitly.
os.environ.setdefault("OTELBPF_DETACH", "wait")

# ---------------------------------------------------------------------------------------
# OTLP collector: rotel receiving on free loopback ports, forwarding to a recording sink.
# ---------------------------------------------------------------------------------------

_COLLECTOR_KEY = pytest.StashKey[OtlpCollector]()


@pytest.fixture
def otlp_collector(request: pytest.FixtureRequest) -> Iterator[OtlpCollector]:
    """A fresh collector per test (rotel starts in ~15 ms); see harness/otlp.py for its API."""
    collector = OtlpCollector()
    request.node.stash[_COLLECTOR_KEY] = collector
    try:
        yield collector
    finally:
        collector.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Attach what the collector received and rotel's log to every failed test that used one."""
    report = yield
    collector = item.stash.get(_COLLECTOR_KEY, None)
    if collector is not None and report.failed:
        report.sections.append(("otlp collector", collector.describe()))
    return report


# ---------------------------------------------------------------------------------------
# bpf gate: tests marked `bpf` skip where eBPF cannot load, but fail where it must work.
# ---------------------------------------------------------------------------------------


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("bpf") is None:
        return
    reason = bpf_unavailable_reason()
    if reason is None:
        return
    if bpf_required():
        pytest.fail(f"eBPF is required here (CI=true or OTELBPF_REQUIRE_BPF=1) but unavailable: {reason}",
                    pytrace=False)
    pytest.skip(f"eBPF unavailable: {reason}")
