"""Bounded, batching hand-off from correlation to span exporters.

Like the Collector's batch processor + sending queue: spans wait here until
``send_batch_size`` are ready or ``timeout`` passes, then every exporter gets
the batch. The queue never grows past ``max_queue_size``; what does not fit
is dropped and counted (otelbpf.export.dropped), so an exporter that is down
costs bounded memory and is visible, never silent.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otelbpf.base.health import Health
from otelbpf.base.threadname import name_os_thread
from otelbpf.export.jsonfile import FileSpanExporter

log = logging.getLogger(__name__)


class SpanQueue:
    def __init__(
        self,
        exporters: Sequence[tuple[str, SpanExporter]],
        health: Health,
        *,
        max_queue_size: int = 8192,
        batch_size: int = 512,
        timeout_s: float = 1.0,
    ) -> None:
        self._exporters = list(exporters)
        self._health = health
        self._max = max_queue_size
        self._batch = batch_size
        self._timeout = timeout_s
        self._q: deque[ReadableSpan] = deque()
        self._cv = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="otelbpf-spans", daemon=True)
        self._thread.start()

    def offer(self, spans: list[ReadableSpan]) -> int:
        """Enqueue; returns how many were dropped because the queue is full."""
        with self._cv:
            room = self._max - len(self._q)
            take = spans if len(spans) <= room else spans[: max(room, 0)]
            self._q.extend(take)
            dropped = len(spans) - len(take)
            if len(self._q) >= self._batch:
                self._cv.notify()
        if dropped:
            self._health.add("otelbpf.export.dropped", dropped, signal="traces", reason="queue_full")
        return dropped

    def __len__(self) -> int:
        return len(self._q)

    def _take(self) -> list[ReadableSpan]:
        n = min(self._batch, len(self._q))
        return [self._q.popleft() for _ in range(n)]

    def _run(self) -> None:
        name_os_thread("otelbpf-spans")
        while True:
            with self._cv:
                if not self._closing and len(self._q) < self._batch:
                    self._cv.wait(self._timeout)
                batch = self._take()
                closing = self._closing and not self._q
            if batch:
                self._export(batch)
            if closing:
                return

    def _export(self, batch: list[ReadableSpan]) -> None:
        # A span recorded unsampled (the CUDA calls of a request head sampling shed:
        # correlate/spans.py) goes to the agent's own files, which its answers are read from
        # (diagnose, report), and to no trace backend, where it would be a root with no request.
        sampled = [s for s in batch if s.context.trace_flags.sampled]
        for name, exporter in self._exporters:
            mine = batch if isinstance(exporter, FileSpanExporter) else sampled
            if not mine:
                continue
            try:
                result = exporter.export(mine)
            except Exception as exc:  # an exporter bug must not stop the others
                log.warning("span exporter %s raised: %s", name, exc)
                result = SpanExportResult.FAILURE
            if result == SpanExportResult.SUCCESS:
                self._health.add("otelbpf.export.sent", len(mine), signal="traces", exporter=name)
            else:
                self._health.add("otelbpf.export.failures", 1, signal="traces", exporter=name)
                self._health.add(
                    "otelbpf.export.dropped", len(mine), signal="traces", reason="export_failed", exporter=name
                )

    def close(self, timeout_s: float = 30.0) -> None:
        """Flush what is queued (bounded by ``timeout_s``), then shut exporters down."""
        with self._cv:
            self._closing = True
            self._cv.notify()
        self._thread.join(timeout_s)
        with self._cv:  # an exporter still stuck must not send, later, what is counted here
            left = len(self._q)
            self._q.clear()
        if left:
            self._health.add("otelbpf.export.dropped", left, signal="traces", reason="shutdown")
        for _name, exporter in self._exporters:
            try:
                exporter.shutdown()
            except Exception as exc:
                log.warning("exporter shutdown failed: %s", exc)
