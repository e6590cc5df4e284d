"""The capabilities the agent runs with: checked at start, the rest dropped before it attaches.

What the agent needs it needs for its whole life, not only to start: libraries opened later
are attached later (uprobe-multi links: CAP_BPF and CAP_PERFMON; BCC's perf uprobe events, on
kernels without links: CAP_SYS_ADMIN; their paths read from /proc/PID/maps: CAP_SYS_PTRACE),
a Python walker is loaded the first time a CPython version is seen (CAP_BPF), and BCC reads
tracefs when it compiles and when it detaches (CAP_DAC_READ_SEARCH unless uid 0). So nothing
of that set can be given up once the probes are attached. Everything else is dropped before
the first BPF program is compiled, from the effective, permitted, inheritable, ambient and
bounding sets, while the agent is still one thread (capabilities belong to threads; every
later thread inherits the reduced set):

- kept: CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH, CAP_CHECKPOINT_RESTORE
  (/proc/PID/map_files; the set docs/capabilities.md measures); CAP_SYS_ADMIN instead of the
  last only where uprobes are perf events (kernels before 6.6: the sensor's ``uprobe_links``) or
  where it stands in for one of the others not held; and, where held, CAP_KILL only when the
  agent may resume what its pause stopped (``run -- CMD``, or host mode with
  ``service.host_pause`` on: SIGCONT to a paused process of another user's, or one that
  changed user), CAP_SYSLOG only when the profiling or sched
  receiver is enabled (kernel frame names: /proc/kallsyms shows zeros without it) and, before
  Linux 5.11, CAP_SYS_RESOURCE (BPF memory charged to memlock);
- dropped, for instance: CAP_DAC_OVERRIDE (the agent writes only where its user may),
  CAP_SETUID, CAP_SYS_MODULE, CAP_NET_ADMIN, CAP_CHOWN.

`otelbpf run -- CMD` starts its command's guard before the drop: the command gets the
privileges it would have had without the agent.
"""

from __future__ import annotations

import ctypes
import logging
import os
import resource
from pathlib import Path

log = logging.getLogger(__name__)

CAPABILITY_BITS = {
    "CAP_DAC_OVERRIDE": 1,
    "CAP_DAC_READ_SEARCH": 2,
    "CAP_SYS_PTRACE": 19,
    "CAP_SYS_ADMIN": 21,
    "CAP_SYS_RESOURCE": 24,
    "CAP_PERFMON": 38,
    "CAP_BPF": 39,
    "CAP_CHECKPOINT_RESTORE": 40,
}

CAP_DAC_READ_SEARCH, CAP_KILL, CAP_SETPCAP = 2, 5, 8
CAP_SYS_PTRACE, CAP_SYS_ADMIN, CAP_SYS_RESOURCE, CAP_SYSLOG = 19, 21, 24, 34
CAP_PERFMON, CAP_BPF, CAP_CHECKPOINT_RESTORE = 38, 39, 40
#: The agent's capabilities where uprobes attach as uprobe-multi links (Linux 6.6+): without
#: CAP_SYS_ADMIN, /proc/PID/map_files (the symbolizer's way to a process's mapped files, also
#: in containers and once deleted) opens with CAP_CHECKPOINT_RESTORE (Linux 5.9+).
REQUIRED_WITH_LINKS = (CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH, CAP_CHECKPOINT_RESTORE)
REQUIRED_WITH_LINKS_NAMES = "CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH and CAP_CHECKPOINT_RESTORE"
#: On any kernel (what a manifest for every node grants), as docs/capabilities.md and the README
#: name them: CAP_SYS_ADMIN too, for BCC's perf uprobe events where links are missing.
REQUIRED = (CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN, CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH)
REQUIRED_NAMES = "CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN, CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH"

_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


class PrivilegeError(Exception):
    """The agent lacks a capability it needs; the message names each one and the fix."""


def capability_sets(status_text: str | None = None) -> dict[str, int]:
    """CapInh, CapPrm, CapEff, CapBnd and CapAmb of this process (or of a status text)."""
    text = Path("/proc/self/status").read_text() if status_text is None else status_text
    return {
        k: int(v, 16)
        for k, _, v in (line.partition(":\t") for line in text.splitlines())
        if k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")
    }


def require_privileges(*, uprobe_links: bool) -> None:
    """Fail early, naming each missing capability and what it is for, with the fix; the same
    rules as `otelbpf doctor` (root in a container may lack some, so capabilities count,
    not the uid). ``uprobe_links``: uprobes attach as links here (no CAP_SYS_ADMIN needed)."""
    missing = missing_privileges(
        capability_sets()["CapEff"], os.geteuid(), perf_event_paranoid(), kernel_version(), uprobe_links=uprobe_links
    )
    if missing:
        raise PrivilegeError(
            f"otelbpf needs privileges to load eBPF programs and attach uprobes: run it as root (sudo), or grant "
            f"exactly {REQUIRED_WITH_LINKS_NAMES if uprobe_links else REQUIRED_NAMES} (see docs/capabilities.md). "
            f"Missing: {'; '.join(missing)}."
        )


#: Receivers that name kernel frames (their stacks go through /proc/kallsyms): CAP_SYSLOG.
KERNEL_SYMBOL_RECEIVERS = frozenset({"profiling", "sched"})


def kept_mask(held: int, kernel: tuple[int, int], *, command: bool, kernel_symbols: bool, uprobe_links: bool) -> int:
    """The capabilities, of those ``held``, that the agent keeps for its life: CAP_KILL only
    when it may have to resume what it paused (``command``: a command, or host mode's pause),
    CAP_SYSLOG only if it reads ``kernel_symbols``, CAP_SYS_ADMIN only without ``uprobe_links``
    or where it stands in for CAP_BPF, CAP_PERFMON or CAP_CHECKPOINT_RESTORE (which it implies)
    not held."""
    implied = all(held >> c & 1 for c in (CAP_BPF, CAP_PERFMON, CAP_CHECKPOINT_RESTORE))
    keep = {
        *(REQUIRED_WITH_LINKS if uprobe_links and implied else REQUIRED),
        *((CAP_KILL,) if command else ()),
        *((CAP_SYSLOG,) if kernel_symbols else ()),
        *((CAP_SYS_RESOURCE,) if kernel < (5, 11) else ()),
    }
    mask: int = sum(1 << c for c in keep)
    return held & mask


def drop_unneeded(*, command: bool, receivers: set[str], uprobe_links: bool) -> int:
    """Drop every capability the agent does not need (module doc) with a ``command`` of its
    own or not, these enabled ``receivers``, and uprobes as ``uprobe_links`` or perf events;
    returns the mask kept.

    Call it while the process has one thread: other threads would keep their sets."""
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        log.warning("dropping capabilities with %d threads running: only this thread's are dropped", threads)
    libc = ctypes.CDLL(None, use_errno=True)
    sets = capability_sets()
    keep = kept_mask(
        sets["CapPrm"],
        kernel_version(),
        command=command,
        kernel_symbols=bool(receivers & KERNEL_SYMBOL_RECEIVERS),
        uprobe_links=uprobe_links,
    )
    if sets["CapEff"] >> CAP_SETPCAP & 1:  # needed to shrink the bounding set
        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
        for cap in range(last + 1):
            if sets["CapBnd"] >> cap & 1 and not keep >> cap & 1:
                libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = _Header(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_Data * 2)()
    for i in range(2):
        word = keep >> (32 * i) & 0xFFFFFFFF
        data[i].effective, data[i].permitted, data[i].inheritable = word, word, 0
    if libc.capset(ctypes.byref(header), data) != 0:
        err = ctypes.get_errno()
        log.warning("could not drop capabilities: %s", os.strerror(err))
        return sets["CapEff"]
    log.info("capabilities kept: %s", _names(keep))
    return keep


def effective_capabilities(status_text: str) -> int:
    """The CapEff mask from the text of /proc/<pid>/status."""
    for line in status_text.splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    raise ValueError("no CapEff line in /proc/self/status")


def has_capability(mask: int, cap: str) -> bool:
    return bool(mask >> CAPABILITY_BITS[cap] & 1)


def kernel_version() -> tuple[int, int]:
    major, minor = os.uname().release.split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def perf_event_paranoid() -> int:
    return int(Path("/proc/sys/kernel/perf_event_paranoid").read_text())


def missing_privileges(
    mask: int, euid: int, paranoid: int, kernel: tuple[int, int], *, uprobe_links: bool
) -> list[str]:
    """Capabilities the sensor lacks, each with the reason it needs it (CAP_SYS_ADMIN only
    where uprobes are BCC's perf events: without ``uprobe_links``)."""
    admin = has_capability(mask, "CAP_SYS_ADMIN")
    missing = []
    if not (admin or has_capability(mask, "CAP_BPF")):
        missing.append("CAP_BPF (load BPF programs, create maps)")
    if not (admin or has_capability(mask, "CAP_PERFMON")):
        missing.append("CAP_PERFMON (attach tracing programs)")
    if uprobe_links and not (admin or has_capability(mask, "CAP_CHECKPOINT_RESTORE")):
        missing.append("CAP_CHECKPOINT_RESTORE (open /proc/PID/map_files: the mapped files stacks are symbolized from)")
    if not admin and paranoid > -1 and not uprobe_links:
        missing.append(
            "CAP_SYS_ADMIN (BCC opens uprobes with raw samples, which perf allows only with"
            f" CAP_SYS_ADMIN while kernel.perf_event_paranoid={paranoid} > -1)"
        )
    if euid != 0 and not (has_capability(mask, "CAP_DAC_READ_SEARCH") or has_capability(mask, "CAP_DAC_OVERRIDE")):
        missing.append("CAP_DAC_READ_SEARCH (tracefs is readable by root only)")
    if not has_capability(mask, "CAP_SYS_PTRACE"):
        missing.append("CAP_SYS_PTRACE (read /proc/PID/maps of other users' processes)")
    memlock_unlimited = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1] == resource.RLIM_INFINITY
    if kernel < (5, 11) and not has_capability(mask, "CAP_SYS_RESOURCE") and not memlock_unlimited:
        missing.append("CAP_SYS_RESOURCE (kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK)")
    return missing


def _names(mask: int) -> str:
    names = {
        CAP_DAC_READ_SEARCH: "dac_read_search",
        CAP_KILL: "kill",
        CAP_SYS_PTRACE: "sys_ptrace",
        CAP_SYS_ADMIN: "sys_admin",
        CAP_SYS_RESOURCE: "sys_resource",
        CAP_SYSLOG: "syslog",
        CAP_PERFMON: "perfmon",
        CAP_BPF: "bpf",
        CAP_CHECKPOINT_RESTORE: "checkpoint_restore",
    }
    return ",".join(names.get(c, str(c)) for c in range(64) if mask >> c & 1) or "none"
