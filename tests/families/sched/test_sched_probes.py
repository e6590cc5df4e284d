"""bpf/sched.c and families/sched/probes.py agree: the ring record's layout, the states, the
drop counter slots, the histogram's slot count and the in-CUDA bit (read from the C source,
as tests/base/test_events_parity.py does for the shared kinds)."""

from __future__ import annotations

from harness.c_header import C_TYPES, defines, struct
from otelbpf.families.sched.probes import IN_CUDA, RECORD_DTYPE, SLOTS, STATS, State
from otelbpf.sensor.program import bpf_dir

SOURCE = bpf_dir().joinpath("sched.c").read_text()


def test_the_ring_record_is_laid_out_as_in_c() -> None:
    rec = struct(SOURCE, "sched_rec")
    assert rec.size == RECORD_DTYPE.itemsize
    fields = dict(RECORD_DTYPE.fields or {})
    for f in rec.fields:
        dtype, offset = fields.pop(f.name)[:2]
        assert offset == f.offset and dtype.itemsize == f.size, f
        assert dtype.kind == ("S" if f.ctype == "char" else C_TYPES[f.ctype][1]), f
    assert fields == {}


def test_states_stats_and_slots_are_the_c_ones() -> None:
    d = {name: x.value for name, x in defines(SOURCE).items()}
    assert {s.name: int(s) for s in State} == {
        "preempted": d["SCHED_PREEMPTED"],
        "sleeping": d["SCHED_SLEEPING"],
        "disk": d["SCHED_DISK"],
        "other": d["SCHED_OTHER"],
        "new": d["SCHED_NEW"],
    }
    slots = {d[f"SCHED_STAT_{name.upper()}"]: name for name in STATS}
    assert sorted(slots) == list(range(d["SCHED_STAT_MAX"])) and [slots[i] for i in sorted(slots)] == list(STATS)
    assert d["SCHED_SLOTS"] == SLOTS
    assert f"t->state | (t->in_cuda ? {IN_CUDA:#x} : 0)" in SOURCE  # the bit the correlator tests
