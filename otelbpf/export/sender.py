"""The background sending every push exporter needs: a bounded queue the caller hands
records to and returns, one thread that takes batches from it and sends each with
exponential back-off, and every record that does not go counted with its reason.

The exporters (Pyroscope, OTLP profiles) differ only in how one batch is encoded and sent;
their ``send`` raises ``Retry`` (connection errors, 429/5xx, gRPC UNAVAILABLE...: try again,
after the server's hint if it gave one) or ``Permanent`` (the request is wrong or
unencodable: retrying cannot help). Self-telemetry, per exporter and signal:
``otelbpf.export.sent``, ``.retries``, ``.failures`` (a batch given up on), ``.dropped{reason}``
(queue_full: the oldest record made room for a newer one; shutdown: still queued at stop;
export_failed: retries ran out; or the ``Permanent``'s reason).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from otelbpf.base.health import Health
from otelbpf.base.secrets import redact_logs_of
from otelbpf.base.threadname import name_os_thread
from otelbpf.config import RetryConfig, to_seconds

log = logging.getLogger(__name__)

#: The loggers that write an HTTP exporter's URLs: urllib3's request line at DEBUG (with the
#: query string) and retries, the OpenTelemetry HTTP exporters' and ours, which quote the
#: client's errors ("Max retries exceeded with url: /v1/traces?api_key=...").
HTTP_CLIENT_LOGGERS = (
    "urllib3.connectionpool",
    "urllib3.poolmanager",
    "urllib3.util.retry",
    "opentelemetry.exporter.otlp.proto.http._common",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "otelbpf.export.sender",
    "otelbpf.export.pyroscope",
    "otelbpf.export.otlp_profiles",
)


def redact_http_client_logs() -> None:
    """Keep an HTTP exporter's query token and userinfo out of the log at every level
    (``log_level: debug`` included): called where one is built."""
    redact_logs_of(HTTP_CLIENT_LOGGERS)


T = TypeVar("T")


class Retry(Exception):
    """This attempt failed; another may work (after ``after_s`` if the server said so)."""

    def __init__(self, message: str, after_s: float | None = None) -> None:
        super().__init__(message)
        self.after_s = after_s


class Permanent(Exception):
    """The batch cannot go: counted as dropped with ``reason``, not retried."""

    def __init__(self, message: str, reason: str = "refused") -> None:
        super().__init__(message)
        self.reason = reason


def retry_after(value: str | None) -> float | None:
    """An HTTP ``Retry-After`` in seconds (the delta-seconds form), None when absent or unusable."""
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        return None


class QueuedSender(Generic[T]):
    """``export`` never blocks; ``shutdown`` sends what it can within its timeout."""

    def __init__(
        self,
        name: str,
        signal: str,
        health: Health,
        send: Callable[[list[T]], None],
        *,
        retry: RetryConfig,
        max_queue_size: int,
        batch_size: int = 1,
        on_close: Callable[[], None] = lambda: None,
    ) -> None:
        self.name = name
        self._signal = signal
        self._health = health
        self._send = send
        self._retry = retry
        self._max = max_queue_size
        self._batch = batch_size
        self._on_close = on_close
        self._queue: deque[T] = deque()
        self._cv = threading.Condition()
        self._closing = False
        self._deadline = float("inf")  # when closing: give up sending after this
        self._thread = threading.Thread(target=self._run, name=f"otelbpf-{name}", daemon=True)
        self._thread.start()

    def export(self, records: Sequence[T]) -> None:
        dropped = 0
        with self._cv:
            for r in records:
                if len(self._queue) >= self._max:
                    self._queue.popleft()
                    dropped += 1
                self._queue.append(r)
            self._cv.notify()
        if dropped:
            self.drop(dropped, "queue_full")

    def __len__(self) -> int:
        return len(self._queue)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Send what is queued for at most ``timeout_s``; what is left is dropped and counted."""
        with self._cv:
            self._closing = True
            self._deadline = time.monotonic() + timeout_s
            self._cv.notify()
        self._thread.join(timeout_s + 1)
        with self._cv:
            left = len(self._queue)
            self._queue.clear()
        if left:
            self.drop(left, "shutdown")
        self._on_close()

    def drop(self, n: int, reason: str) -> None:
        self._health.add("otelbpf.export.dropped", n, signal=self._signal, reason=reason, exporter=self.name)

    def _run(self) -> None:
        name_os_thread(f"otelbpf-{self.name}"[:15])
        while True:
            with self._cv:
                while not self._queue and not self._closing:
                    self._cv.wait()
                if not self._queue:
                    return
                batch = [self._queue.popleft() for _ in range(min(len(self._queue), self._batch))]
            self._send_with_retries(batch)

    def _send_with_retries(self, batch: list[T]) -> None:
        delay = to_seconds(self._retry.initial_interval)
        give_up = time.monotonic() + to_seconds(self._retry.max_elapsed_time)
        while True:
            try:
                self._send(batch)
            except Permanent as exc:
                log.warning("%s exporter %s: %d records refused: %s", self._signal, self.name, len(batch), exc)
                reason = exc.reason
            except Retry as exc:
                wait = exc.after_s if exc.after_s is not None else delay
                if time.monotonic() + wait < min(give_up, self._deadline):
                    self._health.add("otelbpf.export.retries", 1, signal=self._signal, exporter=self.name)
                    log.info("%s exporter %s: %s; retrying in %.1fs", self._signal, self.name, exc, wait)
                    self._sleep(wait)
                    delay = min(delay * 2, to_seconds(self._retry.max_interval))
                    continue
                log.warning("%s exporter %s: giving up on %d records: %s", self._signal, self.name, len(batch), exc)
                reason = "export_failed"
            else:
                self._health.add("otelbpf.export.sent", len(batch), signal=self._signal, exporter=self.name)
                return
            self._health.add("otelbpf.export.failures", 1, signal=self._signal, exporter=self.name)
            self.drop(len(batch), reason)
            return

    def _sleep(self, seconds: float) -> None:
        with self._cv:
            self._cv.wait_for(lambda: time.monotonic() >= self._deadline, timeout=seconds)


class QueuedExporter(Generic[T]):
    """An exporter whose ``export``, length and ``shutdown`` are its ``QueuedSender``'s (set
    ``self._sender`` in ``__init__``): what it adds is how one batch is sent."""

    _sender: QueuedSender[T]

    def export(self, records: Sequence[T]) -> None:
        self._sender.export(records)

    def __len__(self) -> int:
        return len(self._sender)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Send what is queued for at most ``timeout_s``; what is left is dropped and counted."""
        self._sender.shutdown(timeout_s)
