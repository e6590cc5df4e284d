"""The symbolizer's caches are bounded (sizes from the config) and count what they evict."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time

import pytest

from otelbpf.base.procfs import read_maps
from otelbpf.config import DEFAULT_CONFIG_YAML, ConfigError
from otelbpf.correlate import symbolizer
from otelbpf.correlate.symbolizer import EVICTIONS, Symbolizer, _TableCache
from otelbpf.families.registry import load_config_text

LIBS = sorted({m.path for m in read_maps(os.getpid()) if m.path.endswith(".so") or ".so." in m.path})[:4]


def function_addresses(n: int) -> list[int]:
    """``n`` distinct code addresses of this process (libc's exported functions)."""
    libc = ctypes.CDLL(None)
    names = [
        "malloc",
        "free",
        "calloc",
        "realloc",
        "strlen",
        "memcpy",
        "memset",
        "strcmp",
        "getpid",
        "open",
        "close",
        "read",
        "write",
        "printf",
        "qsort",
        "strtol",
    ]
    return [ctypes.cast(getattr(libc, f), ctypes.c_void_p).value for f in names[:n]]


def test_resolved_names_are_bounded_and_evictions_counted():
    sym = Symbolizer(max_names=4)
    before = EVICTIONS["names"]
    addrs = function_addresses(10)
    names = [sym.resolve(os.getpid(), a) for a in addrs]
    assert "malloc" in names[0]
    assert len(sym._names) == 4
    assert EVICTIONS["names"] - before == 6
    # the most recently used survive; an evicted one is resolved again, to the same name
    assert sym.resolve(os.getpid(), addrs[0]) == names[0]
    assert EVICTIONS["names"] - before == 7


def test_process_snapshots_are_bounded_and_evictions_counted():
    sleeper = "import time; print('ready', flush=True); time.sleep(30)"
    procs = [subprocess.Popen([sys.executable, "-c", sleeper], stdout=subprocess.PIPE, text=True) for _ in range(3)]
    try:
        for p in procs:  # running Python: libc mapped (read right after the fork, it may not be yet)
            assert p.stdout is not None and p.stdout.readline() == "ready\n"
        sym = Symbolizer(max_processes=2)
        before = EVICTIONS["processes"]
        for p in procs:
            sym.remember(p.pid)
        assert list(sym._maps) == [procs[1].pid, procs[2].pid]
        assert EVICTIONS["processes"] - before == 1
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_symbol_tables_are_bounded_and_evictions_counted():
    assert len(LIBS) >= 3, LIBS
    cache = _TableCache(2)
    before = EVICTIONS["tables"]
    tables = []
    for path in LIBS[:3]:
        st = os.stat(path)
        tables.append(cache.get(path, st.st_dev, st.st_ino, int(st.st_mtime)))
    assert len(cache) == 2
    assert EVICTIONS["tables"] - before == 1
    st = os.stat(LIBS[2])
    assert cache.get(LIBS[2], st.st_dev, st.st_ino, int(st.st_mtime)) is tables[2]  # still cached
    st = os.stat(LIBS[0])
    again = cache.get(LIBS[0], st.st_dev, st.st_ino, int(st.st_mtime))
    assert again is not tables[0] and (again.addrs == tables[0].addrs).all()  # evicted: read anew
    assert EVICTIONS["tables"] - before == 2


def test_symbol_tables_fit_a_byte_budget_and_evictions_counted():
    sizes = {}
    for path in LIBS[:3]:
        st = os.stat(path)
        sizes[path] = _TableCache(8).get(path, st.st_dev, st.st_ino, int(st.st_mtime)).nbytes
    assert all(sizes.values()), sizes
    budget = sizes[LIBS[1]] + sizes[LIBS[2]]  # the two most recent fit, not the first as well
    cache = _TableCache(128, max_bytes=budget)
    before = EVICTIONS["tables"]
    tables = []
    for path in LIBS[:3]:
        st = os.stat(path)
        tables.append(cache.get(path, st.st_dev, st.st_ino, int(st.st_mtime)))
    assert cache.nbytes == budget
    assert len(cache) == 2
    assert EVICTIONS["tables"] - before == 1
    st = os.stat(LIBS[0])
    again = cache.get(LIBS[0], st.st_dev, st.st_ino, int(st.st_mtime))
    assert again is not tables[0] and (again.addrs == tables[0].addrs).all()  # evicted: read anew
    assert cache.nbytes <= budget or (len(cache) == 1 and cache.nbytes == again.nbytes)  # alone when larger


def test_a_table_larger_than_the_budget_is_still_kept_while_used():
    st = os.stat(LIBS[0])
    cache = _TableCache(128, max_bytes=1)
    table = cache.get(LIBS[0], st.st_dev, st.st_ino, int(st.st_mtime))
    assert cache.get(LIBS[0], st.st_dev, st.st_ino, int(st.st_mtime)) is table
    assert cache.nbytes == table.nbytes > 1


def test_one_library_through_many_map_files_links_is_one_entry():
    """Profiles read each process's libraries through /proc/PID/map_files: the cache keys
    them by inode, not by that per-process path, so they neither evict each other nor count."""
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) for _ in range(3)]
    try:
        cache = _TableCache(2)
        before = EVICTIONS["tables"]
        got = set()
        for p in procs:
            [m] = [m for m in read_maps(p.pid) if "libc.so" in m.path and m.executable]
            link = f"/proc/{p.pid}/map_files/{m.range_name}"
            st = os.stat(link)
            got.add(id(cache.get(link, st.st_dev, st.st_ino, int(st.st_mtime))))
        assert len(got) == 1 and len(cache) == 1
        assert EVICTIONS["tables"] == before
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_cache_sizes_come_from_the_config():
    cfg = load_config_text(DEFAULT_CONFIG_YAML)
    assert cfg.receivers["cuda"].symbol_names == 65536
    assert cfg.receivers["cuda"].symbol_tables == 128
    assert cfg.receivers["profiling"].symbol_tables == 128
    assert cfg.receivers["profiling"].symbol_table_bytes == 32 << 20
    small = DEFAULT_CONFIG_YAML.replace("    symbol_names: 65536\n", "    symbol_names: 16\n", 1)
    with pytest.raises(ConfigError, match="symbol_names"):
        load_config_text(small)


def test_the_agent_sizes_its_caches_from_the_config(monkeypatch, tmp_path):
    from otelbpf.agent import Agent

    monkeypatch.chdir(tmp_path)  # the default file exporter's ./otelbpf-out

    text = DEFAULT_CONFIG_YAML.replace("    symbol_names: 65536\n", "    symbol_names: 2048\n", 1)
    text = text.replace("    symbol_tables: 128\n", "    symbol_tables: 300\n")
    text = text.replace("    symbol_table_bytes: 32MiB\n", "    symbol_table_bytes: 24MiB\n")
    monkeypatch.setattr(symbolizer.TABLES, "max_tables", symbolizer.TABLES.max_tables)
    monkeypatch.setattr(symbolizer.TABLES, "max_bytes", symbolizer.TABLES.max_bytes)
    agent = Agent(load_config_text(text))
    assert agent.symbolizer._max_names == 2048
    assert symbolizer.TABLES.max_tables == 300
    assert symbolizer.TABLES.max_bytes == 24 << 20


def test_a_snapshot_holds_mappings_flat_and_gives_the_same_ones_back():
    maps = read_maps(os.getpid())
    snap = symbolizer._Snapshot(maps, 0)
    code = sorted((m for m in maps if m.executable), key=lambda m: m.start)
    for m in code:
        for addr in (m.start, m.end - 1):
            i = snap.find(addr)
            assert i is not None and snap.mapping(i) == m
        assert snap.find(m.end) is None or snap.mapping(snap.find(m.end)).start == m.end
    for m in maps:
        assert snap.file_at(m.start) == m
    assert snap.find(0) is None and snap.file_at(0) is None
    # paths are interned: one string however many snapshots name it
    other = symbolizer._Snapshot(read_maps(os.getpid()), 0)
    assert snap.mapping(snap.find(code[0].start)).path is other.mapping(other.find(code[0].start)).path


def test_snapshots_of_exited_processes_are_released_after_a_grace():
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) for _ in range(2)]
    live, dead = procs
    try:
        sym = Symbolizer(gone_grace_s=60, sweep_s=3600)
        for p in procs:
            sym.remember(p.pid)
        sym.resolve(dead.pid, function_addresses(1)[0])
        assert any(k[0] == dead.pid for k in sym._names)
        dead.kill()
        dead.wait()
        t0 = time.monotonic_ns()
        sym.release_exited(t0)  # found gone now: its names are still wanted for a while
        assert set(sym._maps) == {live.pid, dead.pid}
        sym.release_exited(t0 + 59 * 10**9)
        assert dead.pid in sym._maps
        sym.release_exited(t0 + 60 * 10**9)
        assert list(sym._maps) == [live.pid]
        assert not any(k[0] == dead.pid for k in sym._names)
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _mappings(path: str) -> dict[str, int]:
    """Resident KiB of each of this process's shared read-only mappings of ``path`` (a symbol
    table's names), by address range."""
    out: dict[str, int] = {}
    mine = ""
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(" ", 1)[0]
            if "-" in head and ":" not in head:
                fields = line.split()
                mine = head if fields[1] == "r--s" and len(fields) > 5 and fields[5] == path else ""
            elif mine and line.startswith("Rss:"):
                out[mine] = int(line.split()[1])
    return out


def test_a_tables_name_pages_are_unmapped_after_so_many_names(monkeypatch):
    """Names are read through a mapping of the file; every page they were on stayed mapped (RSS)
    until the table went. Now every NAME_READS_PER_DROP names the table lets them go, and reads on.
    (Other tables of the same file, other tests' or the cache's, keep their own mappings.)"""
    path = next(m.path for m in read_maps(os.getpid()) if os.path.basename(m.path).startswith("libc.so"))
    before = _mappings(path)
    table = symbolizer._SymbolTable(path)
    (mine,) = set(_mappings(path)) - set(before)

    def mapped_kib() -> int:
        return _mappings(path)[mine]

    assert len(table.addrs) > 400, path
    monkeypatch.setattr(symbolizer, "NAME_READS_PER_DROP", 100)
    picks = [int(table.addrs[i]) for i in range(0, len(table.addrs), len(table.addrs) // 99)][:99]
    names = [table.lookup(a) for a in picks]  # 99 names read, across the whole string table
    assert sum(n is not None for n in names) > 90
    assert mapped_kib() >= 8, "the names' pages are mapped"
    assert table.lookup(picks[0]) == names[0]  # the 100th name read: its page and the rest go
    assert mapped_kib() == 0
    assert table.lookup(picks[50]) == names[50]  # read again, from the page cache
    assert mapped_kib() > 0
