"""Assemble one BPF program from the shared parts and the enabled families, and load it.

One program per agent: common.h, the generated library-name filter, discovery.c, then every
family's C file and generated entry points. BCC compiles it (4-6 s here) at the first start
on a node; later starts with the same text load what that compile left in the program cache
(``program_cache``, ~1 s).
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import signal
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from otelbpf.sensor import lean_compile, program_cache, skeleton, uprobe_links
from otelbpf.sensor.family import ProbeFamily

log = logging.getLogger(__name__)

#: Signals a process is sent asynchronously (an operator's kill, a terminal, a supervisor,
#: a child's exit): held while programs are verified, see ``signals_held``.
ASYNC_SIGNALS = frozenset(
    {
        signal.SIGTERM,
        signal.SIGINT,
        signal.SIGHUP,
        signal.SIGQUIT,
        signal.SIGUSR1,
        signal.SIGUSR2,
        signal.SIGCHLD,
        signal.SIGALRM,
        signal.SIGPIPE,
        signal.SIGWINCH,
    }
)


@cache
def bpf_dir() -> Traversable:
    """``bpf/`` of a source checkout (and an editable install), else the copy a wheel
    carries as package data (``otelbpf/bpf/``, put there by setup.py)."""
    checkout = Path(__file__).resolve().parents[2] / "bpf"
    if (checkout / "common.h").is_file():
        return checkout
    return resources.files("otelbpf").joinpath("bpf")


#: ``#include "name.h"`` of a header in bpf/ (a family's own, e.g. sockets.c's h2_frames.h).
_LOCAL_INCLUDE = re.compile(r'^#include "([A-Za-z0-9_]+\.h)"[ \t]*$', re.MULTILINE)


def _bpf_source(name: str) -> str:
    """A file of bpf/, its own headers (``#include "x.h"``) put in its text where included: the
    program's text is then all of what it compiles, which the program cache keys on."""
    text = bpf_dir().joinpath(name).read_text()
    return _LOCAL_INCLUDE.sub(lambda m: _bpf_source(m.group(1)), text)


def _prefix_test(prefix: str) -> str:
    return " && ".join(f"name[{i}] == {ord(c)}" for i, c in enumerate(prefix))


def library_filter_c(prefixes: list[str], unmarked: Collection[str] = ()) -> str:
    """``wanted_library(name)``: does a file name start with a watched prefix? 1: yes, and
    the opener becomes a library user (``lib_users``); 2: yes, a library whose openers are
    not (``unmarked``: LibraryKind.marks_user false); 0: no.

    Byte comparisons rather than string literals keep the program free of
    .rodata, which BCC handles unevenly across versions.
    """
    body = "\n".join(
        f"    if ({_prefix_test(p)})\n        return {2 if p in unmarked else 1};" for p in sorted(set(prefixes))
    )
    return f"static __always_inline int wanted_library(const char *name)\n{{\n{body}\n    return 0;\n}}\n"


def source_order(families: Sequence[ProbeFamily]) -> list[ProbeFamily]:
    """The families in the order their C is put together: as given, except that each comes after
    the families it names in ``after`` (BPF C sees only what is above it: tls.c uses sockets.c's
    maps). A family that names one absent is an error here, not a compile error later."""
    names = {f.name for f in families}
    for f in families:
        missing = [a for a in f.after if a not in names]
        if missing:
            raise ValueError(f"the {f.name} family's C needs the {', '.join(missing)} family's")
    out: list[ProbeFamily] = []
    placed: set[str] = set()
    pending = list(families)
    while pending:
        ready = next((f for f in pending if all(a in placed for a in f.after)), None)
        if ready is None:
            raise ValueError(f"families that need each other: {', '.join(f.name for f in pending)}")
        pending.remove(ready)
        out.append(ready)
        placed.add(ready.name)
    return out


def build(
    families: list[ProbeFamily],
    *,
    filter_pids: bool,
    pause_on_load: bool = False,
    pause_new_only: bool = False,
    paused_entries: int = 4096,
    events_ring_bytes: int,
    str_ring_bytes: int = 256 * 1024,
    inflight_entries: int = 16384,
) -> tuple[str, list[str]]:
    """Return (C text, cflags) for BCC.

    ``pause_on_load``: stop a process at every probed library open and exec (``run --``);
    ``pause_new_only`` (host mode): only at the open of a library path not known to be
    attached, ``paused_entries`` processes stopped at once at most (common.h)."""
    page = 4096
    kinds = [k for f in families for k in f.libraries if k.open_prefix]
    # a prefix is unmarked only if every kind with it is (a shared prefix marks its users)
    unmarked = {k.open_prefix for k in kinds} - {k.open_prefix for k in kinds if k.marks_user}
    parts = [
        _bpf_source("common.h"),
        library_filter_c([k.open_prefix for k in kinds], unmarked),
        _bpf_source("discovery.c"),
    ]
    cflags = [
        f"-DEVENTS_RING_PAGES={events_ring_bytes // page}",
        f"-DSTR_RING_PAGES={str_ring_bytes // page}",
        f"-DINFLIGHT_ENTRIES={inflight_entries}",
    ]
    if filter_pids:
        cflags.append("-DFILTER_PIDS=1")
    cflags.append(f"-DPAUSE_ON_LOAD={int(pause_on_load or pause_new_only)}")  # 1: stop a process at its library open
    if pause_new_only:
        cflags += ["-DPAUSE_NEW_ONLY=1", f"-DPAUSED_ENTRIES={paused_entries}"]
    if any(k.content_symbol for f in families for k in f.libraries):
        cflags.append("-DEXEC_REPORT=1")  # executables are recognised by content: report execs
    for fam in source_order(families):
        if fam.c_file:  # a poller family (gpu: NVML) has no C
            parts.append(_bpf_source(fam.c_file))
        parts.append(fam.generated_c)
        cflags.extend(fam.cflags)
    return "\n".join(parts), cflags


@contextmanager
def signals_held() -> Iterator[None]:
    """Hold the asynchronous signals on this thread, deliver them on leaving.

    The kernel's verifier gives up with EAGAIN when a signal is pending for the loading
    thread, so a SIGTERM, a SIGHUP or any handled signal that arrives during the seconds of
    a compile would make the agent fail to start. Held, they wait and arrive right after
    the load (a SIGTERM then stops the agent as usual). A ptrace stop (a debugger, py-spy
    without --nonblocking) interrupts a load the same way and cannot be held.
    """
    old = signal.pthread_sigmask(signal.SIG_BLOCK, ASYNC_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _tail_call_types(families: Sequence[ProbeFamily]) -> list[tuple[str, int]]:
    """(program, BPF program type) of every family's tail-called program."""
    from bcc import BPF  # imported late: `otelbpf --help` works without BCC

    types = {"tracepoint": BPF.TRACEPOINT, "kprobe": BPF.KPROBE}
    return [(tc.program, types[tc.prog_type]) for fam in families for tc in fam.tail_calls]


def place_tail_calls(bpf: Any, families: Sequence[ProbeFamily]) -> None:
    """Load each family's tail-called programs into their program arrays."""
    places = [(tc.array, tc.index) for fam in families for tc in fam.tail_calls]
    for (array, index), (prog, prog_type) in zip(places, _tail_call_types(families)):
        fn = bpf.load_func(prog, prog_type)
        bpf[array][ctypes.c_int(index)] = ctypes.c_int(fn.fd)


def load(
    text: str,
    cflags: Sequence[str],
    families: Sequence[ProbeFamily],
    cache: program_cache.ProgramCache | None = None,
    *,
    uprobe_multi: bool = False,
) -> Any:
    """Compile and load the program with its tail calls in place, asynchronous signals held
    (``signals_held``); the BCC object. With a ``cache``, the programs an earlier compile of
    the same text left there are loaded instead of compiled (``program_cache``), and a
    compile leaves its own. A program left half loaded is unloaded again. ``uprobe_multi``:
    its uprobe programs load for uprobe-multi links (``uprobe_links``)."""
    with signals_held():
        bpf = _from_cache(text, list(cflags), cache, families, uprobe_multi) if cache is not None else None
        if bpf is None:
            bpf = _compile(text, list(cflags), cache, uprobe_multi)
        try:
            _set_agent_self(bpf)
            place_tail_calls(bpf, families)
        except BaseException:
            bpf.cleanup()
            raise
    return bpf


def _set_agent_self(bpf: Any) -> None:
    """This process's pid in ``agent_self`` (common.h), for the probes to skip; a program
    without common.h (a test's, the doctor's) has no such map."""
    try:
        table = bpf["agent_self"]
    except KeyError:
        return
    table[ctypes.c_int(0)] = ctypes.c_uint32(os.getpid())


def _compile(text: str, cflags: list[str], cache: program_cache.ProgramCache | None, uprobe_multi: bool) -> Any:
    with lean_compile.lean_modules():  # LLVM's state freed once compiled (lean_compile)
        bpf = uprobe_links.bpf_class()(text=text, cflags=cflags, uprobe_multi=uprobe_multi)
    if cache is not None:
        try:
            programs = program_cache.capture(bpf.module)
        except program_cache.Uncacheable as exc:
            log.warning("program cache: this program cannot be kept (%s): every start compiles it", exc)
        else:
            cache.put(program_cache.key(text, cflags), programs)
    return bpf


def _from_cache(
    text: str,
    cflags: list[str],
    cache: program_cache.ProgramCache,
    families: Sequence[ProbeFamily],
    uprobe_multi: bool,
) -> Any:
    """The program loaded from ``cache``, or None (a miss, or an entry that does not fit: logged)."""
    from otelbpf.sensor.cached_bpf import CachedBPF, CacheMismatch

    entry_key = program_cache.key(text, cflags)
    programs = cache.get(entry_key)
    if programs is None:
        log.info("program cache %s: no entry for this program, kernel and BCC: compiling", cache.path)
        return None
    try:
        with lean_compile.lean_modules():
            return CachedBPF(
                skeleton.skeleton(text),
                cflags,
                programs,
                preload=_tail_call_types(families),
                uprobe_multi=uprobe_multi,
            )
    except CacheMismatch as exc:
        log.warning("program cache: entry %s does not fit (%s): compiling", entry_key[:12], exc)
    except Exception as exc:  # the skeleton did not compile, a program was refused
        log.warning("program cache: entry %s could not be loaded (%s): compiling", entry_key[:12], exc)
    return None
