"""Suite-wide pytest wiring; the logic lives in tests/harness/."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.bpf_gate import bpf_required, bpf_unavailable_reason
from harness.nvcc import static_runtime_programs
from harness.otlp import OtlpCollector

# Agents started by tests release their probes before they exit, as before the background
# release existed: the next test's agent would otherwise attach while the last one's probes
# are still being released (the kernel does both one probe at a time, under one mutex) and
# tests that time an attach would wait on it. tests/test_agent.py's signal test runs the
# background release, the default, explicitly.
os.environ.setdefault("OTELBPF_DETACH", "wait")

REPO = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------------------------------
# Built artefacts, made once per session for every module that asks (modules that need them
# for every test say `pytestmark = pytest.mark.usefixtures("built")`).
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def built() -> None:
    """The example C libraries and programs (examples/build.sh does nothing when they are up
    to date): the stand-in CUDA/NCCL/ibverbs libraries and the workloads that load them."""
    out = subprocess.run(["bash", str(REPO / "examples" / "build.sh")], capture_output=True, text=True)
    assert out.returncode == 0, f"examples/build.sh failed:\n{out.stdout}{out.stderr}"


@pytest.fixture(scope="session")
def ibverbs_workload(built: None) -> Path:
    """examples' ibverbs workload. build.sh skips it without libibverbs-dev; a test that needs
    it fails then rather than skipping, so a CI host missing the package is noticed."""
    workload = REPO / "build" / "examples" / "ibverbs_workload"
    if not workload.exists():
        pytest.fail(f"{workload} was not built (install libibverbs-dev: scripts/setup.sh --test)")
    return workload


@pytest.fixture(scope="session")
def real_nccl() -> Path:
    """NVIDIA's libnccl from the nvidia-nccl-cu12 wheel (a test extra)."""
    import nvidia.nccl

    return Path(list(nvidia.nccl.__path__)[0]) / "lib" / "libnccl.so.2"


@pytest.fixture(scope="session")
def nvcc_programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """static_runtime.cu built by nvcc once per session: static, stripped, shared runtime
    (harness/nvcc.py; skips without nvcc, fails under CI=true)."""
    return static_runtime_programs(tmp_path_factory.mktemp("nvcc"))


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


#: Folders of heavy checks that need no BPF but take seconds each (property-based fuzzing,
#: wheel and manifest builds): their own tier, after the fast unit tier (scripts/test.sh).
HEAVY_FOLDERS = ("fuzz", "deploy")
#: Fixtures that make a test heavy: nvcc builds programs (seconds, once per session).
HEAVY_FIXTURES = ("nvcc_programs",)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests = Path(__file__).parent
    for item in items:
        rel = Path(item.path).relative_to(tests) if Path(item.path).is_relative_to(tests) else None
        fixtures = getattr(item, "fixturenames", ())
        if (rel is not None and rel.parts[0] in HEAVY_FOLDERS) or any(f in fixtures for f in HEAVY_FIXTURES):
            item.add_marker(pytest.mark.heavy)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("bpf") is None:
        return
    reason = bpf_unavailable_reason()
    if reason is None:
        return
    if bpf_required():
        pytest.fail(
            f"eBPF is required here (CI=true or OTELBPF_REQUIRE_BPF=1) but unavailable: {reason}", pytrace=False
        )
    pytest.skip(f"eBPF unavailable: {reason}")
