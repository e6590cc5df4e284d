"""RingBufferReader against a real BPF ring buffer filled by a real tracepoint program.

One small BCC program (compiled once for the module) writes a fixed-size record on every
``getppid()`` of the process named in its ``target`` map. Records carry a sequence number from
the BPF side and its complement, so order, loss and torn reads are all visible. The BPF side
counts what it submitted and what the ring refused, which the drained arrays must match.
The ring is one page and the record stride (40 bytes) does not divide it, so records straddle
the end of the data area and every drain past the first ~100 records runs across the wrap.
"""

from __future__ import annotations

import mmap
import os
import struct
import subprocess
import sys
import time
from collections.abc import Iterator

import numpy as np
import pytest

from otelbpf.sensor.ringbuf import RingBufferReader

pytestmark = pytest.mark.bpf

RING_BYTES = 4096
RECORD = np.dtype([("seq", "<u8"), ("check", "<u8"), ("pid", "<u4"), ("mode", "<u4"), ("spun", "<u8")])
STRIDE = 8 + RECORD.itemsize  # 8-byte kernel header; 40 is already 8-aligned

# Modes (target[1]): what the program does with odd sequence numbers.
SUBMIT, DISCARD_ODD, HOLD_ODD = 0, 1, 2

#: Iterations of bpf_get_stack() while an odd record is reserved in HOLD_ODD mode: ~0.5 us
#: each here, so the record stays BUSY for ~20 ms, ample for a drain on the other CPU.
SPIN = 40_000

SOURCE = r"""
struct rec { u64 seq; u64 check; u32 pid; u32 mode; u64 spun; };
BPF_RINGBUF_OUTPUT(ring, 1);
BPF_ARRAY(counts, u64, 3);   /* 0: next sequence number, 1: submitted, 2: reserve failed */
BPF_ARRAY(target, u32, 2);   /* 0: pid to record, 1: mode */

static __always_inline void bump(u32 slot)
{
    u64 *v = counts.lookup(&slot);
    if (v)
        __sync_fetch_and_add(v, 1);
}

TRACEPOINT_PROBE(syscalls, sys_enter_getppid)
{
    u32 k_pid = 0, k_mode = 1, k_seq = 0;
    u32 *want = target.lookup(&k_pid);
    u32 *mode = target.lookup(&k_mode);
    if (!want || !mode || *want != (bpf_get_current_pid_tgid() >> 32))
        return 0;
    u64 *next = counts.lookup(&k_seq);
    if (!next)
        return 0;
    u64 seq = __sync_fetch_and_add(next, 1);
    struct rec *r = ring.ringbuf_reserve(sizeof(struct rec));
    if (!r) {
        bump(2);
        return 0;
    }
    r->seq = seq;
    r->check = ~seq;
    r->pid = *want;
    r->mode = *mode;
    r->spun = 0;
    if (*mode == 2 && (seq & 1)) {
        /* Keep the reserved record BUSY for a while: a user-space drain must stop at it. */
        u64 frames[8];
        u64 spun = 0;
#pragma clang loop unroll(disable)
        for (int i = 0; i < SPIN; i++)
            spun += bpf_get_stack(args, frames, sizeof(frames), BPF_F_USER_STACK) >= 0;
        r->spun = spun;
    }
    if (*mode == 1 && (seq & 1)) {
        ring.ringbuf_discard(r, BPF_RB_NO_WAKEUP);
        return 0;
    }
    ring.ringbuf_submit(r, BPF_RB_NO_WAKEUP);
    bump(1);
    return 0;
}
"""


class RingProgram:
    """The loaded program and a view of its maps."""

    def __init__(self) -> None:
        from bcc import BPF

        self.bpf = BPF(text=SOURCE.encode(), cflags=[f"-DSPIN={SPIN}"])

    def reset(self, pid: int, mode: int) -> None:
        """Point the program at ``pid`` in ``mode`` with counters at zero."""
        counts, target = self.bpf[b"counts"], self.bpf[b"target"]
        for slot in range(3):
            counts[counts.Key(slot)] = counts.Leaf(0)
        target[target.Key(0)] = target.Leaf(pid)
        target[target.Key(1)] = target.Leaf(mode)

    def count(self, slot: int) -> int:
        counts = self.bpf[b"counts"]
        return counts[counts.Key(slot)].value

    @property
    def submitted(self) -> int:
        return self.count(1)

    @property
    def refused(self) -> int:
        return self.count(2)

    def reader(self) -> RingBufferReader:
        return RingBufferReader(self.bpf[b"ring"].map_fd, RING_BYTES, RECORD)


@pytest.fixture(scope="module")
def program() -> Iterator[RingProgram]:
    prog = RingProgram()
    try:
        yield prog
    finally:
        prog.bpf.cleanup()


@pytest.fixture
def ring(program: RingProgram) -> Iterator[RingBufferReader]:
    """A reader on an empty ring: records left by an earlier test are consumed first."""
    program.reset(0, SUBMIT)
    reader = program.reader()
    reader.drain()
    assert reader.pending_bytes() == 0
    try:
        yield reader
    finally:
        program.reset(0, SUBMIT)
        reader.close()


def fire(n: int) -> None:
    for _ in range(n):
        os.getppid()


def check_records(records: np.ndarray, first_seq: int, pid: int) -> None:
    """Consecutive sequence numbers from ``first_seq``, intact, all from ``pid``."""
    assert records.dtype == RECORD
    np.testing.assert_array_equal(records["seq"], np.arange(first_seq, first_seq + len(records), dtype=np.uint64))
    np.testing.assert_array_equal(records["check"], ~records["seq"])
    assert (records["pid"] == pid).all()


def test_drain_returns_exact_records_in_order(program: RingProgram, ring: RingBufferReader) -> None:
    program.reset(os.getpid(), SUBMIT)
    assert len(ring.drain()) == 0
    fire(25)
    assert ring.pending_bytes() == 25 * STRIDE
    records = ring.drain()
    assert program.submitted == 25 and program.refused == 0
    assert len(records) == 25
    check_records(records, 0, os.getpid())
    assert ring.pending_bytes() == 0
    assert len(ring.drain()) == 0


def test_max_records_leaves_the_rest_for_the_next_drain(program: RingProgram, ring: RingBufferReader) -> None:
    program.reset(os.getpid(), SUBMIT)
    fire(30)
    head = ring.drain(max_records=12)
    assert ring.pending_bytes() == 18 * STRIDE
    tail = ring.drain()
    check_records(np.concatenate([head, tail]), 0, os.getpid())
    assert (len(head), len(tail)) == (12, 18)


def test_many_times_the_ring_size_across_drains_wraps_without_loss(
    program: RingProgram, ring: RingBufferReader
) -> None:
    program.reset(os.getpid(), SUBMIT)
    batches = []
    for n in [77, 101, 3, 99, 64, 100, 51, 88, 97, 100] * 3:  # each fits; 2,340 records, ~23 ring sizes
        fire(n)
        batches.append(ring.drain())
        assert len(batches[-1]) == n
    records = np.concatenate(batches)
    assert len(records) * STRIDE > 20 * RING_BYTES
    assert program.submitted == len(records) and program.refused == 0
    check_records(records, 0, os.getpid())


def test_full_ring_refuses_records_and_the_drain_returns_exactly_what_was_submitted(
    program: RingProgram, ring: RingBufferReader
) -> None:
    program.reset(os.getpid(), SUBMIT)
    fire(37)  # start from a position where the free space wraps around the end
    check_records(ring.drain(), 0, os.getpid())
    program.reset(os.getpid(), SUBMIT)
    fire(250)
    capacity = (RING_BYTES - 1) // STRIDE  # the kernel keeps producer - consumer below the ring size
    assert program.submitted == capacity
    assert program.refused == 250 - capacity
    records = ring.drain()
    assert len(records) == program.submitted
    check_records(records, 0, os.getpid())
    # Space is back once drained.
    fire(40)
    check_records(ring.drain(), 250, os.getpid())
    assert program.refused == 250 - capacity


def test_discarded_records_are_skipped_and_counted(program: RingProgram, ring: RingBufferReader) -> None:
    program.reset(os.getpid(), DISCARD_ODD)
    fire(40)
    records = ring.drain()
    np.testing.assert_array_equal(records["seq"], np.arange(0, 40, 2, dtype=np.uint64))
    np.testing.assert_array_equal(records["check"], ~records["seq"])
    assert ring.discarded == 20
    assert ring.pending_bytes() == 0


class RingHeaders:
    """A second, read-only view of the ring: the consumer position and record headers,
    to tell whether a record was BUSY around a drain."""

    def __init__(self, map_fd: int) -> None:
        page = mmap.PAGESIZE
        self._cons = mmap.mmap(map_fd, page, mmap.MAP_SHARED, mmap.PROT_READ, offset=0)
        self._data = mmap.mmap(map_fd, page + 2 * RING_BYTES, mmap.MAP_SHARED, mmap.PROT_READ, offset=page)

    def consumer(self) -> int:
        return struct.unpack_from("<Q", self._cons, 0)[0]

    def busy(self, position: int) -> bool:
        """Whether the record at ring ``position`` is still being written."""
        length = struct.unpack_from("<I", self._data, mmap.PAGESIZE + (position & (RING_BYTES - 1)))[0]
        return bool(length & 1 << 31)

    def close(self) -> None:
        self._cons.close()
        self._data.close()


PRODUCER = "import os, sys\nfor _ in sys.stdin:\n    os.getppid(); os.getppid()\n    print('done', flush=True)\n"


def test_a_record_still_being_written_is_not_consumed(program: RingProgram, ring: RingBufferReader) -> None:
    """A producer on another CPU holds its record BUSY; the drain stops in front of it.

    The producer is a child process (this process would hold the GIL through its own
    syscall): of each pair of getppid() calls, the second reserves a record and holds it
    for ~20 ms. Producer and drain are pinned to different CPUs. A drain counts when the
    record was BUSY both before and after it (on a loaded host the drain may miss the
    window: it is tried again, and every drain must return whole records in order anyway).
    """
    mine = os.sched_getaffinity(0)
    cpus = sorted(mine)
    if len(cpus) < 2:
        pytest.skip("needs two CPUs: the producer holds its record in the kernel, without preemption")
    child = subprocess.Popen([sys.executable, "-c", PRODUCER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    headers = RingHeaders(program.bpf[b"ring"].map_fd)
    observed = 0
    try:
        os.sched_setaffinity(child.pid, {cpus[1]})
        os.sched_setaffinity(0, {cpus[0]})
        program.reset(child.pid, HOLD_ODD)
        for attempt in range(20):
            child.stdin.write("go\n")
            child.stdin.flush()
            deadline = time.monotonic() + 10
            while ring.pending_bytes() < 2 * STRIDE and time.monotonic() < deadline:
                pass
            assert ring.pending_bytes() == 2 * STRIDE, "the child's records never arrived"
            held = headers.consumer() + STRIDE
            busy_before = headers.busy(held)
            early = ring.drain()
            busy_after = headers.busy(held)
            check_records(early, 2 * attempt, child.pid)
            if busy_before and busy_after:
                observed += 1
                # Only the first record was committed: the second, reserved, is left in place.
                assert len(early) == 1
                assert ring.pending_bytes() == STRIDE
            assert child.stdout.readline() == "done\n"
            late = ring.drain()
            both = np.concatenate([early, late])
            check_records(both, 2 * attempt, child.pid)
            assert len(both) == 2 and both["spun"][1] == SPIN
            assert ring.pending_bytes() == 0
            if observed:
                break
        assert observed, "no drain ran while the record was held (the host is too busy)"
    finally:
        os.sched_setaffinity(0, mine)
        headers.close()
        child.kill()
        child.wait()


def test_ring_size_must_be_a_power_of_two(program: RingProgram) -> None:
    with pytest.raises(ValueError, match="3000 is not a power of two"):
        RingBufferReader(program.bpf[b"ring"].map_fd, 3000, RECORD)


def test_the_peak_is_the_most_that_waited_at_any_drain_since_it_was_taken(
    program: RingProgram, ring: RingBufferReader
) -> None:
    program.reset(os.getpid(), SUBMIT)
    ring.take_peak()
    fire(30)
    ring.drain()
    fire(10)
    ring.drain()
    assert ring.take_peak() == 30 * STRIDE  # the fuller of the two drains
    fire(5)
    assert ring.take_peak() == 5 * STRIDE  # what waits now starts the next interval
    ring.drain()
    assert ring.take_peak() == 5 * STRIDE
    assert ring.take_peak() == 0
    assert ring.size == RING_BYTES
