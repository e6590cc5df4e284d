"""A training loop with one planted host-side cause of GPU idle time, for the sched
receiver's tests: its thread named ``train`` launches work through the CUDA stand-in
runtime (ctypes) and synchronizes each step.

- ``starved``: each step's batch comes from a queue fed by a slow producer thread
  (``loader``, 20 ms per batch): the training thread waits on a futex;
- ``contended``: each step prepares its batch on the CPU (a few ms of Python); run it
  pinned to one core beside CPU hogs on that core (``taskset``) and it waits for a CPU;
- ``checkpoint``: every 5th step the training thread writes a 16 MiB checkpoint and fsyncs it
  (``torch.save`` to local disk, synchronously) into DIR;
- ``fsyncs``: every step the training thread appends 64 KiB to a log in DIR and fsyncs it 8
  times (each fsync ~0.2-0.5 ms off the CPU: under the sched receiver's 1 ms span threshold,
  summed per window in the kernel); it writes what it planted to DIR/fsyncs.json: its gaps'
  wall time less their CPU time (``time.thread_time``), and the fsyncs' alone;
- ``healthy``: batches are ready at once, and the loop does nothing else.

Usage: sched_job.py MODE LIBCUDART STEPS [DIR]  (DIR: checkpoint and fsyncs)
"""

from __future__ import annotations

import ctypes
import json
import os
import queue
import sys
import threading
import time

_libc = ctypes.CDLL("libc.so.6")


class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


def name_thread(name: str) -> None:
    _libc.prctl(15, name.encode(), 0, 0, 0)  # PR_SET_NAME: what the kernel calls the thread


def main() -> int:
    mode, lib, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rt = ctypes.CDLL(lib)
    rt.cudaLaunchKernel.argtypes = [ctypes.c_void_p, Dim3, Dim3, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    rt.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
    kernel = ctypes.cast(_libc.abs, ctypes.c_void_p)
    batches: queue.Queue[int] = queue.Queue(maxsize=2)

    def loader() -> None:
        name_thread("loader")
        for i in range(steps):
            time.sleep(0.02)  # reading and decoding a batch, slowly
            batches.put(i)

    def prepare() -> int:
        end = time.thread_time() + 0.004  # 4 ms of this thread's CPU time
        n = 0
        while time.thread_time() < end:
            n += 1
        return n

    state = os.urandom(16 << 20)

    def checkpoint(step: int) -> None:
        with open(os.path.join(sys.argv[4], "checkpoint.pt"), "wb") as f:
            f.write(state)
            f.flush()
            os.fsync(f.fileno())

    planted: dict = {"gap_wall_s": 0.0, "gap_cpu_s": 0.0, "fsync_wall_s": 0.0, "fsync_cpu_s": 0.0, "fsyncs": 0}
    each: list[float] = []
    chunk = os.urandom(64 << 10)

    def fsyncs(log) -> None:
        for _ in range(8):
            w, c = time.perf_counter(), time.thread_time()
            log.write(chunk)
            log.flush()
            os.fsync(log.fileno())
            each.append(time.perf_counter() - w)
            planted["fsync_wall_s"] += each[-1]
            planted["fsync_cpu_s"] += time.thread_time() - c
            planted["fsyncs"] += 1

    def train() -> None:
        if mode == "starved":
            # A wait before the thread names itself (a loader's first batch, the GIL): its later
            # waits share that one's kernel stack and must still count under the new name.
            first: queue.Queue[int] = queue.Queue()
            threading.Timer(0.02, first.put, (0,)).start()
            first.get()
        name_thread("train")
        log = open(os.path.join(sys.argv[4], "train.log"), "ab") if mode == "fsyncs" else None  # noqa: SIM115
        for step in range(steps):
            w, c = time.perf_counter(), time.thread_time()  # a gap: from the synchronize's return
            if mode == "starved":
                batches.get()
            elif mode == "contended":
                prepare()
            elif mode == "checkpoint" and step % 5 == 4:
                checkpoint(step)
            elif log is not None:
                fsyncs(log)
            if step:  # the first step's "gap" follows no synchronize
                planted["gap_wall_s"] += time.perf_counter() - w
                planted["gap_cpu_s"] += time.thread_time() - c
            rc = rt.cudaLaunchKernel(kernel, Dim3(1, 1, 1), Dim3(32, 1, 1), None, 0, None)
            rc = rc or rt.cudaStreamSynchronize(None)
            if rc:
                raise SystemExit(f"CUDA call failed: {rc}")
        if log is not None:
            log.close()
            planted["fsync_median_s"] = sorted(each)[len(each) // 2]
            with open(os.path.join(sys.argv[4], "fsyncs.json"), "w") as f:
                json.dump(planted, f)

    if mode == "starved":
        threading.Thread(target=loader, daemon=True).start()
    t = threading.Thread(target=train)
    t.start()
    t.join()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
