"""Uprobes as uprobe-multi links (``sensor/uprobe_links.py``), against BCC's perf events.

Real probes on real code: libc's ``getpid`` in this process, and NVIDIA's ``libcudart.so.13``
(a fresh copy: an inode nothing attached to before) under the sensor. A uprobe is an int3
written over the function's first instruction in every process that maps the file, so what
this process reads at the function's address says whether the probe is in place.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.agent import wait_until
from otelbpf.base.events import Kind
from otelbpf.families.cuda.probes import cuda_family
from otelbpf.sensor import elf, uprobe_links
from otelbpf.sensor.sensor import Sensor, SensorOptions

pytestmark = pytest.mark.bpf

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
CUDART13 = Path("/usr/local/cuda-13.0/lib64/libcudart.so.13")
INT3 = 0xCC
COUNT = r"""
BPF_ARRAY(hits, u64, 2);
static int count(int i) { u64 *v = hits.lookup(&i); if (v) __sync_fetch_and_add(v, 1); return 0; }
int on_entry(struct pt_regs *ctx) { return count(0); }
int on_return(struct pt_regs *ctx) { return count(1); }
"""
MALLOC_ONCE = (
    "import ctypes, json, os, sys\n"
    "lib = ctypes.CDLL(sys.argv[1])\n"
    "p = ctypes.c_void_p()\n"
    "print(json.dumps({'pid': os.getpid(), 'rc': lib.cudaMalloc(ctypes.byref(p), 4096)}))\n"
)


@pytest.fixture(autouse=True)
def _fresh_support_check():
    """``supported()`` is cached per process: each test decides it again, under its own env."""
    uprobe_links.supported.cache_clear()
    yield
    uprobe_links.supported.cache_clear()


def _first_byte(address: int) -> int:
    return ctypes.string_at(address, 1)[0]


def test_this_kernel_makes_uprobe_multi_links() -> None:
    """CI's kernel (6.18, like this machine's) has them; where one lacks them the sensor falls
    back to perf events (the next tests run both ways)."""
    if not uprobe_links.supported() and os.environ.get("CI") == "true":
        pytest.fail(f"kernel {os.uname().release}: no uprobe-multi links (Linux 6.6+ has them)")
    assert uprobe_links.supported()


def test_off_by_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("OTELBPF_UPROBE_MULTI", "0")
    assert not uprobe_links.supported()


def test_a_link_fires_at_entry_and_return_and_its_release_puts_the_code_back() -> None:
    libc = ctypes.CDLL(LIBC)
    [site] = elf.resolve(LIBC, ["getpid"])["getpid"]
    address = ctypes.cast(libc.getpid, ctypes.c_void_p).value + (site.probe_vaddr - site.vaddr)
    original = _first_byte(address)
    bpf = uprobe_links.bpf_class()(text=COUNT, uprobe_multi=True)
    links = uprobe_links.Links()
    try:
        links.attach(bpf, LIBC, site.probe_vaddr, "on_entry", ret=False)
        links.attach(bpf, LIBC, site.probe_vaddr, "on_return", ret=True)
        assert len(links) == 2
        assert _first_byte(address) == INT3
        for _ in range(3):
            libc.getpid()
        hits = bpf["hits"]
        assert (hits[0].value, hits[1].value) == (3, 3)
        links.close_all()
        assert len(links) == 0
        assert _first_byte(address) == original  # released at once, not after a grace period
        libc.getpid()
        assert (hits[0].value, hits[1].value) == (3, 3)
    finally:
        links.close_all()
        bpf.cleanup()


@pytest.fixture
def fresh_cudart(tmp_path: Path) -> Path:
    if not CUDART13.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{CUDART13} is missing: .ci/run must install the CUDA 13 toolkit")
        pytest.skip(f"no {CUDART13}")
    copy = tmp_path / "libcudart.so.13"
    shutil.copy(CUDART13.resolve(), copy)
    return copy


@pytest.mark.parametrize("multi", ["1", "0"], ids=["links", "perf events"])
def test_the_sensor_probes_the_same_either_way_and_stop_removes_every_probe(monkeypatch, fresh_cudart, multi):
    monkeypatch.setenv("OTELBPF_UPROBE_MULTI", multi)
    monkeypatch.setenv("OTELBPF_DETACH", "wait")
    families = [cuda_family(["cudart"])]
    lib = ctypes.CDLL(str(fresh_cudart))  # mapped here too: its probes show in this process
    [malloc] = elf.resolve(str(fresh_cudart), ["cudaMalloc"])["cudaMalloc"]
    address = ctypes.cast(lib.cudaMalloc, ctypes.c_void_p).value + (malloc.probe_vaddr - malloc.vaddr)
    original = _first_byte(address)
    events: list[np.ndarray] = []
    idle = subprocess.Popen(["sleep", "300"])  # watched: a process that maps no CUDA library
    sensor = Sensor(
        SensorOptions(families, pids=[idle.pid], search_globs=[str(fresh_cudart)]),
        lambda ring, arr: events.append(arr) if ring == "events" else None,
    )
    sensor.start()
    try:
        assert (sensor._links is not None) == (multi == "1")
        assert sensor.attach_stats.probes > 0 and not sensor.attach_stats.by_reason
        assert _first_byte(address) == INT3
        sensor.watch_pid(os.getpid())
        out = subprocess.run(
            [sys.executable, "-c", MALLOC_ONCE, str(fresh_cudart)], capture_output=True, text=True, check=True
        )
        pid = json.loads(out.stdout)["pid"]

        def mallocs() -> int:
            arr = np.concatenate(events) if events else np.zeros(0)
            return int(((arr["pid"] == pid) & (arr["kind"] == Kind.CUDA_MALLOC)).sum()) if len(arr) else 0

        assert wait_until(lambda: mallocs() == 1, timeout=10), "cudaMalloc was not seen once"
    finally:
        sensor.stop()
        idle.kill()
        idle.wait()
    assert _first_byte(address) == original
