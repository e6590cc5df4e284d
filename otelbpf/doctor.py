"""`otelbpf doctor`: say plainly what this host lets the sensor do, by trying each thing for real.

Kernel config files, sysctls and capability bits each tell only part of the story (a kernel can
have kprobes configured and still refuse them; root can lack capabilities inside a container), so
every check here performs the real operation: load a program, create a ring buffer, attach a
uprobe and a tracepoint and watch them fire.  Each check is one small function returning a
`Check`; `run_doctor` prints one line per check, the GPU/RDMA libraries running processes map, and
a verdict with the fix for each blocker.  The exit code is 0 only when the sensor can run.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import fnmatch
import os
import platform
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO

from otelbpf.base.privileges import (
    CAPABILITY_BITS,
    effective_capabilities,
    has_capability,
    kernel_version,
    missing_privileges,
    perf_event_paranoid,
)
from otelbpf.base.procfs import parse_maps
from otelbpf.sensor.kernel_headers import installed as installed_headers

OK, MISSING, FAIL, SKIP = "OK", "MISSING", "FAIL", "SKIP"

AGENT_CAPABILITIES = "CAP_BPF,CAP_PERFMON,CAP_SYS_ADMIN,CAP_SYS_PTRACE,CAP_DAC_READ_SEARCH"
PRIVILEGE_FIX = (
    f"run as root (sudo otelbpf doctor) or grant {AGENT_CAPABILITIES}"
    " (plus CAP_SYS_RESOURCE on kernels older than 5.11); see docs/capabilities.md"
)
SETUP_FIX = "run scripts/setup.sh as root"
TRACEFS_FIX = "mount -t tracefs nodev /sys/kernel/tracing (scripts/setup.sh does it)"

BPF_SYSCALL_NR = {"x86_64": 321, "aarch64": 280}
BPF_MAP_CREATE, BPF_PROG_LOAD = 0, 5
BPF_PROG_TYPE_TRACEPOINT = 5
BPF_MAP_TYPE_RINGBUF = 27
BPF_ATTR_SIZE = 128

PROBE_PROGRAMS = r"""
BPF_ARRAY(doctor_hits, u64, 3);

int on_uprobe(struct pt_regs *ctx) {
    u32 slot = 0;
    doctor_hits.atomic_increment(slot);
    return 0;
}

int on_tracepoint(void *ctx) {
    if ((bpf_get_current_pid_tgid() >> 32) != DOCTOR_TGID)
        return 0;
    u32 slot = 1;
    doctor_hits.atomic_increment(slot);
    return 0;
}

int on_perf_event(struct bpf_perf_event_data *ctx) {
    u32 slot = 2;
    doctor_hits.atomic_increment(slot);
    return 0;
}

int on_kprobe(struct pt_regs *ctx) {
    return 0;
}
"""
UPROBE_SLOT, TRACEPOINT_SLOT, PERF_SLOT = 0, 1, 2
FENTRY_TARGET = "vfs_read"
FENTRY_PROGRAM = f"KFUNC_PROBE({FENTRY_TARGET}) {{ return 0; }}"
TRACEPOINT = "syscalls:sys_enter_getpid"
OPTIONAL_PROBES = ("perf events", "kprobes", "fentry")

LIBRARY_PATTERNS = (
    ("CUDA runtime", "libcudart*"),
    ("CUDA driver", "libcuda.so*"),
    ("NCCL", "libnccl*"),
    ("ibverbs", "libibverbs*"),
)


@dataclass(frozen=True)
class Check:
    """One line of the report.  `required` checks must be OK for the sensor to run."""

    name: str
    status: str
    detail: str
    fix: str = ""
    required: bool = True


@dataclass(frozen=True)
class MappedLibrary:
    """A GPU/RDMA library that a running process has mapped, and from where."""

    pid: int
    comm: str
    kind: str
    path: str


@dataclass(frozen=True)
class ProcessScan:
    """What a /proc/*/maps scan found; `denied` processes could not be read (no CAP_SYS_PTRACE)."""

    libraries: list[MappedLibrary]
    scanned: int
    vanished: int
    denied: int


class _CapturedOutput:
    """What libbcc printed: it puts the real cause (errno, path) on fds 1 and 2, not in the exception."""

    text = ""


@contextlib.contextmanager
def _capture_bcc_output() -> Iterator[_CapturedOutput]:
    """Route fds 1 and 2 into a file while BCC runs, so its messages land in the report, not around it."""
    captured = _CapturedOutput()
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    with tempfile.TemporaryFile() as sink:
        for fd in saved:
            os.dup2(sink.fileno(), fd)
        try:
            yield captured
        finally:
            for fd, original in saved.items():
                os.dup2(original, fd)
                os.close(original)
            sink.seek(0)
            captured.text = " ".join(sink.read().decode(errors="replace").split())


def _with_output(message: object, captured: _CapturedOutput) -> str:
    return f"{message} ({captured.text})" if captured.text else str(message)


# --- privileges -------------------------------------------------------------------------------


def check_privileges() -> Check:
    mask = effective_capabilities(Path("/proc/self/status").read_text())
    euid = os.geteuid()
    held = [cap for cap in CAPABILITY_BITS if has_capability(mask, cap)]
    who = f"euid {euid}; effective: {', '.join(held) or 'no capabilities'}"
    from otelbpf.sensor import uprobe_links

    missing = missing_privileges(
        mask, euid, perf_event_paranoid(), kernel_version(), uprobe_links=uprobe_links.supported()
    )
    if missing:
        return Check("privileges", FAIL, f"{who}; missing {'; '.join(missing)}", PRIVILEGE_FIX)
    return Check("privileges", OK, who)


# --- raw bpf(2): no BCC needed ------------------------------------------------------------------


def _bpf(cmd: int, attr: bytes) -> int:
    """Call bpf(2) directly and return the new fd; raises OSError with the kernel's errno."""
    nr = BPF_SYSCALL_NR.get(platform.machine())
    if nr is None:
        raise OSError(errno.ENOSYS, f"no known bpf(2) syscall number for {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(attr.ljust(BPF_ATTR_SIZE, b"\0"), BPF_ATTR_SIZE)
    fd: int = libc.syscall(ctypes.c_long(nr), ctypes.c_long(cmd), buf, ctypes.c_ulong(BPF_ATTR_SIZE))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return fd


def _bpf_errno_check(name: str, err: OSError, what: str) -> Check:
    if err.errno in (errno.EPERM, errno.EACCES):
        return Check(
            name, FAIL, f"kernel refused to {what} ({errno.errorcode[err.errno]}): not privileged", PRIVILEGE_FIX
        )
    if err.errno == errno.ENOSYS:
        return Check(
            name,
            MISSING,
            f"cannot {what}: {err.strerror} (kernel without CONFIG_BPF_SYSCALL)",
            "use a kernel built with CONFIG_BPF_SYSCALL=y",
        )
    return Check(name, FAIL, f"cannot {what}: {err.strerror}", "see the kernel log (dmesg) for the cause")


def check_bpf_syscall() -> Check:
    """Load `r0 = 0; exit` as a tracepoint program: the smallest thing that needs tracing privileges."""
    insns = ctypes.create_string_buffer(bytes([0xB7, 0, 0, 0, 0, 0, 0, 0]) + bytes([0x95, 0, 0, 0, 0, 0, 0, 0]), 16)
    license_ = ctypes.create_string_buffer(b"GPL")
    attr = (
        BPF_PROG_TYPE_TRACEPOINT.to_bytes(4, "little")
        + (2).to_bytes(4, "little")
        + ctypes.addressof(insns).to_bytes(8, "little")
        + ctypes.addressof(license_).to_bytes(8, "little")
    )
    try:
        os.close(_bpf(BPF_PROG_LOAD, attr))
    except OSError as err:
        return _bpf_errno_check("bpf syscall", err, "load a tracepoint program")
    return Check("bpf syscall", OK, "loaded a 2-instruction tracepoint program with bpf(2)")


def check_ring_buffer() -> Check:
    size = os.sysconf("SC_PAGE_SIZE")
    attr = b"".join(v.to_bytes(4, "little") for v in (BPF_MAP_TYPE_RINGBUF, 0, 0, size))
    try:
        os.close(_bpf(BPF_MAP_CREATE, attr))
    except OSError as err:
        if err.errno == errno.EINVAL:
            return Check(
                "ring buffer",
                MISSING,
                "BPF_MAP_TYPE_RINGBUF rejected (EINVAL): kernel older than 5.8",
                "use a kernel >= 5.8",
            )
        return _bpf_errno_check("ring buffer", err, "create a BPF ring buffer")
    return Check("ring buffer", OK, f"created a {size} B BPF_MAP_TYPE_RINGBUF map")


# --- files the kernel exposes ----------------------------------------------------------------------


def check_btf() -> Check:
    btf = Path("/sys/kernel/btf/vmlinux")
    if btf.is_file():
        return Check("btf", OK, f"{btf} ({btf.stat().st_size // 1024} KiB)", required=False)
    return Check(
        "btf", MISSING, f"no {btf} (CONFIG_DEBUG_INFO_BTF off); optional: BCC compiles with headers", required=False
    )


def _mounts() -> list[tuple[str, str]]:
    """(fstype, mount point) pairs of this mount namespace."""
    return [(f[2], f[1]) for f in (line.split() for line in Path("/proc/self/mounts").read_text().splitlines())]


def check_tracefs() -> Check:
    mounts = _mounts()
    tracefs = [point for fstype, point in mounts if fstype == "tracefs"]
    if tracefs:
        return Check("tracefs", OK, f"tracefs mounted at {', '.join(tracefs)}")
    if ("debugfs", "/sys/kernel/debug") in mounts:
        return Check("tracefs", OK, "debugfs at /sys/kernel/debug (tracefs automounts at /sys/kernel/debug/tracing)")
    return Check(
        "tracefs", MISSING, "tracefs not mounted: tracepoints cannot attach and BCC cannot detach uprobes", TRACEFS_FIX
    )


def _uts_release(build_dir: Path) -> str:
    header = build_dir / "include/generated/utsrelease.h"
    try:
        return header.read_text().split('"')[1]
    except (OSError, IndexError):
        return "unknown release"


def check_headers() -> Check:
    release = os.uname().release
    override = os.environ.get("BCC_KERNEL_SOURCE")
    if override:
        return Check("kernel headers", OK, f"BCC_KERNEL_SOURCE={override} (set in the environment)")
    build = Path(f"/lib/modules/{release}/build")
    if (build / "include").is_dir():
        target = build.resolve()
        headers = _uts_release(target)
        if headers == release:
            return Check("kernel headers", OK, f"{build} -> {target} (the running kernel's)")
        return Check(
            "kernel headers",
            OK,
            f"FALLBACK {build} -> {target} ({headers}, not {release}): BCC compiles, struct layouts"
            " are not the running kernel's, and otelbpf never reads kernel structs",
        )
    if Path("/sys/kernel/kheaders.tar.xz").is_file():
        return Check("kernel headers", OK, "/sys/kernel/kheaders.tar.xz (the kernel's built-in headers)")
    if (found := installed_headers()) is not None:
        return Check(
            "kernel headers",
            OK,
            f"FALLBACK none for {release}: the agent compiles against {found[0]} (BCC_KERNEL_SOURCE); "
            "otelbpf never reads kernel structs",
        )
    return Check(
        "kernel headers",
        MISSING,
        f"no {build} and no /sys/kernel/kheaders.tar.xz: BCC cannot compile",
        f"{SETUP_FIX} (installs linux-headers and links {build})",
    )


# --- BCC ------------------------------------------------------------------------------------------


def check_bcc_import() -> tuple[Check, ModuleType | None]:
    try:
        import bcc
    except ImportError as err:
        return Check(
            "bcc",
            FAIL,
            f"`import bcc` failed in {sys.executable}: {err}",
            "run the doctor from the project venv (.venv/bin/otelbpf doctor); scripts/setup.sh"
            " installs python3-bpfcc and links its bcc module into .venv",
        ), None
    except OSError as err:
        return Check("bcc", FAIL, f"bcc could not load libbcc: {err}", "apt-get install libbpfcc"), None
    return Check("bcc", OK, f"bcc {bcc.__version__} from {Path(bcc.__file__).parent}"), bcc


def compile_probes(bcc: ModuleType) -> tuple[Check, Any]:
    started = time.monotonic()
    with _capture_bcc_output() as err:
        try:
            bpf = bcc.BPF(text=PROBE_PROGRAMS, cflags=[f"-DDOCTOR_TGID={os.getpid()}"])
        except Exception as exc:  # BCC raises bare Exception for compile and load errors
            bpf = None
            error = exc
    if bpf is None:
        return Check("bcc compile", FAIL, _with_output(error, err), f"{SETUP_FIX} (kernel headers)"), None
    return Check("bcc compile", OK, f"compiled the probe programs in {time.monotonic() - started:.2f} s"), bpf


def _hits(bpf: Any, slot: int) -> int:
    return int(bpf["doctor_hits"][ctypes.c_int(slot)].value)


def _uprobe_fix(error_text: str) -> str:
    from otelbpf.sensor import uprobe_links

    mask = effective_capabilities(Path("/proc/self/status").read_text())
    if uprobe_links.supported():
        return "grant CAP_BPF and CAP_PERFMON (or run as root): uprobe-multi links need them"
    if not has_capability(mask, "CAP_SYS_ADMIN"):
        return "grant CAP_SYS_ADMIN (or run as root): BCC's uprobes need it; see docs/capabilities.md"
    if "uprobe_events" in error_text:
        return TRACEFS_FIX
    return "check that the kernel has CONFIG_UPROBE_EVENTS=y"


def check_uprobes(bpf: Any) -> Check:
    """Attach to libc's getpid in this process only, call it, and see the probe count the calls:
    as the sensor attaches, a uprobe-multi link where the kernel has them, else a perf event."""
    from otelbpf.sensor import uprobe_links

    if uprobe_links.supported():
        return _check_uprobe_link(bpf)
    pid = os.getpid()
    with _capture_bcc_output() as err:
        try:
            bpf.attach_uprobe(name="c", sym="getpid", fn_name=b"on_uprobe", pid=pid)
            error = None
        except Exception as exc:
            error = exc
    if error is not None:
        text = _with_output(error, err)
        return Check("uprobes", FAIL, f"attaching to libc getpid failed: {text}", _uprobe_fix(text))
    for _ in range(3):
        os.getpid()  # CPython calls libc getpid() every time
    hits = _hits(bpf, UPROBE_SLOT)
    with _capture_bcc_output() as err:
        try:
            bpf.detach_uprobe(name="c", sym="getpid", pid=pid)
            detached = ""
        except Exception as exc:
            detached = f"; detaching failed: {_with_output(exc, err)}"
    if hits < 3:
        return Check(
            "uprobes",
            FAIL,
            f"attached to libc getpid but saw {hits} of 3 calls{detached}",
            "check dmesg for uprobe errors",
        )
    return Check(
        "uprobes", OK, f"uprobe on libc getpid fired for {hits} of 3 calls{detached}", TRACEFS_FIX if detached else ""
    )


def _check_uprobe_link(bpf: Any) -> Check:
    import bcc

    from otelbpf.sensor import uprobe_links

    pid = os.getpid()
    try:
        path, offset = bcc.BPF._check_path_symbol(b"c", b"getpid", 0, pid)
        fn = bpf.load_func(b"on_uprobe", bcc.BPF.KPROBE, attach_type=uprobe_links.BPF_TRACE_UPROBE_MULTI)
        fd = uprobe_links.link(fn.fd, os.fsdecode(path), offset, ret=False, pid=pid)
    except Exception as exc:
        return Check("uprobes", FAIL, f"linking to libc getpid failed: {exc}", _uprobe_fix(str(exc)))
    try:
        for _ in range(3):
            os.getpid()  # CPython calls libc getpid() every time
        hits = _hits(bpf, UPROBE_SLOT)
    finally:
        os.close(fd)
    if hits < 3:
        return Check(
            "uprobes", FAIL, f"linked to libc getpid but saw {hits} of 3 calls", "check dmesg for uprobe errors"
        )
    return Check("uprobes", OK, f"uprobe on libc getpid (a uprobe-multi link) fired for {hits} of 3 calls")


def check_uprobe_links() -> Check:
    """Whether the sensor's uprobes are uprobe-multi links (fast to attach and release) or perf
    events (each release waits out grace periods under a kernel-wide mutex that attaches wait on)."""
    from otelbpf.sensor import uprobe_links

    if uprobe_links.supported():
        return Check("uprobe links", OK, "uprobes attach as uprobe-multi BPF links", required=False)
    return Check(
        "uprobe links",
        MISSING,
        "uprobes attach as perf events: each release takes a grace period and holds up every attach "
        "meanwhile (a new library's pause, the agent's stop)",
        "Linux 6.6+ has uprobe-multi links (or OTELBPF_UPROBE_MULTI=0 is set)",
        required=False,
    )


def check_tracepoints(bpf: Any) -> Check:
    with _capture_bcc_output() as err:
        try:
            bpf.attach_tracepoint(tp=TRACEPOINT, fn_name=b"on_tracepoint")
            error = None
        except Exception as exc:
            error = exc
    if error is not None:
        text = _with_output(error, err)
        fix = TRACEFS_FIX if "No such file" in text else PRIVILEGE_FIX
        return Check("tracepoints", FAIL, f"attaching to {TRACEPOINT} failed: {text}", fix)
    os.getpid()
    hits = _hits(bpf, TRACEPOINT_SLOT)
    with _capture_bcc_output():
        bpf.detach_tracepoint(tp=TRACEPOINT)
    if hits < 1:
        return Check(
            "tracepoints",
            FAIL,
            f"attached to {TRACEPOINT} but it never fired",
            "check that the kernel has CONFIG_FTRACE_SYSCALLS=y",
        )
    return Check("tracepoints", OK, f"{TRACEPOINT} fired for this process")


def check_perf_events(bpf: Any, bcc: ModuleType) -> Check:
    """Sample cpu-clock at 999 Hz on every CPU while spinning, until a sample lands (at most 0.3 s)."""
    kind, config = bcc.PerfType.SOFTWARE, bcc.PerfSWConfig.CPU_CLOCK
    with _capture_bcc_output() as err:
        try:
            bpf.attach_perf_event(ev_type=kind, ev_config=config, fn_name=b"on_perf_event", sample_freq=999)
            error = None
        except Exception as exc:
            error = exc
    if error is not None:
        return Check("perf events", FAIL, f"cpu-clock: {_with_output(error, err)}", PRIVILEGE_FIX, required=False)
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline and _hits(bpf, PERF_SLOT) == 0:
        pass
    hits = _hits(bpf, PERF_SLOT)
    bpf.detach_perf_event(ev_type=kind, ev_config=config)
    if hits == 0:
        return Check(
            "perf events",
            FAIL,
            "cpu-clock attached but took no sample in 0.3 s",
            "check kernel.perf_event_max_sample_rate",
            required=False,
        )
    return Check("perf events", OK, f"cpu-clock sampled at 999 Hz ({hits} sample(s) in the first spin)", required=False)


def check_kprobes(bpf: Any) -> Check:
    event = bpf.get_syscall_fnname("getpid")
    with _capture_bcc_output() as err:
        try:
            bpf.attach_kprobe(event=event, fn_name=b"on_kprobe")
            error = None
        except Exception as exc:
            error = exc
    if error is None:
        bpf.detach_kprobe(event=event)
        return Check("kprobes", OK, f"attached a kprobe to {event.decode()}", required=False)
    if not Path("/sys/bus/event_source/devices/kprobe").exists():
        return Check(
            "kprobes",
            MISSING,
            "CONFIG_KPROBES is off (no kprobe PMU); optional: otelbpf uses uprobes and tracepoints",
            required=False,
        )
    return Check("kprobes", FAIL, f"{event.decode()}: {_with_output(error, err)}; optional", required=False)


def check_fentry(bcc: ModuleType) -> Check:
    if platform.machine() != "x86_64" or not Path("/sys/kernel/btf/vmlinux").is_file():
        return Check(
            "fentry", MISSING, "BCC's fentry needs x86_64 and /sys/kernel/btf/vmlinux; optional", required=False
        )
    with _capture_bcc_output() as err:
        try:
            bpf = bcc.BPF(text=FENTRY_PROGRAM)
            error = None
        except Exception as exc:
            error = exc
    if error is None:
        _release(bpf)
        return Check("fentry", OK, f"loaded and attached an fentry program on {FENTRY_TARGET}", required=False)
    if "Operation not permitted" in err.text:
        reason = "EPERM although tracepoint programs load: this kernel has no usable BPF trampolines"
    else:
        reason = _with_output(error, err)
    return Check(
        "fentry", MISSING, f"kernel refused an fentry program on {FENTRY_TARGET}: {reason}; optional", required=False
    )


def _release(bpf: Any) -> None:
    """Detach everything now; BCC's own atexit cleanup would raise again if tracefs is missing."""
    with _capture_bcc_output():
        try:
            bpf.cleanup()
        except Exception:
            pass  # the uprobes check already reported the detach failure
    atexit.unregister(bpf.cleanup)


def _guarded(name: str, check: Callable[..., Check], *args: Any) -> Check:
    """Run a BCC-based check; BCC raises bare Exceptions from detach paths too, and the report must finish."""
    try:
        return check(*args)
    except Exception as exc:
        return Check(
            name,
            FAIL,
            f"unexpected error from BCC: {exc}",
            "report this with the doctor's full output",
            required=name not in OPTIONAL_PROBES,
        )


def _skip(names: list[str], reason: str) -> Iterator[Check]:
    for name in names:
        yield Check(name, SKIP, f"not tried: {reason}", required=name not in OPTIONAL_PROBES)


def bcc_checks(bpf_loads: bool) -> Iterator[Check]:
    """The checks that need BCC: import, compile, then each probe kind attached and fired."""
    probes = ["uprobes", "tracepoints", "perf events", "kprobes", "fentry"]
    imported, bcc = check_bcc_import()
    yield imported
    if bcc is None:
        yield from _skip(["bcc compile", *probes], "bcc is not importable")
        return
    if not bpf_loads:
        yield from _skip(["bcc compile", *probes], "the bpf syscall check failed")
        return
    compiled, bpf = compile_probes(bcc)
    yield compiled
    if bpf is None:
        yield from _skip(probes, "the probe programs did not compile")
        return
    try:
        yield _guarded("uprobes", check_uprobes, bpf)
        yield _guarded("tracepoints", check_tracepoints, bpf)
        yield _guarded("perf events", check_perf_events, bpf, bcc)
        yield _guarded("kprobes", check_kprobes, bpf)
    finally:
        _release(bpf)
    yield _guarded("fentry", check_fentry, bcc)


def check_nvml() -> Check:
    """The gpu receiver's source: can NVML (the driver's libnvidia-ml.so.1) be opened?"""
    from otelbpf.families.gpu.nvml import probe

    opened, detail = probe()
    if opened:
        return Check("NVML", OK, f"{detail}: the gpu receiver reads them", required=False)
    why = "no driver" if detail in ("library_not_found", "driver_not_loaded") else f"cannot be opened ({detail})"
    return Check(
        "NVML",
        MISSING,
        f"{why} — the gpu receiver stays idle",
        "install the NVIDIA driver (libnvidia-ml.so.1) where there is a GPU",
        required=False,
    )


#: The embedded default's ``service.program_cache.directory``.
PROGRAM_CACHE = "/var/cache/otelbpf"


def check_program_cache(path: str = PROGRAM_CACHE) -> Check:
    """Whether starts can load compiled programs from the default cache directory (the agent
    refuses one it does not own or others can write in: what it reads goes into the kernel)."""
    name = "program cache"
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return Check(name, OK, f"{path} absent: the first start compiles and creates it", required=False)
    except OSError as exc:
        return Check(name, FAIL, f"{path}: {exc.strerror}: every start compiles", required=False)
    if not stat.S_ISDIR(st.st_mode):
        why = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a directory"
        return Check(name, FAIL, f"{path} is {why}: not used, every start compiles", f"rm {path}", required=False)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return Check(
            name,
            FAIL,
            f"{path} (uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}) is not the agent's alone: not used, "
            "every start compiles",
            f"chown {os.geteuid()} {path} && chmod 700 {path}",
            required=False,
        )
    try:
        entries = sum(1 for e in os.scandir(path) if e.name.endswith(".bpfprog.json"))
    except OSError as exc:
        return Check(name, FAIL, f"{path}: {exc.strerror}", required=False)
    return Check(name, OK, f"{path}: {entries} compiled program(s) kept for starts without a compile", required=False)


def host_checks() -> Iterator[Check]:
    yield check_privileges()
    bpf_syscall = check_bpf_syscall()
    yield bpf_syscall
    yield check_ring_buffer()
    yield check_btf()
    yield check_tracefs()
    yield check_headers()
    yield from bcc_checks(bpf_syscall.status == OK)
    if bpf_syscall.status == OK:
        yield check_uprobe_links()
    yield check_program_cache()
    yield check_nvml()


# --- processes mapping GPU / RDMA libraries ------------------------------------------------------


def libraries_in_maps(maps_text: str) -> list[tuple[str, str]]:
    """(kind, path) for each distinct CUDA/NCCL/ibverbs library file in a /proc/PID/maps text."""
    found: dict[str, str] = {}
    for m in parse_maps(maps_text):
        name = m.file.rsplit("/", 1)[1]
        for kind, pattern in LIBRARY_PATTERNS:
            if fnmatch.fnmatchcase(name, pattern):
                found.setdefault(m.file, kind)
    return [(kind, path) for path, kind in found.items()]


def scan_processes(proc: Path = Path("/proc")) -> ProcessScan:
    """Read every process's maps; processes may exit mid-scan, and others' need CAP_SYS_PTRACE."""
    libraries: list[MappedLibrary] = []
    scanned = vanished = denied = 0
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            maps = Path(entry.path, "maps").read_text()
            comm = Path(entry.path, "comm").read_text().strip()
        except (FileNotFoundError, ProcessLookupError):
            vanished += 1
            continue
        except PermissionError:
            denied += 1
            continue
        scanned += 1
        pid = int(entry.name)
        libraries.extend(MappedLibrary(pid, comm, kind, path) for kind, path in libraries_in_maps(maps))
    libraries.sort(key=lambda lib: (lib.pid, lib.kind, lib.path))
    return ProcessScan(libraries, scanned, vanished, denied)


def _write_scan(scan: ProcessScan, out: TextIO) -> None:
    mask = effective_capabilities(Path("/proc/self/status").read_text())
    out.write(f"\nCUDA / NCCL / ibverbs libraries mapped by running processes ({scan.scanned} scanned):\n")
    for lib in scan.libraries:
        out.write(f"  pid {lib.pid} ({lib.comm}): {lib.kind} {lib.path}\n")
    if not scan.libraries:
        out.write("  none: no running process maps libcudart, libcuda, libnccl or libibverbs\n")
    if scan.denied and not has_capability(mask, "CAP_SYS_PTRACE"):
        out.write(f"  {scan.denied} process(es) could not be read: run as root or grant CAP_SYS_PTRACE\n")
    elif scan.denied:
        out.write(f"  {scan.denied} process(es) could not be read (they hold capabilities this process lacks)\n")
    if scan.vanished:
        out.write(f"  {scan.vanished} process(es) exited during the scan\n")


# --- report ---------------------------------------------------------------------------------------


def _write_verdict(checks: list[Check], out: TextIO) -> int:
    blockers = [c for c in checks if c.required and c.status in (FAIL, MISSING)]
    optional = [c for c in checks if not c.required and c.status in (FAIL, MISSING)]
    if blockers:
        out.write("\nResult: the sensor CANNOT run on this host:\n")
        given: set[str] = set()
        for check in blockers:
            fix = "the same as above" if check.fix in given else check.fix
            given.add(check.fix)
            out.write(f"  - {check.name}: {check.detail}\n    fix: {fix}\n")
    else:
        out.write("\nResult: OK, the sensor can run on this host.\n")
    if optional:
        names = ", ".join(c.name for c in optional)
        out.write(f"Optional features unavailable (otelbpf works without them): {names}\n")
    return 1 if blockers else 0


def run_doctor(out: TextIO = sys.stdout) -> int:
    """Print what this host can do for the sensor; return 0 when the sensor can run, 1 otherwise."""
    uname = os.uname()
    out.write(
        f"otelbpf doctor: kernel {uname.release} ({uname.machine}), python {platform.python_version()}"
        f" at {sys.executable}\n"
    )
    checks = []
    for check in host_checks():
        checks.append(check)
        out.write(f"{check.status:<8} {check.name:<15} {check.detail}\n")
        out.flush()
    _write_scan(scan_processes(), out)
    from otelbpf.live.agents import running_report  # an agent running here: what it lost, and why

    running_report(out)
    return _write_verdict(checks, out)
