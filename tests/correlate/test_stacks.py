"""Merging native and Python frames (stacks.merge), on hand-made stacks."""

from __future__ import annotations

from otelbpf.base.procfs import Mapping
from otelbpf.correlate.stacks import TRUNCATED, Frame, PythonFrame, merge, native
from otelbpf.correlate.symbolizer import NativeFrame

INTERP = "libpython3.11.so.1.0"


def nat(name: str, module: str = "libc.so.6") -> Frame:
    return Frame(name, module=module)


def py(name: str, entry: bool = False) -> PythonFrame:
    return PythonFrame(name, "t.py", 1, 1, entry)


def names(frames: list[Frame]) -> list[str]:
    return [f.function for f in frames]


def test_eval_frames_become_the_python_frames_they_ran_with_frame_pointers():
    native = [
        nat("crunch_inner", "ext.so"),
        nat("crunch", "ext.so"),
        nat("cfunction_call", INTERP),
        nat("_PyEval_EvalFrameDefault", INTERP),
        nat("PyObject_Call", INTERP),
        nat("_PyEval_EvalFrameDefault", INTERP),
        nat("Py_RunMain", INTERP),
        nat("__libc_start_main"),
    ]
    python = [py("forward"), py("train_step", entry=True), py("callback"), py("main", entry=True)]
    out = merge(
        native,
        python,
        interpreter=INTERP,
        interpreter_frame_pointers=True,
        native_truncated=False,
        python_truncated=False,
    )
    assert names(out) == ["crunch_inner", "crunch", "forward", "train_step", "callback", "main", "__libc_start_main"]


def test_without_frame_pointers_the_walk_stops_at_the_interpreter_and_python_goes_on_top():
    native = [
        nat("crunch_inner", "ext.so"),
        nat("crunch", "ext.so"),
        nat("cfunction_call", INTERP),
        nat("garbage", INTERP),
    ]
    python = [py("call_native"), py("main", entry=True)]
    out = merge(
        native,
        python,
        interpreter=INTERP,
        interpreter_frame_pointers=False,
        native_truncated=False,
        python_truncated=False,
    )
    assert names(out) == ["crunch_inner", "crunch", "call_native", "main"]


def test_the_interrupted_interpreter_function_stays_as_the_leaf():
    out = merge(
        [nat("PyLong_FromLong", INTERP), nat("x", INTERP)],
        [py("spin", entry=True)],
        interpreter=INTERP,
        interpreter_frame_pointers=False,
        native_truncated=False,
        python_truncated=True,
    )
    assert names(out) == ["PyLong_FromLong", "spin", "[truncated]"]


def test_a_native_stack_not_read_to_its_root_is_marked():
    out = merge(
        [nat("memcpy"), nat("work", "app")],
        [],
        interpreter=None,
        interpreter_frame_pointers=False,
        native_truncated=False,
        python_truncated=False,
    )
    assert out[-1] == TRUNCATED
    out = merge(
        [nat("work", "app"), nat("start_thread")],
        [],
        interpreter=None,
        interpreter_frame_pointers=False,
        native_truncated=False,
        python_truncated=False,
    )
    assert names(out) == ["work", "start_thread"]


def test_a_return_address_in_no_file_ends_the_native_part():
    native = [
        nat("cudaMalloc", "libcudart.so.12"),
        nat("ffi_call", "libffi.so.8"),
        Frame("[unknown]+0x7ffc", module="[unknown]"),
        nat("bogus", "libc.so.6"),
    ]
    out = merge(
        native,
        [py("alloc"), py("main", entry=True)],
        interpreter=INTERP,
        interpreter_frame_pointers=False,
        native_truncated=False,
        python_truncated=False,
    )
    assert names(out) == ["cudaMalloc", "ffi_call", "[truncated]", "alloc", "main"]


def test_a_native_frame_is_the_same_whatever_address_its_library_was_mapped_at():
    """Two processes, one library at two ASLR bases: one frame (so the interned frames do not
    grow with short-lived processes), whose address and mapping keep pprof's arithmetic
    (address - memory_start + file_offset) at the instruction's offset in the file."""
    made = []
    for base in (0x7F12_3450_0000, 0x7FAB_CDE0_0000):
        m = Mapping(base, base + 0x20_0000, 0x2_8000, "/usr/lib/x86_64-linux-gnu/libc.so.6")
        ip = base + 0x1_2345  # 0x2_8000 + 0x1_2345 into the file
        resolved = NativeFrame("getpid", "libc.so.6", ip - m.start + m.offset, "ab12", m)
        made.append(native(resolved, ip))
    a, b = made
    assert a == b and hash(a) == hash(b)
    assert a.mapping is b.mapping  # one tuple per placed mapping, shared by its frames
    start, limit, file_offset = a.mapping
    assert a.address - start + file_offset == 0x2_8000 + 0x1_2345
    assert start <= a.address < limit and limit - start == 0x20_0000
    assert (a.path, a.build_id, a.function) == ("/usr/lib/x86_64-linux-gnu/libc.so.6", "ab12", "getpid")


def test_a_native_frame_in_no_file_keeps_its_address():
    frame = native(NativeFrame(None, "[unknown]", 0x1234, "", None), 0x1234)
    assert (frame.address, frame.mapping, frame.function) == (0x1234, (0, 0, 0), "[unknown]+0x1234")
