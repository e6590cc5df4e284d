"""A training loop over the CUDA stand-in runtime (ctypes) with planted host-side causes of GPU
idle time, each measured by the job itself: what it prints is the expected answer.

Each step launches 20 kernels (run ``FAKECUDA_KERNEL_US=1500``: 30 ms of simulated GPU work)
and synchronizes once, as every training loop does; the planted work runs in the training
thread after the synchronize, while the GPU has nothing queued:

- ``checkpoint``: every 5th step ``save_checkpoint`` hashes a 24 MiB state, writes it and fsyncs
  it into DIR (a synchronous ``torch.save`` to local disk);
- ``tokenize``: every step ``tokenize_batch`` prepares the next batch in Python (~14 ms of CPU);
- ``both``: the two at once;
- ``healthy``: nothing but the launches and the synchronize;
- ``sync_per_layer``: a synchronize after every launch (20 a step), the layers short (100 us
  kernels: ``FAKECUDA_KERNEL_US`` set before the runtime loads), so that draining and refilling
  the queue costs a share of the run;
- ``pageable``: each step's 8 MiB batch copied in with ``cudaMemcpy`` from pageable memory.

Prints one JSON line: per planted function its wall-clock seconds and its CPU seconds
(``time.thread_time``: on the CPU, user and kernel), the synchronizes and copies made, and the
steps run.

Usage: train_job.py MODE LIBCUDART STEPS DIR
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import sys
import time
from collections import defaultdict

_libc = ctypes.CDLL("libc.so.6")
planted: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])


class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


def measured(fn):  # type: ignore[no-untyped-def]
    """Adds the call's wall-clock and CPU seconds to ``planted[fn.__name__]``."""

    def run(*args):  # type: ignore[no-untyped-def]
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return fn(*args)
        finally:
            seen = planted[fn.__name__]
            seen[0] += time.perf_counter() - wall
            seen[1] += time.thread_time() - cpu

    return run


STATE = os.urandom(24 << 20)


@measured
def save_checkpoint(directory: str, step: int) -> None:
    digest = hashlib.sha256(STATE).hexdigest()
    with open(os.path.join(directory, "checkpoint.pt"), "wb") as f:
        f.write(STATE)
        f.write(digest.encode())
        f.flush()
        os.fsync(f.fileno())


@measured
def tokenize_batch(step: int) -> int:
    end = time.thread_time() + 0.014
    n = step
    while time.thread_time() < end:
        for word in ("the", "quick", "brown", "fox"):
            n = (n * 31 + len(word)) % 1_000_003
    return n


def main() -> int:
    mode, lib, steps, directory = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    if mode == "sync_per_layer":
        os.environ["FAKECUDA_KERNEL_US"] = "100"  # read by the stand-in driver at its first call
    rt = ctypes.CDLL(lib)
    rt.cudaLaunchKernel.argtypes = [ctypes.c_void_p, Dim3, Dim3, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    rt.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
    kernel = ctypes.cast(_libc.abs, ctypes.c_void_p)
    _libc.prctl(15, b"train", 0, 0, 0)  # PR_SET_NAME
    batch = ctypes.create_string_buffer(8 << 20)  # pageable: not allocated or registered with CUDA
    device = ctypes.c_void_p()
    if mode == "pageable" and rt.cudaMalloc(ctypes.byref(device), ctypes.c_size_t(len(batch))):
        raise SystemExit("cudaMalloc failed")
    rt.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    syncs = copies = 0
    for step in range(steps):
        if mode in ("tokenize", "both"):
            tokenize_batch(step)
        if mode in ("checkpoint", "both") and step % 5 == 4:
            save_checkpoint(directory, step)
        if mode == "pageable":
            if rt.cudaMemcpy(device, batch, len(batch), 1):  # cudaMemcpyHostToDevice
                raise SystemExit("cudaMemcpy failed")
            copies += 1
        for _ in range(20):
            rc = rt.cudaLaunchKernel(kernel, Dim3(1, 1, 1), Dim3(32, 1, 1), None, 0, None)
            if not rc and mode == "sync_per_layer":
                rc = rt.cudaStreamSynchronize(None)
                syncs += 1
            if rc:
                raise SystemExit(f"CUDA call failed: {rc}")
        if mode != "sync_per_layer":
            if rt.cudaStreamSynchronize(None):
                raise SystemExit("cudaStreamSynchronize failed")
            syncs += 1
    print(
        json.dumps(
            {
                "steps": steps,
                "syncs": syncs,
                "copies": copies,
                "copy_bytes": copies * len(batch),
                "planted": {k: {"wall_s": w, "cpu_s": c} for k, (w, c) in planted.items()},
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
