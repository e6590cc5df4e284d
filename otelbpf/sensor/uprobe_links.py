"""Uprobes as BPF links (``BPF_TRACE_UPROBE_MULTI``, Linux 6.6+) instead of BCC's perf events.

BCC attaches a uprobe as a perf event of the kernel's ``uprobe`` PMU. Releasing one waits out
RCU-tasks-trace grace periods under the kernel's global ``event_mutex``, one probe after the
other: 0.6 s for 60 probes on a quiet machine here, minutes for a few thousand under load
(docs/BENCHMARKS.md), and every attach on the host, of this agent or another, waits behind that
mutex meanwhile. That is what made a never-seen library's pause 1.4 s instead of 0.13 s while an
earlier sensor's probes were going, what held a stopping agent for tens of seconds, and most of
the BPF test tier's time. A uprobe-multi link takes no such mutex: 60 probes attach in ~15 ms,
and their releases, each a grace period too, share one when made at once (~0.1 s).

A program attached by such a link must be loaded with that expected attach type, and programs
that tail-call each other must agree on it, so the choice is made once per loaded object,
before anything is loaded: every ``BPF_PROG_TYPE_KPROBE`` program of it (the sensor loads
kprobe-typed programs only for uprobes) gets ``BPF_TRACE_UPROBE_MULTI`` (``UprobeMultiLoads``).
Where the kernel lacks it (``supported()`` tries once), or with ``OTELBPF_UPROBE_MULTI=0``,
BCC's perf events are used as before.

One link per probe, not one per library: the sensor keeps its per-probe bookkeeping (what is
attached, what failed, counted), and links are cheap. BCC's 1,000-probe quota per process, which
counts its perf events, does not apply to links; open file descriptors do (one per probe).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from otelbpf.sensor import elf

log = logging.getLogger(__name__)

#: enum bpf_attach_type (include/uapi/linux/bpf.h)
BPF_TRACE_UPROBE_MULTI = 48
#: uprobe_multi.flags: the program runs at the function's return
BPF_F_UPROBE_MULTI_RETURN = 1
_BPF_PROG_LOAD = 5
_BPF_LINK_CREATE = 28
_BPF_PROG_TYPE_KPROBE = 2
_ATTR_SIZE = 128  # the kernel takes a larger, zero-filled attr

_SYS_BPF = {"x86_64": 321, "aarch64": 280}.get(os.uname().machine)
_libc = ctypes.CDLL(None, use_errno=True)


def _bpf(cmd: int, attr: ctypes.Array[ctypes.c_uint8]) -> int:
    if _SYS_BPF is None:
        raise OSError(errno.ENOSYS, f"bpf(2) number unknown on {os.uname().machine}")
    fd = int(_libc.syscall(_SYS_BPF, cmd, attr, _ATTR_SIZE))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return fd


def link(prog_fd: int, path: str, offset: int, *, ret: bool, pid: int = 0) -> int:
    """A uprobe (``ret``: uretprobe) at file ``offset`` of ``path`` running ``prog_fd`` (for
    ``pid`` alone, if not 0); the link's fd, which holds it: closing it detaches. Raises OSError."""
    attr = (ctypes.c_uint8 * _ATTR_SIZE)()
    raw_path = ctypes.create_string_buffer(os.fsencode(path))
    offsets = (ctypes.c_uint64 * 1)(offset)
    struct.pack_into("<IIII", attr, 0, prog_fd, 0, BPF_TRACE_UPROBE_MULTI, 0)
    # uprobe_multi: path, offsets, ref_ctr_offsets, cookies, cnt, flags, pid
    struct.pack_into(
        "<QQQQIII",
        attr,
        16,
        ctypes.addressof(raw_path),
        ctypes.addressof(offsets),
        0,
        0,
        1,
        BPF_F_UPROBE_MULTI_RETURN if ret else 0,
        pid,
    )
    return _bpf(_BPF_LINK_CREATE, attr)


def load_program(name: str, insns: bytes, license: bytes, kern_version: int) -> int:
    """Load a kprobe-typed program for uprobe-multi links (the program cache's instructions;
    BCC's loader of that version takes no expected attach type); its fd. On the verifier's
    refusal, OSError with the end of its log."""
    code = ctypes.create_string_buffer(insns, len(insns))
    lic = ctypes.create_string_buffer(license)
    for log_size in (0, 1 << 20):
        log_buf = ctypes.create_string_buffer(log_size or 1)
        attr = (ctypes.c_uint8 * _ATTR_SIZE)()
        struct.pack_into(
            "<IIQQIIQI",
            attr,
            0,
            _BPF_PROG_TYPE_KPROBE,
            len(insns) // 8,
            ctypes.addressof(code),
            ctypes.addressof(lic),
            1 if log_size else 0,
            log_size,
            ctypes.addressof(log_buf) if log_size else 0,
            kern_version,
        )
        struct.pack_into("<15s", attr, 48, name.encode()[:15])  # prog_name, NUL-terminated
        struct.pack_into("<I", attr, 68, BPF_TRACE_UPROBE_MULTI)
        try:
            return _bpf(_BPF_PROG_LOAD, attr)
        except OSError as exc:
            if log_size:
                tail = log_buf.value.decode(errors="replace").strip().splitlines()[-8:]
                raise OSError(exc.errno, f"the verifier refused {name}: " + " | ".join(tail)) from None
    raise AssertionError("unreachable")


@functools.cache
def supported() -> bool:
    """Whether this kernel attaches uprobe-multi links (and ``OTELBPF_UPROBE_MULTI`` is not 0).

    Tried for real: a two-instruction program linked at the last byte of this process's own
    executable. That byte lies in no executable mapping (section headers, or at most the data
    segment), so nothing is installed anywhere; offset 0 would have been the ELF header, which
    an old layout (text in the first segment) maps executable."""
    if os.environ.get("OTELBPF_UPROBE_MULTI", "1") == "0":
        log.info("uprobes as perf events (OTELBPF_UPROBE_MULTI=0)")
        return False
    insns = bytes.fromhex("b7000000000000009500000000000000")  # r0 = 0; exit
    code = ctypes.create_string_buffer(insns, len(insns))
    license = ctypes.create_string_buffer(b"GPL")
    attr = (ctypes.c_uint8 * _ATTR_SIZE)()
    struct.pack_into("<IIQQ", attr, 0, _BPF_PROG_TYPE_KPROBE, 2, ctypes.addressof(code), ctypes.addressof(license))
    struct.pack_into("<I", attr, 68, BPF_TRACE_UPROBE_MULTI)  # expected_attach_type
    try:
        prog = _bpf(_BPF_PROG_LOAD, attr)
    except OSError as exc:
        log.info("uprobes as perf events: this kernel loads no uprobe-multi program (%s)", exc.strerror)
        return False
    try:
        exe = os.path.realpath("/proc/self/exe")
        os.close(link(prog, exe, os.stat(exe).st_size - 1, ret=False))
    except OSError as exc:
        log.info("uprobes as perf events: this kernel makes no uprobe-multi link (%s)", exc.strerror)
        return False
    finally:
        os.close(prog)
    return True


class UprobeMultiLoads:
    """Mixin for ``bcc.BPF`` (before it in the bases): with ``uprobe_multi`` set before
    ``__init__``, every kprobe-typed program loads with ``BPF_TRACE_UPROBE_MULTI``, those
    loaded by name later and those BCC or a subclass loads on its own alike."""

    def __init__(self, *args: Any, uprobe_multi: bool = False, **kwargs: Any) -> None:
        self.uprobe_multi = uprobe_multi  # before BCC's __init__, which may load programs
        super().__init__(*args, **kwargs)

    def load_func(self, func_name: Any, prog_type: int, device: Any = None, attach_type: int = -1) -> Any:
        if self.uprobe_multi and prog_type == _BPF_PROG_TYPE_KPROBE and attach_type == -1:
            attach_type = BPF_TRACE_UPROBE_MULTI
        return super().load_func(func_name, prog_type, device, attach_type)  # type: ignore[misc]


@functools.cache
def bpf_class() -> type:
    """``bcc.BPF`` with ``UprobeMultiLoads`` (made on first use: BCC is imported late, so that
    ``otelbpf --help`` works without it)."""
    from bcc import BPF

    class LoadedBPF(UprobeMultiLoads, BPF):
        """A compiled program's BCC object (``program.load``)."""

    return LoadedBPF


#: Threads releasing links at once (each holds ~8 KiB of stack while it waits in the kernel).
CLOSE_THREADS = 64


class Links:
    """The sensor's uprobe links: attached one by one, released all at once."""

    def __init__(self) -> None:
        self._fds: list[int] = []

    def __len__(self) -> int:
        return len(self._fds)

    def attach(self, bpf: Any, path: str, vaddr: int, program: str, *, ret: bool) -> None:
        """``program`` of ``bpf`` at ``vaddr`` of ``path``, its address turned into a file
        offset by the file's loadable segments, as BCC's own ``attach_uprobe`` does (so both
        ways probe the same byte)."""
        from bcc import BPF

        fn = bpf.load_func(program, BPF.KPROBE)
        self._fds.append(link(fn.fd, path, elf.file_offset(path, vaddr), ret=ret))

    def close_all(self) -> None:
        """Release every link, on up to ``CLOSE_THREADS`` threads at once. Each release waits
        out an RCU-tasks-trace grace period (``uprobe_unregister_sync``), but concurrent
        waiters share one: 60 links closed one after another took 3.4 s here, on 4 threads
        0.98 s, on 16 0.33 s, on 64 0.09 s."""
        fds, self._fds = self._fds, []
        if not fds:
            return
        with ThreadPoolExecutor(min(CLOSE_THREADS, len(fds)), thread_name_prefix="otelbpf-detach") as pool:
            list(pool.map(_close, fds))


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
