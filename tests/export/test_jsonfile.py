"""The file exporters write OTLP/JSON: each line, with its ids turned back into bytes,
parses into the very protobuf request the OTLP exporters would have sent."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from google.protobuf.json_format import ParseDict
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics.export import MetricExportResult, MetricsData, ResourceMetrics, ScopeMetrics
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace import Link, SpanKind

from otelbpf.base.safe_files import UnsafeOutput
from otelbpf.correlate import metrics as m
from otelbpf.correlate.spans import make_span, new_context, scope
from otelbpf.export.jsonfile import FileMetricExporter, FileSpanExporter

RESOURCE = Resource({"service.name": "trainer", "process.pid": 4242, "process.command_args": ("python", "train.py")})
SCOPE = scope("otelbpf.test")
T0 = 1_700_000_000_000_000_000


def spans(n: int = 3, blob: str = "") -> list:
    parent = make_span(
        "request",
        resource=RESOURCE,
        scope=SCOPE,
        start_ns=T0,
        end_ns=T0 + 10**6,
        attributes={"http.request.method": "GET"},
        kind=SpanKind.SERVER,
    )
    out = [parent]
    for i in range(n - 1):
        out.append(
            make_span(
                "cudaMemcpy",
                resource=RESOURCE,
                scope=SCOPE,
                start_ns=T0 + i,
                end_ns=T0 + i + 500,
                attributes={"cuda.memcpy.bytes": 4096 * i, "cuda.memcpy.async": False, "ratio": 0.5, "blob": blob},
                error="cudaErrorInsufficientDriver (35)" if i % 2 else None,
                parent=parent.context,
            )
        )
    return out


def metrics_data(now: int = T0) -> MetricsData:
    hist = m.HistogramState()
    hist.add(np.array([2e-6, 3e-3, 0.2]))
    built = [
        m.cumulative_sum("cuda.memcpy.bytes", "By", "bytes", [({"cuda.memcpy.direction": "H2D"}, 8192)], T0 - 10, now),
        m.gauge("cuda.memory.in_use", "By", "in use", [({}, 512)], now),
        m.histogram(
            "cuda.sync.duration",
            "s",
            "waits",
            [hist.point({"cuda.api.function": "cudaDeviceSynchronize"}, T0 - 10, now)],
        ),
    ]
    return MetricsData([ResourceMetrics(RESOURCE, [ScopeMetrics(SCOPE, built, "")], "")])


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def ids_to_base64(node: object) -> None:
    """Undo OTLP/JSON's hex ids, into protobuf JSON's base64 bytes."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("traceId", "spanId", "parentSpanId") and isinstance(v, str):
                node[k] = base64.b64encode(bytes.fromhex(v)).decode()
            else:
                ids_to_base64(v)
    elif isinstance(node, list):
        for v in node:
            ids_to_base64(v)


def keys(node: object) -> set[str]:
    if isinstance(node, dict):
        return set(node) | {k for v in node.values() for k in keys(v)}
    if isinstance(node, list):
        return {k for v in node for k in keys(v)}
    return set()


def test_span_line_is_otlp_json_and_parses_back_into_the_same_request(tmp_path: Path) -> None:
    exporter = FileSpanExporter(str(tmp_path))
    batch = spans()
    assert exporter.export(batch) == SpanExportResult.SUCCESS
    exporter.shutdown()
    [doc] = lines(tmp_path / "traces.jsonl")
    [rs] = doc["resourceSpans"]
    [ss] = rs["scopeSpans"]
    parent, child, failed = ss["spans"]
    assert parent["traceId"] == f"{batch[0].context.trace_id:032x}"
    assert parent["spanId"] == f"{batch[0].context.span_id:016x}"
    assert child["parentSpanId"] == parent["spanId"] and child["traceId"] == parent["traceId"]
    assert "parentSpanId" not in parent
    assert (parent["kind"], child["kind"]) == (2, 1)  # SPAN_KIND_SERVER, SPAN_KIND_INTERNAL as integers
    assert failed["status"] == {"code": 2, "message": "cudaErrorInsufficientDriver (35)"}
    assert child["startTimeUnixNano"] == str(T0) and child["endTimeUnixNano"] == str(T0 + 500)
    assert ss["scope"]["name"] == "otelbpf.test"
    assert {"resourceSpans", "scopeSpans", "startTimeUnixNano", "traceId"} <= keys(doc)
    assert not any("_" in k for k in keys(doc)), "OTLP/JSON field names are lowerCamelCase"
    ids_to_base64(doc)
    assert ParseDict(doc, ExportTraceServiceRequest()) == encode_spans(batch)


def test_link_ids_are_hex_too(tmp_path: Path) -> None:
    target = new_context()
    span = ReadableSpan(
        name="s",
        context=new_context(),
        resource=RESOURCE,
        attributes={},
        links=[Link(target)],
        start_time=T0,
        end_time=T0 + 1,
        instrumentation_scope=SCOPE,
    )
    exporter = FileSpanExporter(str(tmp_path))
    exporter.export([span])
    exporter.shutdown()
    [doc] = lines(tmp_path / "traces.jsonl")
    [link] = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["links"]
    assert (link["traceId"], link["spanId"]) == (f"{target.trace_id:032x}", f"{target.span_id:016x}")
    ids_to_base64(doc)
    assert ParseDict(doc, ExportTraceServiceRequest()) == encode_spans([span])


def test_metric_line_parses_back_into_the_same_request(tmp_path: Path) -> None:
    exporter = FileMetricExporter(str(tmp_path))
    data = metrics_data()
    assert exporter.export(data) == MetricExportResult.SUCCESS
    assert exporter.force_flush()
    exporter.shutdown()
    [doc] = lines(tmp_path / "metrics.jsonl")
    by_name = {metric["name"]: metric for metric in doc["resourceMetrics"][0]["scopeMetrics"][0]["metrics"]}
    assert by_name["cuda.memcpy.bytes"]["sum"]["aggregationTemporality"] == 2  # CUMULATIVE, as an integer
    assert by_name["cuda.memcpy.bytes"]["sum"]["isMonotonic"] is True
    assert by_name["cuda.memcpy.bytes"]["sum"]["dataPoints"][0]["asInt"] == "8192"
    assert by_name["cuda.memory.in_use"]["gauge"]["dataPoints"][0]["asInt"] == "512"
    hist = by_name["cuda.sync.duration"]["histogram"]["dataPoints"][0]
    assert (hist["count"], hist["min"], hist["max"]) == ("3", 2e-6, 0.2)
    assert len(hist["bucketCounts"]) == len(hist["explicitBounds"]) + 1
    assert not any("_" in k for k in keys(doc))
    assert ParseDict(doc, ExportMetricsServiceRequest()) == encode_metrics(data)


def test_one_request_per_line_appended_across_exporters(tmp_path: Path) -> None:
    first = FileSpanExporter(str(tmp_path))
    first.export(spans(2))
    first.export(spans(4))
    first.shutdown()
    again = FileSpanExporter(str(tmp_path))  # a restarted agent appends
    again.export(spans(1))
    again.shutdown()
    docs = lines(tmp_path / "traces.jsonl")
    assert [len(d["resourceSpans"][0]["scopeSpans"][0]["spans"]) for d in docs] == [2, 4, 1]


def test_concurrent_exports_never_interleave_lines(tmp_path: Path) -> None:
    exporter = FileSpanExporter(str(tmp_path))

    def work() -> None:
        for _ in range(20):
            exporter.export(spans(3, blob="x" * 5000))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    exporter.shutdown()
    assert len(lines(tmp_path / "traces.jsonl")) == 80


def test_rotation_keeps_every_line(tmp_path: Path) -> None:
    """1 MiB files; each request is ~0.6 MiB, so every second one rotates: several rotations
    fall in the same second and must not overwrite one another."""
    exporter = FileSpanExporter(str(tmp_path), rotate_bytes=1 << 20)
    for i in range(7):
        assert exporter.export(spans(2, blob=f"{i}" * 600_000)) == SpanExportResult.SUCCESS
    exporter.shutdown()
    rotated = sorted(p.name for p in tmp_path.glob("traces-*.jsonl"))
    assert len(rotated) == 3
    assert all(p.startswith("traces-") and p.endswith(".jsonl") and str(os.getpid()) in p for p in rotated)
    blobs = []
    for name in [*rotated, "traces.jsonl"]:  # sorted names are oldest first
        for doc in lines(tmp_path / name):
            span = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][1]
            blob = next(a["value"]["stringValue"] for a in span["attributes"] if a["key"] == "blob")
            blobs.append(blob[0])
    assert blobs == [str(i) for i in range(7)]
    assert all(len(lines(tmp_path / name)) == 2 for name in rotated)


def test_an_output_file_that_is_a_link_is_refused_not_followed(tmp_path: Path) -> None:
    """As root: traces.jsonl -> a file the agent must not touch (issue 13, row 7)."""
    victim = tmp_path / "passwd"
    victim.write_text("root:x:0:0\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "traces.jsonl").symlink_to(victim)
    (out / "metrics.jsonl").symlink_to("/dev/full")

    with pytest.raises(UnsafeOutput, match="traces.jsonl is a symbolic link: refusing"):
        FileSpanExporter(str(out))
    with pytest.raises(UnsafeOutput, match="metrics.jsonl is a symbolic link"):
        FileMetricExporter(str(out))
    assert victim.read_text() == "root:x:0:0\n"


FILE_SIZE_LIMITED = """
import resource, sys
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from otelbpf.correlate.spans import make_span, scope
from otelbpf.export.jsonfile import FileSpanExporter

resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))  # Python ignores SIGXFSZ: writes fail with EFBIG
exporter = FileSpanExporter(sys.argv[1])
span = make_span("s", resource=Resource({}), scope=scope("t"), start_ns=1, end_ns=2, attributes={"blob": "x" * 3000})
print(" ".join(exporter.export([span]).name for _ in range(8)))
exporter.shutdown()
"""


def test_a_write_that_fails_part_way_leaves_only_whole_lines(tmp_path: Path) -> None:
    """A real short write: the file size limit stops the fifth line part way through."""
    out = subprocess.run(
        [sys.executable, "-c", FILE_SIZE_LIMITED, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.returncode == 0, out.stderr
    results = out.stdout.split()
    written = results.count("SUCCESS")
    assert results == ["SUCCESS"] * written + ["FAILURE"] * (8 - written) and 0 < written < 8
    data = (tmp_path / "traces.jsonl").read_bytes()
    assert data.endswith(b"\n") and len(data) < 20_000
    assert len(lines(tmp_path / "traces.jsonl")) == written


def test_rotate_bytes_zero_never_rotates(tmp_path):
    exporter = FileSpanExporter(str(tmp_path), rotate_bytes=0)
    for _ in range(50):
        exporter._out.write(b"x" * 100_000)
    exporter.shutdown()
    assert [p.name for p in tmp_path.iterdir()] == ["traces.jsonl"]


def test_past_max_rotated_the_oldest_rotated_files_go_and_are_counted(tmp_path: Path) -> None:
    """Keep the newest ``max_rotated`` rotated files (any run's: an older run's name sorts
    first), remove the rest, count each; a link named like one is left alone, never followed."""
    from otelbpf.export.jsonfile import FILES_REMOVED

    FILES_REMOVED.take()
    older_run = tmp_path / "traces-20200101T000000-1-000001.jsonl"
    older_run.write_text("{}\n")
    victim = tmp_path.parent / f"{tmp_path.name}-victim.jsonl"
    victim.write_text("kept\n")
    link = tmp_path / "traces-20200101T000000-1-000002.jsonl"
    link.symlink_to(victim)
    other_signal = tmp_path / "metrics-20200101T000000-1-000001.jsonl"
    other_signal.write_text("{}\n")
    exporter = FileSpanExporter(str(tmp_path), rotate_bytes=1 << 20, max_rotated=2)
    for i in range(6):  # ~0.6 MiB a request: a rotation after every second one
        assert exporter.export(spans(2, blob=f"{i}" * 600_000)) == SpanExportResult.SUCCESS
    exporter.shutdown()
    mine = sorted(p.name for p in tmp_path.glob(f"traces-*-{os.getpid()}-*.jsonl"))
    assert [name[-12:] for name in mine] == ["000002.jsonl", "000003.jsonl"]
    assert not older_run.exists() and other_signal.exists()
    assert link.is_symlink() and victim.read_text() == "kept\n"
    assert FILES_REMOVED.take() == {"traces": 2}  # the older run's file, then this run's first


def test_a_folder_that_cannot_be_listed_fails_no_export(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Removing old rotated files is housekeeping after the line is written: when the folder
    cannot be listed, the export still succeeds (and the reason is logged)."""
    import otelbpf.export.jsonfile as jsonfile

    def refuse(*_: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(jsonfile.os, "scandir", refuse)
    exporter = FileSpanExporter(str(tmp_path), rotate_bytes=1 << 20, max_rotated=1)
    for i in range(4):
        assert exporter.export(spans(2, blob=f"{i}" * 600_000)) == SpanExportResult.SUCCESS
    exporter.shutdown()
    monkeypatch.undo()  # os.scandir is pathlib's too
    assert len(list(tmp_path.glob("traces-*.jsonl"))) == 2  # nothing removed, nothing lost
