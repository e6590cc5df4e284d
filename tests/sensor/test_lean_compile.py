"""BCC modules built without the table reader/writer JIT (sensor/lean_compile.py), on the real
libbcc: the program compiles, loads and uses its maps as before, and LLVM's engine is gone."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from otelbpf.sensor import lean_compile, program

pytestmark = pytest.mark.bpf

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """
BPF_HASH(counts, u32, u64, 64);
BPF_TASK_STORAGE(marks, u64);  /* needs the BTF that -g produces: still there */

TRACEPOINT_PROBE(sched, sched_process_exec)
{
    u32 pid = bpf_get_current_pid_tgid() >> 32;
    u64 *m = marks.task_storage_get((struct task_struct *)bpf_get_current_task_btf(), 0,
                                    BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (m)
        *m = pid;
    counts.increment(pid);
    return 0;
}

int on_call(struct pt_regs *ctx) { return 0; }
"""


def test_a_lean_module_loads_and_serves_its_maps_without_the_jit():
    import bcc

    lean = lean_compile.compiler()
    assert lean is not None, "Debian's libbcc 0.26 exports the constructor and load_string"
    before = lean.modules
    original = bcc.lib.bpf_module_create_c_from_string
    bpf = program.load(PROGRAM, [], [])
    try:
        assert lean.modules == before + 1  # built by the lean path, not BCC's C entry point
        assert bcc.lib.bpf_module_create_c_from_string is original  # the swap ends with the load
        counts = bpf["counts"]
        counts[counts.Key(7)] = counts.Leaf(41)
        assert [(k.value, v.value) for k, v in counts.items()] == [(7, 41)]
        assert bpf.load_func(b"on_call", bcc.BPF.KPROBE).fd > 0
    finally:
        bpf.cleanup()


SPRINTF = """
import sys
from otelbpf.sensor import lean_compile, program
if sys.argv[1] == "bcc":
    lean_compile.compiler = lambda: None
bpf = program.load(sys.argv[2], [], [])
counts = bpf["counts"]
print(counts.key_sprintf(counts.Key(7)).decode(), flush=True)
"""


def test_the_jit_and_the_llvm_state_it_kept_are_gone(tmp_path):
    """What the JIT was for, printing a key as text, works on BCC's path and not on the lean
    one: there BCC calls the missing printer (an empty std::function) and the process aborts.
    otelbpf never calls these (test_no_code_prints_map_keys_through_bcc)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = [sys.executable, "-c", SPRINTF]
    own = subprocess.run([*run, "bcc", PROGRAM], capture_output=True, text=True, env=env, timeout=120)
    assert own.returncode == 0 and own.stdout.strip() == "0x7", own.stderr[-2000:]
    lean = subprocess.run([*run, "lean", PROGRAM], capture_output=True, text=True, env=env, timeout=120)
    assert lean.returncode == -signal.SIGABRT, (lean.returncode, lean.stdout, lean.stderr[-2000:])


def test_a_program_that_does_not_compile_fails_as_before_and_restores_bcc():
    import bcc

    original = bcc.lib.bpf_module_create_c_from_string
    with pytest.raises(Exception, match="Failed to compile"):
        program.load("int broken(void *ctx) { return undefined_name; }", [], [])
    assert bcc.lib.bpf_module_create_c_from_string is original


@pytest.mark.parametrize("missing", [lean_compile._CTOR, lean_compile._LOAD_STRING])
def test_a_libbcc_without_the_entry_points_is_refused(missing):
    import bcc

    class Partial:
        def __getattr__(self, name: str) -> object:
            if name == missing:
                raise AttributeError(name)
            return getattr(bcc.lib, name)

    with pytest.raises(AttributeError, match=missing):
        lean_compile.LeanCompiler(Partial(), ctypes.CDLL("libstdc++.so.6"))


def test_without_a_lean_compiler_bcc_compiles_its_own_way(monkeypatch):
    import bcc

    monkeypatch.setattr(lean_compile, "compiler", lambda: None)
    original = bcc.lib.bpf_module_create_c_from_string
    with lean_compile.lean_modules():
        assert bcc.lib.bpf_module_create_c_from_string is original
