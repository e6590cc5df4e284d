"""The contract between the kernel and user space.

Numpy dtypes mirror the C structs in ``bpf/common.h`` (and ``struct sock_rec`` in
``bpf/sockets.c``) byte for byte, so the sensor can drain ring buffers as whole arrays
instead of one record at a time. The enums name the ``kind`` and ``func`` codes the BPF
programs write; ``FLAG_*`` are common.h's ``EVF_*``. ``bpf/common.h`` is the source of
truth: tests/base/test_events_parity.py parses it and fails on any value, field offset or
size that differs here.
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
    [("pid", "<u4"), ("kind", "u1"), ("paused", "u1"), ("exec", "u1"), ("pad", "V1"), ("a0", "<u8"), ("s", "S240")]
)
assert STREVENT_DTYPE.itemsize == 256


class Kind(enum.IntEnum):
    """``EV_*`` in common.h. Ranges per family: 1-9 process life cycle,
    10-19 CUDA, 20-29 NCCL, 30-39 ibverbs, 40-49 sockets, 50-59 profiling; every correlator
    receives every batch and handles its own range. Kinds common.h marks internal (100 up:
    CUDA calls completed at return) never reach user space and are not named here."""

    PROC_EXEC = 1
    PROC_EXIT = 2
    CUDA_LAUNCH = 10
    CUDA_MEMCPY = 11
    CUDA_MALLOC = 12
    CUDA_FREE = 13
    CUDA_SYNC = 14
    CUDA_CALL = 15  # other paired CUDA calls: events, stream waits, VMM handles
    CUDA_HOST_ALLOC = 16  # page-locked host memory allocated or registered: a0 bytes, a1 address
    CUDA_HOST_FREE = 17  # ... freed or unregistered: a0 address
    CUDA_KERNEL_NAME = 18  # __cudaRegisterFunction: a0 host stub, a1 address of its device name
    CUDA_KERNEL_ALIAS = 19  # a0 kernel handle, a1 what it stands for (host stub, CUkernel)
    NCCL_ENTER = 20  # an NCCL call began (bpf/nccl.c documents each kind's fields)
    NCCL_RETURN = 21  # it returned
    NCCL_COMM = 22  # a communicator became known: init returned, or its rank/size was read
    IBV_OPEN = 30  # ibverbs (bpf/ibverbs.c documents each kind's a0..a3)
    IBV_CLOSE = 31
    IBV_CREATE_QP = 32
    IBV_MODIFY_QP = 33
    IBV_QP_GID = 34
    IBV_DESTROY_QP = 35
    IBV_REG_MR = 36
    IBV_DEREG_MR = 37
    IBV_CREATE_CQ = 38
    IBV_COMPLETION = 39  # an error or slow work completion
    SOCK_DATA = 40  # a read/write-like syscall on a tracked socket (sockdata ring)
    SOCK_CONNECT = 41  # connect() to an inet address (sockdata ring)
    SOCK_ACCEPT = 42  # accept()/accept4() returned a connection (sockdata ring)
    SOCK_CLOSE = 43  # close() of a tracked socket (sockdata ring)
    SOCK_UNKNOWN = 44  # first I/O on an fd the kernel has not classified (sockdata ring)
    SOCK_LOCAL = 45  # a connect()ed socket's local address, once established (sockdata ring)
    SOCK_COUNTED = 46  # an HTTP/2 connection's streams are counted in the kernel from here on (sockdata ring)
    PROFILE_PROC = 50  # first CPU sample or CUDA allocation of a process (bpf/profile.c): inspect it
    CUDA_LAUNCH_SITE = 60  # first launch of (process, API, handle): a0 handle, a1 return address, a2 its caller's
    #: a CUDA Graphs call returned (capture, construction, instantiation, update, destruction,
    #: launch); a0..a3 per function (bpf/cuda.c, GRAPH_CALLS in families/cuda/probes.py)
    CUDA_GRAPH = 61
    #: a launch made while its thread captured a stream: a0 handle, a1 return address, a2 its caller's, a3 stream
    CUDA_CAPTURED = 62
    TORCH_OP = 70  # a torch operator returned (bpf/torch.c): a0 entry address, a1 depth, a2 exit address
    #: the thread's last wake-up by another thread of its process, ahead of its next CUDA event
    #: (common.h): ts_ns the wake-up, a0 the waker's tid, a1 the waker's own waker (0: none), a2 when
    HANDOFF = 80


class StrKind(enum.IntEnum):
    """``SEV_*`` in common.h."""

    LIB_OPEN = 1
    CUDA_FUNC_NAME = 2
    IBV_CONTEXT = 30  # ibv_open_device returned a context (a0); s: the device name


#: ``EVF_INCOMPLETE``: the thread exited before the call returned.
FLAG_INCOMPLETE = 1
#: ``EVF_NCCL_UNKNOWN_COMM``: the NCCL call's communicator was created before the probes were
#: attached, so ``a0`` holds its pointer instead of its id and no sequence number is counted.
FLAG_NCCL_UNKNOWN_COMM = 2
#: ``EVF_DRIVER``: a CUDA driver API call (libcuda), not the runtime's.
FLAG_DRIVER = 4
#: ``EVF_SHED``: a CUDA call or torch operator made while its thread served an HTTP request that
#: head sampling shed (bpf/sockets.c): its span stays out of trace backends, with no request to
#: be the child of.
FLAG_SHED = 0x10
#: ``CUDA_DEVICE_SHIFT``: bits 9-15 of a CUDA record's flags hold the calling thread's current
#: device + 1 (0: none known; bpf/cuda.c keeps it from cudaSetDevice and the context calls).
CUDA_DEVICE_SHIFT = 9


def cuda_device(flags: int) -> int | None:
    """The device a CUDA record's call was made for (``CUDA_DEVICE_SHIFT``), None if not known."""
    dev = (flags >> CUDA_DEVICE_SHIFT) & 0x7F
    return dev - 1 if dev else None


#: ``EVF_IBV_POSTED``: an ``IBV_COMPLETION`` whose post was seen: its ts and duration are real.
FLAG_IBV_POSTED = 0x100


class Stat(enum.IntEnum):
    """Slots of the kernel's per-CPU ``stats`` array: drops counted in BPF."""

    EVENTS_LOST = 0
    STR_LOST = 1
    INFLIGHT_FULL = 2
    LAUNCH_MAP_FULL = 3
    SOCK_LOST = 4
    SOCK_MAP_FULL = 5
    IBV_MAP_FULL = 6
    IBV_TRUNCATED = 7
    TORCH_UNWOUND = 8
    TORCH_DEPTH = 9
    CALL_LOST = 10


def is_driver(func: int) -> bool:
    """Whether a CUDA function id (``event.func``) is the driver's: the runtime's are below
    20 and from 30 to 63, the driver's from 20 to 29 and from 64 up."""
    return 20 <= func < 30 or func >= 64


# Function ids carried in ``event.func`` for the CUDA family (``is_driver`` tells the driver's).
# Ids never change meaning: profiles and maps store them. A member's name is the symbol
# probed. The functional form: names such as ``__cudaRegisterFunction`` would be mangled
# inside a class body (and mypy reads the members of ``enum.IntEnum("...", [...])``).
CudaFunc = enum.IntEnum(
    "CudaFunc",
    [
        ("cudaLaunchKernel", 1),
        ("cudaLaunchKernel_ptsz", 2),
        ("cudaLaunchKernelExC", 3),
        ("cudaLaunchKernelExC_ptsz", 4),
        ("cudaGraphLaunch", 5),
        ("cudaGraphLaunch_ptsz", 6),
        ("cudaMalloc", 7),
        ("cudaFree", 8),
        ("cudaMemcpy", 9),
        ("cudaMemcpyAsync", 10),
        ("cudaMemcpyAsync_ptsz", 11),
        ("cudaStreamSynchronize", 12),
        ("cudaStreamSynchronize_ptsz", 13),
        ("cudaDeviceSynchronize", 14),
        ("cuLaunchKernel", 20),
        ("cuLaunchKernelEx", 21),
        ("cuMemAlloc_v2", 22),
        ("cuMemFree_v2", 23),
        ("cuModuleGetFunction", 24),
        ("cudaMallocAsync", 30),
        ("cudaFreeAsync", 31),
        ("cudaMallocAsync_ptsz", 32),
        ("cudaFreeAsync_ptsz", 33),
        ("cudaEventSynchronize", 34),
        ("cudaEventQuery", 35),
        ("cudaEventRecord", 36),
        ("cudaEventRecord_ptsz", 37),
        ("cudaStreamWaitEvent", 38),
        ("cudaStreamWaitEvent_ptsz", 39),
        ("cudaHostRegister", 40),
        ("cudaHostUnregister", 41),
        ("cudaMallocHost", 42),
        ("cudaHostAlloc", 43),
        ("cudaFreeHost", 44),
        ("cudaMemcpy2D", 45),
        ("cudaMemcpy2DAsync", 46),
        ("cudaMemcpy2DAsync_ptsz", 47),
        ("__cudaRegisterFunction", 48),
        ("__cudaGetKernel", 49),
        ("cudaGetKernel", 50),
        # CUDA Graphs, the runtime's (15-19, 51-63)
        ("cudaStreamBeginCapture", 51),
        ("cudaStreamBeginCapture_ptsz", 52),
        ("cudaStreamEndCapture", 53),
        ("cudaStreamEndCapture_ptsz", 54),
        ("cudaGraphCreate", 55),
        ("cudaGraphAddKernelNode", 56),
        ("cudaGraphInstantiate", 57),
        ("cudaGraphInstantiateWithFlags", 58),
        ("cudaGraphInstantiateWithParams", 59),
        ("cudaGraphInstantiateWithParams_ptsz", 60),
        ("cudaGraphExecUpdate", 61),
        ("cudaGraphExecDestroy", 62),
        ("cudaGraphDestroy", 63),
        ("cudaGraphExecKernelNodeSetParams", 15),
        ("cudaGraphKernelNodeSetParams", 16),
        ("cudaSetDevice", 17),
        ("cuLaunchKernel_ptsz", 64),
        ("cuLaunchKernelEx_ptsz", 65),
        ("cuGraphLaunch", 66),
        ("cuGraphLaunch_ptsz", 67),
        ("cuLibraryGetKernel", 68),
        ("cuKernelGetFunction", 69),
        ("cuMemAllocAsync", 70),
        ("cuMemFreeAsync", 71),
        ("cuMemAllocAsync_ptsz", 72),
        ("cuMemFreeAsync_ptsz", 73),
        ("cuMemCreate", 74),
        ("cuMemRelease", 75),
        ("cuMemMap", 76),
        ("cuMemUnmap", 77),
        ("cuMemcpy", 78),
        ("cuMemcpyAsync", 79),
        ("cuMemcpyHtoD_v2", 80),
        ("cuMemcpyDtoH_v2", 81),
        ("cuMemcpyDtoD_v2", 82),
        ("cuMemcpyHtoDAsync_v2", 83),
        ("cuMemcpyDtoHAsync_v2", 84),
        ("cuMemcpyDtoDAsync_v2", 85),
        ("cuMemcpy2D_v2", 86),
        ("cuMemcpy2DAsync_v2", 87),
        ("cuMemcpy3D_v2", 88),
        ("cuMemcpy3DAsync_v2", 89),
        ("cuStreamSynchronize", 90),
        ("cuCtxSynchronize", 91),
        ("cuEventSynchronize", 92),
        ("cuEventQuery", 93),
        ("cuEventRecord", 94),
        ("cuStreamWaitEvent", 95),
        ("cuMemHostRegister_v2", 96),
        ("cuMemHostUnregister", 97),
        ("cuMemAllocHost_v2", 98),
        ("cuMemHostAlloc", 99),
        ("cuMemFreeHost", 100),
        ("cuStreamSynchronize_ptsz", 101),
        ("cuEventRecord_ptsz", 102),
        ("cuStreamWaitEvent_ptsz", 103),
        ("cuMemcpyAsync_ptsz", 104),
        ("cuMemcpyHtoDAsync_v2_ptsz", 105),
        ("cuMemcpyDtoHAsync_v2_ptsz", 106),
        ("cuMemcpyDtoDAsync_v2_ptsz", 107),
        ("cuMemcpy2DAsync_v2_ptsz", 108),
        ("cuMemcpy3DAsync_v2_ptsz", 109),
        # CUDA Graphs, the driver's
        ("cuStreamBeginCapture", 110),
        ("cuStreamBeginCapture_v2", 111),
        ("cuStreamBeginCapture_ptsz", 112),
        ("cuStreamBeginCapture_v2_ptsz", 113),
        ("cuStreamEndCapture", 114),
        ("cuStreamEndCapture_ptsz", 115),
        ("cuGraphCreate", 116),
        ("cuGraphAddKernelNode", 117),
        ("cuGraphAddKernelNode_v2", 118),
        ("cuGraphInstantiate", 119),
        ("cuGraphInstantiate_v2", 120),
        ("cuGraphInstantiateWithFlags", 121),
        ("cuGraphInstantiateWithParams", 122),
        ("cuGraphInstantiateWithParams_ptsz", 123),
        ("cuGraphExecUpdate", 124),
        ("cuGraphExecUpdate_v2", 125),
        ("cuGraphExecDestroy", 126),
        ("cuGraphDestroy", 127),
        ("cuGraphExecKernelNodeSetParams", 128),
        ("cuGraphExecKernelNodeSetParams_v2", 129),
        ("cuGraphKernelNodeSetParams", 130),
        ("cuGraphKernelNodeSetParams_v2", 131),
        # the thread's current context (bpf/cuda.c: kept in the kernel, no event of their own)
        ("cuCtxSetCurrent", 132),
        ("cuCtxPushCurrent_v2", 133),
        ("cuCtxPopCurrent_v2", 134),
        ("cuDevicePrimaryCtxRetain", 135),
        ("cuCtxCreate_v2", 136),
        ("cuCtxCreate_v3", 137),
        ("cuCtxCreate_v4", 138),
    ],
)


#: ``cudaMemcpyKind`` values -> the direction names used in attributes/metrics.
MEMCPY_DIRECTION = {0: "H2H", 1: "H2D", 2: "D2H", 3: "D2D", 4: "default"}


def unpack_dim(packed: int) -> tuple[int, int, int]:
    """Inverse of ``pack_dim`` in cuda.c: x | y << 32 | z << 48."""
    return packed & 0xFFFFFFFF, (packed >> 32) & 0xFFFF, (packed >> 48) & 0xFFFF


class NcclFunc(enum.IntEnum):
    """Function ids carried in ``event.func`` by the NCCL kinds (bpf/nccl.c)."""

    ncclCommInitRank = 1
    ncclCommInitAll = 2
    ncclCommInitRankConfig = 3
    ncclCommSplit = 4
    ncclCommDestroy = 5
    ncclCommAbort = 6
    ncclAllReduce = 10
    ncclAllGather = 11
    ncclReduceScatter = 12
    ncclBroadcast = 13
    ncclReduce = 14
    ncclSend = 15
    ncclRecv = 16
    ncclGroupStart = 20
    ncclGroupEnd = 21
    ncclCommCount = 30
    ncclCommUserRank = 31


class SockFunc(enum.IntEnum):
    """Syscall ids carried in ``sock_rec.func`` for the sockets family (bpf/sockets.c)."""

    read = 1
    write = 2
    readv = 3
    writev = 4
    sendto = 5
    recvfrom = 6
    sendmsg = 7
    recvmsg = 8
    connect = 9
    accept = 10
    accept4 = 11
    close = 12


#: Syscalls that carry bytes from the process to the peer.
SOCK_EGRESS = frozenset({SockFunc.write, SockFunc.writev, SockFunc.sendto, SockFunc.sendmsg})

#: ``sock_rec.flags`` bits (bpf/sockets.c).
SOCKF_LISTENER_UNKNOWN = 1  # accept on a listener whose port the kernel did not know
SOCKF_VECTOR_TRUNCATED = 2  # more iovecs than the probe copies: the payload stops early
SOCKF_SHIFT_BIT = 8  # bits 8-12: the request's head-sampling shift (kept with probability 2^-shift)
SOCKF_SERVING_SHED = 0x2000  # written by a thread serving an HTTP/1 request the kernel shed
#: An HTTP/2 server's record: the streams whose HEADERS begin in it sampled in the kernel at its shift
#: (bpf/h2_frames.h h2_keep), with the connection's sequence in port (low 16 bits) and local_port (high).
SOCKF_H2_DECIDED = 0x4000

#: Size of ``struct sock_rec`` without its payload.
SOCK_HEADER_BYTES = 64

_SOCK_HEADER_FIELDS = [
    ("ts_ns", "<u8"),  # syscall entry (CLOCK_MONOTONIC)
    ("duration_ns", "<u8"),  # entry -> exit
    ("pid", "<u4"),
    ("tid", "<u4"),
    ("fd", "<i4"),
    ("ret", "<i4"),  # bytes moved, new fd (accept), or -errno
    ("kind", "u1"),
    ("func", "u1"),
    ("cap", "<u2"),  # payload bytes captured (<= ret)
    ("flags", "<u4"),
    ("family", "<u2"),  # connect/accept: AF_INET or AF_INET6
    ("port", "<u2"),  # connect: remote port; accept: peer port
    ("local_port", "<u2"),  # accept: the listener's port when known
    ("pad", "V2"),
    ("addr", "V16"),  # connect: remote address; accept: peer address (network order)
]

#: Socket records as the sensor delivers them from the ``sockdata`` ring, where each is
#: ``struct sock_rec``'s header followed by the ``cap`` bytes captured: the header's
#: fields, and ``data``, the captured bytes (``bytes``, exactly ``cap`` long).
SOCK_RECORD_DTYPE = np.dtype(_SOCK_HEADER_FIELDS + [("data", object)])
assert SOCK_RECORD_DTYPE.fields is not None and SOCK_RECORD_DTYPE.fields["data"][1] == SOCK_HEADER_BYTES  # sockets.c's


class IbvFunc(enum.IntEnum):
    """Function ids carried in ``event.func`` by the ibverbs control-path kinds
    (bpf/ibverbs.c); ``IBV_COMPLETION`` carries the completion's opcode slot instead."""

    ibv_open_device = 1
    ibv_close_device = 2
    ibv_create_qp = 3
    ibv_create_qp_ex = 4
    ibv_modify_qp = 5
    ibv_destroy_qp = 6
    ibv_reg_mr = 7
    ibv_reg_mr_iova = 8
    ibv_reg_mr_iova2 = 9
    ibv_reg_dmabuf_mr = 10
    ibv_dereg_mr = 11
    ibv_create_cq = 12
