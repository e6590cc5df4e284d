"""Merging native and Python frames (stacks.merge), on hand-made stacks."""

from __future__ import annotations

from otelbpf.correlate.stacks import TRUNCATED, Frame, PythonFrame, merge

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
