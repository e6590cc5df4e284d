"""The profiler's CPU samples in time (bpf/profile.c ``cpu_times``): per thread, in 65 us buckets
on the wall clock, each bucket's code as its innermost Python frame; the pprof the same with or
without them; written beside the pprof by the file exporter and read back by the diagnosis."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

from test_profiles import INNER_AT, NATIVE_STACK, ONLY_NATIVE_STACK, PERIOD, PID, PY_STACK, described, inner
from test_profiles import profiled as profiled  # the fixture: one collection round over fake maps

from otelbpf.analyze.idle import load_timelines
from otelbpf.base.health import Health
from otelbpf.correlate.profile_record import CpuTimeline
from otelbpf.export.encoded_profile import encoded
from otelbpf.export.profile_export import PprofFileExporter
from otelbpf.families.profiling.profiler import TIME_BUCKET_SHIFT as SHIFT

SAMPLES = [(PID, NATIVE_STACK, 0, PY_STACK, 3), (PID, ONLY_NATIVE_STACK, 0, 0, 2)]


def test_samples_in_time_name_their_thread_bucket_and_python_frame(profiled) -> None:
    assert SHIFT == 16  # 65.5 us: a sample placed within a 0.5 ms gap
    assert f"#define TIME_BUCKET_SHIFT {SHIFT}\n" in (Path(__file__).parents[3] / "bpf" / "profile.c").read_text()
    now = time.monotonic_ns() >> SHIFT
    times = [
        (PID, 11, now - 5, NATIVE_STACK, 0, PY_STACK, 2),
        (PID, 11, now - 3, NATIVE_STACK, 0, PY_STACK, 1),
        (PID, 12, now - 4, ONLY_NATIVE_STACK, 0, 0, 2),
    ]
    [with_times], _ = profiled(SAMPLES, times=times)
    [without], _ = profiled(SAMPLES)

    # the pprof is the samples' alone
    def pprof(p: object) -> list:
        return [([described(f) for f in [s.frames]], s.values, s.labels) for s in p.samples]

    assert pprof(with_times) == pprof(without) and without.timeline is None
    tl = with_times.timeline
    assert isinstance(tl, CpuTimeline) and (tl.bucket_ns, tl.period_ns) == (1 << SHIFT, PERIOD)
    assert sorted(tl.threads) == [11, 12] and [n for _t, n, _i in tl.threads[11]] == [2, 1]
    (t0, _, i), (t1, _, _) = tl.threads[11]
    assert t1 - t0 == 2 << SHIFT
    # on the wall clock: the bucket's start, within the read's interval
    assert with_times.start_ns - (10 << SHIFT) <= t0 <= with_times.end_ns
    function, file, line, _native = tl.stacks[i]
    assert (function, file, line) == ("inner", __file__.replace("_timeline", ""), INNER_AT[1])
    assert tl.stacks[tl.threads[12][0][2]][:3] == (tl.stacks[tl.threads[12][0][2]][0], "", 0)


def test_the_file_exporter_writes_the_timeline_beside_the_pprof_and_diagnose_reads_it(profiled, tmp_path) -> None:
    now = time.monotonic_ns() >> SHIFT
    [p], _ = profiled(SAMPLES, times=[(PID, 11, now - 5, NATIVE_STACK, 0, PY_STACK, 2)])
    PprofFileExporter(str(tmp_path), Health(), max_files=10).export([encoded(p)])
    names = sorted(f.name for f in (tmp_path / "profiles").iterdir())
    assert len(names) == 2 and names[0].endswith(".pb.gz") and names[1] == names[0][:-6] + ".timeline.json.gz"
    [(pid, tl)] = load_timelines(str(tmp_path)).items()
    assert pid == PID and tl.covered == [(p.start_ns, p.end_ns)] and tl.threads[11][0][1] == 2
    assert tl.stacks[0].function == inner.__name__ and tl.stacks[0].line == INNER_AT[1]


def test_a_timeline_costs_about_its_rows() -> None:
    """What one interval's timeline holds in memory: a busy thread at 99 Hz for 10 s is 990
    rows; the kernel map bounds a read to TIME_ENTRIES (16,384) rows."""
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    tl = CpuTimeline(
        1 << 20, PERIOD, [("f", "x.py", 1, "")], {t: [(10**18 + i << 20, 1, 0) for i in range(1024)] for t in range(16)}
    )
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    used = sum(s.size_diff for s in after.compare_to(before, "filename"))
    per_row = used / (16 * 1024)
    print(f"timeline: {per_row:.0f} bytes a row, {per_row * 16384 / 2**20:.1f} MiB for a full map")
    assert per_row < 200 and tl.threads
