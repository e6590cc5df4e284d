"""Dropping clean file pages (base/resident.py), on mappings made here with libc's mmap: what is
dropped leaves residence and reads back the same; a read-only mapping holding written pages,
a writable one and a shared one are never touched. The fixed mmap threshold, in a fresh
interpreter each: large blocks freed leave residence."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from otelbpf.base.resident import drop_file_pages, every_file

PAGE = os.sysconf("SC_PAGE_SIZE")
PAGES = 64
PROT_READ, PROT_WRITE = 1, 2
MAP_SHARED, MAP_PRIVATE = 1, 2

libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "code.bin"
    path.write_bytes(bytes(range(256)) * (PAGES * PAGE // 256))
    return path


@contextmanager
def mapped(path: Path, prot: int, flags: int) -> Iterator[int]:
    fd = os.open(path, os.O_RDWR)
    try:
        address = libc.mmap(None, PAGES * PAGE, prot, flags, fd, 0)
        assert address not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
    finally:
        os.close(fd)
    try:
        yield address
    finally:
        libc.munmap(address, PAGES * PAGE)


def touch(address: int) -> bytes:
    return ctypes.string_at(address, PAGES * PAGE)  # reads every page in


def resident(address: int) -> tuple[int, int]:
    """(Rss, Anonymous) bytes of this process's mapping that starts at ``address``."""
    found, rss, anon = False, 0, 0
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(" ", 1)[0]
            if "-" in head and ":" not in head:
                found = int(head.split("-", 1)[0], 16) == address
            elif found and line.startswith("Rss:"):
                rss = int(line.split()[1]) * 1024
            elif found and line.startswith("Anonymous:"):
                anon = int(line.split()[1]) * 1024
    return rss, anon


def only(path: Path):
    return lambda p: p == str(path)


def test_a_read_only_private_file_mapping_is_dropped_and_reads_back_the_same(data_file):
    with mapped(data_file, PROT_READ, MAP_PRIVATE) as address:
        before = touch(address)
        assert resident(address) == (PAGES * PAGE, 0)
        assert drop_file_pages(only(data_file)) == PAGES * PAGE
        assert resident(address)[0] == 0
        assert touch(address) == before == data_file.read_bytes()  # read in again from the file


def test_a_mapping_with_written_pages_is_never_dropped(data_file):
    """Private pages written and then made read-only (as the loader does with relocated data):
    dropping them would bring back the file's bytes in place of what was written."""
    with mapped(data_file, PROT_READ | PROT_WRITE, MAP_PRIVATE) as address:
        touch(address)
        ctypes.memset(address, 0xAB, PAGE)  # one page written: copied, anonymous
        assert libc.mprotect(address, PAGES * PAGE, PROT_READ) == 0
        rss, anon = resident(address)
        assert anon == PAGE and rss == PAGES * PAGE
        assert drop_file_pages(only(data_file)) == 0
        assert resident(address) == (rss, anon)
        assert ctypes.string_at(address, PAGE) == b"\xab" * PAGE


@pytest.mark.parametrize(("prot", "flags"), [(PROT_READ | PROT_WRITE, MAP_PRIVATE), (PROT_READ, MAP_SHARED)])
def test_writable_and_shared_mappings_are_not_candidates(data_file, prot, flags):
    with mapped(data_file, prot, flags) as address:
        touch(address)
        assert drop_file_pages(only(data_file)) == 0
        assert resident(address)[0] == PAGES * PAGE


def test_devices_and_memfds_are_not_files():
    assert every_file("/usr/lib/x86_64-linux-gnu/libc.so.6")
    assert every_file("/usr/lib/libfoo.so (deleted)")
    for path in ("/dev/nvidia0", "/dev/zero", "/memfd:sealed (deleted)", "[vdso]", "anon_inode:bpf-map", ""):
        assert not every_file(path)


_HELD_AFTER_FREE = """
import sys, threading
import numpy as np
from otelbpf.base.resident import fix_mmap_threshold

def anon_mib():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024

fixed = fix_mmap_threshold() if sys.argv[1] == "fix" else False
keep, held = [], []

def work():  # on a thread, in an arena of its own, as the agent's processing thread
    before = anon_mib()
    big = np.ones(16 << 20, np.uint8)
    del big  # a freed 16 MiB mapping: glibc raises its threshold to it unless fixed
    blocks = []
    for _ in range(16):
        blocks.append(np.ones(2 << 20, np.uint8))
        keep.append(np.ones(4000, np.uint8))  # a small block stays live above each large one
    del blocks[:]
    held.append(anon_mib() - before)

t = threading.Thread(target=work)
t.start()
t.join()
print(fixed, round(held[0]))
"""


def _held_after_free(mode: str, env: dict[str, str] | None = None) -> tuple[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", _HELD_AFTER_FREE, mode],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **(env or {})},
    ).stdout.split()
    return out[0], int(out[1])


def test_a_fixed_mmap_threshold_gives_large_blocks_back_when_freed():
    """glibc's own behaviour first, so the test shows what the fix changes: 32 MiB of 2 MiB
    blocks freed stay resident after a larger freed block raised the threshold."""
    fixed, held = _held_after_free("raised")
    assert (fixed, held) == ("False", 32)
    fixed, held = _held_after_free("fix")
    assert fixed == "True"
    assert held <= 2


def test_an_operators_glibc_tunable_is_kept():
    fixed, held = _held_after_free("fix", {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=33554432"})
    assert (fixed, held) == ("False", 32)
