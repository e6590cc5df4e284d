"""Output files written as root without following anyone's links.

The agent runs as root, and its output directory may sit where other users can write
(a shared working directory, /tmp). Whatever name it opens there could be a symbolic link
to /etc/passwd, a FIFO that blocks the exporter, or a hard link to a file it must not
touch. So every path is opened relative to a directory descriptor taken once, with
O_NOFOLLOW, and must turn out to be a regular file with a single link, owned by the agent's
user (another user's file, planted where the agent will append, is not written); temporary files
get random names and O_EXCL. What is created is owner-only by default (the telemetry
names paths, hosts and peers).
"""

from __future__ import annotations

import errno
import os
import secrets
import stat


class UnsafeOutput(OSError):
    """An output path the agent refuses to write through; the message names it and why."""


_NOFOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class OutputDir:
    """A directory the operator named, held open: a later rename or symlink swap of its path
    does not redirect what is written into it."""

    def __init__(self, path: str, *, dir_mode: int = 0o700, file_mode: int = 0o600) -> None:
        self.path = path
        self.file_mode = file_mode
        self.dir_mode = dir_mode
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        self.fd = _open_dir(path, None, dir_mode, path)

    def subdir(self, name: str) -> OutputDir:
        """A directory directly inside this one (created ``dir_mode``), under the same rules."""
        sub = object.__new__(OutputDir)
        sub.path, sub.file_mode, sub.dir_mode = os.path.join(self.path, name), self.file_mode, self.dir_mode
        sub.fd = _open_dir(_plain(name), self.fd, self.dir_mode, sub.path)
        return sub

    def open_append(self, name: str) -> int:
        """``name`` opened for appending (created ``file_mode``): a regular file with one link."""
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = self._open(name, flags)
        os.set_blocking(fd, True)
        return fd

    def write_whole(self, name: str, data: bytes) -> None:
        """``name`` replaced by ``data`` at once: written under a random name (O_EXCL), renamed."""
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
        link, owned by the agent's user, never through a link); more than ``limit`` bytes is
        refused (a file grown by someone else is not read into memory)."""
        fd = self._open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, keep_mode=True)
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
            raise UnsafeOutput(f"{self.path} is writable by others (mode {stat.S_IMODE(st.st_mode):o})")

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
