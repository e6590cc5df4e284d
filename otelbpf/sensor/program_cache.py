"""Compile once per node: the compiled BPF programs kept on disk for the next start.

BCC compiles the program with clang and LLVM at every start: ~4-5 s of the agent's ~7 s on
this VM (docs/BENCHMARKS.md), the same work each time for the same program text, kernel and
BCC. After a compile, each program's instructions are kept here with the positions where
they name a map (BCC writes the map's fd into the code) and the shapes of the maps; the next
start with the same key compiles only the skeleton (``skeleton.py``: the maps and the
programs' names, ~0.6 s), checks it declares the same maps and programs, and loads the kept
instructions with the skeleton's map fds written in (``cached_bpf.CachedBPF``).

The key covers everything the compiled code depends on: the program text and flags (the
agent's configuration and the host's library layouts are in them), the kernel release and
build, and BCC's version and library. A change of any is a miss and a full compile, which
replaces the entry. Entries are JSON (no code runs when one is read), in a directory the
agent's user owns and only it can write (``check_private``): what is read back goes into
the kernel. Each entry, too, must be the agent's user's, writable by no one else, a regular
file with one link (``OutputDir.read_whole``): an entry left 0666 (restored from a backup or
an image) could have been rewritten by anyone, who would then choose the code root loads. Such
an entry is refused (a warning naming it, ``otelbpf.program_cache.refused``) and removed, so
the compile that follows writes a safe one in its place. Anything else wrong with an entry
(unreadable, malformed, a shape that differs, a program the verifier refuses) is logged and
answered with a full compile.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import os
import re
import struct
import time
from dataclasses import dataclass

from otelbpf.base.health import Health
from otelbpf.base.safe_files import OutputDir, UnsafeOutput
from otelbpf.sensor import bcc_module
from otelbpf.sensor.bcc_module import BPF_INSN_BYTES, TableShape

log = logging.getLogger(__name__)

#: Bumped when the entry format or what a key covers changes.
FORMAT = 1
_SUFFIX = ".bpfprog.json"
#: An entry larger than this is not read (the `all` program's is ~0.4 MiB).
_MAX_ENTRY_BYTES = 64 << 20
_LD_IMM64 = 0x18  # BPF_LD | BPF_IMM | BPF_DW: two instructions, a 64-bit immediate
_CALL = 0x85  # BPF_JMP | BPF_CALL
_PSEUDO_MAP_FD = 1


class Uncacheable(Exception):
    """Compiled code this cache cannot replay (it would need a relocation it does not do)."""


@dataclass(frozen=True)
class CachedPrograms:
    """A compile's programs, position-independent: map fds zeroed, their positions kept."""

    tables: tuple[TableShape, ...]
    #: program name -> its instructions, with the map fds zeroed
    code: dict[str, bytes]
    #: program name -> (instruction index, map name) for each map it names
    maps: dict[str, tuple[tuple[int, str], ...]]

    def mismatch(self, functions: list[str], shapes: list[TableShape]) -> str | None:
        """Why a skeleton with these programs and maps cannot take this code, or None."""
        if sorted(functions) != sorted(self.code):
            missing, extra = set(self.code) - set(functions), set(functions) - set(self.code)
            return f"programs differ (only cached: {sorted(missing)[:3]}, only compiled: {sorted(extra)[:3]})"
        mine = {t.name: t for t in self.tables}
        theirs = {t.name: t for t in shapes}
        if mine != theirs:
            diff = sorted(n for n in set(mine) | set(theirs) if mine.get(n) != theirs.get(n))
            return f"maps differ: {diff[:3]}"
        return None

    def relocated(self, name: str, fds: dict[str, int]) -> bytes:
        """Program ``name``'s instructions with ``fds`` (map name -> fd) written in."""
        code = bytearray(self.code[name])
        for index, table in self.maps[name]:
            struct.pack_into("<i", code, index * BPF_INSN_BYTES + 4, fds[table])
        return bytes(code)


def capture(module: int) -> CachedPrograms:
    """The compiled module's programs, made position-independent. Raises Uncacheable."""
    by_fd = bcc_module.tables(module)
    code: dict[str, bytes] = {}
    maps: dict[str, tuple[tuple[int, str], ...]] = {}
    for name in bcc_module.function_names(module):
        try:
            insns = bytearray(bcc_module.instructions(module, name))
        except KeyError:
            raise Uncacheable(f"BCC gives no instructions for {name}") from None
        refs: list[tuple[int, str]] = []
        k, count = 0, len(insns) // BPF_INSN_BYTES
        while k < count:
            op, regs = insns[k * 8], insns[k * 8 + 1]
            src = regs >> 4
            if op == _LD_IMM64:
                if src == _PSEUDO_MAP_FD:
                    (fd,) = struct.unpack_from("<i", insns, k * 8 + 4)
                    if fd not in by_fd:
                        raise Uncacheable(f"{name} names fd {fd}, not one of the module's maps")
                    refs.append((k, by_fd[fd].name))
                    struct.pack_into("<i", insns, k * 8 + 4, 0)
                elif src != 0:  # map values, BTF ids, functions by address: not replayed
                    raise Uncacheable(f"{name}: a 64-bit load of kind {src} at instruction {k}")
                k += 2
                continue
            if op == _CALL and src not in (0, 1):  # 0: a helper, 1: a call within the program
                raise Uncacheable(f"{name}: a call of kind {src} (a kernel function) at instruction {k}")
            k += 1
        code[name], maps[name] = bytes(insns), tuple(refs)
    return CachedPrograms(tables=tuple(by_fd.values()), code=code, maps=maps)


def key(text: str, cflags: list[str]) -> str:
    """What the compiled code depends on, hashed."""
    import bcc

    uname = os.uname()
    h = hashlib.sha256()
    parts = (str(FORMAT), getattr(bcc, "__version__", "?"), *_compiler_files(), uname.release, uname.version)
    for part in (*parts, uname.machine):
        h.update(part.encode() + b"\0")
    h.update("\0".join(cflags).encode() + b"\0\0")
    h.update(text.encode())
    return h.hexdigest()


_COMPILER_FILE = re.compile(r"/lib(bcc|LLVM|clang-cpp|clang)[-.][^/]*$")


def _compiler_files(maps: str = "/proc/self/maps") -> list[str]:
    """The compiler's libraries this process has loaded (libbcc, LLVM, clang), each as
    path:size:mtime: a rebuilt package with the same version string is another compiler."""
    found: set[str] = set()
    with open(maps) as f:
        for line in f:
            path = line.rstrip("\n").split(maxsplit=5)[-1]
            if _COMPILER_FILE.search(path):
                found.add(path)
    out = []
    for path in sorted(found):
        try:
            st = os.stat(path)
        except OSError:
            continue
        out.append(f"{path}:{st.st_size}:{st.st_mtime_ns}")
    return out


def to_json(programs: CachedPrograms, entry_key: str) -> bytes:
    doc = {
        "format": FORMAT,
        "key": entry_key,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "tables": [list(vars(t).values()) for t in programs.tables],
        "programs": {
            name: {"code": base64.b64encode(code).decode(), "maps": [list(r) for r in programs.maps[name]]}
            for name, code in programs.code.items()
        },
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def from_json(data: bytes, entry_key: str) -> CachedPrograms:
    """Parse an entry; ValueError (saying what) for anything not as written by ``to_json``."""
    try:
        doc = json.loads(data)
        if doc.get("format") != FORMAT or doc.get("key") != entry_key:
            raise ValueError(f"format {doc.get('format')!r} or key does not match")
        # TableShape takes exactly its six fields: more or fewer is a TypeError
        tables = tuple(TableShape(str(n), *(int(v) for v in rest)) for n, *rest in doc["tables"])
        code: dict[str, bytes] = {}
        maps: dict[str, tuple[tuple[int, str], ...]] = {}
        names = {t.name for t in tables}
        for name, prog in doc["programs"].items():
            insns = base64.b64decode(prog["code"], validate=True)
            count = len(insns) // BPF_INSN_BYTES
            if not insns or len(insns) % BPF_INSN_BYTES:
                raise ValueError(f"{name}: {len(insns)} bytes is not whole instructions")
            refs = tuple((int(i), str(t)) for i, t in prog["maps"])
            if any(not 0 <= i < count or t not in names for i, t in refs):
                raise ValueError(f"{name}: a map reference outside the code or to an unknown map")
            code[str(name)], maps[str(name)] = insns, refs
    except (KeyError, TypeError, AttributeError, json.JSONDecodeError, binascii.Error) as exc:
        raise ValueError(f"malformed ({type(exc).__name__}: {exc})") from None
    return CachedPrograms(tables=tables, code=code, maps=maps)


class ProgramCache:
    """The entries in one directory (created owner-only; refused if anyone else can write in it).
    The directory is opened for each read or write: it is used at start only."""

    def __init__(self, directory: str, max_entries: int, health: Health | None = None) -> None:
        self.path = directory
        self.max_entries = max_entries
        self.health = health if health is not None else Health()

    def _open(self) -> OutputDir:
        d = OutputDir(self.path)
        try:
            d.check_private()
        except UnsafeOutput:
            d.close()
            raise
        return d

    def get(self, entry_key: str) -> CachedPrograms | None:
        """The entry for ``entry_key``, or None (a miss, or an entry that cannot be used: logged)."""
        name = entry_key + _SUFFIX
        try:
            d = self._open()
        except OSError as exc:
            log.warning("program cache %s: not used (%s)", self.path, exc)
            return None
        try:
            data = d.read_whole(name, _MAX_ENTRY_BYTES)
            try:
                os.utime(name, dir_fd=d.fd, follow_symlinks=False)  # recently used: kept longest
            except OSError:
                pass
        except FileNotFoundError:
            return None
        except UnsafeOutput as exc:  # anyone's to rewrite, or not the agent's: never loaded
            self.health.add("otelbpf.program_cache.refused")
            log.warning("program cache: entry refused (%s): removed, compiling", exc)
            try:
                os.unlink(name, dir_fd=d.fd)  # the directory is the agent's alone (check_private)
            except OSError:
                pass
            return None
        except OSError as exc:
            log.warning("program cache %s: not used (%s)", self.path, exc)
            return None
        finally:
            d.close()
        try:
            return from_json(data, entry_key)
        except ValueError as exc:
            log.warning("program cache: %s/%s is not usable (%s): compiling", self.path, name, exc)
            return None

    def put(self, entry_key: str, programs: CachedPrograms) -> None:
        """Keep ``programs`` under ``entry_key``; then the ``max_entries`` most recently used."""
        try:
            d = self._open()
        except OSError as exc:
            log.warning("program cache %s: not written (%s): the next start compiles again", self.path, exc)
            return
        try:
            d.write_whole(entry_key + _SUFFIX, to_json(programs, entry_key))
            self._trim(d)
        except OSError as exc:
            log.warning("program cache %s: not written (%s): the next start compiles again", self.path, exc)
        finally:
            d.close()

    def _trim(self, d: OutputDir) -> None:
        with os.scandir(d.fd) as entries:
            found = [
                (e.stat(follow_symlinks=False).st_mtime_ns, e.name)
                for e in entries
                if e.name.endswith(_SUFFIX) and e.is_file(follow_symlinks=False)
            ]
        for _mtime, name in sorted(found, reverse=True)[self.max_entries :]:
            try:
                os.unlink(name, dir_fd=d.fd)
            except FileNotFoundError:  # another agent's trim removed it first
                continue
            log.info("program cache: removed %s/%s (more than %d entries)", self.path, name, self.max_entries)
