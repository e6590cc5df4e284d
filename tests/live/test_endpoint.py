"""The agent's state socket: owner-only, one snapshot per connection, and every way a viewer
can fail to get one (no agent, a stale socket, a half answer, a refused run directory) is a
clear EndpointError, while a failing snapshot does not end the endpoint."""

from __future__ import annotations

import os
import socket
import stat
import threading
from pathlib import Path

import pytest

from otelbpf.live import endpoint
from otelbpf.live.endpoint import EndpointError, StateServer, fetch

SNAP = {"version": 1, "agent_pid": 1, "processes": [], "spans": []}


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch) -> Path:
    d = tmp_path / "run"
    monkeypatch.setenv(endpoint.RUN_DIR_ENV, str(d))
    monkeypatch.delenv("OTELBPF_LIVE", raising=False)
    return d


def test_one_snapshot_per_connection_from_an_owner_only_socket(run_dir: Path) -> None:
    server = endpoint.serve(lambda: SNAP)
    assert server is not None
    try:
        assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(server.path).st_mode) == 0o600
        assert endpoint.sockets() == [server.path] and server.path.endswith(f"agent-{os.getpid()}.sock")
        assert fetch(server.path) == SNAP and fetch(server.path) == SNAP
    finally:
        server.close()
    assert not os.path.exists(server.path)
    with pytest.raises(EndpointError, match="no such socket"):
        fetch(server.path)


def test_a_failing_snapshot_leaves_the_endpoint_serving(run_dir: Path) -> None:
    calls = []

    def snapshot() -> dict:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return SNAP

    server = StateServer(snapshot)
    try:
        with pytest.raises(EndpointError, match="closed the connection without a snapshot"):
            fetch(server.path)
        assert fetch(server.path) == SNAP
    finally:
        server.close()


def test_a_stale_socket_and_a_dead_end_are_said(tmp_path: Path) -> None:
    stale = str(tmp_path / "agent-1.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(stale)
    s.close()  # the file stays, nobody listens: an agent killed with -9
    with pytest.raises(EndpointError, match="stale socket"):
        fetch(stale)
    silent = str(tmp_path / "agent-2.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(silent)
    listener.listen(1)  # accepts (the kernel does) but never answers
    try:
        with pytest.raises(EndpointError, match="no snapshot within 0.3s"):
            fetch(silent, timeout_s=0.3)
    finally:
        listener.close()


def test_not_a_snapshot_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "agent-3.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(2)

    def answer(bodies: list[bytes]) -> None:
        for body in bodies:
            conn, _ = listener.accept()
            conn.sendall(body)
            conn.close()

    t = threading.Thread(target=answer, args=([b'{"version": 2}\n', b"[1, 2]\n"],))
    t.start()
    try:
        for _ in range(2):
            with pytest.raises(EndpointError, match="not a version-1 snapshot"):
                fetch(path)
    finally:
        t.join(5)
        listener.close()


def test_a_run_directory_open_to_others_is_refused_and_the_agent_runs_on(run_dir: Path) -> None:
    run_dir.mkdir(mode=0o755)
    run_dir.chmod(0o755)
    with pytest.raises(OSError, match="mode 0700"):
        StateServer(lambda: SNAP)
    assert endpoint.serve(lambda: SNAP) is None
    link = run_dir.parent / "link"
    link.symlink_to(run_dir.parent)
    with pytest.raises(OSError, match="link is a symbolic link"):
        StateServer(lambda: SNAP, str(link))


def test_a_run_directory_swapped_for_a_link_after_its_check_does_not_take_the_socket(
    run_dir: Path, monkeypatch
) -> None:
    """Issue 31: the socket goes through the same rules as every file the agent writes. The
    run directory is checked, then (as another user who can write in its parent could) renamed
    and replaced by a link to a folder of theirs before the bind: the socket stays in the
    directory checked, and nothing appears in theirs."""
    theirs = run_dir.parent / "theirs"
    theirs.mkdir(mode=0o777)
    real_unlink, swapped = os.unlink, []

    def unlink_then_swap(path, *args, **kwargs):  # the step between the check and the bind
        if not swapped:
            swapped.append(run_dir.rename(run_dir.parent / "checked"))
            run_dir.symlink_to(theirs)
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink_then_swap)
    server = StateServer(lambda: SNAP)
    monkeypatch.setattr(os, "unlink", real_unlink)
    try:
        assert swapped and list(theirs.iterdir()) == []
        socket_path = swapped[0] / f"agent-{os.getpid()}.sock"
        assert stat.S_ISSOCK(socket_path.lstat().st_mode) and stat.S_IMODE(socket_path.lstat().st_mode) == 0o600
        assert fetch(str(socket_path)) == SNAP
    finally:
        server.close()
    assert list(swapped[0].iterdir()) == []


def test_turned_off(run_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv("OTELBPF_LIVE", "off")
    assert endpoint.serve(lambda: SNAP) is None and not run_dir.exists()


def test_the_newest_agent_that_answers_is_taken_over_a_stale_socket(run_dir: Path) -> None:
    with pytest.raises(EndpointError, match="no agent socket in"):
        endpoint.fetch_newest()
    server = StateServer(lambda: SNAP)
    stale = run_dir / "agent-999999.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(stale))  # newer than the live one: an agent killed with -9 after it started
    s.close()
    live = os.stat(server.path).st_mtime
    os.utime(stale, (live + 1, live + 1))  # file times tick coarsely (jiffies): both binds can read the same time
    try:
        assert endpoint.sockets()[0] == str(stale)
        assert endpoint.fetch_newest() == SNAP
    finally:
        server.close()
    with pytest.raises(EndpointError, match="stale socket"):
        endpoint.fetch_newest()
