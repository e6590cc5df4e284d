"""The ibverbs receiver end to end: the real agent (`otelbpf run`) against a real OTLP
collector, watching examples/ibverbs/workload.c drive the real libibverbs (Debian's
libibverbs1), which runs the fakeverbs provider (examples/ibverbs/fakeverbs.c) for a device
that examples/ibverbs/fakedev.sh makes visible in a private mount namespace.

The control path is probed on libibverbs' own exported functions; the data path on the
provider functions the agent finds in each opened context's ops table. Every number the
workload reports (work requests, bytes, completions by status) must come out exactly.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
import yaml

from harness.agent import REPO, AgentProcess, otlp_grpc

pytestmark = [pytest.mark.bpf, pytest.mark.usefixtures("ibverbs_workload")]

BUILD = REPO / "build" / "examples"
WORKLOAD = BUILD / "ibverbs_workload"
FAKEDEV = REPO / "examples" / "ibverbs" / "fakedev.sh"
PROVIDER = BUILD / "ibverbs" / "libfakeverbs-rdmav34.so"


def config(collector, tmp: Path, **ibverbs) -> Path:
    """The ibverbs receiver alone; completions count as slow only past 10 s unless a test says
    otherwise (a loaded machine can delay a 10 us completion past the 1 ms default)."""
    exporter = otlp_grpc(collector)
    name = exporter.pop("name")
    doc = {
        "receivers": {"ibverbs": {"search_paths": [], "slow_completion": "10s", **ibverbs}},
        "processors": {"batch": {"timeout": "100ms"}},
        "exporters": {name: exporter},
        "service": {
            "pipelines": {
                "traces": {"receivers": ["ibverbs"], "processors": ["batch"], "exporters": [name]},
                "metrics": {"receivers": ["ibverbs"], "processors": ["batch"], "exporters": [name]},
            },
            "telemetry": {"metrics_interval": "300ms", "drain_interval": "20ms", "log_level": "info"},
        },
    }
    path = tmp / "otelbpf.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def run_agent(cfg: Path, *workload_args: str, env: dict | None = None) -> tuple[AgentProcess, dict]:
    """`otelbpf run -c cfg -- fakedev.sh ibverbs_workload ARGS` to completion; the workload's report."""
    with AgentProcess(["-c", str(cfg), "--", str(FAKEDEV), str(WORKLOAD), *workload_args], env=env) as agent:
        assert agent.wait(120) == 0, agent.output
    reports = [line for line in agent.output.splitlines() if line.startswith('{"pid"')]
    assert reports, agent.output
    return agent, json.loads(reports[-1])


def points(collector, name: str, pid: int, **attrs) -> list:
    return [
        p
        for p in collector.latest_points(name, **{"process.pid": pid})
        if all(p.attributes.get(k) == v for k, v in attrs.items())
    ]


def value(collector, name: str, pid: int, **attrs) -> float:
    return sum(p.value for p in points(collector, name, pid, **attrs))


def expected_completions(report: dict) -> Counter:
    """(qpn, opcode, status) -> count, from what the workload polled."""
    out: Counter = Counter()
    for qp in report["qps"]:
        for key, (count, _bytes) in qp["completions"].items():
            opcode, status = key.split(":")
            out[(qp["qpn"], opcode, status)] += count
    return out


def wait_for_qp_metrics(collector, report: dict) -> None:
    pid = report["pid"]
    want = sum(n for qp in report["qps"] for n, _ in qp["posted"].values())
    try:
        collector.wait_for(
            lambda: value(collector, "rdma.wr.posted", pid) == want, what=f"rdma.wr.posted summing to {want}"
        )
    except AssertionError:
        got = [(p.attributes, p.value, p.resource) for p in points(collector, "rdma.wr.posted", pid)]
        raise AssertionError(f"rdma.wr.posted: want {want}, the workload reported {report}, got {got}") from None


def test_transfer_and_errors_are_counted_exactly_per_queue_pair(otlp_collector, tmp_path):
    agent, w = run_agent(config(otlp_collector, tmp_path), "--iterations", "25", "--phases", "transfer,errors")
    c, pid = otlp_collector, w["pid"]
    wait_for_qp_metrics(c, w)

    for qp in w["qps"]:
        for opcode, (count, nbytes) in qp["posted"].items():
            assert value(c, "rdma.wr.posted", pid, **{"rdma.qp.num": qp["qpn"], "rdma.wr.opcode": opcode}) == count
            assert value(c, "rdma.wr.bytes", pid, **{"rdma.qp.num": qp["qpn"], "rdma.wr.opcode": opcode}) == nbytes
    got = Counter()
    for p in points(c, "rdma.completions", pid):
        got[(p.attributes["rdma.qp.num"], p.attributes["rdma.wc.opcode"], p.attributes["rdma.wc.status"])] += p.value
    assert got == expected_completions(w)
    a, b = w["qps"][0], w["qps"][1]
    assert (
        value(c, "rdma.completion.bytes", pid, **{"rdma.qp.num": b["qpn"], "rdma.wc.opcode": "RECV"})
        == b["completions"]["RECV:SUCCESS"][1]
    )

    # Peers, devices and ports as attributes; the GID of an InfiniBand port holds no IP address.
    send = points(c, "rdma.wr.posted", pid, **{"rdma.qp.num": a["qpn"], "rdma.wr.opcode": "SEND"})[0]
    assert send.attributes["rdma.qp.remote.num"] == b["qpn"]
    assert send.attributes["rdma.device.name"] == w["device"] == "fakeverbs0"
    assert send.attributes["rdma.qp.remote.lid"] == w["lid"]
    assert send.attributes["rdma.qp.remote.gid"] == w["gid"]
    assert send.attributes["rdma.port.num"] == 1
    assert send.attributes["rdma.qp.type"] == "RC"
    assert "network.peer.address" not in send.attributes

    # Latency: A's signaled sends (SEND, RDMA_READ) and its receives, each matched to its post.
    hist = points(c, "rdma.completion.duration", pid, **{"rdma.qp.num": a["qpn"], "rdma.queue": "send"})[0]
    assert hist.count == 50 and hist.unit == "s" and sum(hist.bucket_counts) == 50
    assert 10e-6 <= hist.sum / hist.count < 1.0  # the provider completes 10 us after the post
    assert (
        points(c, "rdma.completion.duration", pid, **{"rdma.qp.num": a["qpn"], "rdma.queue": "receive"})[0].count == 25
    )
    for st in ("INIT", "RTR", "RTS"):
        assert value(c, "rdma.qp.state.changes", pid, **{"rdma.qp.num": a["qpn"], "rdma.qp.state": st}) == 1
    assert value(c, "rdma.memory.registered", pid, **{"rdma.device.name": "fakeverbs0"}) == 0  # deregistered
    assert value(c, "otelbpf.ibverbs.anomalies", pid) == 0

    spans = [s for s in c.spans() if s.resource.get("process.pid") == pid]
    names = Counter(s.name for s in spans)
    assert names["ibv_create_qp"] == 6 and names["ibv_destroy_qp"] == 6 and names["rdma.qp"] == 6
    assert names["ibv_modify_qp"] == 5 * 3 + 1 and names["ibv_reg_mr"] == 1 and names["ibv_reg_mr_iova2"] == 1
    assert names["ibv_open_device"] == 1 and names["ibv_close_device"] == 1 and names["ibv_dereg_mr"] == 2
    rtr = [
        s
        for s in spans
        if s.name == "ibv_modify_qp"
        and s.attributes.get("rdma.qp.state") == "RTR"
        and s.attributes["rdma.qp.num"] == a["qpn"]
    ][0]
    assert rtr.attributes["rdma.qp.remote.num"] == b["qpn"] and rtr.attributes["rdma.qp.path_mtu"] == 4096
    failed = [s for s in spans if s.name == "ibv_modify_qp" and s.status_code == "STATUS_CODE_ERROR"]
    assert [s.attributes["rdma.return_code"] for s in failed] == [22]  # F: RESET -> RTR, EINVAL
    errors = Counter(s.attributes["rdma.wc.status"] for s in spans if s.name == "rdma.completion")
    assert errors == {"RETRY_EXC_ERR": 1, "WR_FLUSH_ERR": 2, "RNR_RETRY_EXC_ERR": 1}
    assert all(s.status_code == "STATUS_CODE_ERROR" for s in spans if s.name == "rdma.completion")
    lifetimes = [s for s in spans if s.name == "rdma.qp"]
    assert {s.attributes["rdma.qp.end_reason"] for s in lifetimes} == {"destroyed"}
    reg = [s for s in spans if s.name.startswith("ibv_reg_mr")]
    assert sorted(s.attributes["rdma.mr.length"] for s in reg) == [1 << 20, 1 << 20]

    # The data path was found through the context's ops table, in the provider.
    assert re.search(
        r"ibverbs data path: pid \d+ device fakeverbs0: post_send -> \S+libfakeverbs-rdmav34.so"
        r"\+0x[0-9a-f]+ \(fv_post_send\)",
        agent.output,
    ), agent.output
    probes = {p.attributes["function"]: p.value for p in c.latest_points("otelbpf.ibverbs.datapath.probes")}
    assert probes == {"post_send": 1, "post_recv": 1, "poll_cq": 2, "create_qp_ex": 2}
    assert c.latest_points("otelbpf.events.lost", reason="ibv_map_full")[0].value == 0


def test_slow_completions_become_spans_with_the_post_time(otlp_collector, tmp_path):
    cfg = config(otlp_collector, tmp_path, slow_completion="1ms")
    _agent, w = run_agent(cfg, "--iterations", "4", env={"FAKEVERBS_DELAY_NS": "3000000"})
    c, pid = otlp_collector, w["pid"]
    wait_for_qp_metrics(c, w)
    slow = [s for s in c.spans("rdma.completion") if s.resource.get("process.pid") == pid]
    # Signaled: A's SEND and RDMA_READ, B's RDMA_WRITE_WITH_IMM; receives: one each on A and B.
    assert Counter(s.attributes["rdma.wc.opcode"] for s in slow) == {
        "SEND": 4,
        "RDMA_READ": 4,
        "RDMA_WRITE": 4,
        "RECV": 4,
        "RECV_RDMA_WITH_IMM": 4,
    }
    for s in slow:
        assert s.status_code != "STATUS_CODE_ERROR" and s.attributes["rdma.wc.status"] == "SUCCESS"
        assert s.end_ns - s.start_ns >= 3_000_000
    sends = [s for s in slow if s.attributes["rdma.wc.opcode"] == "SEND"]
    assert {s.attributes["rdma.wr.bytes"] for s in sends} == {3000}
    hists = points(c, "rdma.completion.duration", pid, **{"rdma.queue": "send"})
    assert sum(h.count for h in hists) == 12 and sum(h.sum for h in hists) >= 12 * 3e-3


def test_process_exiting_with_queue_pairs_open(otlp_collector, tmp_path):
    _agent, w = run_agent(config(otlp_collector, tmp_path), "--iterations", "5", "--exit-open")
    c, pid = otlp_collector, w["pid"]
    wait_for_qp_metrics(c, w)
    lifetimes = c.wait_for(
        lambda: [s for s in c.spans("rdma.qp") if s.resource.get("process.pid") == pid], what="QP lifetime spans"
    )
    assert sorted(s.attributes["rdma.qp.num"] for s in lifetimes) == sorted(q["qpn"] for q in w["qps"])
    for s in lifetimes:
        assert s.attributes["rdma.qp.end_reason"] == "process_exited"
        assert s.attributes["rdma.qp.state"] == "RTS" and s.status_code == "STATUS_CODE_ERROR"
    assert not [s for s in c.spans("ibv_destroy_qp") if s.resource.get("process.pid") == pid]
    assert value(c, "rdma.memory.registered", pid) == w["mr_bytes"]
    assert value(c, "rdma.memory.regions", pid) == 2


def test_library_unloaded_and_loaded_again_while_attached(otlp_collector, tmp_path):
    agent, w = run_agent(
        config(otlp_collector, tmp_path), "--iterations", "6", "--reload", "--qp-ex", "--phases", "transfer,errors"
    )
    c, pid = otlp_collector, w["pid"]
    assert w["reloads"] == 1  # the workload checked both files left its address space
    wait_for_qp_metrics(c, w)
    # The same QP numbers and peers come back after the reload: one series each, summed.
    want: Counter = Counter()
    for qp in w["qps"]:
        for opcode, (count, _b) in qp["posted"].items():
            want[(qp["qpn"], opcode)] += count
    got = Counter(
        {
            (p.attributes["rdma.qp.num"], p.attributes["rdma.wr.opcode"]): p.value
            for p in points(c, "rdma.wr.posted", pid)
        }
    )
    assert got == want
    got = Counter()
    for p in points(c, "rdma.completions", pid):
        got[(p.attributes["rdma.qp.num"], p.attributes["rdma.wc.opcode"], p.attributes["rdma.wc.status"])] += p.value
    assert got == expected_completions(w)
    spans = [s for s in c.spans() if s.resource.get("process.pid") == pid]
    assert Counter(s.name for s in spans)["ibv_open_device"] == 2
    assert Counter(s.name for s in spans)["ibv_create_qp_ex"] == 2  # B, in each round
    # The provider was mapped twice, perhaps at two addresses; its file was probed once.
    probes = {p.attributes["function"]: p.value for p in c.latest_points("otelbpf.ibverbs.datapath.probes")}
    assert probes == {"post_send": 1, "post_recv": 1, "poll_cq": 2, "create_qp_ex": 2}
    assert "attach failed" not in agent.output


def test_control_path_only(otlp_collector, tmp_path):
    _agent, w = run_agent(config(otlp_collector, tmp_path, data_path=False), "--iterations", "3")
    c, pid = otlp_collector, w["pid"]
    c.wait_for(
        lambda: [s for s in c.spans("rdma.qp") if s.resource.get("process.pid") == pid], what="QP lifetime spans"
    )
    c.wait_for(lambda: points(c, "rdma.qp.state.changes", pid), what="state changes")
    assert not points(c, "rdma.wr.posted", pid)
    assert not c.latest_points("otelbpf.ibverbs.datapath.probes")
    assert value(c, "rdma.qp.state.changes", pid, **{"rdma.qp.state": "RTS"}) == 2
