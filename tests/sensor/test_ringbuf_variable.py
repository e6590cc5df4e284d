"""VariableRingReader against a real BPF ring buffer holding records of different lengths.

A small BCC program writes, on every ``getppid()`` of the process in its ``target`` map, a
16-byte header (sequence number, its complement) followed by the first ``seq * 37 % 301``
bytes of a pattern user space put in a map: each record's length differs from its
neighbours', so records land at every alignment, straddle the end of the one-page data area,
and a payload's bytes say whether it was cut or shifted. The program counts what it sent and
what the ring refused, which the drains must match exactly.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest

from otelbpf.sensor.ringbuf import VariableRingReader

pytestmark = pytest.mark.bpf

RING_BYTES = 4096
PATTERN = bytes((i * 7 + 3) & 0xFF for i in range(512))
DTYPE = np.dtype([("seq", "<u8"), ("check", "<u8"), ("data", object)])

SOURCE = r"""
struct rec { u64 seq; u64 check; u8 data[512]; };
BPF_RINGBUF_OUTPUT(ring, 1);
BPF_ARRAY(counts, u64, 3);      /* 0: next sequence number, 1: sent, 2: refused */
BPF_ARRAY(target, u32, 1);
BPF_ARRAY(pattern, struct rec, 1);
BPF_PERCPU_ARRAY(scratch, struct rec, 1);

static __always_inline void bump(u32 slot)
{
    u64 *v = counts.lookup(&slot);
    if (v)
        __sync_fetch_and_add(v, 1);
}

TRACEPOINT_PROBE(syscalls, sys_enter_getppid)
{
    u32 zero = 0;
    u32 *want = target.lookup(&zero);
    if (!want || *want != (bpf_get_current_pid_tgid() >> 32))
        return 0;
    u64 *next = counts.lookup(&zero);
    struct rec *pat = pattern.lookup(&zero);
    struct rec *r = scratch.lookup(&zero);
    if (!next || !pat || !r)
        return 0;
    u64 seq = __sync_fetch_and_add(next, 1);
    __builtin_memcpy(r, pat, sizeof(*r));
    r->seq = seq;
    r->check = ~seq;
    u64 n = (seq * 37) % 301;
    asm volatile("" : "+r"(n));  /* the verifier does not bound a modulo: bound it again */
    if (n > 300)
        n = 300;
    if (ring.ringbuf_output(r, 16 + n, BPF_RB_NO_WAKEUP) != 0)
        bump(2);
    else
        bump(1);
    return 0;
}
"""


class Program:
    def __init__(self) -> None:
        from bcc import BPF

        self.bpf = BPF(text=SOURCE.encode())
        pattern = self.bpf[b"pattern"]
        leaf = pattern.Leaf()
        for i, b in enumerate(PATTERN):
            leaf.data[i] = b
        pattern[pattern.Key(0)] = leaf

    def reset(self, pid: int) -> None:
        counts, target = self.bpf[b"counts"], self.bpf[b"target"]
        for slot in range(3):
            counts[counts.Key(slot)] = counts.Leaf(0)
        target[target.Key(0)] = target.Leaf(pid)

    def count(self, slot: int) -> int:
        counts = self.bpf[b"counts"]
        return counts[counts.Key(slot)].value

    def reader(self) -> VariableRingReader:
        return VariableRingReader(self.bpf[b"ring"].map_fd, RING_BYTES, DTYPE)


@pytest.fixture(scope="module")
def program() -> Iterator[Program]:
    prog = Program()
    try:
        yield prog
    finally:
        prog.bpf.cleanup()


@pytest.fixture
def ring(program: Program) -> Iterator[VariableRingReader]:
    program.reset(0)
    reader = program.reader()
    reader.drain()
    assert reader.pending_bytes() == 0
    try:
        yield reader
    finally:
        program.reset(0)
        reader.close()


def fire(n: int) -> None:
    for _ in range(n):
        os.getppid()


def check(records: np.ndarray, first_seq: int | None) -> None:
    """Consecutive records from ``first_seq`` (None: increasing, with gaps), headers intact, each
    payload its exact prefix."""
    assert records.dtype == DTYPE
    if first_seq is None:
        assert (np.diff(records["seq"].astype(np.int64)) > 0).all()
    else:
        np.testing.assert_array_equal(records["seq"], np.arange(first_seq, first_seq + len(records), dtype=np.uint64))
    np.testing.assert_array_equal(records["check"], ~records["seq"])
    for seq, payload in zip(records["seq"].tolist(), records["data"].tolist()):
        assert type(payload) is bytes
        assert payload == PATTERN[: seq * 37 % 301], seq


def test_records_of_every_length_come_back_exact_and_in_order(program: Program, ring: VariableRingReader) -> None:
    program.reset(os.getpid())
    fire(12)
    got = ring.drain()
    assert len(got) == 12 == program.count(1)
    check(got, 0)
    assert ring.pending_bytes() == 0


def test_many_times_the_ring_across_drains_wraps_without_loss(program: Program, ring: VariableRingReader) -> None:
    program.reset(os.getpid())
    seen = 0
    for _ in range(60):  # ~8 records per round, ~1.4 KiB: the data area wraps every ~3 rounds
        fire(8)
        got = ring.drain()
        check(got, seen)
        seen += len(got)
    assert seen == 480 == program.count(1)
    assert program.count(2) == 0


def test_max_records_leaves_the_rest_for_the_next_drain(program: Program, ring: VariableRingReader) -> None:
    program.reset(os.getpid())
    fire(9)
    first = ring.drain(max_records=4)
    check(first, 0)
    assert len(first) == 4
    rest = ring.drain()
    check(rest, 4)
    assert len(rest) == 5


def test_a_full_ring_refuses_and_the_drain_returns_exactly_what_was_sent(
    program: Program, ring: VariableRingReader
) -> None:
    program.reset(os.getpid())
    fire(200)  # ~35 KiB offered to a 4 KiB ring: once full, only records short enough still fit
    got = ring.drain()
    assert program.count(2) > 0
    assert len(got) == program.count(1)
    check(got, None)


def test_empty_drain_has_the_dtype(ring: VariableRingReader) -> None:
    got = ring.drain()
    assert len(got) == 0 and got.dtype == DTYPE


def test_dtype_must_end_with_an_object_payload(program: Program) -> None:
    with pytest.raises(ValueError, match="object field 'data'"):
        VariableRingReader(program.bpf[b"ring"].map_fd, RING_BYTES, np.dtype([("seq", "<u8"), ("data", "u1", (4,))]))
