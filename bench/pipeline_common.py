"""What bench/http_pipeline.py and bench/http2_pipeline.py share: socket records through the
real ``HttpCorrelator`` in ring-sized batches, then its spans through the file exporter, timed
in CPU seconds (``time.process_time``)."""

from __future__ import annotations

import cProfile
import pstats
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

from otelbpf.correlate.base import CorrelatorSettings
from otelbpf.correlate.causality import Causality
from otelbpf.correlate.clock import MonotonicClock
from otelbpf.correlate.process_info import ProcessInfo
from otelbpf.export.jsonfile import FileSpanExporter
from otelbpf.families.http.correlator import HttpCorrelator


@dataclass
class PipelineRun:
    spans: list
    counts: dict = field(default_factory=dict)  # (metric, attributes) -> the agent's otelbpf.* counts
    correlate_s: float = 0.0
    export_s: float = 0.0

    def problems(self) -> dict[str, int]:
        return {str(k): v for k, v in self.counts.items() if "problems" in k[0]}


def feed_and_export(
    arr: np.ndarray, port: int, batch: int, profile: bool, top: int = 25, **options: object
) -> PipelineRun:
    """``arr`` in batches of ``batch`` records (one drain each), then the file exporter, 512 spans
    a request; ``profile`` prints the ``top`` functions of a cProfile of the correlator.
    ``options``: the correlator's (a ``sampler``, say)."""
    run = PipelineRun(spans=[])

    def count(metric: str, n: int, **attrs) -> None:
        key = (metric, tuple(sorted(attrs.items())))
        run.counts[key] = run.counts.get(key, 0) + n

    corr = HttpCorrelator(
        CorrelatorSettings(ProcessInfo(), MonotonicClock(), run.spans.extend),
        count,
        Causality(),
        lambda m, items: None,
        ports=[port],
        max_spans_per_second=10**9,
        **options,  # type: ignore[arg-type]
    )
    prof = cProfile.Profile() if profile else None
    t0 = time.process_time()
    if prof:
        prof.enable()
    for s in range(0, len(arr), batch):
        corr.on_ring("sockdata", arr[s : s + batch])
        corr.on_tick()
    if prof:
        prof.disable()
    run.correlate_s = time.process_time() - t0
    corr.collect()
    with tempfile.TemporaryDirectory() as d:
        exporter = FileSpanExporter(d)
        t0 = time.process_time()
        for s in range(0, len(run.spans), 512):
            exporter.export(run.spans[s : s + 512])
        run.export_s = time.process_time() - t0
        exporter.shutdown()
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(top)
    return run
