"""What a compiled BCC module holds, read through libbcc's C API.

BCC's Python module declares only the entry points it uses itself; these are the ones the
program cache needs besides (the tables by index, their shapes, and loading instructions
that did not come from the module). Declared on a handle of its own so that ``bcc.lib``'s
declarations stay BCC's.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import cache
from typing import Any

BPF_INSN_BYTES = 8


@dataclass(frozen=True)
class TableShape:
    """A map as the kernel sees it: what must be equal for compiled code to use it."""

    name: str
    type: int
    key_size: int
    leaf_size: int
    max_entries: int
    flags: int


@cache
def lib() -> Any:
    """libbcc, with the signatures this module uses."""
    import bcc

    handle = ctypes.CDLL(bcc.lib._name, use_errno=True)
    vp, ull, u, i, s = ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_uint, ctypes.c_int, ctypes.c_char_p
    for name, restype, argtypes in (
        ("bpf_num_functions", ull, [vp]),
        ("bpf_function_name", s, [vp, ull]),
        ("bpf_function_start", vp, [vp, s]),
        ("bpf_function_size", ctypes.c_size_t, [vp, s]),
        ("bpf_num_tables", ull, [vp]),
        ("bpf_table_name", s, [vp, ull]),
        ("bpf_table_fd_id", i, [vp, ull]),
        ("bpf_table_type_id", i, [vp, ull]),
        ("bpf_table_key_size_id", ctypes.c_size_t, [vp, ull]),
        ("bpf_table_leaf_size_id", ctypes.c_size_t, [vp, ull]),
        ("bpf_table_max_entries_id", ull, [vp, ull]),
        ("bpf_table_flags_id", i, [vp, ull]),
        ("bpf_module_license", s, [vp]),
        ("bpf_module_kern_version", u, [vp]),
        # (prog_type, name, insns, bytes, license, kern_version, log_level, log_buf, log_size)
        ("bcc_prog_load", i, [i, s, vp, i, s, u, i, ctypes.c_char_p, u]),
    ):
        fn = getattr(handle, name)
        fn.restype, fn.argtypes = restype, argtypes
    return handle


def function_names(module: int) -> list[str]:
    n = lib().bpf_num_functions(module)
    return [lib().bpf_function_name(module, k).decode() for k in range(n)]


def instructions(module: int, name: str) -> bytes:
    """The compiled instructions of program ``name`` (its maps' fds in place)."""
    raw = name.encode()
    start, size = lib().bpf_function_start(module, raw), lib().bpf_function_size(module, raw)
    if not start:
        raise KeyError(name)
    return ctypes.string_at(start, size)


def tables(module: int) -> dict[int, TableShape]:
    """The module's maps by their fd."""
    L = lib()
    out: dict[int, TableShape] = {}
    for k in range(L.bpf_num_tables(module)):
        shape = TableShape(
            name=L.bpf_table_name(module, k).decode(),
            type=L.bpf_table_type_id(module, k),
            key_size=L.bpf_table_key_size_id(module, k),
            leaf_size=L.bpf_table_leaf_size_id(module, k),
            max_entries=L.bpf_table_max_entries_id(module, k),
            flags=L.bpf_table_flags_id(module, k),
        )
        out[L.bpf_table_fd_id(module, k)] = shape
    return out


def license_of(module: int) -> bytes:
    return bytes(lib().bpf_module_license(module) or b"")


def kern_version(module: int) -> int:
    return int(lib().bpf_module_kern_version(module))


def load_program(prog_type: int, name: str, insns: bytes, license: bytes, kern_version: int) -> int:
    """Load ``insns`` as a program; its fd. On the verifier's refusal, OSError with the
    end of its log (loaded again with the log on, as BCC does)."""
    L = lib()
    buf = ctypes.create_string_buffer(insns, len(insns))
    fd = L.bcc_prog_load(prog_type, name.encode(), buf, len(insns), license, kern_version, 0, None, 0)
    if fd >= 0:
        return int(fd)
    err = ctypes.get_errno()
    log = ctypes.create_string_buffer(1 << 20)
    fd = L.bcc_prog_load(prog_type, name.encode(), buf, len(insns), license, kern_version, 1, log, len(log))
    if fd >= 0:  # a load refused once then accepted: keep it
        return int(fd)
    tail = log.value.decode(errors="replace").strip().splitlines()[-8:]
    raise OSError(err, f"the verifier refused {name}: " + " | ".join(tail) if tail else f"cannot load {name}")
