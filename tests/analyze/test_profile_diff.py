"""The differential CPU profile of a slow rank against the healthy ones (profile_diff.py),
over pprof files written the way the profiling receiver writes them."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from otelbpf.analyze import profile_diff
from otelbpf.correlate.profile_record import CPU_SAMPLE_TYPES, Profile, Sample
from otelbpf.correlate.stacks import Frame
from otelbpf.export.pprof import encode

MS = 1_000_000
T0 = 1_700_000_000_000_000_000


def write_profile(
    folder: Path,
    pid: int,
    stacks: dict[tuple[str, ...], int],
    *,
    start_ns: int = T0,
    seconds: float = 10.0,
    host: str = "node1",
) -> Path:
    """One CPU profile as the receiver writes it: stacks root first, values CPU ns."""
    labels = {"service_name": "train", "host_name": host, "process_pid": str(pid)}
    samples = [
        Sample([Frame(f) for f in reversed(stack)], (ns // (10 * MS), ns), labels) for stack, ns in stacks.items()
    ]
    prof = Profile(
        "process_cpu",
        "cpu",
        labels,
        pid,
        start_ns,
        start_ns + int(seconds * 1e9),
        99,
        CPU_SAMPLE_TYPES,
        "cpu",
        period_type=("cpu", "nanoseconds"),
        period=10 * MS,
        samples=samples,
    )
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"train-{pid}-cpu-{(start_ns + int(seconds * 1e9)) // MS}.pb.gz"
    path.write_bytes(encode(prof))
    return path


COMMON = {("main", "train_step", "launch"): 2000 * MS, ("main", "collective"): 500 * MS}


def job(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    write_profile(out / "profiles", 100, COMMON)
    write_profile(out / "profiles", 101, {**COMMON, ("main", "train_step", "launch"): 2200 * MS})
    # The slow rank: the same work, plus 4 s of CPU in prepare_batch_on_host over 10 s.
    write_profile(out / "profiles", 102, {**COMMON, ("main", "train_step", "prepare_batch_on_host"): 4000 * MS})
    return out


def test_the_planted_frame_leads_normalised_per_second(tmp_path):
    out = job(tmp_path)
    ranks, skipped = profile_diff.read_cpu([str(out)])
    assert not skipped and set(ranks) == {("node1", 100), ("node1", 101), ("node1", 102)}
    d = profile_diff.diff(ranks[("node1", 102)], [ranks[("node1", 100)], ranks[("node1", 101)]])
    assert d.frames[0].function == "prepare_batch_on_host"
    assert d.frames[0].self_ms_per_s == pytest.approx(400.0)  # 4 s over 10 s
    assert d.frames[0].total_ms_per_s == pytest.approx(400.0)
    # launch: the slow rank 200 ms/s, the healthy mean 210 ms/s: not more, not named.
    assert "launch" not in {f.function for f in d.frames}


def test_ranks_profiled_for_different_lengths_compare_by_rate(tmp_path):
    """A healthy rank profiled for twice as long does not look twice as busy."""
    folder = tmp_path / "p"
    write_profile(folder, 1, {("main", "work"): 1000 * MS}, seconds=10)
    write_profile(folder, 1, {("main", "work"): 1000 * MS}, seconds=10, start_ns=T0 + 10 * 10**9)
    write_profile(folder, 2, {("main", "work"): 1000 * MS, ("main", "extra"): 500 * MS}, seconds=10)
    ranks, _ = profile_diff.read_cpu([str(folder)])
    assert ranks[("node1", 1)].seconds == pytest.approx(20.0)
    d = profile_diff.diff(ranks[("node1", 2)], [ranks[("node1", 1)]])
    assert [(f.function, f.self_ms_per_s) for f in d.frames] == [("extra", 50.0)]  # work: 100 ms/s on both


def test_an_excess_within_the_sampling_noise_is_not_named(tmp_path):
    """Two seconds at 99 Hz: every rank loads its batches alike (20 samples), the slow one got
    two samples more there by chance (10 ms/s, past min_ms_per_s) and 30 in its planted frame.
    Only the planted frame explains it; the same files without sample counts name both."""
    folder = tmp_path / "p"
    write_profile(folder, 1, {("main", "load_batch"): 200 * MS}, seconds=2)
    write_profile(folder, 2, {("main", "load_batch"): 200 * MS}, seconds=2)
    slow = {("main", "load_batch"): 220 * MS, ("main", "prepare_batch_on_host"): 300 * MS}
    write_profile(folder, 3, slow, seconds=2)
    ranks, _ = profile_diff.read_cpu([str(folder)])
    assert ranks[("node1", 3)].samples == 52
    d = profile_diff.diff(ranks[("node1", 3)], [ranks[("node1", 1)], ranks[("node1", 2)]])
    assert [(f.function, f.self_ms_per_s) for f in d.frames] == [("prepare_batch_on_host", 150.0)]
    for rank in ranks.values():
        rank.samples = 0  # a pprof without a samples count: no noise floor to apply
    d = profile_diff.diff(ranks[("node1", 3)], [ranks[("node1", 1)], ranks[("node1", 2)]])
    assert [f.function for f in d.frames] == ["prepare_batch_on_host", "load_batch"]


def test_window_and_process_filters(tmp_path):
    folder = tmp_path / "p"
    write_profile(folder, 1, {("main", "early"): 100 * MS}, start_ns=T0)
    write_profile(folder, 1, {("main", "late"): 100 * MS}, start_ns=T0 + 100 * 10**9)
    write_profile(folder, 2, {("main", "other"): 100 * MS}, host="node2")
    ranks, _ = profile_diff.read_cpu([str(folder)], {("node1", 1)}, (T0 + 50 * 10**9, T0 + 200 * 10**9))
    assert list(ranks) == [("node1", 1)]
    assert {s[-1] for s in ranks[("node1", 1)].stacks} == {"late"}


def test_a_partial_or_foreign_file_is_skipped_and_named(tmp_path):
    out = job(tmp_path)
    good = next((out / "profiles").iterdir())
    (out / "profiles" / "train-9-cpu-1.pb.gz").write_bytes(good.read_bytes()[:40])  # being written
    (out / "profiles" / "train-8-cpu-1.pb.gz").write_bytes(gzip.compress(b"\xff" * 64))  # not pprof
    ranks, skipped = profile_diff.read_cpu([str(out)])
    assert len(ranks) == 3 and len(skipped) == 2
    assert all("not a readable pprof profile" in s for s in skipped)


def test_no_healthy_rank_gives_no_frames_not_a_crash(tmp_path):
    out = job(tmp_path)
    ranks, _ = profile_diff.read_cpu([str(out)])
    assert profile_diff.diff(ranks[("node1", 102)], []).frames[0].function == "prepare_batch_on_host"
    assert profile_diff.diff(profile_diff.RankCpu(5), [ranks[("node1", 100)]]).frames == []


@pytest.mark.skipif(
    shutil.which("go") is None and os.environ.get("CI") != "true",
    reason="go is not installed (scripts/setup.sh --test installs golang-go)",
)
def test_the_pprof_pair_reads_back_as_a_diff_in_go_tool_pprof(tmp_path):
    out = job(tmp_path)
    ranks, _ = profile_diff.read_cpu([str(out)])
    slow, base = profile_diff.write_pprof(
        ranks[("node1", 102)], [ranks[("node1", 100)], ranks[("node1", 101)]], str(tmp_path / "diff")
    )
    top = subprocess.run(
        ["go", "tool", "pprof", "-top", "-diff_base", base, slow], capture_output=True, text=True, timeout=120
    )
    assert top.returncode == 0, top.stderr
    rows = [
        line.split() for line in top.stdout.splitlines() if line.strip().endswith(("prepare_batch_on_host", "launch"))
    ]
    by_name = {r[-1]: r for r in rows}
    assert by_name["prepare_batch_on_host"][0] == "4000ms"  # +4 s flat on the slow rank
    assert by_name["launch"][0].startswith("-")  # a little less than the healthy mean


def test_the_differential_tree_is_the_slow_ranks_tree_coloured_by_its_excess(tmp_path):
    out = job(tmp_path)
    ranks, _ = profile_diff.read_cpu([str(out)])
    tree = profile_diff.diff_tree(ranks[("node1", 102)], [ranks[("node1", 100)], ranks[("node1", 101)]])
    assert tree["name"] == "all" and tree["value"] == 6500 * MS
    [main] = tree["children"]
    step = next(c for c in main["children"] if c["name"] == "train_step")
    by_name = {c["name"]: c for c in step["children"]}
    assert by_name["prepare_batch_on_host"]["delta"] == 4000 * MS  # the healthy ranks never ran it
    assert by_name["launch"]["delta"] == (2000 - 2100) * MS  # 2.0 s against a 2.1 s mean
    assert "launch" in by_name and set(by_name) == {"prepare_batch_on_host", "launch"}


@pytest.mark.skipif(os.geteuid() != 0 and os.environ.get("CI") != "true", reason="playing another user needs root")
def test_the_pprof_pair_is_written_as_everything_root_writes(tmp_path):
    """Issue 31: one path for what root writes. ``stragglers --diff-profiles`` wrote the pair
    0644 into any folder, another user's too; now owner-only, never through a link, and a
    folder another user made beforehand is refused."""
    ranks, _ = profile_diff.read_cpu([str(job(tmp_path))])
    slow, healthy = ranks[("node1", 102)], [ranks[("node1", 100)], ranks[("node1", 101)]]
    mine = tmp_path / "diff" / "rank2-102"
    mine.mkdir(parents=True, mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("root's\n")
    (mine / "base-healthy.pb.gz").symlink_to(victim)
    paths = profile_diff.write_pprof(slow, healthy, str(mine))
    assert [(os.stat(p).st_mode & 0o777, Path(p).is_symlink()) for p in paths] == [(0o600, False), (0o600, False)]
    assert victim.read_text() == "root's\n"

    theirs = tmp_path / "diff" / "rank3-103"
    theirs.mkdir(mode=0o777)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(OSError, match=r"rank3-103 is owned by uid 65534, not the agent's \(uid 0\)"):
        profile_diff.write_pprof(slow, healthy, str(theirs))
    assert list(theirs.iterdir()) == []
