"""The idle accounting (analyze/idle.py) over synthetic spans and CPU samples: every second of
the gaps after a synchronize charged once, to what the launching thread did in it."""

from __future__ import annotations

from otelbpf.analyze.diagnose import _process_findings, _Span
from otelbpf.analyze.idle import Timeline, Where, account

MS = 1_000_000
T0 = 1_700_000_000_000_000_000
TRAIN = 7
PERIOD = 10_101_010  # 99 Hz
CKPT = Where("save_checkpoint", "/job/train.py", 31, "write")
TOK = Where("tokenize", "/job/train.py", 12)


class Job:
    """One training thread: steps of launches and one synchronize, with planted host work
    after the synchronize; CPU samples every PERIOD while the thread is on the CPU."""

    def __init__(self) -> None:
        self.t = T0
        self.spans: list[_Span] = []
        self.off: list[_Span] = []
        self.tl = Timeline(PERIOD, 1 << 20, [CKPT, TOK], {TRAIN: []}, [(T0, T0 + 3600 * 10**9)])
        self._next_sample = T0 + PERIOD // 2

    def call(self, name: str, dur: int, **attrs: object) -> None:
        self.spans.append(_Span(name, self.t, self.t + dur, TRAIN, dict(attrs), f"{len(self.spans):016x}"))
        self.t += dur

    def on_cpu(self, dur: int, stack: int) -> None:
        """Run ``dur`` ns on the CPU in ``stack``: samples at every period boundary crossed."""
        end = self.t + dur
        while self._next_sample < end:
            if self._next_sample >= self.t:
                self.tl.threads[TRAIN].append((self._next_sample - (1 << 19), 1, stack))
            self._next_sample += PERIOD
        self.t = end

    def off_cpu(self, reason: str, dur: int) -> None:
        attrs = {"otelbpf.sched.reason": reason, "otelbpf.sched.blocked_ns": dur, "thread.name": "train"}
        self.off.append(_Span("off_cpu", self.t, self.t + dur, TRAIN, attrs, f"{len(self.off):016x}"))
        self.t += dur
        self._next_sample = max(self._next_sample, self.t)  # the CPU clock does not run off the CPU

    def step(self, *, tokenize: int = 0, checkpoint: tuple[int, int] | None = None) -> None:
        for _ in range(20):
            self.call("cudaLaunchKernel", 10_000)
            self.t += 20_000
        self.call("cudaStreamSynchronize", 30 * MS)
        self.t += 50_000
        if tokenize:
            self.on_cpu(tokenize, 1)
        if checkpoint:
            self.on_cpu(checkpoint[0], 0)
            self.off_cpu("io", checkpoint[1])


def test_the_checkpoint_is_charged_on_and_off_the_cpu_not_to_the_synchronize() -> None:
    j = Job()
    for i in range(100):
        j.step(checkpoint=(60 * MS, 40 * MS) if i % 5 == 4 else None)
    j.step()
    acc = account(j.spans, j.off, j.tl)
    assert abs(acc.code[CKPT.key].seconds - 20 * 0.06) / 1.2 < 0.1, acc.code
    assert abs(acc.charges["blocking_io"].seconds - 20 * 0.04) < 1e-6
    assert acc.charges["sync_storm"].seconds < 0.01  # 101 gaps of 50 us: the draining alone
    assert acc.charged_s + acc.unexplained_s <= acc.budget_s + 1e-9
    assert abs(acc.charged_s + acc.unexplained_s - acc.budget_s) < 1e-6  # every second once
    findings = _process_findings("job (pid 1)", j.spans, {}, j.off, j.tl)
    assert [f.cause for f in findings][:2] == ["host_code", "blocking_io"], [(f.cause, f.cost_s) for f in findings]
    assert "save_checkpoint (train.py:31) -> write" in findings[0].summary
    assert "sync_storm" not in {f.cause for f in findings}


def test_two_causes_at_once_get_their_planted_shares() -> None:
    j = Job()
    for i in range(200):
        j.step(tokenize=14 * MS, checkpoint=(50 * MS, 0) if i % 10 == 9 else None)
    j.step()
    by = {f.evidence.get("function", f.cause): f for f in _process_findings("job (pid 1)", j.spans, {}, j.off, j.tl)}
    assert abs(by["tokenize"].cost_s - 200 * 0.014) / 2.8 < 0.1, by["tokenize"]
    assert abs(by["save_checkpoint"].cost_s - 20 * 0.05) / 1.0 < 0.15, by["save_checkpoint"]


def test_without_cpu_samples_the_gaps_are_unexplained_and_say_why() -> None:
    j = Job()
    for _ in range(50):
        j.step(tokenize=14 * MS)
    j.step()
    findings = _process_findings("job (pid 1)", j.spans, {}, [], None)
    assert [f.cause for f in findings] == ["unexplained"], findings
    ev = findings[0].evidence["idle"]
    assert abs(ev["unexplained_s"] - 50 * 0.014) < 0.01
    assert any("neither CPU samples nor the sched receiver" in k for k in ev["could_not_see"]), ev


def test_a_process_exiting_mid_gap_is_not_charged_for_it() -> None:
    j = Job()
    for _ in range(10):
        j.step()
    j.call("cudaLaunchKernel", 10_000)
    j.call("cudaStreamSynchronize", 30 * MS)
    j.on_cpu(500 * MS, 1)  # then the process exits: no next call ends this gap
    acc = account(j.spans, j.off, j.tl)
    assert acc.open_gaps == 1 and not acc.code and acc.budget_s < 0.01


def test_one_synchronize_per_step_is_not_a_storm_but_one_per_layer_is() -> None:
    healthy = Job()
    for _ in range(100):
        healthy.step()
    assert _process_findings("job (pid 1)", healthy.spans, {}, healthy.off, healthy.tl) == []
    storm = Job()
    for _ in range(30):
        for _ in range(150):
            storm.call("cudaLaunchKernel", 10_000)
            storm.call("cudaStreamSynchronize", 1 * MS)
            storm.t += 200_000
    storm.call("cudaLaunchKernel", 10_000)
    findings = _process_findings("job (pid 1)", storm.spans, {}, storm.off, storm.tl)
    assert findings[0].cause == "sync_storm" and abs(findings[0].cost_s - 4500 * 0.0002) < 1e-3, findings


def test_allocations_in_a_gap_are_charged_once_to_memory_churn() -> None:
    j = Job()
    for _ in range(50):
        j.step()
        j.call("cudaMalloc", 2 * MS, **{"cuda.memory.bytes": 1 << 20})
        j.call("cudaFree", 2 * MS)
    j.step()
    acc = account(j.spans, j.off, j.tl)
    assert abs(acc.charges["memory_churn"].seconds - 0.2) < 1e-6
    assert abs(acc.charged_s + acc.unexplained_s - acc.budget_s) < 1e-6


def test_samples_without_spans_and_a_clock_step_invent_no_cause() -> None:
    j = Job()
    for _ in range(50):
        j.step(tokenize=14 * MS)
    j.step()
    assert _process_findings("job (pid 1)", [], {}, [], j.tl) == []  # samples of a process without CUDA spans
    # the samples' clock stepped an hour away from the spans': nothing joins, nothing is made up
    j.tl.threads[TRAIN] = [(t + 3600 * 10**9, n, i) for t, n, i in j.tl.threads[TRAIN]]
    findings = _process_findings("job (pid 1)", j.spans, {}, j.off, j.tl)
    assert [f.cause for f in findings] == ["unexplained"], findings
    assert "no CPU sample shows" in findings[0].summary


def test_gaps_the_profiler_did_not_cover_say_so() -> None:
    j = Job()
    for _ in range(50):
        j.step(tokenize=14 * MS)
    j.step()
    j.tl.covered = [(T0 + 3600 * 10**9, T0 + 7200 * 10**9)]  # the profiler read only later
    [f] = _process_findings("job (pid 1)", j.spans, {}, j.off, j.tl)
    assert f.cause == "unexplained" and "neither CPU samples nor the sched receiver" in f.summary


def test_unreadable_timeline_files_are_skipped(tmp_path) -> None:
    import gzip
    import json

    from otelbpf.analyze.idle import load_timelines

    d = tmp_path / "profiles"
    d.mkdir()
    (d / "a-1-cpu-1.timeline.json.gz").write_bytes(b"not gzip")
    (d / "a-1-cpu-2.timeline.json.gz").write_bytes(gzip.compress(b'{"pid": 1}'))
    good = {"pid": 1, "start_ns": 10, "end_ns": 20, "bucket_ns": 1, "period_ns": 5, "stacks": [["f", "x.py", 3, ""]]}
    (d / "a-1-cpu-3.timeline.json.gz").write_bytes(
        gzip.compress(json.dumps(good | {"threads": {"7": [[12, 1, 0]]}}).encode())
    )
    secret = tmp_path / "elsewhere.json.gz"
    secret.write_bytes(gzip.compress(json.dumps(good | {"pid": 2, "threads": {}}).encode()))
    (d / "a-2-cpu-4.timeline.json.gz").symlink_to(secret)  # never read through a link
    [(pid, tl)] = load_timelines(str(tmp_path)).items()
    assert pid == 1 and tl.threads == {7: [(12, 1, 0)]} and tl.stacks == [Where("f", "x.py", 3)]
    assert load_timelines(str(tmp_path / "nothing")) == {}


def test_a_handful_of_calls_is_no_cause_and_shares_stay_at_most_one() -> None:
    j = Job()
    j.call("cudaMalloc", 100 * MS, **{"cuda.memory.bytes": 1 << 30})  # two slow allocations at start-up
    j.call("cudaFree", 100 * MS)
    for _ in range(5):
        j.step()
    findings = _process_findings("job (pid 1)", j.spans, {}, j.off, j.tl)
    assert "memory_churn" not in {f.cause for f in findings}, findings
    assert all(0 < f.share <= 1.0 for f in findings)


def test_gaps_shorter_than_a_sampling_period_are_estimated_pooled() -> None:
    """2 ms of Python after each synchronize: one gap in five gets a sample, which alone would
    overstate its gap five times; pooled, the estimate holds (and nothing divides by zero)."""
    j = Job()
    for _ in range(500):
        j.step(tokenize=2 * MS)
    j.step()
    acc = account(j.spans, j.off, j.tl)
    assert abs(acc.code[TOK.key].seconds - 500 * 0.002) < 0.1 * 1.0, acc.code
    assert acc.charged_s + acc.unexplained_s <= acc.budget_s + 1e-9


LOADER = 9  # another thread of the process: a data loader, or a Python thread holding the GIL
LOAD = Where("load_batch", "/job/train.py", 40, "libcrypto.so.3+0x29c289")


def _loader_samples(j: Job, start: int, end: int) -> None:
    """The other thread on the CPU from ``start`` to ``end``: a sample every period."""
    j.tl.stacks.append(LOAD) if LOAD not in j.tl.stacks else None
    rows = j.tl.threads.setdefault(LOADER, [])
    rows.extend((t, 1, j.tl.stacks.index(LOAD)) for t in range(start, end, PERIOD))
    rows.sort()


def test_off_cpu_waits_without_sched_are_unexplained_and_name_the_thread_that_ran_meanwhile() -> None:
    """A training thread waiting on a slower producer (sched off): its waits are off the CPU, no
    sample of its own shows them; the producer's samples in the same gaps name what it waited for."""
    j = Job()
    for _ in range(60):
        j.step()
        j.t += 20 * MS  # blocked on the queue: off the CPU, no sample
    j.step()
    _loader_samples(j, T0, j.t)
    findings = _process_findings("job (pid 1)", j.spans, {}, None, j.tl)
    assert [f.cause for f in findings] == ["unexplained"], findings
    [u] = findings
    assert abs(u.cost_s - 60 * 0.02) < 0.01, u
    assert "the sched receiver is off" in u.summary and "--receivers" in u.fix and "sched" in u.fix
    assert "--receivers cuda,gpu,profiling,sched" in u.summary  # how to see why, in the finding itself
    [(thread, seconds)] = u.evidence["other_threads_code"].items()
    assert thread == "thread 9 in load_batch (train.py)" and abs(seconds - 60 * 0.02) < 0.1, u.evidence
    assert "load_batch (train.py)" in u.summary
    # the launching thread's own samples are not another thread's
    assert _process_findings("job (pid 1)", j.spans, {}, None, Job().tl)[0].evidence["other_threads_code"] == {}
    # with the sched receiver the waits are input_starvation, the producer named beside them
    # (apart from other_threads, the other threads' off-CPU time by name from the metrics)
    s = Job()
    for _ in range(60):
        s.step()
        s.off_cpu("futex", 20 * MS)
    s.step()
    _loader_samples(s, T0, s.t)
    starved = _process_findings("job (pid 1)", s.spans, {}, s.off, s.tl)[0]
    assert starved.cause == "input_starvation" and starved.evidence["other_threads"] == {}, starved
    assert "thread 9 in load_batch (train.py)" in starved.evidence["other_threads_code"], starved.evidence


def test_a_short_gap_after_a_step_long_synchronize_is_what_the_host_did_not_a_storm() -> None:
    """One synchronize a step, then a log line fsync'd (0.5 ms off the CPU): the gaps are under
    1 ms, but the synchronizes drained a step's work; the gaps are the fsyncs, not turnarounds."""
    j = Job()
    for _ in range(300):
        j.step()
        j.t += 500_000
    j.step()
    findings = _process_findings("job (pid 1)", j.spans, {}, None, j.tl)
    assert "sync_storm" not in {f.cause for f in findings}, findings
    [u] = findings
    assert u.cause == "unexplained" and abs(u.cost_s - 300 * 0.00055) < 0.005, u
    # with the sched receiver, the same gaps are charged by reason
    io = Job()
    for _ in range(300):
        io.step()
        io.off_cpu("io", 500_000)
    io.step()
    found = _process_findings("job (pid 1)", io.spans, {}, io.off, io.tl)
    assert found[0].cause == "blocking_io" and abs(found[0].cost_s - 0.15) < 1e-6, found


def test_a_launch_bound_loop_charges_its_gaps_to_the_launches_not_to_host_code() -> None:
    """Tiny kernels: 1,000 launches a step (no spans by default) fill the gap after each
    synchronize; the GPU keeps up. The gap's CPU time is the launching, not host code."""
    j = Job()
    for _ in range(40):
        j.call("cudaStreamSynchronize", 50_000)
        j.on_cpu(3 * MS, 1)  # 1,000 launches of 3 us, from the loop's own line
    j.call("cudaStreamSynchronize", 50_000)
    launches = {("cuda.kernel.launches", (("cuda.api.function", "cudaLaunchKernel"),)): (0, {"asInt": "40000"}, "sum")}
    findings = _process_findings("job (pid 1)", j.spans, launches, None, j.tl)
    assert [f.cause for f in findings] == ["launch_bound"], findings
    assert abs(findings[0].cost_s - 40 * 0.003) < 0.005 and findings[0].evidence["launches"] == 40_000
    # the same gaps without the launches: host code
    assert _process_findings("job (pid 1)", j.spans, {}, None, j.tl)[0].cause == "host_code"


def test_a_function_in_a_sample_or_two_is_no_finding() -> None:
    j = Job()
    for i in range(20):
        j.step(tokenize=14 * MS if i < 2 else 0)  # ~3 samples, 4% of the window
    j.step()
    assert "host_code" not in {f.cause for f in _process_findings("job (pid 1)", j.spans, {}, j.off, j.tl)}


def test_every_call_failing_is_told_from_the_spans_alone_and_nothing_else_is_made_up() -> None:
    """No metrics (the metrics pipeline off): the spans' errors say that every call failed; the
    failed synchronizes drained nothing, so their gaps are no idle budget."""
    j = Job()
    for _ in range(50):
        failed = {"cuda.error.name": "cudaErrorInsufficientDriver"}
        j.call("cudaMemcpy", 2_000, **failed, **{"cuda.memcpy.direction": "H2D"})
        j.call("cudaStreamSynchronize", 1_000, **failed)
        j.on_cpu(14 * MS, 1)
    [f] = _process_findings("job (pid 1)", j.spans, {}, None, j.tl)
    assert f.cause == "cuda_errors" and "100 of 100 CUDA calls failed" in f.summary, f
    assert "cudaErrorInsufficientDriver" in f.summary
    acc = account(j.spans, None, j.tl)
    assert acc.budget_s == 0 and acc.gaps == 0 and not acc.code


def test_a_process_exiting_mid_gap_says_so_in_the_account() -> None:
    import io

    from otelbpf.analyze.diagnose import write_report

    j = Job()
    for _ in range(50):
        j.step(tokenize=14 * MS)
    j.call("cudaStreamSynchronize", 30 * MS)
    j.on_cpu(2000 * MS, 1)  # then it exits: this gap has no end
    findings = _process_findings("job (pid 1)", j.spans, {}, None, j.tl)
    assert findings[0].evidence["idle"]["open_gaps"] == 1
    assert findings[0].cost_s < 50 * 0.014 * 1.3  # the 2 s of the last gap are charged to nothing
    out = io.StringIO()
    write_report(findings, out)
    assert "1 gap the trace ended in" in out.getvalue() and "not charged" in out.getvalue(), out.getvalue()


def test_another_threads_sample_is_counted_once_where_two_launchers_gaps_overlap() -> None:
    j = Job()
    for _ in range(30):
        j.step()
        j.t += 20 * MS
    j.step()
    twin = [_Span(s.name, s.start, s.end, TRAIN + 1, s.attrs, s.span_id) for s in j.spans]  # a second launcher
    _loader_samples(j, T0, j.t)
    one = account(j.spans, None, j.tl).others
    both = account(j.spans + twin, None, j.tl).others
    assert one == both and sum(one.values()) > 50, (one, both)


def test_short_waits_summed_in_the_kernel_are_charged_by_their_sums() -> None:
    """bpf/sched.c sums a thread's off-CPU intervals under span_threshold per window: one span
    from the first switch-out to the last switch-in (``otelbpf.sched.intervals`` of them), its
    blocked and run-queue parts the sums. Inside a gap they are charged their sums, not the
    span's length; a span half in the gap, half of them."""
    j = Job()
    for _ in range(50):
        j.step()
        # four fsyncs of 0.3 ms (+ 20 us waiting for a CPU), 0.1 ms on the CPU between them: one window
        attrs = {
            "otelbpf.sched.reason": "io",
            "otelbpf.sched.blocked_ns": 4 * 300_000,
            "otelbpf.sched.runqueue_ns": 4 * 20_000,
            "otelbpf.sched.intervals": 4,
            "thread.name": "train",
        }
        j.off.append(_Span("off_cpu", j.t, j.t + 1_580_000, TRAIN, attrs, f"{len(j.off):016x}"))
        j.t += 1_580_000
        j.t += 2 * MS  # on the CPU, unsampled here
    j.step()
    acc = account(j.spans, j.off, j.tl)
    assert abs(acc.charges["blocking_io"].seconds - 50 * 0.0012) < 1e-6, acc.charges
    assert abs(acc.charges["host_contention"].seconds - 50 * 0.00008) < 1e-6
    assert acc.charged_s + acc.unexplained_s <= acc.budget_s + 1e-9
    findings = _process_findings("job (pid 1)", j.spans, {}, j.off, j.tl)
    io = next(f for f in findings if f.cause == "blocking_io")
    assert io.evidence["waits"] == 200  # the intervals, not the spans
    # the same span straddling a gap's end: the part inside, pro rata
    k = Job()
    k.step()
    attrs = {**attrs, "otelbpf.sched.blocked_ns": 800_000, "otelbpf.sched.runqueue_ns": 0}
    k.off.append(_Span("off_cpu", k.t - 1 * MS, k.t + 1 * MS, TRAIN, attrs, "0" * 16))
    k.t += 1 * MS
    k.step()
    acc = account(k.spans, k.off, k.tl)
    # the gap: 50 us after the synchronize and the 1 ms after; 1.05 of the span's 2 ms
    assert abs(acc.charges["blocking_io"].seconds - 0.0008 * 1.05 / 2) < 1e-6, acc.charges


def test_two_devices_from_one_thread_have_a_budget_each() -> None:
    """One thread drives two devices in turn (cuda.device.id on its calls): each step it
    queues device 0's work and synchronizes it (30 ms), then device 1's (30 ms), then runs
    10 ms of host code. Device 0 has nothing queued from its synchronize's return until its
    next launch: 30 ms inside device 1's calls, then the host code; device 1 likewise, the
    host code, then device 0's calls. The time in the other device's calls is neither host
    code nor unexplained: it is ``other_device``; the host code is charged once per device
    that waited for it."""
    j = Job()

    def work(dev: int, wait: int) -> None:
        for _ in range(5):
            j.call("cudaLaunchKernel", 10_000, **{"cuda.device.id": dev})
            j.t += 20_000
        j.call("cudaStreamSynchronize", wait, **{"cuda.device.id": dev})
        j.t += 50_000

    for _ in range(40):
        work(0, 30 * MS)
        work(1, 30 * MS)
        j.on_cpu(10 * MS, 1)
    work(0, 30 * MS)
    acc = account(j.spans, j.off, j.tl)
    other = acc.charges["other_device"]
    # device 0's 40 gaps hold device 1's launches and synchronize (5 x 10 us + 30 ms), device
    # 1's 39 closed gaps device 0's (its last ends with the trace)
    assert abs(other.by["device 1"] - 40 * 0.03005) < 1e-6 and abs(other.by["device 0"] - 39 * 0.03005) < 1e-6
    assert abs(other.seconds - 79 * 0.03005) < 1e-6, other
    # the host code: in device 0's gaps and in device 1's, 10 ms a step each, by the samples
    assert abs(acc.code[TOK.key].seconds - 79 * 0.01) / 0.79 < 0.15, acc.code
    assert acc.unexplained_s < 0.1 * acc.budget_s, acc.summary()
    assert acc.charges["sync_storm"].seconds < 0.01
    assert acc.charged_s + acc.unexplained_s <= acc.budget_s + 1e-9
    findings = _process_findings("job (pid 1)", j.spans, {}, j.off, j.tl)
    by = {f.cause: f for f in findings}
    assert "other_device" in by and set(by["other_device"].evidence["by_device"]) == {"device 0", "device 1"}
    assert by["other_device"].share <= 0.5  # of 2 (thread, device) pairs' time
    # without the attribute: one budget per thread, as before (device 1's calls end device 0's gaps)
    for s in j.spans:
        s.attrs.pop("cuda.device.id", None)
    assert "other_device" not in account(j.spans, j.off, j.tl).charges
