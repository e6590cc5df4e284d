"""Export metrics every ``interval``: the probe families' cumulative metrics
per process, plus the agent's own otelbpf.* health.

All metrics are cumulative, so an export that fails loses nothing for good:
the next successful one carries the totals. Failures are still counted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from opentelemetry.sdk.metrics.export import (
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otelbpf.base.health import Health
from otelbpf.base.threadname import name_os_thread

log = logging.getLogger(__name__)

#: A source returns (resource, scope, metrics) triples.
Triples = list[tuple[Resource, InstrumentationScope, list[Metric]]]
Source = Callable[[], Triples]
#: How long a round waits for its sources before exporting what it has.
SOURCE_WAIT_S = 20.0
#: The first round comes this long after the start, not a whole interval (10 s by default):
#: ``otelbpf top`` then has numbers, and rates, from the first second.
FIRST_ROUND_S = 1.0


def source_name(source: Source) -> str:
    """How a source is named in logs and in ``otelbpf.metrics.source_timeouts{source}``."""
    return str(getattr(source, "__qualname__", None) or getattr(source, "__name__", None) or type(source).__name__)


class _SourceRunner:
    """One source, called on a daemon thread of its own.

    A source may block: a receiver's collect() waits for its correlator's lock, which a
    processing thread stuck on one batch never lets go (the watchdog says so), or for a
    sync with that thread. On the metrics thread, that one source held up every other one,
    the agent's own health included (the stall counter never got out), and the last export
    at stop. On its own thread it holds up nothing: a round waits for it a bounded time,
    then goes on without it. What it returns late is not dropped (it may hold the final
    totals of processes the source has since forgotten): it is exported by the next round,
    before anything newer of that source, which is not asked again until then.
    """

    def __init__(self, source: Source, health: Health) -> None:
        self.source = source
        self.name = source_name(source)
        self._health = health
        self._cond = threading.Condition()
        self._asked = False
        self._busy = False
        self._result: Triples | None = None  # returned, not yet taken
        self._thread: threading.Thread | None = None

    def ask(self) -> bool:
        """Start a call unless one is running or its result waits; True when one started."""
        with self._cond:
            if self._asked or self._busy or self._result is not None:
                return False
            self._asked = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="otelbpf-metrics-source", daemon=True)
                self._thread.start()
            self._cond.notify()
            return True

    def wait(self, deadline: float) -> bool:
        """Until the running call returns or ``deadline`` (monotonic); True when idle."""
        with self._cond:
            return self._cond.wait_for(lambda: not (self._asked or self._busy), max(0.0, deadline - time.monotonic()))

    @property
    def busy(self) -> bool:
        with self._cond:
            return self._asked or self._busy

    def take(self) -> Triples | None:
        with self._cond:
            result, self._result = self._result, None
            return result

    def _run(self) -> None:
        name_os_thread("otelbpf-metrics-source")
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._asked)
                self._asked, self._busy = False, True
            result: Triples = []
            try:
                result = list(self.source())
            except Exception:  # one broken source must not hide the others
                log.exception("metric source %s failed", self.name)
                self._health.add("otelbpf.metrics.source_errors")
            with self._cond:
                self._busy = False
                self._result = result
                self._cond.notify_all()


class MetricsLoop:
    def __init__(
        self,
        exporters: Sequence[tuple[str, MetricExporter]],
        sources: Sequence[Source],
        health: Health,
        interval_s: float,
        on_collect: Callable[[MetricsData], None] | None = None,
    ) -> None:
        """``on_collect``: also given each collection (the live view, live/state.py): the same
        one the exporters get, since a source's collect() forgets the processes that exited."""
        self._on_collect = on_collect
        self._exporters = list(exporters)
        self._runners = [_SourceRunner(s, health) for s in sources]
        self._health = health
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otelbpf-metrics", daemon=True)
        self._round_lock = threading.Lock()  # one round at a time: the timer's or the final one

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        name_os_thread("otelbpf-metrics")
        wait_s = min(FIRST_ROUND_S, self._interval)
        while not self._stop.wait(wait_s):
            wait_s = self._interval
            try:
                self.export_once()
            except Exception:  # a failed round must not end the loop: the agent would export nothing
                log.exception("metrics export failed; trying again in %.1fs", self._interval)
                self._health.add("otelbpf.metrics.export_errors")

    @property
    def failed(self) -> bool:
        """The timer thread ended before stop(): no metric leaves any more (the agent exits)."""
        return self._thread.ident is not None and not self._thread.is_alive() and not self._stop.is_set()

    def _group(self, results: list[Triples]) -> MetricsData:
        grouped: dict[tuple[tuple[str, str], ...], tuple[Resource, list[ScopeMetrics]]] = {}
        for triples in results:
            try:
                for resource, scope, metrics in triples:
                    key = tuple(sorted((k, str(v)) for k, v in resource.attributes.items()))
                    scopes = grouped.setdefault(key, (resource, []))[1]
                    scopes.append(ScopeMetrics(scope=scope, metrics=metrics, schema_url=""))
            except Exception:  # one source's garbage must not hide the others
                log.exception("metric source returned something that is not (resource, scope, metrics)")
                self._health.add("otelbpf.metrics.source_errors")
        return MetricsData(
            resource_metrics=[
                ResourceMetrics(resource=resource, scope_metrics=scopes, schema_url="")
                for resource, scopes in grouped.values()
            ]
        )

    def _late(self) -> list[Triples]:
        """What sources returned after an earlier round had gone on without them."""
        return [r for r in (runner.take() for runner in self._runners) if r is not None]

    def _gather(self, deadline: float, *, final: bool) -> list[Triples]:
        """Ask every idle source, wait for all of them until ``deadline``, take what came."""
        for runner in self._runners:
            runner.ask()
        results = []
        for runner in self._runners:
            while not runner.wait(min(deadline, time.monotonic() + 0.05)):
                if time.monotonic() >= deadline or (self._stop.is_set() and not final):
                    break  # stopping: the final round waits for it, and takes what it returns
            if not runner.busy:
                result = runner.take()
                if result is not None:
                    results.append(result)
            elif self._stop.is_set() and not final:
                continue
            else:
                self._health.add("otelbpf.metrics.source_timeouts", 1, source=runner.name)
                log.warning(
                    "metric source %s has not answered%s: exported without it%s",
                    runner.name,
                    " by the end of the stop's budget" if final else f" within {SOURCE_WAIT_S:.0f}s",
                    "" if final else "; what it returns later goes out with the next export",
                )
        return results

    def collect(self, wait_s: float = SOURCE_WAIT_S) -> MetricsData:
        """One collection from every source that answers within ``wait_s`` (what a source
        returned late to an earlier round included)."""
        return self._group(self._late() + self._gather(time.monotonic() + wait_s, final=False))

    def export_once(self, wait_s: float = SOURCE_WAIT_S, *, final: bool = False) -> None:
        with self._round_lock:
            late = self._late()
            if late:  # first, and on their own: a source's newer answer must not go out before them
                self._export(self._group(late))
            self._export(self._group(self._gather(time.monotonic() + wait_s, final=final)))

    def _export(self, data: MetricsData) -> None:
        if self._on_collect is not None:
            self._on_collect(data)
        if not data.resource_metrics:
            return
        for name, exporter in self._exporters:
            try:
                result = exporter.export(data)
            except Exception as exc:
                log.warning("metric exporter %s raised: %s", name, exc)
                result = MetricExportResult.FAILURE
            if result == MetricExportResult.SUCCESS:
                self._health.add("otelbpf.export.sent", len(data.resource_metrics), signal="metrics", exporter=name)
            else:
                self._health.add("otelbpf.export.failures", 1, signal="metrics", exporter=name)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the timer and export one last time, so totals at exit are kept.

        Bounded by ``timeout_s`` in all: every source is waited for until then (one that
        timed out in an earlier round too: its late answer may hold a forgotten process's
        totals), and what it returns by then goes out. A source still busy at the end is
        said and counted (``otelbpf.metrics.source_timeouts``); a final round that could not
        run at all (the timer's round stuck in an exporter) in ``otelbpf.metrics.stop_timeouts``."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s

        def final_round() -> None:
            for runner in self._runners:  # a call still running from an earlier round: its answer first
                runner.wait(deadline)
            self.export_once(max(0.0, deadline - time.monotonic()), final=True)

        final = threading.Thread(target=final_round, name="otelbpf-metrics-final", daemon=True)
        final.start()
        final.join(max(0.0, deadline - time.monotonic()) + 0.5)  # its sources are bounded by the deadline
        if final.is_alive():
            self._health.add("otelbpf.metrics.stop_timeouts")
            log.error(
                "the last metrics export did not finish within %.0fs (an exporter or a round is stuck): "
                "totals since the previous export are lost",
                timeout_s,
            )
        for _name, exporter in self._exporters:
            try:
                exporter.shutdown()
            except Exception as exc:
                log.warning("metric exporter shutdown failed: %s", exc)
