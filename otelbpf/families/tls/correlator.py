"""The tls receiver's side of its records: handed on, and counted.

The plaintext records of the ``tlsdata`` ring are parsed by the http receiver, which reads
them as it reads socket records; this correlator hands each batch to the consumers that
registered for the ring (``Context.ring_consumers``) and exports the family's own counts as
``otelbpf.tls.*``: records by outcome (bpf/tls.c ``tls_stats``) and libssl-named files that
were not OpenSSL. Once a batch is handed on (parsed: the http correlator works on it in the
call), the stamp of its last record goes back to the kernel (``tls_processed``), which sheds
new HTTP/1 requests while it is too far behind (bpf/tls.c)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from opentelemetry.sdk.metrics.export import Metric
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otelbpf.families.tls.probes import PROCESSED_MAP, RING, STAMP_OFFSET, STATS, STATS_MAP, Rejected

SCOPE = InstrumentationScope("otelbpf.tls")


def _total(value: Any) -> int:
    """A per-CPU slot's value summed over CPUs (BCC hands an array), or the value."""
    try:
        return int(sum(value))
    except TypeError:
        return int(value)


def last_stamp(arr: np.ndarray) -> int:
    """The highest stamp among a batch's records (``addr`` bytes 8-16, bpf/tls.c), 0 for none."""
    if not len(arr):
        return 0
    raw = np.ascontiguousarray(arr["addr"]).view(np.uint8).reshape(len(arr), -1)
    return int(raw[:, STAMP_OFFSET : STAMP_OFFSET + 8].copy().view("<u8").max())


class TlsCorrelator:
    scope = SCOPE

    def __init__(
        self,
        consumers: Callable[[], Sequence[Callable[[np.ndarray], None]]],
        count: Callable[..., None],
        read_map: Callable[[str], list[tuple[Any, Any]]],
        rejected: Rejected,
        update_map: Callable[[str, list[tuple[int, int]]], None],
    ) -> None:
        """``consumers``: who parses the ring's batches, asked at each batch (receivers are
        built in the config's order, the http one possibly after this one); ``update_map``:
        writes the kernel's ``tls_processed``."""
        self._consumers = consumers
        self._update = update_map
        self._processed = 0
        self._count = count
        self._read_map = read_map
        self._rejected = rejected
        self._lock = threading.Lock()
        self._seen = [0] * len(STATS)
        self._rejected_seen = 0
        self.batches_unconsumed = 0

    def on_events(self, arr: np.ndarray) -> None:
        pass

    def on_strings(self, arr: np.ndarray) -> None:
        pass

    def on_ring(self, name: str, arr: np.ndarray) -> None:
        if name != RING:
            return
        consumers = self._consumers()
        if not consumers:
            self.batches_unconsumed += 1
            self._count("otelbpf.tls.records.dropped", len(arr), reason="no_http_receiver")
        for consume in consumers:
            consume(arr)
        self.processed(last_stamp(arr))

    def processed(self, stamp: int) -> None:
        """The stamp of the last record processed (the ring's bytes written up to it), for the
        kernel's backlog (bpf/tls.c tls_backlog)."""
        if stamp > self._processed:
            self._processed = stamp
            self._update(PROCESSED_MAP, [(0, stamp)])

    def collect(self) -> list[tuple[Resource, list[Metric]]]:
        """The kernel's counts since the last collection, into the agent's own counters."""
        self._count_stats(self._read_map(STATS_MAP))
        return []

    def on_unload(self, bpf: Any) -> None:
        """The family's last moment (the sensor's stop, before the final metrics export): the
        kernel's final counts go into the agent's counters now. Counted only in the final
        round's collect(), they would race the health source that exports those counters in
        the same round, and the last interval's counts could miss the final export."""
        table = bpf[STATS_MAP]
        self._count_stats([(k, v) for k, v in table.items()])

    def _count_stats(self, rows: list[tuple[Any, Any]]) -> None:
        """``tls_stats`` rows (slot, per-CPU values): what grew since the last time, counted."""
        with self._lock:
            totals = [0] * len(STATS)
            for key, value in rows:
                slot = int(getattr(key, "value", key))
                if 0 <= slot < len(STATS):
                    totals[slot] += _total(value)
            for slot, total in enumerate(totals):
                delta = total - self._seen[slot]
                if delta > 0:
                    self._count("otelbpf.tls.calls", delta, outcome=STATS[slot])
                    self._seen[slot] = total
            rejected = self._rejected.count - self._rejected_seen
            if rejected > 0:
                self._count("otelbpf.tls.libraries.rejected", rejected, reason="not_openssl")
                self._rejected_seen += rejected
