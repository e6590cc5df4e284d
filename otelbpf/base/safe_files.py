"""Everything root writes, and what it reads back, on one path: never through anyone's link.

Output files, the report, the program cache and the live socket's run directory all go
through ``OutputDir``. The agent runs as root, and its output directory may sit where other users can write
(a shared working directory, /tmp). Whatever name it opens there could be a symbolic link
to /etc/passwd, a FIFO that blocks the exporter, or a hard link to a file it must not
touch. So every path is opened relative to a directory descriptor taken once, with
O_NOFOLLOW, and must turn out to be a regular file with a single link, owned by the agent's
user (another user's file, planted where the agent will append, is not written); temporary files
get random names and O_EXCL. What is created is owner-only by default (the telemetry
names paths, hosts and peers).

A directory written into must be the agent's user's (or root's) and writable by no one else,
beyond the write bits its configured ``dir_mode`` gives: whoever else can write in it can
remove, swap or rename what the agent leaves there (a user who made ``out/`` 0777 beforehand
replaces ``traces.jsonl`` at will). The one exception is a sticky directory of root's or the
agent's user's, such as /tmp: there others can add names but never remove, rename or replace
the agent's. An entry another user owns is refused everywhere, also as the name a whole file
replaces (in /tmp, ``report.html`` left by another user): the agent neither writes into nor
deletes another user's file. The user who ran the agent through ``sudo`` (``SUDO_UID``) is not
another user: they hold root already, so a folder of theirs that no one else can write (``sudo
otelbpf report out -o report.html`` in their home) and a file of theirs that a whole file
replaces are accepted. (In a sticky directory another user can still create that name
between the check and the rename; the rename then replaces their new entry, never writes into
it, and what stays is the agent's owner-only file, which they cannot remove.)

What is read back is read the same way: the program cache's entries (``read_whole``: the
agent's user's, writable by no one else) and the folders the analysis commands and
``otelbpf mcp`` read as root (``ReadDir``: regular files directly in the folder, never through
a link, so a ``traces.jsonl`` linked to a root-only file is not read and answered from).
"""

from __future__ import annotations

import errno
import io
import os
import secrets
import stat
from collections.abc import Callable


class UnsafeOutput(OSError):
    """A path the agent refuses (or fails) to write through, or refuses to read from; the
    message names it and why, on one line, for the operator to fix (``otelbpf run`` and
    ``otelbpf report`` end with it, exit 2)."""


def operator_uid() -> int | None:
    """The uid of the user who ran this root process through sudo (``SUDO_UID``), or None: that
    user can do as root whatever a folder of theirs would let them do to root's files."""
    if os.geteuid() != 0:
        return None
    try:
        uid = int(os.environ.get("SUDO_UID", ""))
    except ValueError:
        return None
    return uid if uid > 0 else None


_NOFOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class OutputDir:
    """A directory the operator named, held open: a later rename or symlink swap of its path
    does not redirect what is written into it."""

    def __init__(self, path: str, *, dir_mode: int = 0o700, file_mode: int = 0o600) -> None:
        self.path = path
        self.file_mode = file_mode
        self.dir_mode = dir_mode
        parent = os.path.dirname(os.path.abspath(path))
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError as exc:
            raise UnsafeOutput(f"cannot create {parent}: {exc.strerror}") from None
        self.fd = _open_dir(path, None, dir_mode, path)
        self._check_writable_by_us_only()

    def subdir(self, name: str) -> OutputDir:
        """A directory directly inside this one (created ``dir_mode``), under the same rules."""
        sub = object.__new__(OutputDir)
        sub.path, sub.file_mode, sub.dir_mode = os.path.join(self.path, name), self.file_mode, self.dir_mode
        sub.fd = _open_dir(_plain(name), self.fd, self.dir_mode, sub.path)
        sub._check_writable_by_us_only()
        return sub

    def _check_writable_by_us_only(self) -> None:
        """Close and raise unless only the agent's user (or root) can change the directory's
        entries: its owner, and write bits for others beyond ``dir_mode``'s, unless sticky."""
        st = os.fstat(self.fd)
        euid = os.geteuid()
        why = None
        if st.st_uid not in (euid, 0, operator_uid()):
            why = f"is owned by uid {st.st_uid}, not the agent's (uid {euid})"
        elif st.st_mode & 0o022 & ~self.dir_mode and not st.st_mode & stat.S_ISVTX:
            why = f"is writable by other users (mode {stat.S_IMODE(st.st_mode):04o})"
        if why:
            self.close()
            raise UnsafeOutput(
                f"output directory {self.path} {why}: they could replace or remove what is written there; "
                "refusing to write in it (use a directory only the agent's user can write)"
            )

    def open_append(self, name: str) -> int:
        """``name`` opened for appending (created ``file_mode``): a regular file with one link."""
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = self._open(name, flags)
        os.set_blocking(fd, True)
        return fd

    def write_whole(self, name: str, data: bytes) -> None:
        """``name`` replaced by ``data`` at once: written under a random name (O_EXCL), renamed.
        An existing ``name`` of another user's is refused (their file is neither written nor
        removed); a link of the agent's user's is replaced, never followed."""
        try:
            st = os.stat(_plain(name), dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            pass
        else:
            if st.st_uid not in (os.geteuid(), operator_uid()):
                raise UnsafeOutput(
                    f"{os.path.join(self.path, name)} is owned by uid {st.st_uid}, not the agent's "
                    f"(uid {os.geteuid()}); remove it or chown it: refusing to replace it"
                )
        tmp = f".{_plain(name)}.{secrets.token_hex(8)}.tmp"
        fd = self._open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.rename(tmp, _plain(name), src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=self.fd)
            except OSError:
                pass
            raise

    def read_whole(self, name: str, limit: int) -> bytes:
        """``name``'s content, under the same rules as what is written (a regular file with one
        link, owned by the agent's user, never through a link) and writable by no one else: what
        is read back is trusted (the program cache's entries go into the kernel), and a file
        left 0666 (restored from a backup) is anyone's to rewrite. More than ``limit`` bytes is
        refused (a file grown by someone else is not read into memory)."""
        fd = self._open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, keep_mode=True)
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if mode & 0o022:
            os.close(fd)
            raise UnsafeOutput(
                f"{os.path.join(self.path, name)} is writable by other users (mode {mode:04o}): refusing to read it"
            )
        with os.fdopen(fd, "rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise UnsafeOutput(f"{os.path.join(self.path, name)} is over {limit} bytes: refusing to read it")
        return data

    def check_private(self) -> None:
        """Raise unless the directory is the agent's user's and no one else can write in it:
        for what the agent trusts back, not only what it writes."""
        st = os.fstat(self.fd)
        if st.st_uid != os.geteuid():
            raise UnsafeOutput(f"{self.path} is owned by uid {st.st_uid}, not the agent's (uid {os.geteuid()})")
        if st.st_mode & 0o022:
            raise UnsafeOutput(f"{self.path} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o})")

    def rename(self, old: str, new: str) -> None:
        """Rename within the directory (a link is renamed, never followed)."""
        os.rename(_plain(old), _plain(new), src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _open(self, name: str, flags: int, *, keep_mode: bool = False) -> int:
        shown = os.path.join(self.path, name)
        try:
            fd = os.open(_plain(name), flags, self.file_mode, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # the name is a symbolic link
                raise UnsafeOutput(f"{shown} is a symbolic link: refusing to write through it") from None
            if exc.errno == errno.ENXIO:  # a FIFO without a reader (O_NONBLOCK: never waits for one)
                raise UnsafeOutput(f"{shown} is not a regular file: refusing to write to it") from None
            if exc.errno == errno.EACCES:  # the agent runs without CAP_DAC_OVERRIDE: one line, no traceback
                owner = _owner(name, self.fd)
                if owner is not None and owner != os.geteuid():
                    raise UnsafeOutput(
                        f"{shown} is owned by uid {owner}, not the agent's (uid {os.geteuid()}); "
                        "remove it or chown it: refusing to write to it"
                    ) from None
                raise UnsafeOutput(f"cannot open {shown}: {exc.strerror}") from None
            raise
        st = os.fstat(fd)
        why = (
            "is not a regular file"
            if not stat.S_ISREG(st.st_mode)
            else "has other hard links"
            if st.st_nlink != 1
            else f"is owned by uid {st.st_uid}, not the agent's (uid {os.geteuid()}); remove it or chown it"
            if st.st_uid != os.geteuid()
            else None
        )
        if why:
            os.close(fd)
            raise UnsafeOutput(f"{shown} {why}: refusing to write to it")
        if not keep_mode and stat.S_IMODE(st.st_mode) != self.file_mode:
            os.fchmod(fd, self.file_mode)  # a file an older agent left 0644
        return fd


class ReadDir:
    """A folder read as root (``otelbpf report``, ``summary``, ``mcp``): the path the operator
    named is opened once (a link there is the operator's choice), and each entry relative to
    it with O_NOFOLLOW: only regular files directly in it are read, never what a link inside
    points at (another user who can write in the folder could link ``traces.jsonl`` to a
    root-only file and have it read and answered from)."""

    def __init__(self, path: str, *, _fd: int | None = None) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) if _fd is None else _fd

    def subdir(self, name: str) -> ReadDir:
        """The folder ``name`` directly in this one, under the same rules (not through a link)."""
        shown = os.path.join(self.path, name)
        try:
            fd = os.open(_plain(name), _NOFOLLOW_DIR, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise UnsafeOutput(f"{shown} is a symbolic link or not a directory: refusing to read it") from None
            raise
        return ReadDir(shown, _fd=fd)

    def __enter__(self) -> ReadDir:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def names(self, wanted: Callable[[str], bool]) -> list[str]:
        """The names directly in the folder for which ``wanted`` is true, sorted, links and
        subfolders included (opening one says why it is not read)."""
        return sorted(n for n in os.listdir(self.fd) if wanted(n))

    def open_binary(self, name: str) -> io.BufferedReader:
        """``name`` opened for reading: a regular file, never through a link. Raises
        UnsafeOutput for anything else, FileNotFoundError when it is gone."""
        shown = os.path.join(self.path, name)
        try:
            fd = os.open(_plain(name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafeOutput(f"{shown} is a symbolic link: refusing to read it") from None
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise UnsafeOutput(f"{shown} is not a regular file: refusing to read it")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")

    def open_text(self, name: str) -> io.TextIOWrapper:
        """As ``open_binary``, decoded as UTF-8."""
        return io.TextIOWrapper(self.open_binary(name), encoding="utf-8")

    def lstat(self, name: str) -> os.stat_result:
        """``name``'s own status (a link's, not its target's)."""
        return os.stat(_plain(name), dir_fd=self.fd, follow_symlinks=False)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _owner(name: str, dir_fd: int) -> int | None:
    """The uid owning ``name`` itself (not a link's target), or None when it cannot be seen."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_uid
    except OSError:
        return None


def _plain(name: str) -> str:
    """A bare file name: nothing that leaves the directory."""
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise UnsafeOutput(f"{name!r} is not a plain file name")
    return name


def _open_dir(name: str, dir_fd: int | None, mode: int, shown: str) -> int:
    """Open (creating it ``mode`` if missing) the directory ``name``, never through a link."""
    created = False
    try:
        os.mkdir(name, mode, dir_fd=dir_fd)
        created = True
    except FileExistsError:
        pass
    except OSError as exc:  # not a traceback: the operator fixes the path (exit 2)
        raise UnsafeOutput(f"cannot create output directory {shown}: {exc.strerror}") from None
    try:
        fd = os.open(name, _NOFOLLOW_DIR, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafeOutput(
                f"output directory {shown} is a symbolic link or not a directory: refusing to write through it"
            ) from None
        raise
    if created:
        os.fchmod(fd, mode)  # exactly ``mode``, whatever the umask
    return fd
