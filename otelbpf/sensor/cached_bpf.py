"""A ``bcc.BPF`` whose programs come from the program cache instead of the compiler.

BCC compiles the skeleton (``skeleton.py``): the module then holds the maps (created, with
BTF), their key and value layouts, the programs' names and the licence, so tables, attaches
and everything else of ``bcc.BPF`` work as after a full compile. Only ``load_func`` differs:
it loads the cached instructions of the program, with this module's map fds written in,
instead of the skeleton's empty body. BCC's automatic attach of ``tracepoint__*`` programs
waits until that is in place.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bcc import BPF

from otelbpf.sensor import bcc_module, uprobe_links
from otelbpf.sensor.program_cache import CachedPrograms


class CacheMismatch(Exception):
    """The skeleton's maps or programs differ from the cached ones: the cache cannot be used."""


class CachedBPF(uprobe_links.UprobeMultiLoads, BPF):
    #: Read by the sensor's start-up line: where the programs came from.
    from_cache = True

    def __init__(
        self,
        skeleton_text: str,
        cflags: list[str],
        programs: CachedPrograms,
        preload: Sequence[tuple[str, int]] = (),
        *,
        uprobe_multi: bool = False,
    ) -> None:
        """``preload``: (name, program type) of programs certain to be loaded (tail calls),
        loaded with BCC's automatically attached ones on parallel threads. ``uprobe_multi``:
        kprobe-typed programs load for uprobe-multi links (``uprobe_links``)."""
        self._programs = programs
        self._autoload = False
        super().__init__(text=skeleton_text, cflags=cflags, uprobe_multi=uprobe_multi)
        try:
            shapes = bcc_module.tables(self.module)
            why = programs.mismatch(bcc_module.function_names(self.module), list(shapes.values()))
            if why:
                raise CacheMismatch(why)
            self._fds = {shape.name: fd for fd, shape in shapes.items()}
            self._license = bcc_module.license_of(self.module)
            self._kern_version = bcc_module.kern_version(self.module)
            auto = [(n, BPF.TRACEPOINT) for n in programs.code if n.startswith("tracepoint__")]
            self._load_parallel([*auto, *preload])
            self._autoload = True
            self._trace_autoload()
        except BaseException:
            # Nothing of this half-made object may stay loaded or attached: the caller compiles
            # and attaches the same programs next, and two copies would report every event twice.
            self.cleanup()
            raise

    def _load_parallel(self, wanted: Sequence[tuple[str, int]]) -> None:
        """Load ``wanted`` on a thread per core: the verifier's time is most of a cached
        start's (tens of ms for each big program), and each load runs in its own thread's
        kernel context, the GIL released. The threads inherit the caller's held signals."""
        todo = [(n, t) for n, t in dict(wanted).items() if n.encode() not in self.funcs]
        with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
            loads = [(n, pool.submit(self._load_one, n, t)) for n, t in todo]
            errors = []
            for name, future in loads:
                try:
                    self.funcs[name.encode()] = BPF.Function(self, name.encode(), future.result())
                except Exception as exc:
                    errors.append(exc)
        if errors:
            raise errors[0]  # the programs loaded so far are in self.funcs: __init__ unloads them

    def _load_one(self, name: str, prog_type: int) -> int:
        insns = self._programs.relocated(name, self._fds)
        if self.uprobe_multi and prog_type == BPF.KPROBE:
            return uprobe_links.load_program(name, insns, self._license, self._kern_version)
        return bcc_module.load_program(prog_type, name, insns, self._license, self._kern_version)

    def _trace_autoload(self) -> None:
        if self._autoload:
            super()._trace_autoload()

    def load_func(self, func_name: Any, prog_type: int, device: Any = None, attach_type: int = -1) -> Any:
        raw = func_name.encode() if isinstance(func_name, str) else bytes(func_name)
        if raw in self.funcs:
            return self.funcs[raw]
        name = raw.decode()
        if name not in self._programs.code:
            raise Exception(f"Unknown program {name}")  # BCC's words for it
        if device is not None or attach_type != -1:  # the skeleton's body is no program to offload
            raise ValueError(f"{name}: a cached program is loaded without a device or attach type")
        fn = BPF.Function(self, raw, self._load_one(name, prog_type))
        self.funcs[raw] = fn
        return fn
