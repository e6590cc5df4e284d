"""The CPython layout table against the installed interpreters: every offset compiled with
``offsetof`` from that version's own headers, and 3.13's _Py_DebugOffsets read from a live
process. Versions not installed here are skipped."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from otelbpf.families.profiling import python_offsets as po

PYENV = Path.home() / ".pyenv" / "versions"

PROBE = textwrap.dedent("""
    #define Py_BUILD_CORE 1
    #include <Python.h>
    #include <stddef.h>
    #include <stdio.h>
    #include "internal/pycore_runtime.h"
    #include "internal/pycore_interp.h"
    #if PY_VERSION_HEX < 0x030b0000
    #include "frameobject.h"
    #else
    #include "internal/pycore_frame.h"
    #endif
    #define P(name, expr) printf("%s %zu\\n", name, (size_t)(expr))
    int main(void) {
      P("runtime_interp_head", offsetof(_PyRuntimeState, interpreters.head));
    #if PY_VERSION_HEX >= 0x030b0000
      P("interp_threads_head", offsetof(PyInterpreterState, threads.head));
    #else
      P("interp_threads_head", offsetof(PyInterpreterState, tstate_head));
    #endif
      P("tstate_next", offsetof(PyThreadState, next));
      P("tstate_thread_id", offsetof(PyThreadState, thread_id));
    #if PY_VERSION_HEX >= 0x030d0000
      P("tstate_frame", offsetof(PyThreadState, current_frame));
      P("frame_code", offsetof(_PyInterpreterFrame, f_executable));
      P("frame_instr", offsetof(_PyInterpreterFrame, instr_ptr));
    #elif PY_VERSION_HEX >= 0x030b0000
      P("tstate_frame", offsetof(PyThreadState, cframe));
      P("cframe_current", offsetof(_PyCFrame, current_frame));
      P("frame_code", offsetof(_PyInterpreterFrame, f_code));
      P("frame_instr", offsetof(_PyInterpreterFrame, prev_instr));
    #else
      P("tstate_frame", offsetof(PyThreadState, frame));
      P("frame_previous", offsetof(PyFrameObject, f_back));
      P("frame_code", offsetof(PyFrameObject, f_code));
      P("frame_instr", offsetof(PyFrameObject, f_lasti));
    #endif
    #if PY_VERSION_HEX >= 0x030b0000
      P("frame_previous", offsetof(_PyInterpreterFrame, previous));
      P("frame_owner", offsetof(_PyInterpreterFrame, owner));
      P("code_name", offsetof(PyCodeObject, co_qualname));
      P("code_adaptive", offsetof(PyCodeObject, co_code_adaptive));
    #else
      P("code_name", offsetof(PyCodeObject, co_name));
    #endif
    #if PY_VERSION_HEX >= 0x030b0000 && PY_VERSION_HEX < 0x030c0000
      P("frame_is_entry", offsetof(_PyInterpreterFrame, is_entry));
    #endif
    #if PY_VERSION_HEX >= 0x030c0000
      P("FRAME_OWNED_BY_CSTACK", FRAME_OWNED_BY_CSTACK);
      P("code_version", offsetof(PyCodeObject, co_version));
    #endif
      P("code_filename", offsetof(PyCodeObject, co_filename));
      P("code_firstlineno", offsetof(PyCodeObject, co_firstlineno));
      P("code_linetable", offsetof(PyCodeObject, co_linetable));
      P("unicode_state", offsetof(PyASCIIObject, state));
      P("unicode_length", offsetof(PyASCIIObject, length));
      P("unicode_ascii_data", sizeof(PyASCIIObject));
      P("unicode_compact_data", sizeof(PyCompactUnicodeObject));
      P("bytes_size", offsetof(PyVarObject, ob_size));
      P("bytes_data", offsetof(PyBytesObject, ob_sval));
      P("object_type", offsetof(PyObject, ob_type));
      return 0;
    }
""")


def installed(version: str) -> Path | None:
    found = sorted(PYENV.glob(f"{version}.*"))
    return found[-1] if found else None


def compiled_offsets(prefix: Path, version: str, tmp: Path) -> dict[str, int]:
    include = prefix / "include" / f"python{version}"
    src = tmp / "probe.c"
    src.write_text(PROBE)
    exe = tmp / "probe"
    subprocess.run(["gcc", "-w", f"-I{include}", f"-I{include / 'internal'}", str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return {name: int(value) for name, value in (line.split() for line in out.splitlines())}


def expected(version: tuple[int, int], tmp: Path, prefix: Path) -> tuple[po.Offsets, int]:
    if version in po.TABLE:
        layout, offsets = po.TABLE[version]
        return offsets, layout
    proc = subprocess.Popen(
        [str(prefix / "bin" / f"python{version[0]}.{version[1]}"), "-c", "import time; time.sleep(30)"]
    )
    try:
        import time

        time.sleep(0.3)
        found = po.inspect(proc.pid)
        assert found is not None
        return found.offsets, found.layout
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("version", ["3.10", "3.11", "3.12", "3.13"])
def test_offsets_match_the_headers(tmp_path, version):
    prefix = installed(version)
    if prefix is None:
        pytest.skip(f"CPython {version} is not installed here")
    major, minor = (int(x) for x in version.split("."))
    offsets, layout = expected((major, minor), tmp_path, prefix)
    compiled = compiled_offsets(prefix, version, tmp_path)
    for name, value in compiled.items():
        if name == "FRAME_OWNED_BY_CSTACK":
            assert value == po.FRAME_OWNED_BY_CSTACK
            continue
        assert getattr(offsets, name) == value, f"{version} {name}: table {getattr(offsets, name)}, headers {value}"
    assert (
        layout
        == {(3, 10): po.LAYOUT_310, (3, 11): po.LAYOUT_311, (3, 12): po.LAYOUT_312, (3, 13): po.LAYOUT_313}[
            (major, minor)
        ]
    )


@pytest.mark.parametrize("version", sorted(po.TABLE))
def test_the_code_tag_range_covers_its_fields_and_fits_the_walkers_buffer(version):
    """The walker reads [code_tag_start, +code_tag_size) of every frame's code object into a
    256-byte buffer and takes the tag's fields (and 3.13's type) from there."""
    offsets = po.TABLE[version][1]
    start, end = offsets.code_tag_start, offsets.code_tag_start + offsets.code_tag_size
    fields = [
        offsets.object_type,
        offsets.code_firstlineno,
        offsets.code_filename,
        offsets.code_name,
        offsets.code_linetable,
    ]
    if version >= (3, 12):
        fields.append(offsets.code_version)
    else:
        assert offsets.code_version == po.NO_FIELD
    assert all(start <= f and f + 8 <= end for f in fields)
    assert offsets.code_tag_size <= 255


def test_inspect_finds_this_interpreter():
    import os

    found = po.inspect(os.getpid())
    assert found is not None
    assert found.version == sys.version_info[:2]
    assert found.interpreter.endswith(("libpython3.11.so.1.0", f"python{sys.version_info[0]}.{sys.version_info[1]}"))


def test_a_process_without_python_is_none():
    proc = subprocess.Popen(["sleep", "5"])
    try:
        import time

        time.sleep(0.2)
        assert po.inspect(proc.pid) is None
    finally:
        proc.kill()
        proc.wait()


def test_debug_offsets_refuse_a_free_threaded_build_and_a_bad_cookie():
    import struct

    words = [0] * 72
    words[0], words[1] = 0x030D00F0, 1
    with pytest.raises(po.PythonLayoutError, match="free-threaded"):
        po.offsets_from_debug(b"xdebugpy" + struct.pack("<72Q", *words))
    with pytest.raises(po.PythonLayoutError, match="cookie"):
        po.offsets_from_debug(b"nothing!" + bytes(576))
