"""The scheduler-side causes of ``otelbpf diagnose`` (input_starvation, host_contention,
blocking_io) over files the real file exporters wrote: CUDA spans of one training thread,
and the ``off_cpu`` spans the sched receiver makes of its long off-CPU intervals."""

from __future__ import annotations

from pathlib import Path

from opentelemetry.sdk.metrics.export import MetricsData, ResourceMetrics, ScopeMetrics
from test_diagnose import MS, T0, Trace

from otelbpf.analyze.diagnose import diagnose
from otelbpf.correlate import metrics as m
from otelbpf.correlate.spans import make_span, scope
from otelbpf.export.jsonfile import FileMetricExporter, FileSpanExporter

SCHED = scope("otelbpf.sched")
TRAIN, LOADER = 7, 8  # Trace's CUDA calls are on thread 7
FUTEX = ["futex_wait_queue", "futex_wait", "do_futex", "__x64_sys_futex", "do_syscall_64"]
FSYNC = ["io_schedule", "folio_wait_bit", "ext4_sync_file", "do_fsync", "__x64_sys_fsync"]


class Job(Trace):
    """Steps of a training thread (a launch and a synchronize), with off-CPU intervals between."""

    def __init__(self, pid: int) -> None:
        super().__init__(pid)
        self.off: list = []

    def off_cpu(
        self, reason: str, blocked_ns: int, runq_ns: int = 0, tid: int = TRAIN, stack=None, name: str = "train"
    ) -> Job:
        attrs = {
            "thread.id": tid,
            "thread.name": name,
            "otelbpf.sched.reason": reason,
            "otelbpf.sched.blocked_ns": blocked_ns,
            "otelbpf.sched.runqueue_ns": runq_ns,
        }
        if stack:
            attrs["otelbpf.sched.kernel_stack"] = stack
        self.off.append(
            make_span(
                "off_cpu",
                resource=self.res,
                scope=SCHED,
                start_ns=self.t,
                end_ns=self.t + blocked_ns + runq_ns,
                attributes=attrs,
            )
        )
        if tid == TRAIN:
            self.t += blocked_ns + runq_ns
        return self

    def step(self, **planted) -> Job:
        self.call("cudaLaunchKernel", 0, gap_ns=20_000, **{"cuda.kernel.name": "gemm"})
        self.call("cudaStreamSynchronize", 5 * MS, gap_ns=100_000)
        if planted.get("starved"):
            self.off_cpu("futex", 20 * MS, 20_000, stack=FUTEX)
        if planted.get("contended"):
            self.off_cpu("preempted", 0, 4 * MS)
        if planted.get("checkpoint"):
            self.off_cpu("io", 30 * MS, stack=FSYNC)
        if planted.get("gpu_wait"):  # off-CPU inside the synchronize: waiting for the GPU, not a cause here
            self.t -= 5 * MS + 100_000
            self.off_cpu("cuda", 4 * MS)
            self.t += 1 * MS + 100_000
        return self

    def export(self, directory: Path, launches: int = 100) -> Path:
        ex = FileSpanExporter(str(directory))
        ex.export(self.off)
        ex.shutdown()
        return super().export(directory, launches)


def job(pid: int, n: int = 50, **planted) -> Job:
    j = Job(pid)
    for _ in range(n):
        j.step(**planted)
    return j


def test_a_starved_thread_is_told_input_starvation_not_sync_storm(tmp_path: Path) -> None:
    findings = diagnose(str(job(1, starved=True).export(tmp_path)))
    assert findings[0].cause == "input_starvation", [(f.cause, f.cost_s) for f in findings]
    ev = findings[0].evidence
    # the last step's wait comes after the last CUDA call: outside the window
    assert ev["waits"] == 49 and abs(ev["seconds"] - 0.98) < 1e-6 and ev["by_reason"] == {"futex": 0.98}
    assert ev["threads"] == {str(TRAIN): "train"} and ev["stacks"][0]["kernel_stack"] == FUTEX
    assert len(ev["span_ids"]) == 5
    # the 20 ms after each synchronize were spent waiting for the batch: not charged to the sync
    assert "sync_storm" not in [f.cause for f in findings]


def test_cpu_contention_is_told_host_contention(tmp_path: Path) -> None:
    findings = diagnose(str(job(2, contended=True).export(tmp_path)))
    assert findings[0].cause == "host_contention", [(f.cause, f.cost_s) for f in findings]
    ev = findings[0].evidence
    assert ev["waits"] == 49 and ev["preempted"] == 49 and abs(ev["max_wait_s"] - 0.004) < 1e-9
    assert "input_starvation" not in [f.cause for f in findings]


def test_a_synchronous_checkpoint_is_told_blocking_io_with_its_stack(tmp_path: Path) -> None:
    findings = diagnose(str(job(3, checkpoint=True).export(tmp_path)))
    assert findings[0].cause == "blocking_io", [(f.cause, f.cost_s) for f in findings]
    assert findings[0].evidence["stacks"][0]["kernel_stack"] == FSYNC
    assert "fsync" in findings[0].fix or "checkpoint" in findings[0].fix


def test_waiting_for_the_gpu_and_other_threads_waits_are_no_cause(tmp_path: Path) -> None:
    j = job(4, gpu_wait=True)
    for i in range(50):  # the loader sleeps and waits on its own: not the launching thread
        j.off_cpu("futex", 20 * MS, tid=LOADER, name="loader")
    findings = diagnose(str(j.export(tmp_path)))
    assert not {"input_starvation", "host_contention", "blocking_io"} & {f.cause for f in findings}, findings


def test_causes_are_ranked_by_cost_with_the_loaders_state(tmp_path: Path) -> None:
    j = Job(5)
    for i in range(50):
        j.step(starved=True, contended=i % 2 == 0, checkpoint=i % 10 == 0)
    j.export(tmp_path)
    metrics = FileMetricExporter(str(tmp_path))
    metrics.export(
        MetricsData(
            [
                ResourceMetrics(
                    j.res,
                    [
                        ScopeMetrics(
                            SCHED,
                            [
                                m.cumulative_sum(
                                    "otelbpf.thread.off_cpu.time",
                                    "s",
                                    "",
                                    [
                                        ({"thread.name": "loader", "otelbpf.sched.reason": "sleep"}, 0.9),
                                        ({"thread.name": "train", "otelbpf.sched.reason": "futex"}, 1.0),
                                    ],
                                    T0,
                                    j.t,
                                )
                            ],
                            "",
                        )
                    ],
                    "",
                )
            ]
        )
    )
    metrics.shutdown()
    findings = diagnose(str(tmp_path))
    assert [f.cause for f in findings][:3] == ["input_starvation", "blocking_io", "host_contention"]
    assert [f.cost_s for f in findings] == sorted((f.cost_s for f in findings), reverse=True)
    assert findings[0].evidence["other_threads"] == {"loader": {"sleep": 0.9}}


def test_off_cpu_spans_outside_the_cuda_window_are_not_counted(tmp_path: Path) -> None:
    j = Job(6)
    j.off_cpu("futex", 2000 * MS, stack=FUTEX)  # start-up: imports, data set download
    for _ in range(50):
        j.step()
    findings = diagnose(str(j.export(tmp_path)))
    assert "input_starvation" not in [f.cause for f in findings], findings
