"""Compile with BCC so that LLVM's memory goes once the program is loaded.

BCC's C entry point (``bpf_module_create_c_from_string``, what ``bcc.BPF`` calls) always
builds a module with its table "reader/writer" JIT on: per map, an x86 function that prints
or parses a key and a value as text (``table.key_sprintf`` and friends, which the agent never
calls). With it on, BCC keeps LLVM's execution engine, the whole optimised module and its
context for the life of the program: 16 MiB of the agent's anonymous memory here (30 against
46 MiB after the compile's other memory is given back, docs/BENCHMARKS.md). With it off, BCC
copies the compiled instructions out and frees all of LLVM's state at the end of the compile;
the maps, the BTF and every program load are unchanged.

The switch is an argument of BCC's C++ constructor, which libbcc exports but its C API does
not expose: ``ebpf::BPFModule(flags, ts, rw_engine_enabled, maps_ns, allow_rlimit,
dev_name)`` then ``load_string(text, cflags, ncflags)``, called here through ctypes with the
two ``std::string`` arguments laid out as libstdc++'s (the ``__cxx11`` ABI the symbols name).
The result is the same ``BPFModule*`` the C API returns, handed to ``bcc.BPF`` in its place
(``lean_modules``), so everything else (tables, loads, attaches, ``bpf_module_destroy``) is
BCC's own code. A libbcc without these exact symbols (another BCC version, another C++ ABI)
falls back to BCC's path, logged once.

Without the JIT, BCC's ``key_sprintf``/``leaf_sprintf``/``key_scanf``/``leaf_scanf`` call an
empty ``std::function`` and abort the process: the agent never calls them
(tests/sensor/test_bpf_sources.py keeps it so).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)

_CTOR = "_ZN4ebpf9BPFModuleC1EjPNS_12TableStorageEbRKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEEbPKc"
_LOAD_STRING = "_ZN4ebpf9BPFModule11load_stringERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEEPPKci"
#: Bytes allocated for the module object: BCC 0.26's is 600 (the constant its C API passes to
#: ``operator new``); room for later versions' growth. Freed by BCC's ``delete``.
_MODULE_BYTES = 16 * 1024


class _StdString(ctypes.Structure):
    """libstdc++'s ``std::__cxx11::string``: data pointer, length, then a 16-byte local buffer
    (or the capacity). Only ever passed as ``const std::string&`` here: read, never freed."""

    _fields_ = [("data", ctypes.c_void_p), ("size", ctypes.c_size_t), ("local", ctypes.c_char * 16)]


class LeanCompiler:
    """``bpf_module_create_c_from_string``'s signature, with BCC's reader/writer JIT off."""

    def __init__(self, libbcc: Any, libstdcxx: Any) -> None:
        """Raises AttributeError when either library lacks a symbol this needs."""
        self._new = libstdcxx._Znwm
        self._new.restype, self._new.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
        self._ctor = getattr(libbcc, _CTOR)
        self._ctor.restype = None
        self._ctor.argtypes = [
            ctypes.c_void_p,  # this
            ctypes.c_uint,  # flags (BCC's debug bits)
            ctypes.c_void_p,  # TableStorage*: null, the module's own
            ctypes.c_bool,  # rw_engine_enabled
            ctypes.c_void_p,  # const std::string& maps_ns
            ctypes.c_bool,  # allow_rlimit
            ctypes.c_char_p,  # dev_name (an offload device), as bcc.BPF passes it
        ]
        self._load = getattr(libbcc, _LOAD_STRING)
        self._load.restype = ctypes.c_int
        self._load.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_char_p), ctypes.c_int]
        self._destroy = libbcc.bpf_module_destroy
        self.modules = 0  # built this way (what tests and the log read)

    def __call__(
        self,
        text: bytes,
        flags: int,
        cflags: Any,
        ncflags: int,
        allow_rlimit: bool,
        device: bytes | None,
    ) -> int | None:
        text_buf = ctypes.create_string_buffer(text, len(text) + 1)
        empty = ctypes.create_string_buffer(1)
        text_str = _StdString(ctypes.addressof(text_buf), len(text))
        ns_str = _StdString(ctypes.addressof(empty), 0)
        module = self._new(_MODULE_BYTES)
        ctypes.memset(module, 0, _MODULE_BYTES)
        self._ctor(module, flags, None, False, ctypes.addressof(ns_str), allow_rlimit, device)
        if self._load(module, ctypes.addressof(text_str), cflags, ncflags) != 0:
            self._destroy(module)  # what BCC's C API does with a module that did not compile
            return None
        self.modules += 1
        return int(module)


_compiler: LeanCompiler | None = None
_unavailable: str | None = None


def compiler() -> LeanCompiler | None:
    """The process's LeanCompiler, or None (said once) when this libbcc cannot give one."""
    global _compiler, _unavailable
    if _compiler is None and _unavailable is None:
        import bcc

        try:
            _compiler = LeanCompiler(bcc.lib, ctypes.CDLL("libstdc++.so.6"))
        except (AttributeError, OSError) as exc:
            _unavailable = str(exc)
            log.info("BCC keeps LLVM's memory after the compile (%s): this libbcc lacks the entry points", exc)
    return _compiler


@contextmanager
def lean_modules() -> Iterator[None]:
    """Within: ``bcc.BPF(...)`` builds its module with the reader/writer JIT off.

    ``bcc.BPF.__init__`` calls ``bcc.lib.bpf_module_create_c_from_string`` by attribute, so
    the swap is seen by it and by nothing after the block. Not for concurrent use: the agent
    compiles once, on one thread."""
    import bcc

    lean = compiler()
    if lean is None:
        yield
        return
    original = bcc.lib.bpf_module_create_c_from_string
    bcc.lib.bpf_module_create_c_from_string = lean
    try:
        yield
    finally:
        bcc.lib.bpf_module_create_c_from_string = original
