"""SpanQueue: batching, a bounded queue whose drops are counted, failures that stay with
the exporter that failed, and a close that flushes. The exporters are small SpanExporter
classes that block, fail or record (pure logic); one test uses the real file exporter."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from harness.agent import wait_until
from otelbpf.base.health import Health
from otelbpf.correlate.spans import make_span, scope
from otelbpf.export.jsonfile import FileSpanExporter
from otelbpf.export.span_queue import SpanQueue

RESOURCE = Resource({"service.name": "t"})
SCOPE = scope("otelbpf.test")


def spans(n: int, start: int = 0) -> list[ReadableSpan]:
    return [
        make_span(f"s{i}", resource=RESOURCE, scope=SCOPE, start_ns=i, end_ns=i + 1, attributes={})
        for i in range(start, start + n)
    ]


def names(batch: Sequence[ReadableSpan]) -> list[str]:
    return [s.name for s in batch]


class Recording(SpanExporter):
    """Keeps every batch; optionally blocks inside export until released, or fails."""

    def __init__(
        self, *, block: bool = False, result: SpanExportResult = SpanExportResult.SUCCESS, raises: bool = False
    ) -> None:
        self.batches: list[list[str]] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        if not block:
            self.release.set()
        self.result = result
        self.raises = raises
        self.shutdowns = 0

    def export(self, batch: Sequence[ReadableSpan]) -> SpanExportResult:
        self.entered.set()
        self.release.wait(30)
        self.batches.append(names(batch))
        if self.raises:
            raise RuntimeError("exporter bug")
        return self.result

    def shutdown(self) -> None:
        self.shutdowns += 1

    @property
    def exported(self) -> list[str]:
        return [n for b in self.batches for n in b]


def test_full_batches_go_out_without_waiting_for_the_timeout() -> None:
    exporter = Recording()
    health = Health()
    queue = SpanQueue([("rec", exporter)], health, batch_size=4, timeout_s=60)
    start = time.monotonic()
    assert queue.offer(spans(4)) == 0
    assert wait_until(lambda: exporter.batches)
    assert time.monotonic() - start < 5
    assert exporter.batches == [["s0", "s1", "s2", "s3"]]
    queue.close()
    assert health.get("otelbpf.export.sent", signal="traces", exporter="rec") == 4


def test_a_partial_batch_goes_out_after_the_timeout() -> None:
    exporter = Recording()
    queue = SpanQueue([("rec", exporter)], Health(), batch_size=100, timeout_s=0.05)
    queue.offer(spans(3))
    assert wait_until(lambda: exporter.batches, timeout=5)
    assert exporter.batches == [["s0", "s1", "s2"]]
    queue.close()


def test_a_full_queue_drops_and_counts_while_the_exporter_is_stuck() -> None:
    exporter = Recording(block=True)
    health = Health()
    queue = SpanQueue([("stuck", exporter)], health, max_queue_size=10, batch_size=4, timeout_s=0.05)
    queue.offer(spans(4))
    assert exporter.entered.wait(5)  # the first batch is out of the queue, inside export()
    assert queue.offer(spans(15, start=4)) == 5  # 10 fit
    assert len(queue) == 10
    assert queue.offer(spans(1, start=19)) == 1
    assert health.get("otelbpf.export.dropped", signal="traces", reason="queue_full") == 6
    exporter.release.set()
    queue.close()
    assert exporter.exported == [f"s{i}" for i in range(14)]
    assert [len(b) for b in exporter.batches] == [4, 4, 4, 2]
    assert health.get("otelbpf.export.sent", signal="traces", exporter="stuck") == 14
    assert health.get("otelbpf.export.dropped") == 6


@pytest.mark.parametrize(
    "failing", [Recording(result=SpanExportResult.FAILURE), Recording(raises=True)], ids=["returns-failure", "raises"]
)
def test_a_failing_exporter_is_counted_and_does_not_stop_the_others(failing: Recording) -> None:
    healthy = Recording()
    health = Health()
    queue = SpanQueue([("bad", failing), ("good", healthy)], health, batch_size=3, timeout_s=0.05)
    queue.offer(spans(3))
    queue.offer(spans(3, start=3))
    queue.close()
    assert healthy.exported == failing.exported == [f"s{i}" for i in range(6)]
    assert health.get("otelbpf.export.failures", signal="traces", exporter="bad") == 2
    assert health.get("otelbpf.export.dropped", signal="traces", reason="export_failed", exporter="bad") == 6
    assert health.get("otelbpf.export.sent", signal="traces", exporter="good") == 6
    assert health.get("otelbpf.export.sent", signal="traces", exporter="bad") == 0
    assert (failing.shutdowns, healthy.shutdowns) == (1, 1)


def test_close_flushes_what_is_queued_at_once() -> None:
    exporter = Recording()
    health = Health()
    queue = SpanQueue([("rec", exporter)], health, batch_size=512, timeout_s=60)
    queue.offer(spans(3))
    start = time.monotonic()
    queue.close()
    assert time.monotonic() - start < 5, "close waited for the batch timeout"
    assert exporter.exported == ["s0", "s1", "s2"]
    assert exporter.shutdowns == 1
    assert health.get("otelbpf.export.dropped") == 0


def test_close_gives_up_on_a_stuck_exporter_and_counts_what_it_leaves() -> None:
    exporter = Recording(block=True)
    health = Health()
    queue = SpanQueue([("stuck", exporter)], health, max_queue_size=100, batch_size=4, timeout_s=0.05)
    queue.offer(spans(4))
    assert exporter.entered.wait(5)
    queue.offer(spans(6, start=4))
    start = time.monotonic()
    queue.close(timeout_s=0.2)
    assert time.monotonic() - start < 5
    assert health.get("otelbpf.export.dropped", signal="traces", reason="shutdown") == 6
    exporter.release.set()  # the stuck call returns after all
    assert wait_until(lambda: exporter.batches)
    time.sleep(0.2)
    # What close() counted as dropped is not sent afterwards as well.
    assert exporter.exported == ["s0", "s1", "s2", "s3"]


def test_spans_reach_a_real_file_exporter(tmp_path: Path) -> None:
    health = Health()
    queue = SpanQueue([("file", FileSpanExporter(str(tmp_path)))], health, batch_size=5, timeout_s=0.05)
    for i in range(4):
        queue.offer(spans(3, start=3 * i))
    queue.close()
    written = []
    for line in (tmp_path / "traces.jsonl").read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                written += [s["name"] for s in ss["spans"]]
    assert written == [f"s{i}" for i in range(12)]
    assert health.get("otelbpf.export.sent", exporter="file", signal="traces") == 12


def test_unsampled_spans_go_to_the_agents_files_and_no_trace_backend(tmp_path: Path) -> None:
    # the CUDA calls of a request head sampling shed (correlate/spans.py: sampled=False)
    health = Health()
    backend = Recording()
    shed = [
        make_span(f"shed{i}", resource=RESOURCE, scope=SCOPE, start_ns=i, end_ns=i + 1, attributes={}, sampled=False)
        for i in range(2)
    ]
    queue = SpanQueue(
        [("file", FileSpanExporter(str(tmp_path))), ("otlp", backend)], health, batch_size=100, timeout_s=0.05
    )
    queue.offer([*spans(2), *shed])
    queue.offer(shed)  # a batch of nothing else: the backend is not called with an empty one
    queue.close()
    written = [
        s["name"]
        for line in (tmp_path / "traces.jsonl").read_text().splitlines()
        for rs in json.loads(line)["resourceSpans"]
        for ss in rs["scopeSpans"]
        for s in ss["spans"]
    ]
    assert sorted(written) == ["s0", "s1", "shed0", "shed0", "shed1", "shed1"]
    assert backend.batches == [["s0", "s1"]]
    assert health.get("otelbpf.export.sent", exporter="otlp", signal="traces") == 2
    assert health.get("otelbpf.export.sent", exporter="file", signal="traces") == 6
