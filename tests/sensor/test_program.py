"""The assembled BPF program, compiled and loaded by BCC as the agent does, then driven by
real syscalls: library opens, forks, execs, exits, and a process stopped at its open."""

from __future__ import annotations

import ctypes
import os
import re
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from harness import cached_load
from harness.agent import FAKE_CUDART, wait_until
from otelbpf.base.events import EVENT_DTYPE, STREVENT_DTYPE, Kind, StrKind
from otelbpf.families.cuda.probes import cuda_family
from otelbpf.jobguard import close_pause_gate
from otelbpf.sensor import program
from otelbpf.sensor.ringbuf import RingBufferReader

EVENTS_RING = 64 << 10
STR_RING = 256 << 10
FAMILY = cuda_family(["cudart", "cuda"], launch_errors=True)


class Loaded:
    """One build of the program, loaded, with readers on both rings."""

    def __init__(self, cached: bool = False, **options: bool) -> None:
        text, cflags = program.build([FAMILY], events_ring_bytes=EVENTS_RING, str_ring_bytes=STR_RING, **options)
        self.bpf = cached_load.load(text, cflags, [], cached=cached)  # tail calls left out: placed by a test
        self.events = RingBufferReader(self.bpf[b"events"].map_fd, EVENTS_RING, EVENT_DTYPE)
        self.strings = RingBufferReader(self.bpf[b"strevents"].map_fd, STR_RING, STREVENT_DTYPE)

    def watch(self, pid: int) -> None:
        watched = self.bpf[b"watched"]
        watched[watched.Key(pid)] = watched.Leaf(1)

    def unwatch_all(self) -> None:
        self.bpf[b"watched"].clear()

    def opened(self) -> list[tuple[int, str, int]]:
        """(pid, path, paused) of every library open reported since the last call; the
        exec reports among them (``exec``, for executables recognised by content) are kept
        in ``executed``."""
        recs = self.strings.drain()
        assert (recs["kind"] == StrKind.LIB_OPEN).all()
        flags = recs["exec"].tolist()
        rows = [(int(r["pid"]), r["s"].split(b"\0", 1)[0].decode(), int(r["paused"])) for r in recs]
        self.executed = [row for row, f in zip(rows, flags) if f == 1]
        return [row for row, f in zip(rows, flags) if f == 0]

    def close(self) -> None:
        self.events.close()
        self.strings.close()
        self.bpf.cleanup()


@pytest.fixture(scope="module", params=[False, True], ids=["compiled", "cached"])
def filtered(request: pytest.FixtureRequest) -> Iterator[Loaded]:
    loaded = Loaded(cached=request.param, filter_pids=True)
    try:
        yield loaded
    finally:
        loaded.close()


@pytest.fixture
def watching_me(filtered: Loaded) -> Iterator[Loaded]:
    filtered.unwatch_all()
    filtered.events.drain()
    filtered.strings.drain()
    filtered.watch(os.getpid())
    try:
        yield filtered
    finally:
        filtered.unwatch_all()


def try_open(path: Path | str, dir_fd: int | None = None) -> None:
    try:
        os.close(os.open(path, os.O_RDONLY, dir_fd=dir_fd))
    except FileNotFoundError:
        pass


def comm(rec: np.void) -> str:
    return np.array([rec["a0"], rec["a1"]], dtype="<u8").tobytes().split(b"\0", 1)[0].decode()


def test_library_filter_is_byte_comparisons_one_per_distinct_prefix() -> None:
    c = program.library_filter_c(["libcuda.so", "libcudart.so", "libcuda.so"])
    assert c.count("return 1;") == 2
    assert '"' not in c  # no string literals, so no .rodata
    first = re.search(r"if \((.*)\)", c).group(1)
    assert first == " && ".join(f"name[{i}] == {ord(ch)}" for i, ch in enumerate("libcuda.so"))


def test_a_library_whose_openers_are_not_library_users_is_told_apart() -> None:
    c = program.library_filter_c(["libcudart.so", "libssl"], unmarked={"libssl"})
    assert c.count("return 1;") == 1 and c.count("return 2;") == 1


def test_a_family_s_c_comes_after_the_families_it_uses_whatever_the_config_order() -> None:
    from otelbpf.sensor.family import ProbeFamily

    def fam(name: str, *after: str) -> ProbeFamily:
        return ProbeFamily(name=name, c_file=f"{name}.c", libraries=(), after=after)

    tls, sockets, cuda = fam("tls", "sockets"), fam("sockets"), fam("cuda")
    assert [f.name for f in program.source_order([tls, cuda, sockets])] == ["cuda", "sockets", "tls"]
    assert [f.name for f in program.source_order([sockets, tls, cuda])] == ["sockets", "tls", "cuda"]
    with pytest.raises(ValueError, match="needs the sockets"):
        program.source_order([tls, cuda])
    with pytest.raises(ValueError, match="need each other"):
        program.source_order([fam("a", "b"), fam("b", "a")])


@pytest.mark.bpf
def test_every_generated_entry_point_passes_the_verifier(filtered: Loaded) -> None:
    from bcc import BPF

    programs = {p for kind in FAMILY.libraries for spec in kind.probes for p in (spec.entry, spec.ret) if p}
    assert len(programs) > 20
    for name in sorted(programs):
        assert filtered.bpf.load_func(name.encode(), BPF.KPROBE).fd >= 0, name


@pytest.mark.bpf
def test_ring_sizes_come_from_the_build_options(filtered: Loaded) -> None:
    assert filtered.bpf[b"events"].max_entries == EVENTS_RING
    assert filtered.bpf[b"strevents"].max_entries == STR_RING


@pytest.mark.bpf
def test_only_successful_opens_of_wanted_libraries_are_reported(watching_me: Loaded, tmp_path: Path) -> None:
    for name in ("libcudart.so.12", "libcuda.so.1", "libcublas.so.12", "xlibcudart.so.12", "libcudart_static.a"):
        (tmp_path / name).write_bytes(b"")
    watching_me.opened()  # creating them opened them too
    try_open(tmp_path / "libcudart.so.12")
    try_open(tmp_path / "libcudart.so.13")  # absent: the open fails
    try_open(tmp_path / "libcublas.so.12")
    try_open(tmp_path / "xlibcudart.so.12")  # the prefix must start a path component
    try_open(tmp_path / "libcudart_static.a")
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try_open("libcuda.so.1", dir_fd=dir_fd)  # a relative name is tested from its start
    finally:
        os.close(dir_fd)
    assert watching_me.opened() == [
        (os.getpid(), str(tmp_path / "libcudart.so.12"), 0),
        (os.getpid(), "libcuda.so.1", 0),
    ]


@pytest.mark.bpf
def test_unwatched_processes_are_ignored(filtered: Loaded) -> None:
    filtered.unwatch_all()
    filtered.strings.drain()
    filtered.events.drain()
    try_open(FAKE_CUDART)
    subprocess.run(["true"], check=True)
    assert filtered.opened() == []
    assert len(filtered.events.drain()) == 0


@pytest.mark.bpf
def test_children_of_watched_processes_are_followed_through_exec_and_exit(watching_me: Loaded) -> None:
    child = subprocess.run(["/bin/sh", "-c", f"exec /usr/bin/head -c 0 {FAKE_CUDART}"], check=True)
    del child
    events = watching_me.events.drain()
    life = [(Kind(int(e["kind"])), comm(e)) for e in events]
    # sh execs head in the same process: two execs, one exit, all of one pid.
    assert life == [(Kind.PROC_EXEC, "sh"), (Kind.PROC_EXEC, "head"), (Kind.PROC_EXIT, "head")]
    assert len(set(events["pid"].tolist())) == 1 and events["pid"][0] != os.getpid()
    assert (np.diff(events["ts_ns"].astype(np.int64)) > 0).all()
    [(pid, path, paused)] = watching_me.opened()
    assert (pid, path, paused) == (int(events["pid"][0]), str(FAKE_CUDART), 0)
    # The cudart family recognises static runtimes in executables: each exec is reported with its path.
    assert watching_me.executed == [(pid, "/bin/sh", 0), (pid, "/usr/bin/head", 0)]


@pytest.mark.bpf
def test_pause_on_load_stops_the_process_at_its_open_until_resumed_while_the_gate_is_open() -> None:
    """The pause at load stops only while its gate (set by the agent, closed by its stop or by
    the command's guard when the agent dies: otelbpf/jobguard.py) is open."""
    loaded = Loaded(filter_pids=True, pause_on_load=True)
    gate = loaded.bpf[b"pause_gate"]
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; print('ready', flush=True)\n"
            "for _ in range(3):\n"
            f"    sys.stdin.readline(); open({str(FAKE_CUDART)!r}).close(); print('opened', flush=True)",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )

    def state() -> str:
        with open(f"/proc/{child.pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]

    def open_once() -> None:
        child.stdin.write("go\n")
        child.stdin.flush()

    def opened() -> None:
        ready, _, _ = select.select([child.stdout], [], [], 10)
        assert ready, f"child is {state()!r}, it did not open within 10 s"
        assert child.stdout.readline() == "opened\n"

    try:
        # Watched once past its exec (an exec of a watched process is reported, and paused, too).
        assert child.stdout.readline() == "ready\n"
        loaded.watch(child.pid)
        open_once()  # the gate is closed until user space opens it: not stopped
        opened()
        assert loaded.opened() == [(child.pid, str(FAKE_CUDART), 0)]
        gate[ctypes.c_int(0)] = ctypes.c_uint32(1)
        open_once()
        assert wait_until(lambda: state() == "T", timeout=10), f"child is {state()!r}, not stopped"
        assert loaded.opened() == [(child.pid, str(FAKE_CUDART), 1)]
        assert child.poll() is None
        close_pause_gate(gate.map_fd)  # as the guard does when the agent dies: bpf(2), no BCC
        os.kill(child.pid, signal.SIGCONT)
        opened()
        open_once()
        opened()
        assert loaded.opened() == [(child.pid, str(FAKE_CUDART), 0)]
        child.stdin.close()
        assert child.wait(timeout=10) == 0
    finally:
        child.kill()
        child.wait()
        loaded.close()


@pytest.mark.bpf
@pytest.mark.parametrize("cached", [False, True], ids=["compiled", "cached"])
def test_a_paired_call_goes_through_the_shared_program_and_is_counted_lost_without_it(
    tmp_path: Path, cached: bool
) -> None:
    """cudaMalloc's entry hands its arguments to ``cuda_call`` by a tail call (bpf/cuda.c
    hand_over): before the program is in its slot the call is counted (STAT_CALL_LOST),
    once it is the call becomes one event with its size and returned pointer."""
    import ctypes

    from otelbpf.base.events import Stat

    lib = tmp_path / "libcudart.so.12"  # a private inode: no other test's probes on it
    lib.write_bytes(FAKE_CUDART.read_bytes())
    loaded = Loaded(cached=cached, filter_pids=True)
    try:
        loaded.watch(os.getpid())
        bpf = loaded.bpf
        bpf.attach_uprobe(name=str(lib), sym="cudaMalloc", fn_name=b"uprobe_cudaMalloc")
        bpf.attach_uretprobe(name=str(lib), sym="cudaMalloc", fn_name=b"uretprobe_cuda")
        cudart = ctypes.CDLL(str(lib))
        stats = bpf[b"stats"]

        def lost() -> int:
            return int(sum(stats[stats.Key(int(Stat.CALL_LOST))]))

        def malloc(size: int) -> int:
            p = ctypes.c_void_p()
            assert cudart.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(size)) == 0
            return int(p.value or 0)

        malloc(4096)
        assert lost() == 1
        assert not (loaded.events.drain()["kind"] == Kind.CUDA_MALLOC).any()
        program.place_tail_calls(bpf, [FAMILY])
        ptr = malloc(8192)
        [e] = [e for e in loaded.events.drain() if e["kind"] == Kind.CUDA_MALLOC]
        assert (int(e["a0"]), int(e["a1"]), int(e["pid"])) == (8192, ptr, os.getpid())
        assert int(e["duration_ns"]) > 0 and lost() == 1
    finally:
        loaded.close()
