"""Run rotel, the real OTLP collector from PyPI, as a foreground child process.

Without ``--daemon`` rotel stays in the foreground, writes no pid or log file and logs to
stdout, so the child is the collector itself; on SIGTERM it flushes pending batches and
exits. It cannot bind port 0 (it panics), so free ports are picked here and kept for the
life of the object: ``stop()`` and ``start()`` bring it down and back on the same ports, the
way a real endpoint goes away and returns. Its stdout (startup, errors and the
``--debug-log`` lines for every request it receives) is appended to one file across restarts."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import rotel

ROTEL_AGENT = Path(rotel.__file__).with_name("rotel-agent")
_READY_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 5.0
_CONFLICT_RETRY_S = 3.0
_BIND_ERROR = "Address already in use"
_RUN_MARKER = "=== rotel start"


def _free_ports(count: int) -> list[int]:
    """Distinct loopback ports the kernel just handed out (all held open until all are picked)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _die_with_parent() -> list[str]:
    """A command prefix that SIGTERMs rotel if the test process dies without closing it.

    util-linux's ``setpriv --pdeathsig`` sets it up and execs rotel (same pid). A
    ``preexec_fn`` would do the same but forces a fork that grpcio's fork handlers complain
    about while the sink's threads run. Linux sends the signal when the *thread* that started
    rotel ends, so collectors belong to the thread that owns them (pytest's main thread).
    Where setpriv is missing rotel merely outlives a killed test run.
    """
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM"] if setpriv else []


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


class RotelProcess:
    """rotel receiving OTLP on loopback gRPC + HTTP and exporting OTLP/gRPC to ``export_endpoint``."""

    def __init__(
        self, export_endpoint: str, log_path: Path, *, verbosity: str = "basic", batch_timeout: str = "20ms"
    ) -> None:
        if not ROTEL_AGENT.is_file():
            raise RuntimeError(
                f"rotel's collector binary is missing at {ROTEL_AGENT}; "
                "reinstall the test extra: .venv/bin/pip install -e '.[test]'"
            )
        self.export_endpoint = export_endpoint
        self.log_path = log_path
        self.verbosity = verbosity
        self.batch_timeout = batch_timeout
        self.grpc_port, self.http_port = _free_ports(2)
        self._process: subprocess.Popen[bytes] | None = None
        self._starts = 0

    def _command(self) -> list[str]:
        return [
            *_die_with_parent(),
            str(ROTEL_AGENT),
            "start",
            "--otlp-grpc-endpoint",
            f"127.0.0.1:{self.grpc_port}",
            "--otlp-http-endpoint",
            f"127.0.0.1:{self.http_port}",
            "--otlp-receiver-logs-disabled",
            "--debug-log",
            "traces",
            "--debug-log",
            "metrics",
            "--debug-log-verbosity",
            self.verbosity,
            "--batch-timeout",
            self.batch_timeout,
            "--exporter",
            "otlp",
            "--otlp-exporter-endpoint",
            self.export_endpoint,
            "--otlp-exporter-protocol",
            "grpc",
        ]

    @staticmethod
    def _environment() -> dict[str, str]:
        """The caller's environment without ROTEL_* settings, which would change the flags' meaning."""
        env = {key: value for key, value in os.environ.items() if not key.startswith("ROTEL_")}
        env["NO_COLOR"] = "1"
        return env

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def state(self) -> str:
        """One line for failure messages: running, stopped, or exited on its own (with its code)."""
        if self._process is None:
            return "rotel is stopped"
        code = self._process.poll()
        if code is None:
            return f"rotel is running (pid {self._process.pid}, gRPC :{self.grpc_port}, HTTP :{self.http_port})"
        return f"rotel EXITED on its own with code {code} (see its log)"

    def start(self, *, pick_new_ports_on_conflict: bool = False) -> None:
        """Start rotel and wait until both receivers accept connections.

        On the first start a port taken between picking and binding is re-picked; on a
        restart the ports must stay the same, so a conflict is retried for a while and then
        reported.
        """
        if self.running:
            return
        conflict_deadline = time.monotonic() + _CONFLICT_RETRY_S
        while True:
            failure = self._launch()
            if failure is None:
                return
            conflict = _BIND_ERROR in self._last_run_output()
            if conflict and time.monotonic() < conflict_deadline:
                if pick_new_ports_on_conflict:
                    self.grpc_port, self.http_port = _free_ports(2)
                else:
                    time.sleep(0.1)
            else:
                hint = (
                    f"; another process holds port {self.grpc_port} or {self.http_port}, which this "
                    "collector keeps across restarts"
                    if conflict
                    else ""
                )
                raise RuntimeError(
                    f"rotel did not start: {failure}{hint}\n--- rotel output ---\n{self._last_run_output()}"
                )

    def _launch(self) -> str | None:
        """Run rotel once; ``None`` when it is serving, else why not."""
        self._starts += 1
        with self.log_path.open("ab") as log:
            log.write(f"{_RUN_MARKER} #{self._starts}: {' '.join(self._command())}\n".encode())
            log.flush()
            self._process = subprocess.Popen(
                self._command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self._environment(),
            )
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while time.monotonic() < deadline:
            code = self._process.poll()
            if code is not None:
                self._process = None
                return f"it exited with code {code}"
            if _accepts(self.grpc_port) and _accepts(self.http_port):
                return None
            time.sleep(0.01)
        self.stop()
        return f"its receivers on ports {self.grpc_port}/{self.http_port} did not accept within {_READY_TIMEOUT_S}s"

    def stop(self) -> None:
        """SIGTERM (rotel flushes and exits), SIGKILL if it has not gone after a few seconds."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def _last_run_output(self) -> str:
        return _RUN_MARKER + self.log_text().rsplit(_RUN_MARKER, 1)[-1]

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
