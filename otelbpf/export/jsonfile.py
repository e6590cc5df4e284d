"""The embedded default exporter: OTLP-JSON lines on local disk.

One JSON object per line, each an ``ExportTraceServiceRequest`` or
``ExportMetricsServiceRequest`` in the OTLP/JSON encoding (the format of the
Collector's file exporter, replayable by its ``otlpjsonfile`` receiver):
lowerCamelCase fields, hex trace/span ids, enums as integers. Spans are
encoded directly (otlp_json.py: the SDK's protobuf route cost ~100 µs per
span); metrics, a few requests per interval, take the SDK's route.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import threading
import time
from collections.abc import Sequence

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otelbpf.base.safe_files import OutputDir, UnsafeOutput
from otelbpf.export.otlp_json import Conversions, encode_spans_json

log = logging.getLogger(__name__)

#: Rotated files removed past ``max_rotated`` (the oldest first), by signal; read by the agent
#: into ``otelbpf.export.files_removed``.
FILES_REMOVED = Conversions()

_ID_FIELDS = ("traceId", "spanId", "parentSpanId")


def _hex_ids(node: object) -> None:
    """MessageToDict writes bytes as base64; OTLP/JSON wants hex ids."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k in _ID_FIELDS and isinstance(v, str):
                node[k] = base64.b64decode(v).hex()
            else:
                _hex_ids(v)
    elif isinstance(node, list):
        for v in node:
            _hex_ids(v)


def to_otlp_json(message: Message) -> str:
    d = MessageToDict(message, use_integers_for_enums=True)
    _hex_ids(d)
    return json.dumps(d, separators=(",", ":"))


class _JsonLines:
    """Append-only file with size-based rotation, safe across threads.

    Each line goes out unbuffered; a write that fails part way (disk full) is cut off
    again, so the file never holds half a line, nor a failed line written later. The file
    is opened and rotated through ``OutputDir`` (no link followed, owner-only); a file that
    cannot be opened again after a rotation fails each write until it can.
    """

    def __init__(self, out: OutputDir, name: str, rotate_bytes: int, max_rotated: int = 0) -> None:
        self.path = os.path.join(out.path, f"{name}.jsonl")
        self._dir, self._name, self._rotate, self._max_rotated = out, name, rotate_bytes, max_rotated
        self._lock = threading.Lock()
        self._rotations = 0
        self._refused = ""  # the last refusal logged
        self._f: io.FileIO | None = self._open()

    def _open(self) -> io.FileIO:
        return io.FileIO(self._dir.open_append(f"{self._name}.jsonl"), "ab")

    def write(self, line: bytes) -> None:
        data = memoryview(line + b"\n")
        with self._lock:
            if self._f is None:
                try:
                    self._f = self._open()
                except UnsafeOutput as exc:  # counted as a failed export by the caller; said once
                    if str(exc) != self._refused:
                        log.error("%s", exc)
                        self._refused = str(exc)
                    raise
            end = self._f.seek(0, os.SEEK_END)
            try:
                while data:
                    data = data[self._f.write(data) :]
            except OSError:
                self._f.truncate(end)
                raise
            if self._rotate and self._f.tell() >= self._rotate:
                self._f.close()
                self._f = None
                # The sequence number keeps two rotations in one second apart (the second
                # would replace the first) and makes names sort in the order written.
                self._rotations += 1
                stamp = time.strftime("%Y%m%dT%H%M%S")
                rotated = f"{self._name}-{stamp}-{os.getpid()}-{self._rotations:06d}.jsonl"
                self._dir.rename(f"{self._name}.jsonl", rotated)
                self._f = self._open()
                if self._max_rotated:
                    try:
                        self._remove_oldest()
                    except OSError as exc:  # the line is written: the export succeeded all the same
                        log.warning("could not remove old rotated %s files: %s", self._name, exc)

    def _remove_oldest(self) -> None:
        """Keep the newest ``max_rotated`` rotated files of this signal in the directory (any
        run's: their names sort oldest first), remove the rest. A link named like one is left
        alone: never followed, never counted."""
        with os.scandir(self._dir.fd) as entries:
            rotated = sorted(
                e.name
                for e in entries
                if e.name.startswith(f"{self._name}-")
                and e.name.endswith(".jsonl")
                and e.is_file(follow_symlinks=False)
            )
        for old in rotated[: max(len(rotated) - self._max_rotated, 0)]:
            try:
                os.unlink(old, dir_fd=self._dir.fd)
            except FileNotFoundError:
                continue
            FILES_REMOVED.add(self._name)
            log.info(
                "removed %s: more than %d rotated %s files",
                os.path.join(self._dir.path, old),
                self._max_rotated,
                self._name,
            )

    def close(self) -> None:
        with self._lock:
            if self._f is not None:
                self._f.close()
                self._f = None
            self._dir.close()


class FileSpanExporter(SpanExporter):
    def __init__(
        self,
        directory: str,
        rotate_bytes: int = 64 << 20,
        *,
        max_rotated: int = 0,
        file_mode: int = 0o600,
        dir_mode: int = 0o700,
    ) -> None:
        """``rotate_bytes``: start a new file past this size (0: never); ``max_rotated``: rotated
        files kept, the oldest removed first (0: all). Raises UnsafeOutput for a directory or
        file that is a link."""
        self._out = _JsonLines(
            OutputDir(directory, dir_mode=dir_mode, file_mode=file_mode), "traces", rotate_bytes, max_rotated
        )

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            self._out.write(encode_spans_json(spans))
        except OSError:
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._out.close()


class FileMetricExporter(MetricExporter):
    def __init__(
        self,
        directory: str,
        rotate_bytes: int = 64 << 20,
        *,
        max_rotated: int = 0,
        file_mode: int = 0o600,
        dir_mode: int = 0o700,
    ) -> None:
        """As FileSpanExporter's."""
        super().__init__()
        self._out = _JsonLines(
            OutputDir(directory, dir_mode=dir_mode, file_mode=file_mode), "metrics", rotate_bytes, max_rotated
        )

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: object) -> MetricExportResult:
        try:
            self._out.write(to_otlp_json(encode_metrics(metrics_data)).encode())
        except OSError:
            return MetricExportResult.FAILURE
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
        self._out.close()
