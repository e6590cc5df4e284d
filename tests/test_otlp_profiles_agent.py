"""End to end: `otelbpf run` with the profiling receiver sends OTLP profiles over gRPC to a real
grpcio ProfilesService server (harness/otlp_profiles.py: rotel, the collector the other OTLP
tests use, carries no profiles). One agent for the module watches a Python program that spends
its time in a C extension; a second OTLP exporter points at a port nobody listens on."""

from __future__ import annotations

import re
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from harness.agent import REPO, AgentProcess
from harness.otlp_profiles import DecodedSample, OtlpProfilesReceiver
from otelbpf.correlate.container import container_attributes

pytestmark = pytest.mark.bpf

NATIVE_HOT = REPO / "examples" / "profiling" / "native_hot.py"
BUILT = REPO / "build" / "examples" / "profiling"


@dataclass
class Run:
    receiver: OtlpProfilesReceiver
    agent: AgentProcess
    rc: int
    workload_pid: int


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def run(built: None, tmp_path_factory) -> Run:
    tmp = tmp_path_factory.mktemp("otlp-profiles")
    receiver = OtlpProfilesReceiver()
    doc = {
        "receivers": {"profiling": {"interval": "1s", "cuda_memory": False}},
        "processors": {"resource": {"attributes": {"deployment.environment": "test"}}},
        "exporters": {
            "otlp": {"endpoint": receiver.endpoint, "headers": {"x-scope-orgid": "t1"}},
            "otlp/down": {"endpoint": f"http://127.0.0.1:{closed_port()}", "timeout": "1s"},
        },
        "service": {
            "pipelines": {
                "profiles": {"receivers": ["profiling"], "processors": ["resource"], "exporters": ["otlp", "otlp/down"]}
            },
            "telemetry": {"drain_interval": "20ms"},
        },
    }
    cfg = tmp / "otelbpf.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    probe = tmp / "pid"
    # the workload writes its pid first: the samples' resource must name it
    command = [
        sys.executable,
        "-c",
        f"import os, runpy, sys; open({str(probe)!r}, 'w').write(str(os.getpid())); "
        f"sys.argv = [{str(NATIVE_HOT)!r}, '3', {str(BUILT)!r}]; "
        "runpy.run_path(sys.argv[0], run_name='__main__')",
    ]
    with AgentProcess(["-c", str(cfg), "--", *command]) as agent:
        rc = agent.wait(timeout=180)
    yield Run(receiver, agent, rc, int(probe.read_text()))
    receiver.close()


def workload_samples(run: Run) -> list[DecodedSample]:
    return [s for s in run.receiver.samples() if s.resource.get("process.pid") == run.workload_pid]


def test_the_agent_keeps_running_and_counts_what_the_dead_endpoint_dropped(run):
    assert run.rc == 0, run.agent.output
    assert not run.receiver.errors, run.receiver.errors
    assert run.receiver.requests, run.agent.output
    sent = (
        sum(len(sp.profiles) for r in run.receiver.requests for rp in r.resource_profiles for sp in rp.scope_profiles)
        // 2
    )  # two OTLP profiles (samples, cpu) per record
    dropped = int(re.search(r"dropped (\d+), export failures (\d+)", run.agent.output).group(1))
    assert dropped >= sent > 0, run.agent.output  # every record the live endpoint got, the dead one lost
    assert all(m.get("x-scope-orgid") == "t1" for m in run.receiver.metadata)


def test_samples_name_the_python_functions_and_the_c_extension_below_them(run):
    samples = [s for s in workload_samples(run) if s.sample_type == ("cpu", "nanoseconds")]
    assert samples, f"no CPU samples of pid {run.workload_pid}; got {len(run.receiver.samples())} samples"
    merged = [s for s in samples if "call_native" in s.functions()]
    assert merged, {tuple(s.functions()) for s in samples}
    stack = next(s.functions() for s in merged if "crunch_inner" in s.functions())
    assert stack.index("crunch_inner") < stack.index("crunch") < stack.index("call_native") < stack.index("main")
    frames = {f.function: f for s in merged for f in s.frames}
    assert frames["call_native"].kind == "cpython" and frames["call_native"].filename == str(NATIVE_HOT)
    assert frames["crunch_inner"].kind == "native"
    assert Path(frames["crunch_inner"].mapping).name == "hotext.so"
    assert frames["crunch_inner"].build_id  # hotext.so is built with a GNU build id
    assert all(s.value > 0 and s.period_type == ("cpu", "nanoseconds") for s in samples)


def test_resource_is_the_process_one_with_the_pipeline_attributes(run):
    [first, *_] = workload_samples(run)
    r = first.resource
    assert r["process.pid"] == run.workload_pid
    assert r["service.name"] == Path(sys.executable).resolve().name
    assert r["host.name"] == socket.gethostname()
    assert r["process.executable.path"] == str(Path(sys.executable).resolve())
    assert r["deployment.environment"] == "test"
    # container.id and k8s.pod.uid where the cgroup path carries them (the workload shares ours)
    expected = container_attributes(Path("/proc/self/cgroup").read_text())
    assert {k: r.get(k) for k in expected} == expected
    assert first.scope == "otelbpf.profiling"
    assert "service_name" not in first.attributes and "process_pid" not in first.attributes
