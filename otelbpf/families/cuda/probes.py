"""The CUDA probe family: which runtime/driver symbols get which program.

Entry points are generated here, one per symbol, because each must pass its
own function id to the shared bodies in ``bpf/cuda.c`` (the same body serves
``cudaLaunchKernel`` and ``cudaLaunchKernel_ptsz``) and BCC rejects map
helpers inside C macros.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from otelbpf.base.events import CudaFunc, Kind, is_driver
from otelbpf.sensor.family import LibraryKind, ProbeFamily, ProbeSpec, TailCall

# symbol -> (launch variant, C expression of the kernel handle)
_LAUNCHES = {
    CudaFunc.cudaLaunchKernel: ("LAUNCH_RUNTIME", "PT_REGS_PARM1(ctx)"),
    CudaFunc.cudaLaunchKernel_ptsz: ("LAUNCH_RUNTIME", "PT_REGS_PARM1(ctx)"),
    CudaFunc.cudaLaunchKernelExC: ("LAUNCH_RUNTIME_EX", "PT_REGS_PARM2(ctx)"),
    CudaFunc.cudaLaunchKernelExC_ptsz: ("LAUNCH_RUNTIME_EX", "PT_REGS_PARM2(ctx)"),
    CudaFunc.cuLaunchKernel: ("LAUNCH_DRIVER", "PT_REGS_PARM1(ctx)"),
    CudaFunc.cuLaunchKernel_ptsz: ("LAUNCH_DRIVER", "PT_REGS_PARM1(ctx)"),
    CudaFunc.cuLaunchKernelEx: ("LAUNCH_DRIVER_EX", "PT_REGS_PARM2(ctx)"),
    CudaFunc.cuLaunchKernelEx_ptsz: ("LAUNCH_DRIVER_EX", "PT_REGS_PARM2(ctx)"),
}

_P1, _P2, _P3, _P4, _P5, _P6 = (f"PT_REGS_PARM{i}(ctx)" for i in range(1, 7))
_S7, _S8 = "stack_arg(ctx, 7)", "stack_arg(ctx, 8)"


def _host_side(kind: str, dst: str, src: str) -> str:
    """The host pointer of a runtime copy (pinned or pageable is told from it)."""
    return f"host_side({kind}, {dst}, {src})"


_OUT = "EVF_OUT_PTR"
# symbol -> (event kind, flags, a0, a1, a2, a3) as C expressions, stored at entry and
# completed by the return probe. events.py and docs/semantic-conventions.md say what
# each kind's a0..a3 mean; EVF_OUT_PTR: a1 is an out-pointer read at return.
_PAIRED: dict[CudaFunc, tuple[str, str, str, str, str, str]] = {
    CudaFunc.cudaMalloc: ("EV_CUDA_MALLOC", _OUT, _P2, _P1, "0", "0"),  # size, &ptr
    CudaFunc.cudaMallocAsync: ("EV_CUDA_MALLOC", _OUT, _P2, _P1, _P3, "0"),  # size, &ptr, stream
    CudaFunc.cudaMallocAsync_ptsz: ("EV_CUDA_MALLOC", _OUT, _P2, _P1, _P3, "0"),
    CudaFunc.cudaFree: ("EV_CUDA_FREE", "0", _P1, "0", "0", "0"),  # ptr
    CudaFunc.cudaFreeAsync: ("EV_CUDA_FREE", "0", _P1, "0", _P2, "0"),  # ptr, -, stream
    CudaFunc.cudaFreeAsync_ptsz: ("EV_CUDA_FREE", "0", _P1, "0", _P2, "0"),
    CudaFunc.cudaMemcpy: ("EV_CUDA_MEMCPY", "0", _P3, _P4, "0", _host_side(_P4, _P1, _P2)),  # bytes, kind, stream, host
    CudaFunc.cudaMemcpyAsync: ("EV_CUDA_MEMCPY", "0", _P3, _P4, _P5, _host_side(_P4, _P1, _P2)),
    CudaFunc.cudaMemcpyAsync_ptsz: ("EV_CUDA_MEMCPY", "0", _P3, _P4, _P5, _host_side(_P4, _P1, _P2)),
    CudaFunc.cudaMemcpy2D: ("EV_CUDA_MEMCPY", "0", f"{_P5} * {_P6}", _S7, "0", _host_side(_S7, _P1, _P3)),
    CudaFunc.cudaMemcpy2DAsync: ("EV_CUDA_MEMCPY", "0", f"{_P5} * {_P6}", _S7, _S8, _host_side(_S7, _P1, _P3)),
    CudaFunc.cudaMemcpy2DAsync_ptsz: ("EV_CUDA_MEMCPY", "0", f"{_P5} * {_P6}", _S7, _S8, _host_side(_S7, _P1, _P3)),
    CudaFunc.cudaStreamSynchronize: ("EV_CUDA_SYNC", "0", _P1, "0", "0", "0"),  # stream (or event), is-event
    CudaFunc.cudaStreamSynchronize_ptsz: ("EV_CUDA_SYNC", "0", _P1, "0", "0", "0"),
    CudaFunc.cudaDeviceSynchronize: ("EV_CUDA_SYNC", "0", "0", "0", "0", "0"),
    CudaFunc.cudaEventSynchronize: ("EV_CUDA_SYNC", "0", _P1, "1", "0", "0"),
    CudaFunc.cudaEventQuery: ("EV_CUDA_CALL", "0", _P1, "0", "0", "0"),  # event, -, stream
    CudaFunc.cudaEventRecord: ("EV_CUDA_CALL", "0", _P1, "0", _P2, "0"),
    CudaFunc.cudaEventRecord_ptsz: ("EV_CUDA_CALL", "0", _P1, "0", _P2, "0"),
    CudaFunc.cudaStreamWaitEvent: ("EV_CUDA_CALL", "0", _P2, "0", _P1, "0"),
    CudaFunc.cudaStreamWaitEvent_ptsz: ("EV_CUDA_CALL", "0", _P2, "0", _P1, "0"),
    CudaFunc.cudaHostRegister: ("EV_CUDA_HOST_ALLOC", "0", _P2, _P1, "0", "0"),  # bytes, ptr
    CudaFunc.cudaMallocHost: ("EV_CUDA_HOST_ALLOC", _OUT, _P2, _P1, "0", "0"),
    CudaFunc.cudaHostAlloc: ("EV_CUDA_HOST_ALLOC", _OUT, _P2, _P1, "0", "0"),
    CudaFunc.cudaHostUnregister: ("EV_CUDA_HOST_FREE", "0", _P1, "0", "0", "0"),
    CudaFunc.cudaFreeHost: ("EV_CUDA_HOST_FREE", "0", _P1, "0", "0", "0"),
    CudaFunc["__cudaGetKernel"]: ("EV_CUDA_GET_HANDLE", _OUT, "0", _P1, _P2, "0"),  # -, &handle, host stub
    CudaFunc.cudaGetKernel: ("EV_CUDA_GET_HANDLE", _OUT, "0", _P1, _P2, "0"),
    # device, -, -, DEVICE_SET: its return (0) makes the device current on the thread (cuda.c)
    CudaFunc.cudaSetDevice: ("EV_CUDA_CALL", "0", _P1, "0", "0", "DEVICE_SET"),
    # the driver's
    CudaFunc.cuMemAlloc_v2: ("EV_CUDA_MALLOC", _OUT, _P2, _P1, "0", "0"),
    CudaFunc.cuMemAllocAsync: ("EV_CUDA_MALLOC", _OUT, _P2, _P1, _P3, "0"),
    CudaFunc.cuMemAllocAsync_ptsz: ("EV_CUDA_MALLOC", _OUT, _P2, _P1, _P3, "0"),
    CudaFunc.cuMemMap: ("EV_CUDA_MALLOC", "0", _P2, _P1, _P4, "0"),  # size, ptr, allocation handle
    CudaFunc.cuMemFree_v2: ("EV_CUDA_FREE", "0", _P1, "0", "0", "0"),
    CudaFunc.cuMemFreeAsync: ("EV_CUDA_FREE", "0", _P1, "0", _P2, "0"),
    CudaFunc.cuMemFreeAsync_ptsz: ("EV_CUDA_FREE", "0", _P1, "0", _P2, "0"),
    CudaFunc.cuMemUnmap: ("EV_CUDA_FREE", "0", _P1, _P2, "0", "0"),  # ptr, size
    CudaFunc.cuMemCreate: ("EV_CUDA_CALL", _OUT, _P2, _P1, "0", "0"),  # size, handle
    CudaFunc.cuMemRelease: ("EV_CUDA_CALL", "0", "0", _P1, "0", "0"),  # -, handle
    CudaFunc.cuMemcpy: ("EV_CUDA_MEMCPY", "0", _P3, "4", "0", "0"),
    CudaFunc.cuMemcpyAsync: ("EV_CUDA_MEMCPY", "0", _P3, "4", _P4, "0"),
    CudaFunc.cuMemcpyAsync_ptsz: ("EV_CUDA_MEMCPY", "0", _P3, "4", _P4, "0"),
    CudaFunc.cuMemcpyHtoD_v2: ("EV_CUDA_MEMCPY", "0", _P3, "1", "0", _P2),
    CudaFunc.cuMemcpyDtoH_v2: ("EV_CUDA_MEMCPY", "0", _P3, "2", "0", _P1),
    CudaFunc.cuMemcpyDtoD_v2: ("EV_CUDA_MEMCPY", "0", _P3, "3", "0", "0"),
    CudaFunc.cuMemcpyHtoDAsync_v2: ("EV_CUDA_MEMCPY", "0", _P3, "1", _P4, _P2),
    CudaFunc.cuMemcpyHtoDAsync_v2_ptsz: ("EV_CUDA_MEMCPY", "0", _P3, "1", _P4, _P2),
    CudaFunc.cuMemcpyDtoHAsync_v2: ("EV_CUDA_MEMCPY", "0", _P3, "2", _P4, _P1),
    CudaFunc.cuMemcpyDtoHAsync_v2_ptsz: ("EV_CUDA_MEMCPY", "0", _P3, "2", _P4, _P1),
    CudaFunc.cuMemcpyDtoDAsync_v2: ("EV_CUDA_MEMCPY", "0", _P3, "3", _P4, "0"),
    CudaFunc.cuMemcpyDtoDAsync_v2_ptsz: ("EV_CUDA_MEMCPY", "0", _P3, "3", _P4, "0"),
    CudaFunc.cuStreamSynchronize: ("EV_CUDA_SYNC", "0", _P1, "0", "0", "0"),
    CudaFunc.cuStreamSynchronize_ptsz: ("EV_CUDA_SYNC", "0", _P1, "0", "0", "0"),
    CudaFunc.cuCtxSynchronize: ("EV_CUDA_SYNC", "0", "0", "0", "0", "0"),
    CudaFunc.cuEventSynchronize: ("EV_CUDA_SYNC", "0", _P1, "1", "0", "0"),
    CudaFunc.cuEventQuery: ("EV_CUDA_CALL", "0", _P1, "0", "0", "0"),
    CudaFunc.cuEventRecord: ("EV_CUDA_CALL", "0", _P1, "0", _P2, "0"),
    CudaFunc.cuEventRecord_ptsz: ("EV_CUDA_CALL", "0", _P1, "0", _P2, "0"),
    CudaFunc.cuStreamWaitEvent: ("EV_CUDA_CALL", "0", _P2, "0", _P1, "0"),
    CudaFunc.cuStreamWaitEvent_ptsz: ("EV_CUDA_CALL", "0", _P2, "0", _P1, "0"),
    CudaFunc.cuMemHostRegister_v2: ("EV_CUDA_HOST_ALLOC", "0", _P2, _P1, "0", "0"),
    CudaFunc.cuMemAllocHost_v2: ("EV_CUDA_HOST_ALLOC", _OUT, _P2, _P1, "0", "0"),
    CudaFunc.cuMemHostAlloc: ("EV_CUDA_HOST_ALLOC", _OUT, _P2, _P1, "0", "0"),
    CudaFunc.cuMemHostUnregister: ("EV_CUDA_HOST_FREE", "0", _P1, "0", "0", "0"),
    CudaFunc.cuMemFreeHost: ("EV_CUDA_HOST_FREE", "0", _P1, "0", "0", "0"),
    CudaFunc.cuModuleGetFunction: ("EV_CUDA_FUNC_NAME", _OUT, "0", _P1, _P3, "0"),  # -, &handle, name
    CudaFunc.cuLibraryGetKernel: ("EV_CUDA_FUNC_NAME", _OUT, "0", _P1, _P3, "0"),
    CudaFunc.cuKernelGetFunction: ("EV_CUDA_GET_HANDLE", _OUT, "0", _P1, _P2, "0"),  # -, &CUfunction, CUkernel
}

_G = "EV_CUDA_GRAPH"
_BEGIN, _END = "GRAPH_CAPTURE_BEGIN", "GRAPH_CAPTURE_END"
_NODE, _NODE_V2 = "kernel_node_fn(PT_REGS_PARM5(ctx), 0)", "kernel_node_fn(PT_REGS_PARM5(ctx), 1)"
# CUDA Graphs: every call paired (one event when it returns: Kind.CUDA_GRAPH), a0..a3 as below.
# A driver call the runtime makes inside its own is not recorded (on_entry), so each is seen once.
# The return of a capture's begin (a3 GRAPH_CAPTURE_BEGIN, returned 0) marks its thread capturing,
# that of its end unmarks it (bpf/cuda.c capture_mark): launches in between are EV_CUDA_CAPTURED.
GRAPH_CALLS: dict[CudaFunc, tuple[str, str, str, str, str, str]] = {
    # stream, mode, -, begin
    CudaFunc.cudaStreamBeginCapture: (_G, "0", _P1, _P2, "0", _BEGIN),
    CudaFunc.cudaStreamBeginCapture_ptsz: (_G, "0", _P1, _P2, "0", _BEGIN),
    CudaFunc.cuStreamBeginCapture: (_G, "0", _P1, "0", "0", _BEGIN),  # (stream): CUDA 10.0's
    CudaFunc.cuStreamBeginCapture_v2: (_G, "0", _P1, _P2, "0", _BEGIN),
    CudaFunc.cuStreamBeginCapture_ptsz: (_G, "0", _P1, "0", "0", _BEGIN),
    CudaFunc.cuStreamBeginCapture_v2_ptsz: (_G, "0", _P1, _P2, "0", _BEGIN),
    # stream, graph made (out), -, end
    CudaFunc.cudaStreamEndCapture: (_G, _OUT, _P1, _P2, "0", _END),
    CudaFunc.cudaStreamEndCapture_ptsz: (_G, _OUT, _P1, _P2, "0", _END),
    CudaFunc.cuStreamEndCapture: (_G, _OUT, _P1, _P2, "0", _END),
    CudaFunc.cuStreamEndCapture_ptsz: (_G, _OUT, _P1, _P2, "0", _END),
    # -, graph made (out)
    CudaFunc.cudaGraphCreate: (_G, _OUT, "0", _P1, "0", "0"),
    CudaFunc.cuGraphCreate: (_G, _OUT, "0", _P1, "0", "0"),
    # graph, node made (out), the node's kernel (host stub, cudaKernel_t, CUfunction or CUkernel)
    CudaFunc.cudaGraphAddKernelNode: (_G, _OUT, _P2, _P1, _NODE, "0"),
    CudaFunc.cuGraphAddKernelNode: (_G, _OUT, _P2, _P1, _NODE, "0"),
    CudaFunc.cuGraphAddKernelNode_v2: (_G, _OUT, _P2, _P1, _NODE_V2, "0"),
    # graph, executable graph made (out)
    CudaFunc.cudaGraphInstantiate: (_G, _OUT, _P2, _P1, "0", "0"),
    CudaFunc.cudaGraphInstantiateWithFlags: (_G, _OUT, _P2, _P1, "0", "0"),
    CudaFunc.cudaGraphInstantiateWithParams: (_G, _OUT, _P2, _P1, "0", "0"),
    CudaFunc.cudaGraphInstantiateWithParams_ptsz: (_G, _OUT, _P2, _P1, "0", "0"),
    CudaFunc.cuGraphInstantiate: (_G, _OUT, _P2, _P1, "0", "0"),
    CudaFunc.cuGraphInstantiate_v2: (_G, _OUT, _P2, _P1, "0", "0"),
    CudaFunc.cuGraphInstantiateWithFlags: (_G, _OUT, _P2, _P1, "0", "0"),
    CudaFunc.cuGraphInstantiateWithParams: (_G, _OUT, _P2, _P1, "0", "0"),
    CudaFunc.cuGraphInstantiateWithParams_ptsz: (_G, _OUT, _P2, _P1, "0", "0"),
    # executable graph, -, graph it takes its parameters from
    CudaFunc.cudaGraphExecUpdate: (_G, "0", _P1, "0", _P2, "0"),
    CudaFunc.cuGraphExecUpdate: (_G, "0", _P1, "0", _P2, "0"),
    CudaFunc.cuGraphExecUpdate_v2: (_G, "0", _P1, "0", _P2, "0"),
    # executable graph (0: the graph's own node), node, its new kernel
    CudaFunc.cudaGraphExecKernelNodeSetParams: (_G, "0", _P1, _P2, "kernel_node_fn(PT_REGS_PARM3(ctx), 0)", "0"),
    CudaFunc.cuGraphExecKernelNodeSetParams: (_G, "0", _P1, _P2, "kernel_node_fn(PT_REGS_PARM3(ctx), 0)", "0"),
    CudaFunc.cuGraphExecKernelNodeSetParams_v2: (_G, "0", _P1, _P2, "kernel_node_fn(PT_REGS_PARM3(ctx), 1)", "0"),
    CudaFunc.cudaGraphKernelNodeSetParams: (_G, "0", "0", _P1, "kernel_node_fn(PT_REGS_PARM2(ctx), 0)", "0"),
    CudaFunc.cuGraphKernelNodeSetParams: (_G, "0", "0", _P1, "kernel_node_fn(PT_REGS_PARM2(ctx), 0)", "0"),
    CudaFunc.cuGraphKernelNodeSetParams_v2: (_G, "0", "0", _P1, "kernel_node_fn(PT_REGS_PARM2(ctx), 1)", "0"),
    # executable graph / graph destroyed
    CudaFunc.cudaGraphExecDestroy: (_G, "0", _P1, "0", "0", "0"),
    CudaFunc.cuGraphExecDestroy: (_G, "0", _P1, "0", "0", "0"),
    CudaFunc.cudaGraphDestroy: (_G, "0", _P1, "0", "0", "0"),
    CudaFunc.cuGraphDestroy: (_G, "0", _P1, "0", "0", "0"),
    # executable graph, -, stream
    CudaFunc.cudaGraphLaunch: (_G, "0", _P1, "0", _P2, "0"),
    CudaFunc.cudaGraphLaunch_ptsz: (_G, "0", _P1, "0", _P2, "0"),
    CudaFunc.cuGraphLaunch: (_G, "0", _P1, "0", _P2, "0"),
    CudaFunc.cuGraphLaunch_ptsz: (_G, "0", _P1, "0", _P2, "0"),
}
_PAIRED.update(GRAPH_CALLS)

# cuMemcpy2D/3D: bytes and direction come from the descriptor (on_memcpy_desc).
_DESCRIBED_COPIES = {
    CudaFunc.cuMemcpy2D_v2: (2, "0"),
    CudaFunc.cuMemcpy2DAsync_v2: (2, _P2),
    CudaFunc.cuMemcpy2DAsync_v2_ptsz: (2, _P2),
    CudaFunc.cuMemcpy3D_v2: (3, "0"),
    CudaFunc.cuMemcpy3DAsync_v2: (3, _P2),
    CudaFunc.cuMemcpy3DAsync_v2_ptsz: (3, _P2),
}

# Entry-only facts: (event kind, a0, a1).
_FACTS = {
    CudaFunc["__cudaRegisterFunction"]: ("EV_CUDA_KERNEL_NAME", _P2, _P4),  # host stub, device name
}

# The calls that set the thread's current context, or make a context of a device: kept in the
# kernel (bpf/cuda.c thread_devices), no event. (DEV_OP_*, the context or its out-pointer, the device)
_CONTEXT_CALLS = {
    CudaFunc.cuCtxSetCurrent: ("DEV_OP_CTX_SET", _P1, "0"),
    CudaFunc.cuCtxPushCurrent_v2: ("DEV_OP_CTX_PUSH", _P1, "0"),
    CudaFunc.cuCtxPopCurrent_v2: ("DEV_OP_CTX_POP", _P1, "0"),
    CudaFunc.cuDevicePrimaryCtxRetain: ("DEV_OP_PRIMARY", _P1, _P2),
    CudaFunc.cuCtxCreate_v2: ("DEV_OP_CREATE", _P1, _P3),  # (&ctx, flags, dev)
    CudaFunc.cuCtxCreate_v3: ("DEV_OP_CREATE", _P1, _P5),  # (&ctx, params, n, flags, dev)
    CudaFunc.cuCtxCreate_v4: ("DEV_OP_CREATE", _P1, _P4),  # (&ctx, params, flags, dev)
}
CONTEXT_RETURN_PROGRAM = "uretprobe_cuda_context"

RETURN_PROGRAM = "uretprobe_cuda"
#: The shared body of every paired call's entry, and the program array it is tail-called from.
CALL_PROGRAM = "cuda_call"
CALL_ARRAY = "cuda_call_prog"
DRIVER_RETURN_PROGRAM = "uretprobe_cuda_driver"


def _entry_name(func: CudaFunc) -> str:
    return f"uprobe_{func.name}"


def _generate(launch_errors: bool) -> tuple[str, dict[CudaFunc, ProbeSpec]]:
    lines = ["/* generated by otelbpf/families/cuda/probes.py */"]
    specs: dict[CudaFunc, ProbeSpec] = {}

    def entry(func: CudaFunc, body: str, ret: str | None) -> None:
        lines.append(f"int {_entry_name(func)}(struct pt_regs *ctx) {{ return {body}; }}")
        specs[func] = ProbeSpec(func.name, _entry_name(func), ret)

    for func, (variant, fn) in _LAUNCHES.items():
        ret = None
        if launch_errors:
            ret = f"uretprobe_launch_{func.name}"
            lines.append(f"int {ret}(struct pt_regs *ctx) {{ return on_launch_return(ctx, {int(func)}); }}")
        body = "on_driver_launch" if is_driver(func) else "on_launch"
        entry(func, f"{body}(ctx, {int(func)}, {variant}, {fn})", ret)
    # Paired calls hand their arguments to the shared cuda_call program (bpf/cuda.c hand_over).
    for func, (kind, flags, a0, a1, a2, a3) in _PAIRED.items():
        if is_driver(func):
            flags = f"EVF_DRIVER | {flags}"
        ret = DRIVER_RETURN_PROGRAM if is_driver(func) else RETURN_PROGRAM
        entry(func, f"hand_over(ctx, {kind}, {int(func)}, {flags}, 0, {a0}, {a1}, {a2}, {a3})", ret)
    for func, (dims, stream) in _DESCRIBED_COPIES.items():
        desc = f"hand_over(ctx, EV_CUDA_MEMCPY, {int(func)}, EVF_DRIVER, 1, {dims}, {stream}, 0, 0)"
        entry(func, desc, DRIVER_RETURN_PROGRAM)
    for func, (op, arg, dev) in _CONTEXT_CALLS.items():
        entry(func, f"on_context_entry({op}, {arg}, {dev})", CONTEXT_RETURN_PROGRAM)
    for func, (kind, a0, a1) in _FACTS.items():
        entry(func, f"on_fact({kind}, {int(func)}, {a0}, {a1})", None)
    return "\n".join(lines) + "\n", specs


def cuda_family(
    libraries: Sequence[str],
    launch_sample_every: int = 0,
    launch_errors: bool = False,
    launch_map_entries: int = 65536,
) -> ProbeFamily:
    """The CUDA family for the configured libraries ("cudart", "cuda")."""
    code, specs = _generate(launch_errors)
    kinds = []
    if "cudart" in libraries:
        kinds.append(
            LibraryKind(
                "cudart",
                re.compile(r"^libcudart\.so(\.[0-9]+)*$"),
                "libcudart.so",
                tuple(s for f, s in specs.items() if not is_driver(f)),
            )
        )
        # nvcc links the runtime statically by default: the same functions, as local
        # .symtab symbols of the executable (sensor/libraries.py finds such executables).
        kinds.append(
            LibraryKind(
                "cudart_static",
                re.compile(r"(?!)"),  # never by name
                "",
                tuple(s for f, s in specs.items() if not is_driver(f)),
                content_symbol="cudaLaunchKernel",
                symtab=True,
            )
        )
    if "cuda" in libraries:
        kinds.append(
            LibraryKind(
                "cuda",
                re.compile(r"^libcuda\.so(\.[0-9]+)*$"),
                "libcuda.so",
                tuple(s for f, s in specs.items() if is_driver(f)),
            )
        )
    assert int(Kind.CUDA_LAUNCH) == 10  # EV_CUDA_* values are shared with common.h
    return ProbeFamily(
        name="cuda",
        c_file="cuda.c",
        libraries=tuple(kinds),
        generated_c=code,
        counting_maps=("launches", "launch_errors"),
        cflags=(f"-DLAUNCH_SAMPLE_EVERY={int(launch_sample_every)}", f"-DLAUNCH_ENTRIES={int(launch_map_entries)}"),
        tail_calls=(TailCall(CALL_ARRAY, 0, CALL_PROGRAM, "kprobe"),),
    )
