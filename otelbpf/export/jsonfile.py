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
import json
import os
import threading
import time
from collections.abc import Sequence

from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otelbpf.export.otlp_json import encode_spans_json

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


def to_otlp_json(message) -> str:
    d = MessageToDict(message, use_integers_for_enums=True)
    _hex_ids(d)
    return json.dumps(d, separators=(",", ":"))


class _JsonLines:
    """Append-only file with size-based rotation, safe across threads.

    Each line goes out unbuffered; a write that fails part way (disk full) is cut off
    again, so the file never holds half a line, nor a failed line written later.
    """

    def __init__(self, directory: str, name: str, rotate_bytes: int) -> None:
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, f"{name}.jsonl")
        self._dir, self._name, self._rotate = directory, name, rotate_bytes
        self._lock = threading.Lock()
        self._rotations = 0
        self._f = open(self.path, "ab", buffering=0)

    def write(self, line: bytes) -> None:
        data = memoryview(line + b"\n")
        with self._lock:
            end = self._f.seek(0, os.SEEK_END)
            try:
                while data:
                    data = data[self._f.write(data):]
            except OSError:
                try:
                    self._f.truncate(end)
                except OSError:
                    pass  # not a regular file (/dev/full, a pipe): nothing to cut
                raise
            if self._rotate and self._f.tell() >= self._rotate:
                self._f.close()
                # The sequence number keeps two rotations in one second apart (the second
                # would replace the first) and makes names sort in the order written.
                self._rotations += 1
                stamp = time.strftime("%Y%m%dT%H%M%S")
                rotated = f"{self._name}-{stamp}-{os.getpid()}-{self._rotations:06d}.jsonl"
                os.replace(self.path, os.path.join(self._dir, rotated))
                self._f = open(self.path, "ab", buffering=0)

    def close(self) -> None:
        with self._lock:
            self._f.close()


class FileSpanExporter(SpanExporter):
    def __init__(self, directory: str, rotate_bytes: int = 64 << 20) -> None:
        """``rotate_bytes``: start a new file past this size (0: never)."""
        self._out = _JsonLines(directory, "traces", rotate_bytes)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            self._out.write(encode_spans_json(spans))
        except OSError:
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._out.close()


class FileMetricExporter(MetricExporter):
    def __init__(self, directory: str, rotate_bytes: int = 64 << 20) -> None:
        """``rotate_bytes``: start a new file past this size (0: never)."""
        super().__init__()
        self._out = _JsonLines(directory, "metrics", rotate_bytes)

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs) -> MetricExportResult:
        try:
            self._out.write(to_otlp_json(encode_metrics(metrics_data)).encode())
        except OSError:
            return MetricExportResult.FAILURE
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        self._out.close()
