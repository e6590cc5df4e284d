"""An in-process OTLP/gRPC server that keeps every export request it is sent.

It sits behind the real collector (rotel's OTLP exporter forwards to it), so what it holds
is what a backend would have received. Requests are parsed by grpcio with the service
stubs from ``opentelemetry-proto``; a request that does not decode fails the collector's
export, which rotel logs, instead of disappearing.
"""

from __future__ import annotations

import threading
from concurrent import futures

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

# rotel batches up to 8192 items per request; the gRPC default of 4 MiB is too small for that.
_MAX_MESSAGE_BYTES = 256 * 1024 * 1024


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, sink: OtlpSink) -> None:
        self._sink = sink

    def Export(self, request, context):  # noqa: N802 - name fixed by the generated stub
        self._sink._add_trace(request)
        return trace_service_pb2.ExportTraceServiceResponse()


class _MetricsService(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, sink: OtlpSink) -> None:
        self._sink = sink

    def Export(self, request, context):  # noqa: N802 - name fixed by the generated stub
        self._sink._add_metrics(request)
        return metrics_service_pb2.ExportMetricsServiceResponse()


class OtlpSink:
    """OTLP/gRPC trace and metrics receiver on a free loopback port; ``stop()`` ends it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._traces: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self._metrics: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="otlp-sink"),
            options=[("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES)],
        )
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(self), self._server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_MetricsService(self), self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _add_trace(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        with self._lock:
            self._traces.append(request)

    def _add_metrics(self, request: metrics_service_pb2.ExportMetricsServiceRequest) -> None:
        with self._lock:
            self._metrics.append(request)

    def trace_requests(self, start: int = 0) -> list[trace_service_pb2.ExportTraceServiceRequest]:
        """The trace requests received so far, from index ``start`` on, oldest first."""
        with self._lock:
            return self._traces[start:]

    def metric_requests(self, start: int = 0) -> list[metrics_service_pb2.ExportMetricsServiceRequest]:
        """The metrics requests received so far, from index ``start`` on, oldest first."""
        with self._lock:
            return self._metrics[start:]

    def clear(self) -> None:
        with self._lock:
            self._traces.clear()
            self._metrics.clear()

    def stop(self) -> None:
        self._server.stop(grace=None).wait()
