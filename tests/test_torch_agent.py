"""The torch receiver end to end: the real agent (real eBPF) against a real OTLP collector,
watching a real Python process run real PyTorch (the CPU wheel) operators.

One agent for the module, started *after* the workload imported torch (late attach: the
agent finds libtorch_cpu.so mapped in the running process). The workload then runs each
operator a known number of times on its main thread and reports its counts and thread id;
the spans and metrics must say the same.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
import yaml

from harness.agent import AgentProcess, otlp_grpc
from harness.otlp import OtlpCollector

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.bpf

LIB = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
N = 40

WORKLOAD = textwrap.dedent(f"""
    import json, os, sys, threading
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(1)
    print("ready", flush=True)
    sys.stdin.readline()
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    x = torch.randn(4, 32)
    img, w = torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3)
    q = torch.randn(1, 2, 8, 16)
    for _ in range({N}):
        torch.mm(a, b)
        F.layer_norm(x, (32,))
        F.softmax(x, dim=-1)
        F.conv2d(img, w)
        F.scaled_dot_product_attention(q, q, q)
    failed = 0
    for _ in range(3):  # an operator raising: the program must live on (no uretprobe)
        try:
            torch.mm(a, a)
        except RuntimeError:
            failed += 1
    torch.mm(a, b)  # and the next call is still measured
    print(json.dumps({{"pid": os.getpid(), "tid": threading.get_native_id(), "failed": failed}}), flush=True)
    sys.stdin.readline()
""")

#: operator -> calls the workload makes (the last torch.mm after the failures included).
EXPECTED = {
    "mm": N + 1,
    "layer_norm": N,
    "softmax_int": N,
    "_softmax": N,
    "convolution": N,
    "scaled_dot_product_attention": N,
}


def _config(collector: OtlpCollector, tmp: Path) -> Path:
    exporter = otlp_grpc(collector)
    name = exporter.pop("name")
    doc = {
        "receivers": {"torch": {"search_paths": []}},
        "processors": {"batch": {"timeout": "100ms"}},
        "exporters": {name: exporter},
        "service": {
            "pipelines": {
                "traces": {"receivers": ["torch"], "processors": ["batch"], "exporters": [name]},
                "metrics": {"receivers": ["torch"], "processors": ["batch"], "exporters": [name]},
            },
            "telemetry": {"metrics_interval": "300ms", "drain_interval": "20ms", "log_level": "info"},
        },
    }
    path = tmp / "otelbpf.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    """The workload (torch imported first), then the agent; the workload's report."""
    tmp = tmp_path_factory.mktemp("torch")
    script = tmp / "workload.py"
    script.write_text(WORKLOAD)
    with OtlpCollector() as collector:
        proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "ready"
            with AgentProcess(["-c", str(_config(collector, tmp)), "--pid", str(proc.pid)]) as agent:
                agent.wait_ready()
                agent.wait_attached(LIB, timeout=120)
                proc.stdin.write("go\n")
                proc.stdin.flush()
                report = json.loads(proc.stdout.readline())
                yield collector, report, agent
                agent.stop()
        finally:
            proc.kill()
            proc.wait()


def _spans(collector: OtlpCollector, pid: int) -> list:
    return [s for s in collector.spans() if s.scope_name == "otelbpf.torch" and s.resource.get("process.pid") == pid]


def test_operator_spans_count_what_the_workload_ran(run):
    collector, report, agent = run
    assert report["failed"] == 3

    def counts() -> Counter:
        return Counter(s.name for s in _spans(collector, report["pid"]))

    try:
        collector.wait_for(
            lambda: all(counts()[op] >= n for op, n in EXPECTED.items()), timeout=60, what="an operator span per call"
        )
    except AssertionError:
        raise AssertionError(f"spans: {counts()}\nagent:\n{agent.output[-3000:]}") from None
    got = counts()
    assert {op: got[op] for op in EXPECTED} == EXPECTED
    for span in _spans(collector, report["pid"]):
        assert span.attributes["thread.id"] == report["tid"]
        assert span.attributes["torch.operator.name"] == span.name
        assert span.end_ns > span.start_ns


def test_nested_operators_are_children_of_the_operator_around_them(run):
    collector, report, _agent = run
    spans = _spans(collector, report["pid"])
    by_id = {s.span_id: s for s in spans}
    inner = [s for s in spans if s.name == "_softmax"]
    assert len(inner) == N
    for s in inner:
        parent = by_id[s.parent_span_id]
        assert parent.name == "softmax_int"
        assert parent.trace_id == s.trace_id
        assert parent.start_ns <= s.start_ns and s.end_ns <= parent.end_ns
    assert all(by_id.get(s.parent_span_id) is None for s in spans if s.name == "softmax_int")


def test_operator_metrics(run):
    collector, report, _agent = run
    pid = report["pid"]

    def calls(op: str) -> float:
        return sum(
            p.value
            for p in collector.latest_points("otelbpf.torch.operator.calls", **{"process.pid": pid})
            if p.attributes.get("torch.operator.name") == op
        )

    collector.wait_for(
        lambda: all(calls(op) == n for op, n in EXPECTED.items()),
        timeout=30,
        what="otelbpf.torch.operator.calls per operator",
    )
    hist = [
        p
        for p in collector.latest_points("otelbpf.torch.operator.duration", **{"process.pid": pid})
        if p.attributes.get("torch.operator.name") == "mm"
    ]
    assert hist and hist[0].count == N + 1 and hist[0].sum > 0
