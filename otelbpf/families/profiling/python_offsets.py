"""Where CPython keeps its threads, frames and code objects, per version, and which
interpreter a process runs: what ``bpf/profile.c`` needs to walk Python stacks.

CPython 3.13 describes its own layout in ``_Py_DebugOffsets``, the first member of
``_PyRuntime``, for out-of-process tools: it is read from the process's memory. 3.10-3.12
have no such thing, so their offsets are in ``TABLE`` below, each taken from that
version's headers (``Include/cpython/pystate.h`` ``PyThreadState``,
``Include/internal/pycore_interp.h`` ``PyInterpreterState``,
``Include/internal/pycore_runtime.h`` ``_PyRuntimeState``, ``Include/cpython/code.h``
``PyCodeObject``, ``Include/cpython/frameobject.h`` / ``Include/internal/pycore_frame.h``
for frames, ``Include/cpython/unicodeobject.h`` and ``bytesobject.h``) for x86-64 release
builds; ``tests/families/profiling/test_python_offsets.py`` checks every one against ``offsetof`` compiled
with the installed interpreters' headers. Debug and free-threaded builds differ and are not
supported (a free-threaded 3.13 says so in its debug offsets and is refused).

The thread a sample interrupts is matched to its ``PyThreadState`` in the kernel by
``thread_id`` (``pthread_self()``, which glibc and musl make the thread's TLS base), read
from ``task_struct.thread.fsbase``: no thread-local lookup, works in any pid namespace.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass, fields

from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from otelbpf.base.procfs import Mapping, read_maps

NO_FIELD = 0xFFFF

# Frame layouts, as in bpf/profile.c (LAYOUT_*): also the prog-array index of each walker.
LAYOUT_310, LAYOUT_311, LAYOUT_312, LAYOUT_313 = 1, 2, 3, 4
LAYOUT_NAMES = {LAYOUT_310: "310", LAYOUT_311: "311", LAYOUT_312: "312", LAYOUT_313: "313"}
FRAME_OWNED_BY_CSTACK = 3  # pycore_frame.h, 3.12 and 3.13


@dataclass(frozen=True)
class Offsets:
    """Byte offsets, mirrored by ``struct py_offsets`` in bpf/profile.c."""

    runtime_interp_head: int  # _PyRuntimeState.interpreters.head
    interp_threads_head: int  # PyInterpreterState.threads.head (3.10: tstate_head)
    tstate_next: int
    tstate_thread_id: int
    tstate_frame: int  # 3.10 frame, 3.11/3.12 cframe, 3.13 current_frame
    cframe_current: int  # _PyCFrame.current_frame (3.11/3.12)
    frame_previous: int  # 3.10 PyFrameObject.f_back, else _PyInterpreterFrame.previous
    frame_code: int  # f_code (3.13: f_executable)
    frame_instr: int  # 3.10 f_lasti (int), 3.11/3.12 prev_instr, 3.13 instr_ptr
    frame_owner: int  # u8 owner (3.11+)
    frame_is_entry: int  # u8 is_entry (3.11)
    code_filename: int
    code_name: int  # co_qualname (3.11+), co_name (3.10)
    code_firstlineno: int
    code_linetable: int
    code_adaptive: int  # co_code_adaptive (3.11+)
    code_version: int  # co_version (3.12+: every code object made gets the next number)
    unicode_state: int
    unicode_length: int
    unicode_ascii_data: int  # sizeof(PyASCIIObject)
    unicode_compact_data: int  # sizeof(PyCompactUnicodeObject)
    bytes_size: int
    bytes_data: int
    object_type: int

    @property
    def frame_size(self) -> int:
        """Bytes read per frame: up to the end of its last field used."""
        return max(
            self.frame_previous + 8,
            self.frame_code + 8,
            self.frame_instr + 8,
            *(o + 1 for o in (self.frame_owner, self.frame_is_entry) if o != NO_FIELD),
        )

    @property
    def code_size(self) -> int:
        return max(self.code_filename, self.code_name, self.code_linetable) + 8

    @property
    def code_tag_start(self) -> int:
        """The walker reads each frame's code object from here to ``code_tag_start +
        code_tag_size``: the fields its tag is made of (first line, file, name, line table:
        fixed for the code object's life; 3.12+ ``co_version``), and its type (3.13's
        ``f_executable`` may be other than code)."""
        return min(self._tag_fields)

    @property
    def code_tag_size(self) -> int:
        return max(self._tag_fields) + 8 - self.code_tag_start

    @property
    def _tag_fields(self) -> tuple[int, ...]:
        fields = (self.object_type, self.code_firstlineno, self.code_filename, self.code_name, self.code_linetable)
        return fields if self.code_version == NO_FIELD else (*fields, self.code_version)


_COMMON_STR = dict(unicode_state=32, unicode_length=16, bytes_size=16, bytes_data=32, object_type=8)

#: (major, minor) -> (layout, offsets). Sources in the module docstring.
TABLE: dict[tuple[int, int], tuple[int, Offsets]] = {
    (3, 10): (
        LAYOUT_310,
        Offsets(
            runtime_interp_head=32,
            interp_threads_head=8,
            tstate_next=8,
            tstate_thread_id=176,
            tstate_frame=24,
            cframe_current=NO_FIELD,
            frame_previous=24,
            frame_code=32,
            frame_instr=96,
            frame_owner=NO_FIELD,
            frame_is_entry=NO_FIELD,
            code_filename=104,
            code_name=112,
            code_firstlineno=40,
            code_linetable=120,
            code_adaptive=0,
            code_version=NO_FIELD,
            unicode_ascii_data=48,
            unicode_compact_data=72,
            **_COMMON_STR,
        ),
    ),
    (3, 11): (
        LAYOUT_311,
        Offsets(
            runtime_interp_head=40,
            interp_threads_head=16,
            tstate_next=8,
            tstate_thread_id=152,
            tstate_frame=56,
            cframe_current=8,
            frame_previous=48,
            frame_code=32,
            frame_instr=56,
            frame_owner=69,
            frame_is_entry=68,
            code_filename=112,
            code_name=128,
            code_firstlineno=72,
            code_linetable=136,
            code_adaptive=184,
            code_version=NO_FIELD,
            unicode_ascii_data=48,
            unicode_compact_data=72,
            **_COMMON_STR,
        ),
    ),
    (3, 12): (
        LAYOUT_312,
        Offsets(
            runtime_interp_head=40,
            interp_threads_head=72,
            tstate_next=8,
            tstate_thread_id=136,
            tstate_frame=56,
            cframe_current=0,
            frame_previous=8,
            frame_code=0,
            frame_instr=56,
            frame_owner=70,
            frame_is_entry=NO_FIELD,
            code_filename=112,
            code_name=128,
            code_firstlineno=68,
            code_linetable=136,
            code_adaptive=192,
            code_version=92,
            unicode_ascii_data=40,
            unicode_compact_data=56,
            **_COMMON_STR,
        ),
    ),
}

SUPPORTED = ((3, 10), (3, 11), (3, 12), (3, 13))
_DEBUG_COOKIE = b"xdebugpy"
_DEBUG_WORDS = 72  # uint64s after the cookie in 3.13's _Py_DebugOffsets
#: PyCodeObject.co_version in 3.13 (Include/cpython/code.h): not in _Py_DebugOffsets.
CODE_VERSION_313 = 92


class PythonLayoutError(Exception):
    """The interpreter is a Python this walker cannot read; the message says which and why."""


def offsets_from_debug(raw: bytes) -> tuple[int, Offsets]:
    """3.13's ``_Py_DebugOffsets`` (the bytes at ``&_PyRuntime``) -> (PY_VERSION_HEX, offsets).

    Layout of the struct as 3.13 defines it (Include/internal/pycore_runtime.h): a cookie,
    the version, the free-threaded flag, then groups of uint64 offsets, each group starting
    with the size of the struct it describes.
    """
    if raw[:8] != _DEBUG_COOKIE:
        raise PythonLayoutError("_PyRuntime does not start with _Py_DebugOffsets (cookie mismatch)")
    words = struct.unpack_from(f"<{_DEBUG_WORDS}Q", raw, 8)
    version, free_threaded = words[0], words[1]
    if free_threaded:
        raise PythonLayoutError("free-threaded CPython builds are not supported")
    runtime, interp, tstate = words[2:5], words[5:18], words[18:27]
    frame, code, pyobject = words[27:33], words[33:43], words[43:45]
    bytes_object, unicode = words[63:66], words[66:70]
    ascii_size = unicode[3]
    return version, Offsets(
        runtime_interp_head=runtime[2],
        interp_threads_head=interp[3],
        tstate_next=tstate[2],
        tstate_thread_id=tstate[5],
        tstate_frame=tstate[4],
        cframe_current=NO_FIELD,
        frame_previous=frame[1],
        frame_code=frame[2],
        frame_instr=frame[3],
        frame_owner=frame[5],
        frame_is_entry=NO_FIELD,
        code_filename=code[1],
        code_name=code[3],
        code_firstlineno=code[5],
        code_linetable=code[4],
        code_adaptive=code[9],
        code_version=CODE_VERSION_313,
        unicode_state=unicode[1],
        unicode_length=unicode[2],
        unicode_ascii_data=ascii_size,
        unicode_compact_data=ascii_size + 16,  # + utf8_length, utf8
        bytes_size=bytes_object[1],
        bytes_data=bytes_object[2],
        object_type=pyobject[1],
    )


DEBUG_OFFSETS_SIZE = 8 + _DEBUG_WORDS * 8


@dataclass(frozen=True)
class PythonProcess:
    """A process running CPython, as the kernel's walker needs it."""

    pid: int
    version: tuple[int, int]
    layout: int
    runtime: int  # &_PyRuntime in the process
    code_type: int  # &PyCode_Type (checked by the 3.13 walker), else 0
    offsets: Offsets
    interpreter: str  # the file holding _PyRuntime (python3.X or libpython3.X.so)
    frame_pointers: bool  # its eval loop keeps %rbp as frame pointer (native stacks walk through it)


_INTERPRETER = re.compile(r"^(?:lib)?python(\d)\.(\d+)")
EVAL_FUNCTION = "_PyEval_EvalFrameDefault"
_ENDBR64 = bytes.fromhex("f30f1efa")
_PUSH_RBP_MOV_RSP_RBP = bytes.fromhex("554889e5")


_Facts = tuple[dict[str, int], list[tuple[int, int, int]], int | None, bool]
_FACTS: dict[tuple[int, int, int], _Facts] = {}  # (dev, inode, mtime) -> facts: one parse per file


def _elf_facts(path: str, dev: int, ino: int, mtime: int) -> _Facts:
    """(symbol -> vaddr, PT_LOAD (p_offset, p_vaddr, p_filesz), Py_Version value, whether
    _PyEval_EvalFrameDefault starts with a frame-pointer prologue) of an ELF file, cached by
    inode (every process reaches it by its own /proc/PID/map_files path)."""
    key = (dev, ino, mtime)
    if key not in _FACTS:
        if len(_FACTS) >= 64:
            _FACTS.pop(next(iter(_FACTS)))
        _FACTS[key] = _read_elf_facts(path)
    return _FACTS[key]


def _read_elf_facts(path: str) -> _Facts:
    wanted = {"_PyRuntime", "PyCode_Type", "Py_Version", EVAL_FUNCTION}
    syms: dict[str, int] = {}
    with open(path, "rb") as f:
        elf = ELFFile(f)
        loads = [(s["p_offset"], s["p_vaddr"], s["p_filesz"]) for s in elf.iter_segments() if s["p_type"] == "PT_LOAD"]
        for name in (".dynsym", ".symtab"):  # all are exported: .symtab (large) only if .dynsym lacks them
            sec = elf.get_section_by_name(name)
            if isinstance(sec, SymbolTableSection) and not wanted <= syms.keys():
                for sym in sec.iter_symbols():
                    if sym.name in wanted and sym["st_value"]:
                        syms.setdefault(sym.name, sym["st_value"])

        def read(vaddr: int, size: int) -> bytes:
            for off, base, filesz in loads:
                if base <= vaddr < base + filesz:
                    f.seek(off + vaddr - base)
                    return f.read(size)
            return b""

        version = struct.unpack("<I", read(syms["Py_Version"], 4))[0] if "Py_Version" in syms else None
        prologue = read(syms[EVAL_FUNCTION], 8) if EVAL_FUNCTION in syms else b""
    return syms, loads, version, prologue.removeprefix(_ENDBR64).startswith(_PUSH_RBP_MOV_RSP_RBP)


def _load_bias(maps: list[Mapping], path: str, loads: list[tuple[int, int, int]]) -> int | None:
    """Where the file's vaddr 0 is in the process."""
    mine = sorted((m for m in maps if m.path.removesuffix(" (deleted)") == path), key=lambda m: m.offset)
    for m in mine:
        for off, vaddr, size in loads:
            if off <= m.offset < off + max(size, 1):
                return m.start - m.offset + off - vaddr
    return None


def _read_memory(pid: int, addr: int, size: int) -> bytes:
    with open(f"/proc/{pid}/mem", "rb") as mem:
        mem.seek(addr)
        return mem.read(size)


def inspect(pid: int) -> PythonProcess | None:
    """The CPython in ``pid``, or None when it runs none (or is gone).

    Raises PythonLayoutError for a Python whose frames cannot be walked (a version outside
    3.10-3.13, a free-threaded build), naming it.
    """
    maps = read_maps(pid)
    seen: set[str] = set()
    for m in maps:
        path = m.path.removesuffix(" (deleted)")
        base = os.path.basename(path)
        match = _INTERPRETER.match(base)
        if match is None or path in seen:
            continue
        seen.add(path)
        local = f"/proc/{pid}/map_files/{m.start:x}-{m.end:x}"
        try:
            st = os.stat(local)
            syms, loads, version_hex, frame_pointers = _elf_facts(local, st.st_dev, st.st_ino, int(st.st_mtime))
        except (OSError, ValueError) as exc:
            raise PythonLayoutError(f"cannot read {path}: {exc}") from None
        if "_PyRuntime" not in syms:
            continue
        bias = _load_bias(maps, path, loads)
        if bias is None:
            continue
        version = (version_hex >> 24, (version_hex >> 16) & 0xFF) if version_hex else (int(match[1]), int(match[2]))
        if version not in SUPPORTED:
            raise PythonLayoutError(
                f"{path} is Python {version[0]}.{version[1]}: Python stacks are read for 3.10-3.13 only"
            )
        runtime = bias + syms["_PyRuntime"]
        code_type = 0
        if version >= (3, 13):
            version_hex, offsets = offsets_from_debug(_read_memory(pid, runtime, DEBUG_OFFSETS_SIZE))
            layout = LAYOUT_313
            code_type = bias + syms.get("PyCode_Type", 0) if "PyCode_Type" in syms else 0
            if not code_type:
                raise PythonLayoutError(f"{path} exports no PyCode_Type")
        else:
            layout, offsets = TABLE[version]
        return PythonProcess(pid, version, layout, runtime, code_type, offsets, path, frame_pointers)
    return None


def fill_leaf(leaf: object, proc: PythonProcess, state: int) -> None:
    """Write ``proc`` into a ``struct py_proc`` map value (BCC's ctypes Leaf)."""
    leaf.state = state  # type: ignore[attr-defined]
    leaf.runtime = proc.runtime  # type: ignore[attr-defined]
    leaf.code_type = proc.code_type  # type: ignore[attr-defined]
    o = leaf.o  # type: ignore[attr-defined]
    for f in fields(Offsets):
        setattr(o, f.name, getattr(proc.offsets, f.name))
    o.frame_size = proc.offsets.frame_size
    o.code_size = proc.offsets.code_size
    o.code_tag_start = proc.offsets.code_tag_start
    o.code_tag_size = proc.offsets.code_tag_size
    o.layout = proc.layout
    o.owner_cstack = FRAME_OWNED_BY_CSTACK
