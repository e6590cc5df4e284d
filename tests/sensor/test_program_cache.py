"""The program cache: what an entry holds, what is refused, and what happens when an entry
cannot be used (a compile, said in the log). The cached programs' behaviour is checked
beside the compiled ones' in test_program.py, test_socket_probes.py and test_program_load.py."""

from __future__ import annotations

import json
import logging
import os
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otelbpf.base.health import Health
from otelbpf.sensor import bcc_module, program, program_cache
from otelbpf.sensor.bcc_module import TableShape
from otelbpf.sensor.program_cache import CachedPrograms, ProgramCache

KEY = "k" * 64
EVENTS = TableShape("events", 27, 0, 0, 4096, 0)
STATS = TableShape("stats", 6, 4, 8, 16, 0)


def insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


#: r1 = map(stats); r0 = 0; exit
CODE = insn(0x18, 1, 1) + insn(0) + insn(0xB7) + insn(0x95)
PROGRAMS = CachedPrograms(tables=(EVENTS, STATS), code={"prog": CODE}, maps={"prog": ((0, "stats"),)})


def test_an_entry_round_trips_and_relocates_each_map_reference() -> None:
    back = program_cache.from_json(program_cache.to_json(PROGRAMS, KEY), KEY)
    assert back == PROGRAMS
    code = back.relocated("prog", {"stats": 41, "events": 7})
    assert struct.unpack_from("<i", code, 4)[0] == 41
    assert code[8:] == CODE[8:]


def test_mismatch_names_what_differs() -> None:
    assert PROGRAMS.mismatch(["prog"], [STATS, EVENTS]) is None
    assert "programs differ" in (PROGRAMS.mismatch(["prog", "other"], [EVENTS, STATS]) or "")
    bigger = TableShape("stats", 6, 4, 8, 32, 0)
    assert "maps differ: ['stats']" in (PROGRAMS.mismatch(["prog"], [EVENTS, bigger]) or "")


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d.update(key="other"),
        lambda d: d.update(format=0),
        lambda d: d["programs"]["prog"].update(code="AAAA"),  # 3 bytes: not whole instructions
        lambda d: d["programs"]["prog"].update(maps=[[9, "stats"]]),  # past the code
        lambda d: d["programs"]["prog"].update(maps=[[0, "nosuch"]]),
        lambda d: d["tables"][0].append(1),
        lambda d: d.pop("programs"),
    ],
)
def test_a_malformed_entry_is_a_value_error(change) -> None:
    doc = json.loads(program_cache.to_json(PROGRAMS, KEY))
    change(doc)
    with pytest.raises(ValueError):
        program_cache.from_json(json.dumps(doc).encode(), KEY)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400), st.integers(0, 400))
def test_garbage_is_a_value_error_never_another_exception(noise: bytes, at: int) -> None:
    good = program_cache.to_json(PROGRAMS, KEY)
    for data in (noise, good[:at] + noise + good[at + len(noise) :]):
        try:
            program_cache.from_json(data, KEY)
        except ValueError:
            pass


def test_the_key_follows_text_and_flags() -> None:
    k = program_cache.key("int x;", ["-DA=1"])
    assert k == program_cache.key("int x;", ["-DA=1"])
    assert k != program_cache.key("int y;", ["-DA=1"])
    assert k != program_cache.key("int x;", ["-DA=2"])
    assert k != program_cache.key("int x;", ["-DA=1", ""])


def test_the_key_names_the_compilers_files_by_size_and_time(tmp_path: Path) -> None:
    """A rebuilt libbcc or LLVM with the same version string is another compiler."""
    lib = tmp_path / "libbcc.so.0.26.0"
    lib.write_bytes(b"x" * 10)
    other = tmp_path / "libfoo.so.1"
    other.write_bytes(b"")
    maps = tmp_path / "maps"
    maps.write_text(
        f"7f00-7f10 r-xp 00000000 08:01 12 {lib}\n7f10-7f20 r--p 00000000 08:01 12 {lib}\n"
        f"7f20-7f30 r-xp 00000000 08:01 13 {other}\n7f30-7f40 rw-p 00000000 00:00 0\n"
    )
    assert program_cache._compiler_files(str(maps)) == [f"{lib}:10:{lib.stat().st_mtime_ns}"]


def test_put_and_get_in_an_owner_only_directory(tmp_path: Path) -> None:
    cache = ProgramCache(str(tmp_path / "cache"), 8)
    assert cache.get(KEY) is None
    cache.put(KEY, PROGRAMS)
    assert cache.get(KEY) == PROGRAMS
    assert (tmp_path / "cache").stat().st_mode & 0o777 == 0o700
    [entry] = (tmp_path / "cache").iterdir()
    assert entry.stat().st_mode & 0o777 == 0o600


def test_a_directory_others_can_write_is_not_used(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    d = tmp_path / "cache"
    ProgramCache(str(d), 8).put(KEY, PROGRAMS)
    d.chmod(0o777)
    with caplog.at_level(logging.WARNING):
        assert ProgramCache(str(d), 8).get(KEY) is None
    assert "writable by other users (mode 0777)" in caplog.text


def test_a_linked_or_foreign_entry_is_not_read(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    d = tmp_path / "cache"
    cache = ProgramCache(str(d), 8)
    cache.put(KEY, PROGRAMS)
    entry = d / f"{KEY}.bpfprog.json"
    elsewhere = tmp_path / "elsewhere.json"
    entry.rename(elsewhere)
    entry.symlink_to(elsewhere)
    with caplog.at_level(logging.WARNING):
        assert ProgramCache(str(d), 8).get(KEY) is None
    assert "symbolic link" in caplog.text
    assert not entry.is_symlink() and elsewhere.exists()  # the link removed, never followed
    elsewhere.rename(entry)
    os.chown(entry, 65534, 65534)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert ProgramCache(str(d), 8).get(KEY) is None
    assert "owned by uid 65534" in caplog.text


def test_an_entry_others_can_write_is_refused_counted_and_replaced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's case: an entry at 0666 (restored from a backup), root's own, rewritten by
    anyone: whoever writes it chooses the BPF code root loads. Refused, said naming the file,
    counted, removed; the compile that follows writes an owner-only one in its place."""
    d = tmp_path / "cache"
    health = Health()
    cache = ProgramCache(str(d), 8, health)
    cache.put(KEY, PROGRAMS)
    entry = d / f"{KEY}.bpfprog.json"
    entry.chmod(0o666)
    theirs = CachedPrograms(PROGRAMS.tables, {"prog": insn(0x95)}, {"prog": ()})
    entry.write_bytes(program_cache.to_json(theirs, KEY))  # as `nobody` could: the same entry, their code
    with caplog.at_level(logging.WARNING):
        assert cache.get(KEY) is None
    assert f"{entry} is writable by other users (mode 0666): refusing to read it" in caplog.text
    assert health.get("otelbpf.program_cache.refused") == 1 and not entry.exists()
    cache.put(KEY, PROGRAMS)  # what the compile does next
    assert entry.stat().st_mode & 0o777 == 0o600 and cache.get(KEY) == PROGRAMS
    assert health.get("otelbpf.program_cache.refused") == 1


def test_only_the_most_recently_used_entries_are_kept(tmp_path: Path) -> None:
    d = tmp_path / "cache"
    cache = ProgramCache(str(d), 2)
    keys = [c * 64 for c in "abc"]
    for n, k in enumerate(keys[:2]):
        cache.put(k, PROGRAMS)
        os.utime(d / f"{k}.bpfprog.json", ns=(n * 10**9, n * 10**9))
    assert cache.get(keys[0]) == PROGRAMS  # used: now the most recent
    (d / "notes.txt").write_text("left alone")
    cache.put(keys[2], PROGRAMS)
    assert sorted(p.name for p in d.iterdir()) == sorted(
        [f"{keys[0]}.bpfprog.json", f"{keys[2]}.bpfprog.json", "notes.txt"]
    )


# -- with BPF: real compiles and loads -------------------------------------------------------


def _socket_program() -> tuple[str, list[str], list]:
    from otelbpf.families.http.probes import socket_family

    fam = socket_family([], payload_bytes=256, ring_bytes=1 << 20)
    text, cflags = program.build([fam], filter_pids=True, events_ring_bytes=64 << 10)
    return text, cflags, [fam]


@pytest.mark.bpf
def test_a_compile_leaves_an_entry_whose_programs_name_the_maps_they_use(tmp_path: Path) -> None:
    text, cflags, fams = _socket_program()
    cache = ProgramCache(str(tmp_path), 8)
    bpf = program.load(text, cflags, fams, cache)
    try:
        entry = cache.get(program_cache.key(text, cflags))
        assert entry is not None
        # The compiled code names the maps by their fds; the entry, by their names.
        fds = {shape.name: fd for fd, shape in bcc_module.tables(bpf.module).items()}
        assert program_cache.capture(bpf.module) == entry
        for name in entry.code:
            assert entry.relocated(name, fds) == bcc_module.instructions(bpf.module, name), name
        used = {t for refs in entry.maps.values() for _i, t in refs}
        assert {"stats", "sockdata", "sock_capture_prog", "agent_self"} <= used
    finally:
        bpf.cleanup()


@pytest.mark.bpf
def test_an_entry_the_verifier_refuses_means_a_compile_and_a_new_entry(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text, cflags, fams = _socket_program()
    cache = ProgramCache(str(tmp_path), 8)
    program.load(text, cflags, fams, cache).cleanup()
    k = program_cache.key(text, cflags)
    entry = cache.get(k)
    name = "tracepoint__syscalls__sys_enter_connect"
    broken = CachedPrograms(entry.tables, {**entry.code, name: insn(0x95)}, {**entry.maps, name: ()})  # exit, r0 unset
    cache.put(k, broken)
    with caplog.at_level(logging.WARNING):
        bpf = program.load(text, cflags, fams, cache)
    try:
        assert not getattr(bpf, "from_cache", False)
        assert f"program cache: entry {k[:12]} could not be loaded" in caplog.text
        assert "the verifier refused tracepoint__syscalls__sys_enter_connect" in caplog.text
    finally:
        bpf.cleanup()
    assert cache.get(k) == entry  # the compile replaced it
    again = program.load(text, cflags, fams, cache)
    assert getattr(again, "from_cache", False)
    again.cleanup()


@pytest.mark.bpf
def test_an_entry_whose_maps_differ_means_a_compile(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    text, cflags, fams = _socket_program()
    cache = ProgramCache(str(tmp_path), 8)
    program.load(text, cflags, fams, cache).cleanup()
    k = program_cache.key(text, cflags)
    entry = cache.get(k)
    tables = tuple(
        t if t.name != "stats" else TableShape("stats", t.type, t.key_size, t.leaf_size, 1, 0) for t in entry.tables
    )
    cache.put(k, CachedPrograms(tables, entry.code, entry.maps))
    with caplog.at_level(logging.WARNING):
        bpf = program.load(text, cflags, fams, cache)
    try:
        assert not getattr(bpf, "from_cache", False)
        assert "does not fit (maps differ: ['stats'])" in caplog.text
    finally:
        bpf.cleanup()


#: Prints a hash of the program text and flags the agent builds for CONFIG, then exits
#: (program.load replaced: nothing is compiled).
TEXT_HASH = """
import hashlib, sys
from otelbpf.sensor import program
def fake_load(text, cflags, families, cache=None, **_):
    print("KEY", hashlib.sha256((text + "\\0".join(cflags)).encode()).hexdigest(), flush=True)
    raise SystemExit(0)
program.load = fake_load
from otelbpf import cli
sys.argv = ["otelbpf", "run", "-c", sys.argv[1]]
cli.main()
"""


@pytest.mark.bpf  # the agent's start needs root
def test_every_receivers_program_text_is_the_same_in_every_process(tmp_path: Path) -> None:
    """The cache hits only if a restarted agent builds the same text: nothing in it may come
    from the process (its pid, a set's hash order, a time)."""
    import subprocess
    import sys

    import yaml

    doc = yaml.safe_load((Path(program.__file__).parents[1] / "config" / "otelbpf.yaml").read_text())
    doc["exporters"]["file"]["directory"] = str(tmp_path / "out")
    pipelines = doc["service"]["pipelines"]
    pipelines["traces"]["receivers"] = ["cuda", "http", "nccl", "ibverbs", "sched", "torch"]
    pipelines["metrics"]["receivers"] = ["cuda", "http", "nccl", "ibverbs", "gpu"]
    cfg = tmp_path / "all.yaml"
    cfg.write_text(yaml.safe_dump(doc))
    keys = []
    for seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", TEXT_HASH, str(cfg)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONHASHSEED": seed},
        )
        assert out.returncode == 0, out.stderr
        keys.append(next(ln for ln in out.stdout.splitlines() if ln.startswith("KEY")))
    assert keys[0] == keys[1]


def _bpf_prog_fds() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:bpf-prog"
        except FileNotFoundError:  # the listing's own fd, closed by now
            pass
    return count


@pytest.mark.bpf
def test_a_cached_load_that_fails_halfway_leaves_nothing_loaded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tracepoint that does not attach after the cached programs are loaded: every program
    of the half-made object is unloaded before the compile loads its own, or each event would
    be seen by two copies."""
    from otelbpf.sensor.cached_bpf import CachedBPF

    text, cflags, fams = _socket_program()
    cache = ProgramCache(str(tmp_path), 8)
    program.load(text, cflags, fams, cache).cleanup()
    before = _bpf_prog_fds()

    def refuse(self, **kwargs) -> None:
        raise Exception(f"cannot attach {kwargs.get('tp')!r}")

    monkeypatch.setattr(CachedBPF, "attach_tracepoint", refuse)
    with caplog.at_level(logging.WARNING):
        bpf = program.load(text, cflags, fams, cache)
    try:
        assert not getattr(bpf, "from_cache", False)
        assert "could not be loaded (cannot attach" in caplog.text
        assert _bpf_prog_fds() == before + len(bpf.funcs)  # the compile's programs, none other
    finally:
        bpf.cleanup()
    assert _bpf_prog_fds() == before
