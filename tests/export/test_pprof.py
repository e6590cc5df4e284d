"""pprof built here, read back by `go tool pprof -raw` (a real consumer), and the pprof files
the file exporter writes."""

from __future__ import annotations

from pathlib import Path

from harness import pprof
from otelbpf.base.health import Health
from otelbpf.correlate.stacks import TRUNCATED, Frame
from otelbpf.export.encoded_profile import ProfileRecord
from otelbpf.export.pprof import CPU_SAMPLE_TYPES, MEMORY_SAMPLE_TYPES, ProfileBuilder
from otelbpf.export.profile_export import PprofFileExporter

NATIVE = Frame(
    "crunch",
    "native",
    module="ext.so",
    path="/x/ext.so",
    build_id="ab12",
    address=0x7F0000001234,
    mapping=(0x7F0000000000, 0x7F0000010000, 0),
)
PY_LEAF = Frame("forward", "python", "model.py", 42, 40)
PY_ROOT = Frame("train_step", "python", "train.py", 7, 3)


def test_cpu_profile_reads_back_with_values_frames_and_labels(tmp_path: Path):
    b = ProfileBuilder(
        CPU_SAMPLE_TYPES,
        time_ns=1_700_000_000_000_000_000,
        duration_ns=10**10,
        period_type=("cpu", "nanoseconds"),
        period=10_101_010,
        default_sample_type="cpu",
    )
    labels = {"service_name": "train", "process_pid": "42"}
    b.add([NATIVE, PY_LEAF, PY_ROOT], [5, 5 * 10_101_010], labels)
    b.add([PY_LEAF, PY_ROOT, TRUNCATED], [2, 2 * 10_101_010], labels)
    path = tmp_path / "p.pb.gz"
    path.write_bytes(b.encode())
    raw = pprof.read(path)
    assert raw.sample_types == ["samples/count", "cpu/nanoseconds"]
    assert raw.total(0) == 7
    first, second = raw.samples
    assert [(f.function, f.file, f.line) for f in first.frames] == [
        ("crunch", "", 0),
        ("forward", "model.py", 42),
        ("train_step", "train.py", 7),
    ]
    assert second.functions() == ["forward", "train_step", "[truncated]"]
    assert first.labels == {"service_name": "train", "process_pid": "42"}


def test_memory_sample_types(tmp_path: Path):
    b = ProfileBuilder(MEMORY_SAMPLE_TYPES, time_ns=1, duration_ns=1, default_sample_type="inuse_space")
    b.add([Frame("cudaMalloc"), PY_ROOT], [1, 1024, 1, 1024], {})
    path = tmp_path / "m.pb.gz"
    path.write_bytes(b.encode())
    raw = pprof.read(path)
    assert raw.sample_types == ["alloc_objects/count", "alloc_space/bytes", "inuse_objects/count", "inuse_space/bytes"]
    assert raw.samples[0].values == [1, 1024, 1, 1024]


def test_file_exporter_writes_one_readable_file_per_record(tmp_path: Path):
    b = ProfileBuilder(CPU_SAMPLE_TYPES, time_ns=1, duration_ns=1)
    b.add([PY_LEAF], [1, 10], {})
    health = Health()
    e = PprofFileExporter(str(tmp_path), health)
    rec = ProfileRecord("process_cpu", "cpu", {"service_name": "a/b c"}, 7, 1, 2_000_000, 99, b.encode())
    e.export([rec, ProfileRecord("process_cpu", "cpu", {"service_name": "x"}, 8, 1, 3_000_000, 99, b.encode())])
    files = sorted((tmp_path / "profiles").iterdir())
    assert [f.name for f in files] == ["a_b_c-7-cpu-2.pb.gz", "x-8-cpu-3.pb.gz"]
    assert all(pprof.read(f).samples for f in files)
    assert health.get("otelbpf.export.sent", signal="profiles", exporter="file") == 2
