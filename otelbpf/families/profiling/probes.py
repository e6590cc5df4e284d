"""The profiling probe family: ``bpf/profile.c`` with its map sizes, and the hooks that
attach the cpu-clock perf event once the program is loaded.

It probes no library of its own: CPU samples come from a perf event on every CPU, and CUDA
allocations from the cuda family's malloc/free return probes, which call into profile.c
when this family is loaded with ``cuda_memory`` (``-DCUDA_MEMORY_PROFILE``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from otelbpf.sensor import btf
from otelbpf.sensor.family import ProbeFamily

log = logging.getLogger(__name__)


def fsbase_offset() -> int:
    """``task_struct.thread.fsbase`` in the running kernel; 0 (no Python stacks) without BTF."""
    try:
        return btf.task_fsbase_offset()
    except btf.BtfError as exc:
        log.warning("Python stacks are off: %s", exc)
        return 0


def profile_family(
    *,
    python: bool,
    cuda_memory: bool,
    max_python_frames: int,
    stack_entries: int,
    sample_entries: int,
    code_entries: int,
    live_entries: int,
    on_load: Callable[[object], None],
    on_unload: Callable[[object], None],
) -> ProbeFamily:
    fsbase = fsbase_offset() if python else 0
    cflags = [
        f"-DSAMPLE_ENTRIES={sample_entries}",
        f"-DSTACK_ENTRIES={stack_entries}",
        f"-DCODE_ENTRIES={code_entries}",
        f"-DMEM_ENTRIES={stack_entries}",
        f"-DLIVE_ENTRIES={live_entries}",
        f"-DPY_MAX_FRAMES={max_python_frames}",
        f"-DTASK_FSBASE_OFFSET={fsbase}",
    ]
    if cuda_memory:
        cflags.append("-DCUDA_MEMORY_PROFILE=1")
    return ProbeFamily(
        name="profiling",
        c_file="profile.c",
        libraries=(),
        cflags=tuple(cflags),
        on_load=on_load,
        on_unload=on_unload,
    )
