"""Wire one agent together: sensor -> correlate -> export, driven by config.

Data flows one way. The sensor's drain thread only enqueues arrays; one
processing thread turns them into spans and metric state; the span queue and
the metrics loop export. Stopping runs the same path backwards: detach
probes, drain what is left, process it, flush exporters.
"""

from __future__ import annotations

import logging
import os
import queue
import resource as rlimit
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from types import FrameType

import numpy as np
from opentelemetry.sdk.metrics.export import Metric
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otelbpf.base import resident
from otelbpf.base.health import Health
from otelbpf.base.losses import explain
from otelbpf.base.threadname import name_os_thread
from otelbpf.base.watchdog import Watchdog, run_checks
from otelbpf.config import BatchProcessorConfig, Config, ReceiverConfig, to_seconds
from otelbpf.correlate import metrics as m
from otelbpf.correlate import symbolizer
from otelbpf.correlate.clock import MonotonicClock
from otelbpf.correlate.process_info import ProcessInfo, agent_resource
from otelbpf.correlate.profile_record import Profile
from otelbpf.correlate.spans import scope
from otelbpf.correlate.symbolizer import Symbolizer
from otelbpf.export import runs
from otelbpf.export.encoded_profile import encoded
from otelbpf.export.factory import metric_exporter, span_exporter
from otelbpf.export.metrics_loop import MetricsLoop, Source
from otelbpf.export.profile_export import profile_exporter
from otelbpf.export.self_profiling import self_profiler
from otelbpf.export.span_queue import SpanQueue
from otelbpf.families import registry
from otelbpf.families.factory import Context, CutCorrelator, MapAccess, Receiver, RingCorrelator
from otelbpf.jobguard import Job
from otelbpf.live import endpoint as live_endpoint
from otelbpf.live import status
from otelbpf.live.findings import FindingsReporter
from otelbpf.live.state import LiveState
from otelbpf.sensor.program_cache import ProgramCache
from otelbpf.sensor.sensor import TICK, Sensor, SensorError, SensorOptions, require_root

log = logging.getLogger(__name__)

AGENT_SCOPE = scope("otelbpf.agent")
#: The drain thread pauses once the processing queue holds more than 1/8 of
#: ``processing_queue_size`` (2 MiB of the default 16).
QUEUE_PAUSE_DIVISOR = 8
_KERNEL_DROP_REASONS = {
    "events_lost": "ring_buffer_full",
    "str_lost": "string_ring_full",
    "inflight_full": "inflight_map_full",
    "launch_map_full": "launch_map_full",
    "sock_lost": "socket_ring_full",
    "sock_map_full": "socket_map_full",
    "call_lost": "cuda_call_unplaced",
}


class Agent:
    def __init__(
        self,
        config: Config,
        *,
        pids: Sequence[int] = (),
        pause_on_load: bool = False,
    ) -> None:
        self.config = config
        self.health = Health()
        self.clock = MonotonicClock()
        traces = bool(config.pipeline("traces"))
        self._resource_attrs = config.resource_attributes("traces" if traces else "metrics")
        self.process_info = ProcessInfo(
            {k: v for k, v in self._resource_attrs.items()}, command_line=config.targets.command_line
        )
        sizes = [c for _, c in self._receiver_configs()]
        symbolizer.TABLES.max_tables = max((getattr(c, "symbol_tables", 0) for c in sizes), default=0) or 128
        symbolizer.TABLES.max_bytes = max((getattr(c, "symbol_table_bytes", 0) for c in sizes), default=0) or 32 << 20
        self.symbolizer = Symbolizer(
            max_names=next((c.symbol_names for c in sizes if hasattr(c, "symbol_names")), 65536)
        )
        self.started_at = time.time()

        batch = next(
            (
                p
                for s in ("traces", "metrics")
                for _, p in config.pipeline_processors(s)
                if isinstance(p, BatchProcessorConfig)
            ),
            BatchProcessorConfig(),
        )
        self.spans: SpanQueue | None = None
        if traces:
            self.spans = SpanQueue(
                [(n, span_exporter(c)) for n, c in config.pipeline_exporters("traces")],
                self.health,
                max_queue_size=batch.max_queue_size,
                batch_size=batch.send_batch_size,
                timeout_s=to_seconds(batch.timeout),
            )

        self.profile_exporters = [
            (n, profile_exporter(n, c, self.health)) for n, c in config.pipeline_exporters("profiles")
        ]
        self.self_profiler = self_profiler(config)
        maps = MapAccess()
        ctx = Context(
            self.process_info,
            self.symbolizer,
            self.clock,
            self.health,
            self._emit_spans,
            maps,
            traces,
            export_profiles=self._export_profiles,
            profile_attributes=config.resource_attributes("profiles"),
        )
        self.receivers = [registry.build(name, cfg, ctx) for name, cfg in self._receiver_configs()]
        # Correlators whose records open scopes others' spans nest in (torch operators) go first,
        # so the records drained with theirs in one batch find those scopes.
        self.receivers.sort(key=lambda r: not getattr(r.correlator, "opens_scopes", False))
        if not self.receivers:
            raise SensorError("no receiver in any pipeline: name one (e.g. `cuda`) under service.pipelines.*.receivers")
        watched = list(pids) or list(config.targets.pids)
        self.sensor = Sensor(
            SensorOptions(
                families=[r.family for r in self.receivers],
                pids=watched,
                search_globs=[g for r in self.receivers for g in r.search_globs],
                drain_interval_s=to_seconds(config.service.telemetry.drain_interval),
                events_ring_bytes=max(r.ring_buffer_size for r in self.receivers),
                str_ring_bytes=config.service.telemetry.string_ring_size,
                pause_on_load=pause_on_load,
                # host mode only: a --pid target's children may be a shell's jobs
                pause_new_libraries=config.service.host_pause.on() and not watched,
                max_pause_s=to_seconds(config.service.host_pause.max_pause),
                program_cache=_program_cache(config, self.health),
            ),
            deliver=self._deliver,
            backlogged=self._backlogged,
        )
        maps.read, maps.forget, maps.update = self.sensor.read_map, self.sensor.delete_keys, self.sensor.update_map
        maps.with_bpf = self.sensor.with_bpf
        ctx.sync = self.sync
        self.sensor.on_process = self._describe_process
        # Bounded in bytes (as 64-byte events), not batches: one drained batch can hold ~60k
        # events. Records larger than an event (socket payloads) weigh as many as they are long.
        self._work: queue.Queue[tuple[str, np.ndarray] | threading.Event | None] = queue.Queue()
        self._queued = 0
        self._queued_max = config.service.telemetry.processing_queue_size // 64  # in 64-byte events
        # Past this the drain thread stops taking records from the kernel's rings until the
        # processing thread catches up (Sensor._drain_loop): the rings, resident anyway, hold
        # the backlog; the queue's full size is left for forced drains (sync, stop).
        self._queued_pause = self._queued_max // QUEUE_PAUSE_DIVISOR
        self._queued_peak = 0  # since the last health export
        self._queued_lock = threading.Lock()
        self._processor = threading.Thread(target=self._process_loop, name="otelbpf-process", daemon=True)
        #: says when the processing thread is stuck on one batch (base/watchdog.py)
        self.watchdog = Watchdog("otelbpf-process", self.health)
        self._watchdog_stop = threading.Event()
        self.live = LiveState()  # what `otelbpf top` reads: the last metrics collected, the last spans
        self.live_endpoint: live_endpoint.StateServer | None = None
        self.metrics: MetricsLoop | None = None
        #: the diagnosis, live: findings as spans and gauges at the metrics rhythm
        self.findings: FindingsReporter | None = None
        if config.pipeline("metrics") and config.service.findings.enabled:
            self.findings = FindingsReporter(
                self.live.snapshot,
                lambda pid: self.live.resource(pid) or self.process_info.resource(pid),
                lambda spans: self.spans.offer(spans) if self.spans is not None else None,
                to_seconds(config.service.findings.repeat_interval),
            )
        if config.pipeline("metrics"):
            self.metrics = MetricsLoop(
                [(n, metric_exporter(c)) for n, c in config.pipeline_exporters("metrics")],
                [
                    *(self._receiver_source(r) for r in self.receivers),
                    self._health_metrics,
                    *([self.findings.collect] if self.findings else []),
                ],
                self.health,
                to_seconds(config.service.telemetry.metrics_interval),
                on_collect=self.live.on_metrics,
            )

    def _receiver_configs(self) -> list[tuple[str, ReceiverConfig]]:
        seen: dict[str, ReceiverConfig] = {}
        for s in ("traces", "metrics", "profiles"):
            for name, cfg in self.config.pipeline_receivers(s):
                seen[name] = cfg
        return list(seen.items())

    # -- data path --------------------------------------------------------

    def _deliver(self, ring: str, arr: np.ndarray) -> None:
        """Called on the drain thread: enqueue only, never block."""
        if ring == TICK:  # no records: never refused
            self._work.put((ring, arr))
            return
        with self._queued_lock:
            if self._queued + _weight(arr) > self._queued_max:
                full = True
            else:
                full = False
                self._queued += _weight(arr)
                self._queued_peak = max(self._queued_peak, self._queued)
        if full:
            self.health.add("otelbpf.events.dropped", len(arr), reason="processing_queue_full", ring=ring)
        else:
            self._work.put((ring, arr))

    def _backlogged(self) -> bool:
        """Called by the drain thread before each tick: is the processing thread behind?"""
        return self._queued > self._queued_pause

    def _process_loop(self) -> None:
        name_os_thread("otelbpf-process")
        while True:
            item = self._work.get()
            if item is None:
                return
            if isinstance(item, threading.Event):  # a sync() marker: all before it is processed
                item.set()
                continue
            ring, arr = item
            if ring in (TICK, "events"):
                # the tick's family batches are all in (the events ring is delivered last): merged
                # first, so that a request is open before the CUDA calls made for it are processed
                self._tick()
                if ring == TICK:
                    continue
            with self._queued_lock:
                self._queued -= _weight(arr)
            for r in self.receivers:
                self.watchdog.begin(f"{r.name} {ring}")
                try:
                    if ring == "events":
                        r.correlator.on_events(arr)
                    elif ring == "strevents":
                        r.correlator.on_strings(arr)
                    elif any(spec.name == ring for spec in r.family.rings):
                        if not isinstance(r.correlator, RingCorrelator):
                            raise TypeError(f"{r.name}: its family has the ring {ring}, its correlator no on_ring")
                        r.correlator.on_ring(ring, arr)
                except Exception:  # a bad batch is counted, the agent goes on
                    log.exception("%s: processing a batch of %d %s failed", r.name, len(arr), ring)
                    self.health.add(
                        "otelbpf.events.dropped", len(arr), reason="processing_error", ring=ring, receiver=r.name
                    )
                finally:
                    self.watchdog.end()

    def _tick(self) -> None:
        """A drain tick's family batches are all delivered: correlators that merge rings go on
        (a no-op for one with nothing pending: each tick with events ends twice)."""
        for r in self.receivers:
            if isinstance(r.correlator, CutCorrelator):
                self.watchdog.begin(f"{r.name} tick")
                try:
                    r.correlator.on_tick()
                except Exception:  # counted by the correlator where it can; the agent goes on
                    log.exception("%s: processing a drain tick failed", r.name)
                finally:
                    self.watchdog.end()

    def sync(self, timeout_s: float = 5.0) -> bool:
        """Process every event the probes emitted before this call.

        A counting map read at export time can run ahead of the ring events that
        describe what it counts (an RDMA QP's posts are counted in the kernel, its
        peer arrives with ibv_modify_qp on the events ring). A correlator reads its
        maps, then calls this, so what it counted is described before it is
        exported. Bounded: a backlog longer than ``timeout_s`` is counted and
        left to the next export. Once the agent stops, the sensor's final drain
        feeds the processing thread and this waits for that thread to end
        instead: a metrics export racing the stop would otherwise name counters
        whose events are still queued, then forget them.
        """
        if not self._processor.is_alive():
            return True
        if self.sensor.stopping:
            self._processor.join(timeout_s)
            ok = not self._processor.is_alive()
        else:
            self.sensor.drain_tick()
            done = threading.Event()
            self._work.put(done)
            ok = done.wait(timeout_s)
        if not ok:
            self.health.add("otelbpf.metrics.sync_timeouts")
        return ok

    def _mark_library_users(self) -> None:
        """Host mode with the sockets family: tell the kernel which running processes map a
        probed library (its ``lib_users`` set learns later ones from their openat, and
        children from fork), the processes whose requests are traced by default."""
        opts = self.sensor.options
        if opts.pids or not any(f.name == "sockets" for f in opts.families):
            return
        from otelbpf.sensor import libraries

        # a libssl mapping makes no process a library user (LibraryKind.marks_user)
        marking = [replace(f, libraries=tuple(k for k in f.libraries if k.marks_user)) for f in opts.families]
        users = [pid for pid in libraries.all_pids() if next(libraries.from_process(pid, marking), None) is not None]
        self.sensor.update_map("lib_users", [(pid, 1) for pid in users])
        log.info("requests traced for %d running processes that use a probed library", len(users))

    def _describe_process(self, pid: int, exec_ns: int | None = None) -> None:
        """Snapshot a process's resource and memory map while it is alive. At an exec
        (``exec_ns``), what was read of the pid before it is the program it replaced (``env
        VAR=… cmd``: ``env``'s resource): dropped here, while the process is stopped at its
        exec, not when a correlator reaches the exec event, by which time a short program may
        be gone and only its task name left."""
        if exec_ns is not None:
            self.process_info.forget(pid, before_ns=exec_ns)
            self.symbolizer.forget(pid, before_ns=exec_ns)
        self.process_info.resource(pid)
        self.symbolizer.remember(pid)

    def _export_profiles(self, profiles: list[Profile]) -> None:
        # Each with its process's resource as its spans carry it (OTLP profiles send it), and
        # the profiles pipeline's resource attributes over it.
        extra = self.config.resource_attributes("profiles")
        records = [encoded(p, {**self.process_info.resource(p.pid).attributes, **extra}) for p in profiles]
        for _name, exporter in self.profile_exporters:
            exporter.export(records)
        self.live.on_profiles(profiles)  # the CPU timelines, for the live findings

    def _emit_spans(self, spans: list[ReadableSpan]) -> None:
        self.live.on_spans(spans)
        if self.spans is not None:
            self.spans.offer(spans)

    # -- metrics sources --------------------------------------------------

    @staticmethod
    def _receiver_source(r: Receiver) -> Source:
        """One receiver's metrics as a source of its own: a receiver whose collect() blocks
        (behind its stuck processing thread) holds up none of the others."""

        def collect() -> list[tuple[Resource, InstrumentationScope, list[Metric]]]:
            return [(res, r.correlator.scope, metrics) for res, metrics in r.correlator.collect()]

        collect.__qualname__ = f"receiver {r.name}"
        return collect

    def _health_metrics(self) -> list[tuple[Resource, InstrumentationScope, list[Metric]]]:
        from otelbpf.export.jsonfile import FILES_REMOVED
        from otelbpf.export.otlp_json import CONVERSIONS

        for kind, n in CONVERSIONS.take().items():  # values an OTLP encoder had to clamp
            self.health.add("otelbpf.export.values_converted", n, kind=kind)
        for sig, n in FILES_REMOVED.take().items():  # the file exporter's oldest rotated files
            self.health.add("otelbpf.export.files_removed", n, signal=sig)
        now = time.time_ns()
        start = int(self.started_at * 1e9)
        out: list[Metric | None] = []
        out.append(
            m.cumulative_sum(
                "otelbpf.events.received",
                "{event}",
                "Records drained from the BPF ring buffers",
                [({"ring": r}, n) for r, n in self.sensor.records_received.items()],
                start,
                now,
            )
        )
        out.append(
            m.cumulative_sum(
                "otelbpf.events.skipped",
                "{event}",
                "Ring records skipped: discarded by their producer, or malformed",
                [({"ring": r}, n) for r, n in self.sensor.records_skipped().items()],
                start,
                now,
            )
        )
        kernel = self.sensor.kernel_stats()
        out.append(
            m.cumulative_sum(
                "otelbpf.events.lost",
                "{event}",
                "Events lost in the kernel (ring buffer or map full)",
                [({"reason": _KERNEL_DROP_REASONS.get(k, k)}, v) for k, v in kernel.items()],
                start,
                now,
            )
        )
        by_name: dict[str, list[tuple[m.Attrs, int]]] = {}
        for name, attrs, value in self.health.snapshot():
            by_name.setdefault(name, []).append((attrs, value))
        for name, points in by_name.items():
            out.append(m.cumulative_sum(name, "1", "Agent self-telemetry counter", points, start, now))
        out.append(
            m.cumulative_sum(
                "otelbpf.cache.evictions",
                "{entry}",
                "Cache entries evicted (LRU), by cache",
                [({"cache": c}, n) for c, n in sorted(symbolizer.EVICTIONS.items())] or [({}, 0)],
                start,
                now,
            )
        )
        a = self.sensor.attach_stats
        out.append(m.gauge("otelbpf.probes.attached", "{probe}", "Uprobes attached", [({}, a.probes)], now))
        out.append(m.gauge("otelbpf.libraries.attached", "{library}", "Library files probed", [({}, a.libraries)], now))
        out.append(
            m.cumulative_sum(
                "otelbpf.attach.failures",
                "{failure}",
                "Failed attach attempts, by reason",
                [({"reason": r}, n) for r, n in sorted(a.by_reason.items())] or [({}, 0)],
                start,
                now,
            )
        )
        out.append(
            m.gauge(
                "otelbpf.libraries.retrying",
                "{library}",
                "Library files waiting for an attach retry",
                [({}, a.retrying)],
                now,
            )
        )
        if pauses := self.sensor.pause_counts():
            out.append(
                m.cumulative_sum(
                    "otelbpf.pauses",
                    "{process}",
                    "Host mode's pause at a library open, by outcome: stopped; resumed probed, or "
                    "unprobed (the attach failed), or by the guard after max_pause (timeout) or the "
                    "agent's end (orphaned); not stopped, the paused map full (untracked)",
                    [({"outcome": k}, v) for k, v in sorted(pauses.items())],
                    start,
                    now,
                )
            )
        with self._queued_lock:
            queued, peak, self._queued_peak = self._queued, self._queued_peak, self._queued
        out.append(
            m.gauge(
                "otelbpf.processing.queued",
                "By",
                "Records drained and waiting for the processing thread (now, and the most since the last export)",
                [({"state": "current"}, queued * 64), ({"state": "peak"}, peak * 64)],
                now,
            )
        )
        rings = self.sensor.ring_usage()  # after the stop: the last read, for the final export
        if rings:
            out.append(
                m.gauge(
                    "otelbpf.ring.usage",
                    "By",
                    "Bytes waiting in each BPF ring buffer at its fullest since the last export",
                    [({"ring": name}, peak) for name, _size, peak in rings],
                    now,
                )
            )
            out.append(
                m.gauge(
                    "otelbpf.ring.size",
                    "By",
                    "Size of each BPF ring buffer (resident: counted in the agent's memory)",
                    [({"ring": name}, size) for name, size, _peak in rings],
                    now,
                )
            )
        out.append(
            m.cumulative_sum(
                "otelbpf.drain.paused",
                "{tick}",
                "Drain ticks that left records in the kernel's rings: the processing thread was behind",
                [({}, self.sensor.drain_pauses)],
                start,
                now,
            )
        )
        out.append(
            m.cumulative_sum(
                "otelbpf.drain.woken",
                "{wakeup}",
                "Wake-ups of the drain thread by a BPF ring filling another eighth, before its timer's tick",
                [({}, self.sensor.fill_wakeups)],
                start,
                now,
            )
        )
        out.append(
            m.gauge(
                "otelbpf.spans.queued",
                "{span}",
                "Spans waiting for export",
                [({}, len(self.spans) if self.spans else 0)],
                now,
            )
        )
        out.append(
            m.gauge(
                "otelbpf.startup.duration",
                "s",
                "BPF compile and first attach time",
                [
                    (
                        {"phase": "compile", "source": "cache" if self.sensor.programs_cached else "compile"},
                        self.sensor.compile_seconds,
                    ),
                    ({"phase": "attach"}, self.sensor.attach_seconds),
                ],
                now,
            )
        )
        usage = rlimit.getrusage(rlimit.RUSAGE_SELF)
        out.append(
            m.cumulative_sum(
                "process.cpu.time",
                "s",
                "CPU time of the agent",
                [({"cpu.mode": "user"}, usage.ru_utime), ({"cpu.mode": "system"}, usage.ru_stime)],
                start,
                now,
            )
        )
        out.append(m.gauge("process.memory.usage", "By", "Resident memory of the agent", [({}, _rss_bytes())], now))
        out.append(
            m.gauge(
                "otelbpf.agent.busy",
                "s",
                "How long each worker has been on its current item (0: idle)",
                [({"worker": self.watchdog.worker}, self.watchdog.busy_seconds())],
                now,
            )
        )
        return [(agent_resource(self._resource_attrs), AGENT_SCOPE, [x for x in out if x is not None])]

    # -- life cycle -------------------------------------------------------

    def start(self) -> None:
        require_root()
        resident.fix_mmap_threshold()  # before the compile: LLVM's large blocks go back too
        if self.self_profiler is not None:
            self.self_profiler.start()  # first: the BCC compile and the attach are profiled too
        self._processor.start()
        run_checks([self.watchdog], self._watchdog_stop)
        self.sensor.start()
        self._mark_library_users()
        if not self.sensor.options.pause_on_load:
            # --pid targets and the descendants they had already (children forked from now
            # on follow in the kernel): watched, and their maps read while they surely live.
            # Not a `run --` child: the agent's fork until its exec, described at its first
            # library open.
            targets = list(self.sensor.options.pids)
            for pid in descendants(targets):
                self.sensor.watch_pid(pid)
                targets.append(pid)
            for pid in targets:
                self._describe_process(pid)
        if self.metrics is not None:
            self.metrics.start()
        self.live_endpoint = live_endpoint.serve(self.live.snapshot)
        log.info(
            "otelbpf running: compiled in %.2fs%s, %d probes on %d libraries",
            self.sensor.compile_seconds,
            " (programs from the cache)" if self.sensor.programs_cached else "",
            self.sensor.attach_stats.probes,
            self.sensor.attach_stats.libraries,
        )
        # Code run only to start (config validation, the compile, ELF and BTF reading, numpy's
        # and OpenSSL's set-up) stays resident: drop the clean file pages; what runs again
        # is read in again.
        try:
            log.debug("dropped %.1f MiB of clean file pages after start", resident.drop_file_pages() / 2**20)
        except OSError as exc:  # only memory not given back: the agent runs the same
            log.warning("clean file pages not dropped after start: %s", exc)

    def stop(self) -> None:
        if self.live_endpoint is not None:
            self.live_endpoint.close()
        phases: list[tuple[str, float]] = []
        t0 = time.monotonic()

        def done(phase: str) -> None:
            phases.append((phase, time.monotonic() - t0 - sum(t for _, t in phases)))

        self.sensor.stop()  # detach, final drain
        done("sensor")
        self._work.put(None)
        # What is queued is processed before the final exports; a thread the watchdog saw
        # stuck on one batch will not get there: do not wait the full time for it.
        self._processor.join(timeout=2 if self.watchdog.stalled() else 30)
        self._watchdog_stop.set()
        done("processing")
        if self.findings is not None:
            try:
                self.findings.collect()  # the last findings' spans, while the traces pipeline takes them
            except Exception:  # a diagnosis that fails must not stop the flush below
                log.exception("the last live diagnosis failed")
                self.health.add("otelbpf.metrics.source_errors")
        if self.spans is not None:
            self.spans.close()  # flush; what cannot go is counted before...
        done("spans")
        if self.metrics is not None:
            self.metrics.stop()  # ...the final metrics export carries all totals
        done("metrics")
        for _name, exporter in self.profile_exporters:
            exporter.shutdown()  # after the sensor's stop made the last profiles
        done("profiles")
        if self.self_profiler is not None:
            self.self_profiler.stop()  # pushes the last samples, the stop's included
            done("self_profiling")
        log.info(
            "otelbpf stopped in %.2fs (%s)",
            time.monotonic() - t0,
            ", ".join(f"{name} {took:.2f}s" for name, took in phases),
        )

    def stats_line(self) -> str:
        """The run's last line: counts, and each kind of loss with its cause and its fix."""
        kernel = self.sensor.kernel_stats()
        line = (
            f"events received {sum(self.sensor.records_received.values())}, "
            f"spans {sum(getattr(r.correlator, 'spans_emitted', 0) for r in self.receivers)}, "
            f"lost in kernel {sum(kernel.values())}, "
            f"dropped {self.health.get('otelbpf.events.dropped') + self.health.get('otelbpf.export.dropped')}, "
            f"export failures {self.health.get('otelbpf.export.failures')}"
        )
        causes = [f"\n  lost {n:,}: {explain(r)}" for r, n in sorted(self._losses().items())]
        return line + "".join(causes)

    def _losses(self) -> dict[str, int]:
        """Records lost in the kernel and dropped in user space so far, by reason (non-zero)."""
        lost = {_KERNEL_DROP_REASONS.get(k, k): v for k, v in self.sensor.kernel_stats().items() if v}
        for name, attrs, value in self.health.snapshot():
            if name == "otelbpf.events.dropped" and value:
                reason = str(attrs.get("reason", "dropped"))
                lost[reason] = lost.get(reason, 0) + value
        return lost

    def status_sample(self) -> status.Sample:
        """The counters ``otelbpf run``'s status line shows (live/status.py)."""
        attach = self.sensor.attach_stats
        return status.Sample(
            processes=len(self.process_info),
            libraries=attach.libraries,
            probes=attach.probes,
            events=sum(self.sensor.records_received.values()),
            lost=self._losses(),
        )


def _program_cache(config: Config, health: Health) -> ProgramCache | None:
    """The configured program cache (``service.program_cache``), or None when turned off;
    entries it refuses are counted in ``health``."""
    opts = config.service.program_cache
    return ProgramCache(opts.directory, opts.max_entries, health) if opts.directory else None


def _weight(arr: np.ndarray) -> int:
    """Queue weight of a batch, in 64-byte event records (payloads held as bytes included)."""
    if arr.dtype.names and arr.dtype.names[-1] == "data" and arr.dtype["data"] == np.dtype(object):
        return len(arr) + sum(map(len, arr["data"].tolist())) // 64
    return len(arr) * max(1, arr.dtype.itemsize // 64)


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def spawn_gated(command: list[str]) -> tuple[subprocess.Popen[bytes], int]:
    """Start ``command`` stopped at a gate, so it can be watched before it runs.

    The child blocks reading a pipe before exec'ing the command (same pid),
    giving the agent time to put it in the in-kernel filter first.
    """
    r, w = os.pipe()
    gate = "import os,sys; os.read(int(sys.argv[1]), 1); os.execvp(sys.argv[2], sys.argv[2:])"
    proc = subprocess.Popen([sys.executable, "-c", gate, str(r), *command], pass_fds=(r,))
    os.close(r)
    return proc, w


#: In command mode, how long a command ended by the agent (--duration, a second signal) has
#: between SIGTERM and SIGKILL.
JOB_GRACE_S = 5.0


def descendants(pids: Sequence[int]) -> list[int]:
    """Every live descendant of ``pids`` (from each process's parent in /proc/PID/stat): the
    workers a launcher such as torchrun started before the agent was pointed at it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(b")") + 2 :].split()[1])  # after "pid (comm) state"
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], list(pids)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out and child not in pids:
                out.append(child)
                todo.append(child)
    return out


def run(
    config: Config,
    *,
    pids: Sequence[int] = (),
    command: list[str] | None = None,
    job: Job | None = None,
    duration_s: float | None = None,
) -> int:
    """Run until SIGINT/SIGTERM, the watched command exits, or ``duration_s``.

    The CLI starts the command's ``job`` (and drops capabilities) before it imports this
    module, whose imports start threads (numpy's BLAS pool); given a ``command`` instead,
    the job starts here. With a command (under a guard that outlives the agent,
    otelbpf/jobguard.py):
    SIGINT, SIGTERM and SIGHUP are forwarded to it and the agent watches on until it exits,
    then returns its status (128 + the signal that ended it). A second signal kills it;
    ``duration_s`` ends it as timeout(1) does (SIGTERM, SIGKILL after JOB_GRACE_S).
    """
    wake = threading.Event()
    received: list[int] = []

    def on_signal(sig: int, _frame: FrameType | None) -> None:
        received.append(sig)
        wake.set()

    for sig in (signal.SIGINT, signal.SIGTERM, *((signal.SIGHUP,) if command or job else ())):
        signal.signal(sig, on_signal)
    for pid in pids:
        if not os.path.exists(f"/proc/{pid}"):
            raise SensorError(f"no process with pid {pid} (is it running, and in this pid namespace?)")
    if job is None and command:
        job = Job(command)
    if job is not None:
        job.on_exit = wake.set
    watch = [*pids, *((job.pid,) if job else ())]
    watching = f"a command, pid {job.pid}" if job else f"pids {', '.join(map(str, pids))}" if pids else "the host"
    try:
        for folder in runs.file_exporters(config):  # before the exporters open their files
            if (moved := runs.begin_run(folder, watching)) is not None:
                log.info("the previous run's files in %s went to %s", folder.directory, moved)
        agent = Agent(config, pids=watch, pause_on_load=job is not None)
        agent.start()
    except BaseException:
        if job is not None:
            job.close()  # never released: the command does not run
        raise
    rc = 0
    try:
        if job is not None:
            job.release(agent.sensor.pause_gate_fd())
        line = status.StatusLine(sys.stderr) if status.wanted(sys.stderr, command=job is not None) else None
        rc = _watch(agent, job, received, wake, duration_s, line)
    finally:
        agent.stop()
        if job is not None:
            job.close()
        print(f"otelbpf: {agent.stats_line()}", file=sys.stderr)
    return rc


def _watch(
    agent: Agent,
    job: Job | None,
    received: list[int],
    wake: threading.Event,
    duration_s: float | None,
    line: status.StatusLine | None = None,
) -> int:
    """The main thread while the agent runs: signals, the command, the clock, a dead thread,
    and on a terminal the status line."""
    deadline = time.monotonic() + duration_s if duration_s else None
    kill_at: float | None = None
    forwarded = False
    while True:
        wake.wait(0.2)
        wake.clear()
        if line is not None:
            line.tick(agent.status_sample)
        if job is not None and job.exited.is_set():
            return job.returncode or 0
        while received:
            sig = received.pop(0)
            if job is None:
                return 0
            job.signal(signal.SIGKILL if forwarded else sig)
            forwarded = True
        if deadline is not None and time.monotonic() >= deadline:
            if job is None:
                return 0
            job.signal(signal.SIGTERM)
            deadline, kill_at = None, time.monotonic() + JOB_GRACE_S
        if job is not None and kill_at is not None and time.monotonic() >= kill_at:
            job.signal(signal.SIGKILL)
        if agent.metrics is not None and agent.metrics.failed:
            where = f"; the command (pid {job.pid}) runs on, unwatched" if job is not None else ""
            log.error("the metrics thread ended: no metric would leave the agent, stopping%s", where)
            return 1
