"""The families' Context: what each factory's build hands its correlator."""

from __future__ import annotations

from otelbpf.base.health import Health
from otelbpf.correlate.clock import MonotonicClock
from otelbpf.correlate.process_info import ProcessInfo
from otelbpf.correlate.symbolizer import Symbolizer
from otelbpf.families.factory import Context, MapAccess


def _context(traces: bool) -> Context:
    return Context(ProcessInfo(), Symbolizer(), MonotonicClock(), Health(), lambda spans: None, MapAccess(), traces)


def test_map_access_binds_late_the_sensor_maps_given_after_the_correlator_took_them() -> None:
    ctx = _context(True)
    read, forget = ctx.read_map, ctx.forget_keys  # taken at build time, as a builder does
    forgotten: list[tuple[str, list[object]]] = []
    ctx.maps.read = lambda name: [(name, 1)]
    ctx.maps.forget = lambda name, keys: forgotten.append((name, keys))
    assert read("launches") == [("launches", 1)]
    forget("launches", [7])
    assert forgotten == [("launches", [7])]


def test_no_span_budget_without_a_traces_pipeline() -> None:
    assert _context(True).span_rate(500) == 500
    assert _context(False).span_rate(500) == 0


def test_counts_go_to_the_agents_counters_labelled_with_the_receiver() -> None:
    ctx = _context(True)
    ctx.sampled_out("cuda/a")(3)
    ctx.counter("http")("otelbpf.http.problems", 2, reason="desync")
    assert ctx.health.get("otelbpf.spans.sampled_out", receiver="cuda/a") == 3
    assert ctx.health.get("otelbpf.http.problems", receiver="http", reason="desync") == 2


def test_correlator_settings_carry_the_contexts_process_info_clock_and_span_sink() -> None:
    ctx = _context(True)
    settings = ctx.correlator_settings()
    assert (settings.process_info, settings.clock, settings.emit_spans) == (ctx.process_info, ctx.clock, ctx.emit_spans)
