"""One sample's stack as profiles show it: kernel frames, then native frames, with the
interpreter's own frames replaced by the Python frames they were running.

All lists here are leaf first, as the kernel records them.

Merging (``merge``): walking the native stack from the leaf, frames of C extensions and
libraries are kept as they are (below their Python caller). A frame of the interpreter's
eval loop (``_PyEval_EvalFrameDefault``) is replaced by the next group of Python frames,
a group being the frames one eval call ran (it ends at a frame marked as entered from
C); other interpreter frames (call glue) are dropped. An interpreter built without frame
pointers (the usual -O3 build) leaves its callers' native frames unreadable: the walk
stops at the first interpreter frame and every remaining Python frame goes on top.
A stack that could not be read to its root says so with a ``[truncated]`` frame; nothing
is invented.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from otelbpf.correlate.symbolizer import NativeFrame

#: Native functions a thread's stack ends in when it was read to its root.
THREAD_ROOTS = frozenset(
    {
        "_start",
        "__libc_start_main",
        "__libc_start_call_main",
        "start_thread",
        "clone",
        "clone3",
        "__clone",
        "__clone3",
        "thread_start",
    }
)
EVAL_FUNCTION = "_PyEval_EvalFrameDefault"


@dataclass(frozen=True, slots=True)
class Frame:
    """A frame as pprof gets it: a Location with one Line of one Function. Slotted: resolved
    stacks hold tens of thousands on a busy host (~100 bytes each here, ~400 with a dict)."""

    function: str
    kind: str = "native"  # native | kernel | python | marker
    filename: str = ""  # Python source file
    line: int = 0  # 0: unknown
    start_line: int = 0  # the function's first line (Python: co_firstlineno)
    module: str = ""  # mapped file basename; "[kernel.kallsyms]" for the kernel
    path: str = ""  # mapped file path
    build_id: str = ""
    address: int = 0  # runtime address (native and kernel)
    mapping: tuple[int, int, int] = (0, 0, 0)  # (start, end, file offset) of its mapping


TRUNCATED = Frame("[truncated]", kind="marker")


@dataclass(frozen=True, slots=True)
class PythonFrame:
    function: str
    filename: str
    line: int
    start_line: int
    entry: bool  # first frame of one eval call (entered from C)

    def frame(self) -> Frame:
        return Frame(self.function, "python", self.filename, self.line, self.start_line)


def native(frame: NativeFrame, address: int) -> Frame:
    """The frame at ``address`` with its address and mapping the file's, not the process's:
    the address is its offset in the file and the mapping is placed at its own file offset
    (start = offset, limit = offset + size), so pprof's arithmetic (address - memory_start +
    file_offset = the offset in the file) still holds. The same code in two processes is then
    one frame whatever ASLR did with their libraries: the interned frames stay as many as the
    host's distinct code, not its processes (a 2-rank job restarted twice a second added
    ~3,500 frames a minute with runtime addresses). An address in no mapped file is kept."""
    m = frame.mapping
    if m is None:
        return Frame(frame.name, "native", module=frame.module, build_id=frame.build_id, address=address)
    return Frame(
        frame.name,
        "native",
        module=frame.module,
        path=m.path.removesuffix(" (deleted)"),
        build_id=frame.build_id,
        address=address - m.start + m.offset,
        mapping=_file_mapping(m.offset, m.end - m.start),
    )


@functools.lru_cache(maxsize=4096)
def _file_mapping(offset: int, size: int) -> tuple[int, int, int]:
    """One tuple per placed mapping, shared by its frames (its three ints are ~170 bytes)."""
    return (offset, offset + size, offset)


def kernel(name: str | None, address: int) -> Frame:
    return Frame(name or f"[kernel.kallsyms]+{address:#x}", "kernel", module="[kernel.kallsyms]", address=address)


def _groups(python: Sequence[PythonFrame]) -> list[list[Frame]]:
    groups: list[list[Frame]] = [[]]
    for f in python:
        groups[-1].append(f.frame())
        if f.entry:
            groups.append([])
    return [g for g in groups if g]


def _plausible(frames: Sequence[Frame]) -> tuple[list[Frame], bool]:
    """The frames up to the first return address in no mapped file (the frame-pointer
    walk went through code without frame pointers and read stack data as a frame), and
    whether any were cut."""
    for i, f in enumerate(frames):
        if i and f.module == "[unknown]":
            return list(frames[:i]), True
    return list(frames), False


def merge(
    native_frames: Sequence[Frame],
    python: Sequence[PythonFrame],
    *,
    interpreter: str | None,
    interpreter_frame_pointers: bool,
    native_truncated: bool,
    python_truncated: bool,
) -> list[Frame]:
    """The user-space part of a stack (leaf first); see the module docstring.
    ``interpreter`` is the basename of the file holding the interpreter, None for a
    process that runs no Python."""
    native_frames, lost = _plausible(native_frames)
    if not python:
        out = list(native_frames)
        if lost or native_truncated or (out and out[-1].function not in THREAD_ROOTS):
            out.append(TRUNCATED)
        return out
    groups = _groups(python)
    out = []
    for i, f in enumerate(native_frames):
        if f.module != interpreter:
            out.append(f)
            continue
        if not interpreter_frame_pointers:
            if i == 0 and f.function != EVAL_FUNCTION:
                out.append(f)  # the interrupted interpreter function itself is exact
            break
        if f.function == EVAL_FUNCTION and groups:
            out.extend(groups.pop(0))
    if lost:
        out.append(TRUNCATED)  # native frames between here and the Python caller are unknown
    for group in groups:
        out.extend(group)
    if python_truncated:
        out.append(TRUNCATED)
    return out
