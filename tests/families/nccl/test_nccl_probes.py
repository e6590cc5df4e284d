"""The NCCL probes on NVIDIA's real libnccl.so.2 and on the stand-in: where they go, and what
they read from a real process calling the real library (no GPU: the calls that work without
one, examples/nccl/real_nccl.py).

Addresses are checked against readelf; argument values against what the caller passed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from harness.agent import REPO
from otelbpf.base.events import FLAG_NCCL_UNKNOWN_COMM, Kind, NcclFunc
from otelbpf.families.nccl.probes import comm_id, nccl_family, split_comm_id
from otelbpf.sensor import elf

pytestmark = pytest.mark.usefixtures("built")

FAKE_NCCL = REPO / "build" / "examples" / "fakenccl" / "libnccl.so.2"
REAL_NCCL_PY = REPO / "examples" / "nccl" / "real_nccl.py"


def readelf_functions(path: Path) -> dict[str, int]:
    out = subprocess.run(["readelf", "-W", "--dyn-syms", str(path)], check=True, capture_output=True, text=True)
    found = {}
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 8 and parts[3] == "FUNC" and parts[6] != "UND":
            found[parts[7].split("@")[0]] = int(parts[1], 16)
    return found


@pytest.mark.parametrize("which", ["real", "stand-in"])
def test_one_probe_site_per_function_under_both_names(which: str, real_nccl: Path) -> None:
    path = real_nccl if which == "real" else FAKE_NCCL
    kind = nccl_family().libraries[0]
    sites = elf.resolve(str(path), kind.symbols)
    symbols = readelf_functions(path)
    for func in NcclFunc:
        pname, name = "p" + func.name, func.name
        assert symbols[pname] == symbols[name], f"{name} is an alias of {pname} in {path}"
        assert name not in sites, "an aliased address is listed once, under the pnccl name"
        (site,) = sites[pname]
        assert site.vaddr == symbols[pname] and set(site.names) == {pname, name}
        # The real library is not CET-built; the stand-in is, so its probes go past endbr64.
        assert site.skipped_endbr64 == (which == "stand-in")
    assert len(sites) == len(NcclFunc)


def test_comm_ids_are_stable_and_distinct() -> None:
    a, b = bytes(range(128)), bytes(128)
    assert comm_id(a) == comm_id(bytes(a)) != comm_id(b)
    assert split_comm_id(comm_id(a), 0, 1) != split_comm_id(comm_id(a), 0, 0) != split_comm_id(comm_id(a), 1, 0)
    with pytest.raises(ValueError, match="128 bytes"):
        comm_id(b"short")


def gated(command: list[str]) -> tuple[subprocess.Popen, int]:
    """Start ``command`` held at a gate (as the agent does), with its stdout captured."""
    r, w = os.pipe()
    gate = "import os,sys; os.read(int(sys.argv[1]), 1); os.execvp(sys.argv[2], sys.argv[2:])"
    proc = subprocess.Popen(
        [sys.executable, "-c", gate, str(r), *command], pass_fds=(r,), stdout=subprocess.PIPE, text=True
    )
    os.close(r)
    return proc, w


@pytest.mark.bpf
def test_probes_read_the_arguments_a_real_process_passes_the_real_library(real_nccl: Path) -> None:
    """Registers (count, datatype, reduction, root), the 7th argument from the stack (stream),
    and ncclCommInitRank's 128-byte ncclUniqueId, passed by value and so copied to the
    caller's stack: the id the probe reports is the hash of what ncclGetUniqueId produced."""
    from otelbpf.sensor.sensor import Sensor, SensorOptions

    batches: list[np.ndarray] = []
    child, gate = gated(
        [
            sys.executable,
            str(REAL_NCCL_PY),
            "--lib",
            str(real_nccl),
            "--nranks",
            "4",
            "--rank",
            "2",
            "--stream",
            "0xabc0",
        ]
    )
    sensor = Sensor(
        SensorOptions(families=[nccl_family()], pids=[child.pid], search_globs=[str(real_nccl)], drain_interval_s=0.02),
        lambda ring, arr: batches.append(arr) if ring == "events" else None,
    )
    try:
        sensor.start()
        assert (sensor.attach_stats.libraries, sensor.attach_stats.probes) == (1, 2 * len(NcclFunc))
        os.write(gate, b"go")
        os.close(gate)
        out, _ = child.communicate(timeout=60)
        assert child.returncode == 0
        time.sleep(0.1)
    finally:
        child.kill()
        sensor.stop()
    ran = json.loads(out)
    assert ran["results"] == {
        "ncclGetVersion": 0,
        "ncclGetUniqueId": 0,
        "ncclCommInitRank": 1,
        "ncclAllReduce": 4,
        "ncclBroadcast": 4,
        "ncclGroupStart": 0,
        "ncclGroupEnd": 0,
    }
    events = np.concatenate(batches)
    mine = events[
        (events["pid"] == child.pid) & (events["kind"] >= Kind.NCCL_ENTER) & (events["kind"] <= Kind.NCCL_COMM)
    ]
    calls = [(Kind(r["kind"]).name, NcclFunc(r["func"]).name) for r in mine]
    assert calls == [
        (k, f)
        for f in ("ncclCommInitRank", "ncclAllReduce", "ncclBroadcast", "ncclGroupStart", "ncclGroupEnd")
        for k in ("NCCL_ENTER", "NCCL_RETURN")
    ], "one entry and one return per call: the aliases are probed once"
    init, init_ret, allreduce, allreduce_ret, bcast, bcast_ret = mine[:6]
    assert init["a0"] == comm_id(bytes.fromhex(ran["unique_id"]))
    assert init["duration_ns"] == 2 | 4 << 32, "rank 2 of 4"
    assert (init_ret["ret"], allreduce_ret["ret"], bcast_ret["ret"]) == (1, 4, 4)
    assert allreduce["flags"] & FLAG_NCCL_UNKNOWN_COMM and allreduce["a0"] == 0, "a NULL communicator"
    assert allreduce["a2"] == 1024 | 7 << 48 | 2 << 56, "count, float32, max"
    assert allreduce["a3"] == 0xABC0, "the 7th argument, read from the stack"
    assert bcast["a2"] == 256 | 9 << 48 | 0xFF << 56, "count, bfloat16, no reduction"
    assert bcast["ret"] == 3 and bcast["a3"] == 0xABC0, "root 3, stream from the stack"
    assert list(mine["ts_ns"]) == sorted(mine["ts_ns"])
