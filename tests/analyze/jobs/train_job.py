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
- ``pageable``: each step's 8 MiB batch copied in with ``cudaMemcpy`` from pageable memory;
- ``loader``: each step's batch taken from a queue that a slower producer thread fills
  (``load_batch``: hashing, which releases the GIL, ~45 ms of CPU a batch): the training
  thread waits on the queue, off the CPU;
- ``gil``: a side thread runs pure Python (``update_stats``) beside the training loop (20
  kernels of 50 us a step, and ``prepare_step``, ~2 ms of Python): the training thread waits
  for the GIL after its CUDA calls return, off the CPU (a wait Python cannot time where it
  begins, inside the call: ``sync_wall_s`` holds the synchronizes' time as Python sees it);
- ``logging``: short steps (20 kernels of 300 us) and after each synchronize ``log_step``
  appends a line to a log and fsyncs it;
- ``churn``: after each synchronize ``churn_buffers`` frees the step's 20 device buffers and
  allocates the next step's (100 ``cudaFree`` and ``cudaMalloc`` of 4 MiB each, with no GPU
  work queued: an allocator that caches nothing), each call timed;
- ``tiny``: 1,000 kernels of 1 us a step (launch-bound: the GPU finishes each kernel before
  the next arrives) and one synchronize;
- ``mix``: two causes at once in other proportions than ``both``: ``tokenize_batch`` with
  ~5 ms of Python a step and ``save_checkpoint`` every 3rd step.

Prints one JSON line: per planted function its wall-clock seconds and its CPU seconds
(``time.thread_time``: on the CPU, user and kernel), the synchronizes, copies, allocations,
frees and launches made, the steps run, and ``gaps``: the training thread's wall-clock and CPU
seconds from each synchronize's return to the next synchronize (what the GPU idle accounting
calls the gaps, as seen from Python: their wall time less their CPU time is the time the
thread was off the CPU in them).

Usage: train_job.py MODE LIBCUDART STEPS DIR
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import queue
import sys
import threading
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


TOKENIZE_S = {"tokenize": 0.014, "both": 0.014, "mix": 0.005}
KERNEL_US = {"sync_per_layer": "100", "logging": "300", "tiny": "1", "gil": "50"}
LAUNCHES = {"tiny": 1000}
BUFFERS = 100


@measured
def tokenize_batch(step: int, seconds: float = 0.014) -> int:
    end = time.thread_time() + seconds
    n = step
    while time.thread_time() < end:
        for word in ("the", "quick", "brown", "fox"):
            n = (n * 31 + len(word)) % 1_000_003
    return n


def load_batch(q: queue.Queue, steps: int) -> None:
    """The producer: decodes (hashes) each batch, ~45 ms of CPU with the GIL released."""
    data = os.urandom(8 << 20)
    for step in range(steps):
        end = time.thread_time() + 0.045
        while time.thread_time() < end:
            hashlib.sha256(data).digest()
        q.put(step)


@measured
def wait_for_batch(q: queue.Queue) -> int:
    return q.get()


def update_stats(stop: threading.Event) -> None:
    """The side thread: pure Python, holding the GIL but at the interpreter's switches."""
    n = 0
    while not stop.is_set():
        for _ in range(1000):
            n = (n * 31 + 7) % 1_000_003


@measured
def prepare_step(step: int) -> int:
    """The training thread's own Python between steps (~2 ms of CPU): the side thread takes
    the GIL from it at the interpreter's switch interval."""
    end = time.thread_time() + 0.002
    n = step
    while time.thread_time() < end:
        n = (n * 17 + 3) % 1_000_003
    return n


@measured
def log_step(log: int, step: int) -> None:
    os.write(log, json.dumps({"step": step, "loss": 1.0 / (step + 1), "lr": 3e-4}).encode() + b"\n")
    os.fsync(log)


def churn_buffers(rt: ctypes.CDLL, buffers: list[ctypes.c_void_p], calls: dict[str, list[float]]) -> None:
    """Frees the step's device buffers and allocates the next step's, each call timed."""
    for b in buffers:
        t = time.perf_counter()
        rc = rt.cudaFree(b)
        calls["cudaFree"].append(time.perf_counter() - t)
        if rc:
            raise SystemExit(f"cudaFree failed: {rc}")
    buffers.clear()
    for _ in range(BUFFERS):
        b = ctypes.c_void_p()
        t = time.perf_counter()
        rc = rt.cudaMalloc(ctypes.byref(b), ctypes.c_size_t(4 << 20))
        calls["cudaMalloc"].append(time.perf_counter() - t)
        if rc:
            raise SystemExit(f"cudaMalloc failed: {rc}")
        buffers.append(b)


def main() -> int:
    mode, lib, steps, directory = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    if mode in KERNEL_US:
        os.environ["FAKECUDA_KERNEL_US"] = KERNEL_US[mode]  # read by the stand-in driver at its first call
    rt = ctypes.CDLL(lib)
    rt.cudaLaunchKernel.argtypes = [ctypes.c_void_p, Dim3, Dim3, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    rt.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
    rt.cudaMalloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    rt.cudaFree.argtypes = [ctypes.c_void_p]
    kernel = ctypes.cast(_libc.abs, ctypes.c_void_p)
    _libc.prctl(15, b"train", 0, 0, 0)  # PR_SET_NAME
    batch = ctypes.create_string_buffer(8 << 20)  # pageable: not allocated or registered with CUDA
    device = ctypes.c_void_p()
    if mode == "pageable" and rt.cudaMalloc(ctypes.byref(device), ctypes.c_size_t(len(batch))):
        raise SystemExit("cudaMalloc failed")
    rt.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    batches: queue.Queue = queue.Queue(maxsize=2)
    stop = threading.Event()
    side = None
    if mode == "loader":
        side = threading.Thread(target=load_batch, args=(batches, steps), name="loader", daemon=True)
    elif mode == "gil":
        side = threading.Thread(target=update_stats, args=(stop,), name="stats", daemon=True)
    if side is not None:
        side.start()
    log = os.open(os.path.join(directory, "train.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    calls: dict[str, list[float]] = defaultdict(list)
    buffers: list[ctypes.c_void_p] = []
    gaps = [0.0, 0.0]
    launches = LAUNCHES.get(mode, 20)
    syncs = copies = launched = 0
    sync_wall = 0.0  # in the synchronizes after the first, as Python sees them (with the GIL taken back)
    mark: tuple[float, float] | None = None  # (wall, cpu) at the last synchronize's return
    for step in range(steps):
        if mode == "loader":
            wait_for_batch(batches)
        if mode == "gil":
            prepare_step(step)
        if mode in TOKENIZE_S:
            tokenize_batch(step, TOKENIZE_S[mode])
        if mode in ("checkpoint", "both") and step % 5 == 4 or mode == "mix" and step % 3 == 2:
            save_checkpoint(directory, step)
        if mode == "logging" and step:
            log_step(log, step)
        if mode == "churn":
            churn_buffers(rt, buffers, calls)
        if mode == "pageable":
            if rt.cudaMemcpy(device, batch, len(batch), 1):  # cudaMemcpyHostToDevice
                raise SystemExit("cudaMemcpy failed")
            copies += 1
        grid, block = Dim3(1, 1, 1), Dim3(32, 1, 1)
        for _ in range(launches):
            rc = rt.cudaLaunchKernel(kernel, grid, block, None, 0, None)
            launched += not rc
            if not rc and mode == "sync_per_layer":
                rc = rt.cudaStreamSynchronize(None)
                syncs += 1
            if rc:
                raise SystemExit(f"CUDA call failed: {rc}")
        if mode != "sync_per_layer":
            if mark is not None:
                gaps[0] += time.perf_counter() - mark[0]
                gaps[1] += time.thread_time() - mark[1]
            t = time.perf_counter()
            if rt.cudaStreamSynchronize(None):
                raise SystemExit("cudaStreamSynchronize failed")
            if mark is not None:
                sync_wall += time.perf_counter() - t
            mark = (time.perf_counter(), time.thread_time())
            syncs += 1
    stop.set()
    print(
        json.dumps(
            {
                "steps": steps,
                "syncs": syncs,
                "copies": copies,
                "copy_bytes": copies * len(batch),
                "launches": launched,
                "gaps": {"wall_s": gaps[0], "cpu_s": gaps[1]},
                "sync_wall_s": sync_wall,
                "kernel_us": int(os.environ.get("FAKECUDA_KERNEL_US", "50")),
                "calls": {k: {"count": len(v), "seconds": sum(v)} for k, v in calls.items()},
                "planted": {k: {"wall_s": w, "cpu_s": c} for k, (w, c) in planted.items()},
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
