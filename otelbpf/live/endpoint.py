"""The agent's read-only state endpoint: a unix socket that answers each connection with one
JSON snapshot (state.py) and closes. It reads nothing from the client, so there is no request
to get wrong.

The socket is ``<run dir>/agent-<pid>.sock``, mode 0600, in a run directory of mode 0700 owned
by the agent's user: ``OTELBPF_RUN_DIR``, else ``/run/otelbpf`` for root, else
``$XDG_RUNTIME_DIR/otelbpf`` or ``/tmp/otelbpf-<uid>``. A run directory that is a link, is owned
by another user or is open to others is refused (the endpoint is off, the agent runs on).
``OTELBPF_LIVE=off`` turns it off. The directory goes through the agent's one path for what it
writes (``safe_files.OutputDir``): opened once without following a link, checked, and held;
the socket is bound in the directory held (``/proc/self/fd/N/``), so a run directory swapped
for a link after the check does not take the socket elsewhere.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from otelbpf.base.safe_files import OutputDir, UnsafeOutput

if TYPE_CHECKING:  # the snapshot's type only: a viewer needs none of state.py's OpenTelemetry imports
    from otelbpf.live.state import JsonObject

log = logging.getLogger(__name__)

RUN_DIR_ENV = "OTELBPF_RUN_DIR"
#: A snapshot larger than this is not sent whole: the viewer gets an error line instead.
MAX_SNAPSHOT_BYTES = 32 << 20
SEND_TIMEOUT_S = 2.0


class EndpointError(Exception):
    """No snapshot from this socket; the message says why (no agent, a stale socket, a timeout)."""


def run_dir() -> str:
    if os.environ.get(RUN_DIR_ENV):
        return os.environ[RUN_DIR_ENV]
    if os.geteuid() == 0:
        return "/run/otelbpf"
    base = os.environ.get("XDG_RUNTIME_DIR")
    return os.path.join(base, "otelbpf") if base else f"/tmp/otelbpf-{os.geteuid()}"


def _private_dir(path: str) -> OutputDir:
    """The run directory, held open (created 0700): never a link, the agent's user's, and open
    to no one else (a socket's mode does not keep others from connecting on every system)."""
    d = OutputDir(path)
    st = os.fstat(d.fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        d.close()
        raise UnsafeOutput(f"{path} must be a directory of mode 0700 owned by uid {os.geteuid()}")
    return d


def sockets(directory: str | None = None) -> list[str]:
    """The agents' sockets in the run directory, newest first."""

    def mtime(path: str) -> float:
        try:
            return os.stat(path).st_mtime
        except OSError:
            return 0.0  # removed since the listing: an agent that just stopped

    return sorted(glob.glob(os.path.join(directory or run_dir(), "agent-*.sock")), key=mtime, reverse=True)


class StateServer:
    """Serves ``snapshot()`` on a unix socket from a daemon thread."""

    def __init__(self, snapshot: Callable[[], JsonObject], directory: str | None = None) -> None:
        self._snapshot = snapshot
        directory = directory or run_dir()
        self._dir = _private_dir(directory)
        self._name = f"agent-{os.getpid()}.sock"
        self.path = os.path.join(directory, self._name)
        try:
            os.unlink(self._name, dir_fd=self._dir.fd)  # a socket left by an earlier process with this pid
        except FileNotFoundError:
            pass
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        held = f"/proc/self/fd/{self._dir.fd}/{self._name}"  # in the directory checked, whatever its path names now
        old = os.umask(0o177)
        try:
            self._sock.bind(held)
        except OSError:
            self._sock.close()
            self._dir.close()
            raise
        finally:
            os.umask(old)
        os.chmod(held, 0o600)
        self._sock.listen(8)
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="otelbpf-live", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            with conn:
                conn.settimeout(SEND_TIMEOUT_S)
                try:
                    body = json.dumps(self._snapshot(), separators=(",", ":")).encode()
                    if len(body) > MAX_SNAPSHOT_BYTES:
                        body = json.dumps({"error": f"snapshot of {len(body)} bytes is over the limit"}).encode()
                    conn.sendall(body + b"\n")
                except OSError:
                    pass  # the viewer went away or did not read: its problem, not the agent's
                except Exception:  # a snapshot that fails must not end the endpoint
                    log.exception("live snapshot failed")

    def close(self) -> None:
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        try:
            os.unlink(self._name, dir_fd=self._dir.fd)
        except OSError:
            pass
        self._dir.close()


def fetch(path: str, timeout_s: float = 5.0) -> JsonObject:
    """One snapshot from the agent at ``path``. Raises EndpointError with the reason."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout_s)
    chunks = []
    try:
        s.connect(path)
        size = 0
        while True:
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_SNAPSHOT_BYTES + 1:
                raise EndpointError(f"{path}: the snapshot is larger than {MAX_SNAPSHOT_BYTES >> 20} MiB")
            chunks.append(chunk)
    except FileNotFoundError:
        raise EndpointError(f"{path}: no such socket (is the agent running?)") from None
    except ConnectionRefusedError:
        raise EndpointError(f"{path}: nothing listens (a stale socket: the agent exited or restarted)") from None
    except TimeoutError:
        raise EndpointError(f"{path}: no snapshot within {timeout_s:g}s") from None
    except PermissionError:
        raise EndpointError(f"{path}: permission denied (the socket is the agent user's, mode 0600)") from None
    except OSError as exc:
        raise EndpointError(f"{path}: {exc.strerror or exc}") from None
    finally:
        s.close()
    try:
        snap = json.loads(b"".join(chunks))
    except ValueError:
        why = (
            "the answer was not a whole JSON snapshot (the agent stopped mid-answer?)"
            if chunks
            else "the agent closed the connection without a snapshot (see its log)"
        )
        raise EndpointError(f"{path}: {why}") from None
    if not isinstance(snap, dict) or "error" in snap or snap.get("version") != 1:
        raise EndpointError(f"{path}: not a version-1 snapshot: {str(snap)[:200]}")
    return snap


def fetch_newest(directory: str | None = None, timeout_s: float = 5.0) -> JsonObject:
    """A snapshot from the newest agent in the run directory that answers: a socket left by an
    agent killed with -9 is passed over. Raises EndpointError naming the first failure."""
    directory = directory or run_dir()
    errors = []
    for path in sockets(directory):
        try:
            return fetch(path, timeout_s)
        except EndpointError as exc:
            errors.append(str(exc))
    if not errors:
        raise EndpointError(f"no agent socket in {directory} (is `otelbpf run` running, as this user?)")
    raise EndpointError(errors[0] + (f" (and {len(errors) - 1} more sockets)" if len(errors) > 1 else ""))


def serve(snapshot: Callable[[], JsonObject]) -> StateServer | None:
    """The agent's endpoint, or None (turned off, or the run directory refused: said in the log)."""
    if os.environ.get("OTELBPF_LIVE", "").lower() in ("0", "off", "false", "no"):
        return None
    try:
        server = StateServer(snapshot)
    except OSError as exc:
        log.warning("no live state endpoint for `otelbpf top`: %s", exc)
        return None
    log.info("live state for `otelbpf top` on %s", server.path)
    return server
