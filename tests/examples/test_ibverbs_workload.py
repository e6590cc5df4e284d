"""The fakeverbs provider and the NCCL-like workload behave as examples/ibverbs/README.md
says, on the real libibverbs (no BPF here).

The agent tests compare the agent's numbers with what the workload reports, so the report
must be the truth: these tests check it against the design of each phase.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build" / "examples"
WORKLOAD = BUILD / "ibverbs_workload"
PROVIDER = BUILD / "ibverbs" / "libfakeverbs-rdmav34.so"
FAKEDEV = ROOT / "examples" / "ibverbs" / "fakedev.sh"

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="fakedev.sh needs root (private mounts)"),
    pytest.mark.usefixtures("ibverbs_workload"),
]


def workload(*args: str, env: dict | None = None) -> dict:
    out = subprocess.run(
        [str(FAKEDEV), str(WORKLOAD), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def by_name(report: dict) -> dict[str, dict]:
    return {q["name"]: q for q in report["qps"]}


def test_transfer_through_the_real_libibverbs():
    w = workload("--iterations", "7")
    assert w["device"] == "fakeverbs0" and w["lid"] == 1
    assert w["gid"] == "fe80:0000:0000:0000:0002:c903:00fa:0001"  # read by libibverbs from the fake sysfs
    assert w["mr_bytes"] == 2 << 20
    q = by_name(w)
    a, b = q["A"], q["B"]
    assert (a["remote_qpn"], b["remote_qpn"]) == (b["qpn"], a["qpn"])
    assert a["transitions"] == b["transitions"] == 3
    n = 7
    assert a["posted"] == {
        "SEND": [n, 3000 * n],
        "RDMA_WRITE": [n, 65536 * n],
        "RDMA_READ": [n, 8192 * n],
        "RECV": [n, 0],
    }
    assert b["posted"] == {"RECV": [n, 8192 * n], "RDMA_WRITE_WITH_IMM": [n, 4096 * n]}
    assert a["completions"] == {
        "SEND:SUCCESS": [n, 3000 * n],
        "RDMA_READ:SUCCESS": [n, 8192 * n],
        "RECV_RDMA_WITH_IMM:SUCCESS": [n, 4096 * n],
    }
    assert b["completions"] == {"RECV:SUCCESS": [n, 3000 * n], "RDMA_WRITE:SUCCESS": [n, 4096 * n]}


def test_errors_as_on_a_fabric():
    q = by_name(workload("--iterations", "1", "--phases", "errors"))
    assert q["C"]["remote_qpn"] == 0xDEAD01
    assert q["C"]["completions"] == {"SEND:RETRY_EXC_ERR": [1, 0], "SEND:WR_FLUSH_ERR": [2, 0]}
    assert q["D"]["completions"] == {"SEND:RNR_RETRY_EXC_ERR": [1, 0]}
    assert q["E"]["posted"] == {} and q["F"]["transitions"] == 0  # F's RESET -> RTR failed (EINVAL)


def test_injected_failures():
    """FAKEVERBS_FAIL_EVERY=1: every send-queue request fails with FAKEVERBS_FAIL_STATUS (here
    10, IBV_WC_REM_ACCESS_ERR) before the fabric is consulted; the rest of the QP flushes."""
    q = by_name(workload("--phases", "errors", env={"FAKEVERBS_FAIL_EVERY": "1", "FAKEVERBS_FAIL_STATUS": "10"}))
    assert q["C"]["completions"] == {"SEND:REM_ACCESS_ERR": [1, 0], "SEND:WR_FLUSH_ERR": [2, 0]}
    assert q["D"]["completions"] == {"SEND:REM_ACCESS_ERR": [1, 0]}


def test_create_qp_ex_and_reload():
    w = workload("--iterations", "2", "--qp-ex", "--reload")
    assert w["reloads"] == 1  # the workload checked that libibverbs and the provider were unmapped
    names = [q["name"] for q in w["qps"]]
    assert names == ["A", "B", "A", "B"]
    assert [q["qpn"] for q in w["qps"][:2]] == [q["qpn"] for q in w["qps"][2:]]  # the numbers come back


def test_provider_exports_nothing_and_starts_with_endbr64():
    nm = subprocess.run(["nm", "-D", "--defined-only", str(PROVIDER)], capture_output=True, text=True, check=True)
    assert nm.stdout.strip() == ""  # reached through the ops table only, like Debian's providers
    dis = subprocess.run(["objdump", "-d", str(PROVIDER)], capture_output=True, text=True, check=True).stdout
    post_send = dis.split("<fv_post_send>:", 1)[1].splitlines()[1]
    assert "endbr64" in post_send


def test_no_device_outside_the_namespace():
    out = subprocess.run(
        [str(WORKLOAD)],
        capture_output=True,
        text=True,
        timeout=30,
        env={k: v for k, v in os.environ.items() if k not in ("SYSFS_PATH", "RDMAV_DRIVERS")},
    )
    assert out.returncode == 1 and "no RDMA device" in out.stderr
    assert not Path("/dev/infiniband").exists()
    scratch = Path("/run/otelbpf-fakeverbs")  # fakedev.sh's mount point: a private tmpfs only inside
    assert not scratch.exists() or not any(scratch.iterdir())
