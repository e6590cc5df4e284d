"""The NCCL stand-in, the multi-rank job and NVIDIA's real libnccl behave as
examples/nccl/README.md says (no BPF here).

The agent tests read straggler classes out of what the job does, so the job's timing must
really follow its options: a collective waits for the last rank, and each kind of slowness
shows up where the README says.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import time
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

pytestmark = pytest.mark.usefixtures("built")

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build" / "examples"
FAKE_NCCL = BUILD / "fakenccl" / "libnccl.so.2"
FAKE_CUDART = BUILD / "fakecudart" / "libcudart.so.12"
JOB = BUILD / "nccl_job"
API = [
    "ncclGetVersion",
    "ncclGetUniqueId",
    "ncclCommInitRank",
    "ncclCommInitAll",
    "ncclCommInitRankConfig",
    "ncclCommSplit",
    "ncclCommDestroy",
    "ncclCommAbort",
    "ncclAllReduce",
    "ncclAllGather",
    "ncclReduceScatter",
    "ncclBroadcast",
    "ncclReduce",
    "ncclSend",
    "ncclRecv",
    "ncclGroupStart",
    "ncclGroupEnd",
]


def exports(lib: Path) -> dict[str, tuple[int, str, str | None]]:
    """name -> (address, binding, version) of every function the library defines."""
    out = {}
    with lib.open("rb") as f:
        elf = ELFFile(f)
        versym = elf.get_section_by_name(".gnu.version")
        for i, sym in enumerate(elf.get_section_by_name(".dynsym").iter_symbols()):
            if sym["st_info"]["type"] == "STT_FUNC" and sym["st_shndx"] != "SHN_UNDEF":
                version = versym.get_symbol(i)["ndx"] if versym else None
                out[sym.name] = (sym["st_value"], sym["st_info"]["bind"], version)
    return out


def job(*args: object, timeout: float = 60) -> dict:
    out = subprocess.run([str(JOB), *map(str, args)], capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def load_nccl(path: Path) -> ctypes.CDLL:
    ctypes.CDLL(str(FAKE_CUDART), mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(str(path))
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.ncclAllReduce.argtypes = [p, p, ctypes.c_size_t, i, i, p, p]
    lib.ncclBroadcast.argtypes = [p, p, ctypes.c_size_t, i, i, p, p]
    lib.ncclSend.argtypes = [p, ctypes.c_size_t, i, i, p, p]
    lib.ncclCommInitRank.argtypes = [ctypes.POINTER(p), i, UniqueId, i]
    lib.ncclCommInitAll.argtypes = [ctypes.POINTER(p), i, p]
    lib.ncclCommDestroy.argtypes = [p]
    lib.ncclGetErrorString.restype = ctypes.c_char_p
    return lib


# ---- exports


def test_stand_in_exports_names_the_way_the_real_library_does(real_nccl: Path) -> None:
    for lib in (FAKE_NCCL, real_nccl):
        table = exports(lib)
        for name in API:
            addr, bind, version = table[name]
            p_addr, p_bind, p_version = table["p" + name]
            assert addr == p_addr, f"{lib}: {name} and p{name} must share an address"
            assert (bind, p_bind) == ("STB_WEAK", "STB_GLOBAL"), name
            assert {version, p_version} <= {None, "VER_NDX_GLOBAL"}, f"{name} is unversioned"


# ---- the job


def test_a_collective_waits_for_the_slow_rank_and_each_kind_of_slowness_shows_where_documented() -> None:
    iters, slow_ms = 6, 40
    compute = job("--ranks", 4, "--iterations", iters, "--slow-rank", 1, "--slow-kind", "compute", "--slow-ms", slow_ms)
    host = job("--ranks", 4, "--iterations", iters, "--slow-rank", 2, "--slow-kind", "host", "--slow-ms", slow_ms)
    comm = job("--ranks", 3, "--iterations", iters, "--slow-rank", 0, "--slow-kind", "comm", "--slow-ms", slow_ms)
    late_ms = iters * slow_ms
    for summary, slow in ((compute, 1), (host, 2)):
        ranks = summary["ranks"]
        assert all(r["ended"] == "completed" and r["errors"] == 0 and r["iterations"] == iters for r in ranks)
        assert ranks[slow]["comm_sync_us"] < 0.2 * late_ms * 1000, "the slow rank never waits for the others"
        for r in ranks:
            if r["rank"] != slow:
                assert r["comm_sync_us"] > 0.8 * late_ms * 1000, "the others wait for it in the stream sync"
    assert compute["ranks"][1]["compute_sync_us"] > 0.8 * late_ms * 1000
    assert host["ranks"][2]["compute_sync_us"] < 0.2 * late_ms * 1000
    # comm-slow: its own completion is late every time; the others wait for it from the 2nd on.
    assert comm["ranks"][0]["comm_sync_us"] > 0.8 * late_ms * 1000
    assert all(r["comm_sync_us"] > 0.8 * (iters - 1) * slow_ms * 1000 for r in comm["ranks"][1:])
    assert compute["unique_id"].startswith(b"fakenccl".hex()) and len(compute["unique_id"]) == 256


def test_groups_splits_and_every_operation_complete() -> None:
    s = job(
        "--ranks",
        4,
        "--iterations",
        3,
        "--split",
        "--group",
        "--ops",
        "allreduce,allgather,reducescatter,broadcast,reduce,sendrecv",
    )
    for r in s["ranks"]:
        assert (r["ended"], r["errors"], r["iterations"]) == ("completed", 0, 3)
        assert (r["split_nranks"], r["split_rank"]) == (2, r["rank"] // 2)
        # init, split, count, user rank, 2 destroys; per iteration a group of 5 + sendrecv (4) + 1
        assert r["calls"] == 6 + 3 * (2 + 5 + 4 + 1)


def test_a_rank_dying_inside_a_collective_fails_the_others() -> None:
    s = job("--ranks", 4, "--iterations", 6, "--crash-rank", 2, "--crash-iter", 3)
    ranks = s["ranks"]
    assert ranks[2]["signal"] == 9
    for r in ranks[:2] + ranks[3:]:
        assert r["ended"] == "peer_failed" and r["async_error"] == 6 and r["iterations"] == 4


@pytest.mark.parametrize("how", ["destroy", "abort"])
def test_ending_a_communicator_with_collectives_in_flight(how: str) -> None:
    s = job(
        "--ranks",
        3,
        "--iterations",
        5,
        "--end-rank",
        1,
        "--end-iter",
        2,
        "--end-how",
        how,
        "--slow-rank",
        2,
        "--slow-kind",
        "compute",
        "--slow-ms",
        60,
    )
    ended = s["ranks"][1]
    assert ended["ended"] == ("destroyed" if how == "destroy" else "aborted") and ended["iterations"] == 3
    if how == "destroy":  # waits for the in-flight collective, which waits for the slow rank
        assert ended["comm_sync_us"] > 0.8 * 3 * 60_000 - 60_000
    survivors = [s["ranks"][0], s["ranks"][2]]
    assert all(r["ended"] == "peer_failed" and r["async_error"] == 6 for r in survivors)


def test_options_are_checked() -> None:
    out = subprocess.run([str(JOB), "--slow-rank", "1"], capture_output=True, text=True)
    assert out.returncode == 2 and "--slow-kind" in out.stderr
    out = subprocess.run([str(JOB), "--ops", "alltoall"], capture_output=True, text=True)
    assert out.returncode == 2 and "unknown value alltoall" in out.stderr


# ---- the libraries in-process


def test_stand_in_argument_errors_match_the_real_library(real_nccl: Path) -> None:
    for path in (FAKE_NCCL, real_nccl):
        lib = load_nccl(path)
        version = ctypes.c_int()
        assert lib.ncclGetVersion(ctypes.byref(version)) == 0 and version.value > 22000
        uid = UniqueId()
        assert lib.ncclGetUniqueId(ctypes.byref(uid)) == 0 and any(uid.internal)
        assert lib.ncclAllReduce(None, None, 16, 7, 0, None, None) == 4, path
        assert lib.ncclGroupStart() == 0 and lib.ncclGroupEnd() == 0
        assert lib.ncclGetErrorString(4).startswith(b"invalid argument")


def test_stand_in_checks_arguments_and_runs_init_all_in_one_process() -> None:
    lib = load_nccl(FAKE_NCCL)
    comms = (ctypes.c_void_p * 2)()
    assert lib.ncclCommInitAll(comms, 2, None) == 0 and all(comms)
    buf = ctypes.create_string_buffer(64)
    assert lib.ncclAllReduce(buf, buf, 4, 12, 0, comms[0], None) == 4, "datatype out of range"
    assert lib.ncclAllReduce(buf, buf, 4, 7, 5, comms[0], None) == 4, "reduction out of range"
    assert lib.ncclBroadcast(buf, buf, 4, 7, 2, comms[0], None) == 4, "root out of range"
    assert lib.ncclSend(buf, 4, 7, 0, comms[0], None) == 4, "a rank cannot send to itself"
    assert lib.ncclAllReduce(None, buf, 4, 7, 0, comms[0], None) == 4, "NULL buffer"
    comm = ctypes.c_void_p()
    assert lib.ncclCommInitRank(ctypes.byref(comm), 2, UniqueId(), 0) == 4, "an id ncclGetUniqueId did not make"
    stream = ctypes.c_void_p(0x77)
    assert lib.ncclGroupStart() == 0
    for c in comms:
        assert lib.ncclAllReduce(buf, buf, 4, 7, 0, c, stream) == 0
    assert lib.ncclGroupEnd() == 0
    rt = ctypes.CDLL(str(FAKE_CUDART))
    rt.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
    assert rt.cudaStreamSynchronize(stream) == 0
    for c in comms:
        assert lib.ncclCommDestroy(c) == 0
    assert lib.ncclGroupEnd() == 5, "ncclGroupEnd without ncclGroupStart"


def test_host_functions_hold_their_stream() -> None:
    """The stand-in runtime's cudaLaunchHostFunc, which the stand-in NCCL builds on."""
    rt = ctypes.CDLL(str(FAKE_CUDART))
    callback_type = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    ran = []
    callback = callback_type(lambda _data: (time.sleep(0.15), ran.append(time.monotonic())))
    stream, other = ctypes.c_void_p(0x4242), ctypes.c_void_p(0x4343)
    rt.cudaLaunchHostFunc.argtypes = [ctypes.c_void_p, callback_type, ctypes.c_void_p]
    rt.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
    t0 = time.monotonic()
    assert rt.cudaLaunchHostFunc(stream, callback, None) == 0
    assert time.monotonic() - t0 < 0.05, "launching does not wait"
    assert rt.cudaStreamSynchronize(other) == 0 and not ran, "another stream is not held"
    assert rt.cudaStreamSynchronize(stream) == 0
    assert ran and time.monotonic() - t0 >= 0.15
    rt.cudaLaunchHostFunc.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    assert rt.cudaLaunchHostFunc(stream, None, None) == 1
