"""Call NVIDIA's real libnccl.so.2 (PyPI nvidia-nccl-cu12) the ways that work without a GPU.

With no GPU (no libcuda.so.1) NCCL still answers ncclGetVersion and ncclGetUniqueId, groups
that enqueue nothing, and argument errors; ncclCommInitRank fails (1, no CUDA driver) after
reading its arguments, which is what the agent's probes need to see. Prints one JSON line:
the library, its version, the unique id (hex, 128 bytes) and every call's result.

    python examples/nccl/real_nccl.py [--lib PATH] [--nranks N] [--rank R] [--stream 0xHEX]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
from pathlib import Path


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def wheel_library() -> Path:
    import nvidia.nccl

    return Path(list(nvidia.nccl.__path__)[0]) / "lib" / "libnccl.so.2"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lib", type=Path, default=None, help="libnccl.so.2 (default: the nvidia-nccl-cu12 wheel's)")
    parser.add_argument("--nranks", type=int, default=4)
    parser.add_argument("--rank", type=int, default=2)
    parser.add_argument("--stream", type=lambda s: int(s, 0), default=0xABC0, help="stream passed to ncclAllReduce")
    args = parser.parse_args()
    path = args.lib or wheel_library()
    os.environ.setdefault("NCCL_DEBUG", "NONE")
    lib = ctypes.CDLL(str(path))
    vp, i = ctypes.c_void_p, ctypes.c_int
    lib.ncclCommInitRank.argtypes = [ctypes.POINTER(vp), i, UniqueId, i]
    lib.ncclAllReduce.argtypes = [vp, vp, ctypes.c_size_t, i, i, vp, vp]
    lib.ncclBroadcast.argtypes = [vp, vp, ctypes.c_size_t, i, i, vp, vp]
    results: dict[str, int] = {}
    version = ctypes.c_int()
    results["ncclGetVersion"] = lib.ncclGetVersion(ctypes.byref(version))
    uid = UniqueId()
    results["ncclGetUniqueId"] = lib.ncclGetUniqueId(ctypes.byref(uid))
    comm = vp()
    results["ncclCommInitRank"] = lib.ncclCommInitRank(ctypes.byref(comm), args.nranks, uid, args.rank)
    # A NULL communicator: NCCL checks it before anything that needs a GPU.
    results["ncclAllReduce"] = lib.ncclAllReduce(None, None, 1024, 7, 2, None, args.stream)
    results["ncclBroadcast"] = lib.ncclBroadcast(None, None, 256, 9, 3, None, args.stream)
    results["ncclGroupStart"] = lib.ncclGroupStart()
    results["ncclGroupEnd"] = lib.ncclGroupEnd()
    print(json.dumps({
        "lib": str(path), "pid": os.getpid(), "version": version.value, "unique_id": bytes(uid).hex(),
        "nranks": args.nranks, "rank": args.rank, "stream": args.stream, "results": results,
    }))


if __name__ == "__main__":
    main()
