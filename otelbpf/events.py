"""The contract between the kernel and user space.

Numpy dtypes mirror the C structs in ``bpf/common.h`` byte for byte, so the
sensor can drain ring buffers as whole arrays instead of one record at a time.
The enums name the ``kind`` and ``func`` codes the BPF programs write.
"""

from __future__ import annotations

import enum

import numpy as np

#: ``struct event`` (64 bytes). Every record on the ``events`` ring.
EVENT_DTYPE = np.dtype(
    [
        ("ts_ns", "<u8"),
        ("duration_ns", "<u8"),
        ("pid", "<u4"),
        ("tid", "<u4"),
        ("kind", "u1"),
        ("func", "u1"),
        ("flags", "<u2"),
        ("ret", "<i4"),
        ("a0", "<u8"),
        ("a1", "<u8"),
        ("a2", "<u8"),
        ("a3", "<u8"),
    ]
)
assert EVENT_DTYPE.itemsize == 64

#: ``struct strevent`` (256 bytes). Library paths and kernel names.
STREVENT_DTYPE = np.dtype(
    [("pid", "<u4"), ("kind", "u1"), ("paused", "u1"), ("pad", "V2"), ("a0", "<u8"), ("s", "S240")]
)
assert STREVENT_DTYPE.itemsize == 256


class Kind(enum.IntEnum):
    """``EV_*`` in common.h. Ranges per family: 1-9 process life cycle,
    10-19 CUDA, 20-29 NCCL, 30-39 ibverbs, 40-49 sockets; every correlator
    receives every batch and handles its own range."""

    PROC_EXEC = 1
    PROC_EXIT = 2
    CUDA_LAUNCH = 10
    CUDA_MEMCPY = 11
    CUDA_MALLOC = 12
    CUDA_FREE = 13
    CUDA_SYNC = 14


class StrKind(enum.IntEnum):
    """``SEV_*`` in common.h."""

    LIB_OPEN = 1
    CUDA_FUNC_NAME = 2


#: ``EVF_INCOMPLETE``: the thread exited before the call returned.
FLAG_INCOMPLETE = 1


class Stat(enum.IntEnum):
    """Slots of the kernel's per-CPU ``stats`` array: drops counted in BPF."""

    EVENTS_LOST = 0
    STR_LOST = 1
    INFLIGHT_FULL = 2
    LAUNCH_MAP_FULL = 3


class CudaFunc(enum.IntEnum):
    """Function ids carried in ``event.func`` for the CUDA family."""

    cudaLaunchKernel = 1
    cudaLaunchKernel_ptsz = 2
    cudaLaunchKernelExC = 3
    cudaLaunchKernelExC_ptsz = 4
    cudaGraphLaunch = 5
    cudaGraphLaunch_ptsz = 6
    cudaMalloc = 7
    cudaFree = 8
    cudaMemcpy = 9
    cudaMemcpyAsync = 10
    cudaMemcpyAsync_ptsz = 11
    cudaStreamSynchronize = 12
    cudaStreamSynchronize_ptsz = 13
    cudaDeviceSynchronize = 14
    cuLaunchKernel = 20
    cuLaunchKernelEx = 21
    cuMemAlloc_v2 = 22
    cuMemFree_v2 = 23
    cuModuleGetFunction = 24


#: ``cudaMemcpyKind`` values -> the direction names used in attributes/metrics.
MEMCPY_DIRECTION = {0: "H2H", 1: "H2D", 2: "D2H", 3: "D2D", 4: "default"}


def unpack_dim(packed: int) -> tuple[int, int, int]:
    """Inverse of ``pack_dim`` in cuda.c: x | y << 32 | z << 48."""
    return packed & 0xFFFFFFFF, (packed >> 32) & 0xFFFF, (packed >> 48) & 0xFFFF
