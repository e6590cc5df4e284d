"""Drain a BPF ring buffer in bulk, from its mapped pages.

BCC's per-event callback costs ~1 µs of Python per record and saturates a
core near 0.5-1M events/s. Here the ring's pages are mmap'ed directly (as
libbpf does) and all committed records since the last drain are copied out as
one numpy array, so the cost per record is a few nanoseconds of memcpy.

Layout (kernel/bpf/ringbuf.c): page 0 holds the consumer position (written by
us), page 1 the producer position; the data area follows. The kernel offers it
mapped twice back to back (so a run of records that wraps around is contiguous),
but every page of a ring mapping is resident from mmap on, and counts in the
agent's RSS twice: here it is mapped once, and the few records that wrap are
joined by a copy.
Each record has an 8-byte header: u32 length with BUSY (bit 31) and DISCARD
(bit 30) flags, u32 page offset; records are 8-byte aligned.
"""

from __future__ import annotations

import mmap
import struct

import numpy as np
import numpy.typing as npt

_BUSY = 1 << 31
_DISCARD = 1 << 30
_HEADER = 8


class _MappedRing:
    """A BPF ring buffer's pages mapped here: positions and the (doubly mapped) data area."""

    def __init__(self, map_fd: int, size_bytes: int) -> None:
        if size_bytes & (size_bytes - 1):
            raise ValueError(f"ring buffer size {size_bytes} is not a power of two")
        self._mask = size_bytes - 1
        #: the ring's map: epoll on it reports the wake-ups its producers ask for
        self.map_fd = map_fd
        page = mmap.PAGESIZE
        self._cons = mmap.mmap(map_fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
        self._prod = mmap.mmap(map_fd, page + size_bytes, mmap.MAP_SHARED, mmap.PROT_READ, offset=page)
        self._cons_pos = np.frombuffer(self._cons, dtype="<u8", count=1)
        self._prod_pos = np.frombuffer(self._prod, dtype="<u8", count=1)
        self._page = page
        self.size = size_bytes
        self.discarded = 0
        #: The most bytes found waiting at a drain (or by ``take_peak``) since ``take_peak``:
        #: between drains only the producer moves, so this is the ring at its fullest (what a
        #: smaller ring would have had to hold).
        self.peak = 0

    def pending_bytes(self) -> int:
        return int(self._prod_pos[0]) - int(self._cons_pos[0])

    def take_peak(self) -> int:
        """The peak since the last call, which starts the next one from what waits now."""
        pending = self.pending_bytes()
        peak, self.peak = max(self.peak, pending), pending
        return peak

    def _unmap(self) -> None:
        del self._cons_pos, self._prod_pos
        self._cons.close()
        self._prod.close()


class RingBufferReader(_MappedRing):
    """Consumer side of one BPF ring buffer whose records all have ``dtype``."""

    def __init__(self, map_fd: int, size_bytes: int, dtype: np.dtype) -> None:
        super().__init__(map_fd, size_bytes)
        self.dtype = np.dtype(dtype)
        self._stride = (_HEADER + self.dtype.itemsize + 7) & ~7
        # Header + payload + padding, read as one structured record.
        self._record = np.dtype(
            {
                "names": ["len", "pg_off", "data"],
                "formats": ["<u4", "<u4", self.dtype],
                "offsets": [0, 4, _HEADER],
                "itemsize": self._stride,
            }
        )
        self._data = np.frombuffer(self._prod, dtype=np.uint8, offset=self._page)

    def drain(self, max_records: int | None = None) -> np.ndarray:
        """Copy out every committed record, release their space, return them.

        Stops at the first record a producer is still writing (BUSY); it is
        picked up by the next drain.
        """
        cons = int(self._cons_pos[0])
        prod = int(self._prod_pos[0])
        self.peak = max(self.peak, prod - cons)
        n = (prod - cons) // self._stride
        if max_records is not None:
            n = min(n, max_records)
        if n <= 0:
            return np.empty(0, dtype=self.dtype)
        start = cons & self._mask
        end = start + n * self._stride
        if end <= len(self._data):
            raw = self._data[start:end]
        else:  # the run wraps around the end of the (singly mapped) data area
            raw = np.concatenate((self._data[start:], self._data[: end - len(self._data)]))
        view = raw.view(self._record)
        lens = view["len"]
        busy = np.flatnonzero(lens & _BUSY)
        if busy.size:
            n = int(busy[0])
            view = view[:n]
            lens = lens[:n]
        keep = (lens & _DISCARD) == 0
        out: np.ndarray
        if not keep.all():
            self.discarded += int(n - keep.sum())
            out = view["data"][keep].copy()
        else:
            out = view["data"].copy()
        self._cons_pos[0] = cons + n * self._stride
        return out

    def close(self) -> None:
        del self._data
        self._unmap()


class VariableRingReader(_MappedRing):
    """Consumer side of a ring whose records are a fixed header plus a payload of any length.

    ``dtype`` is what ``drain`` returns: the header's fields, then ``data``, an object field
    holding each record's payload as ``bytes`` (what followed the header, exactly). Records
    are walked one by one (their lengths differ), ~1 µs each: for rings of thousands to tens
    of thousands of records a second (socket payloads), not millions.
    """

    def __init__(self, map_fd: int, size_bytes: int, dtype: np.dtype) -> None:
        self.dtype = np.dtype(dtype)
        all_names, fields = self.dtype.names, self.dtype.fields
        if all_names is None or fields is None or all_names[-1] != "data" or fields["data"][0] != np.dtype(object):
            raise ValueError("a variable-length ring's dtype ends with an object field 'data'")
        names = all_names[:-1]
        self._header_names = list(names)
        self._header = np.dtype(
            {
                "names": names,
                "formats": [fields[n][0] for n in names],
                "offsets": [fields[n][1] for n in names],
                "itemsize": fields["data"][1],
            }
        )
        self._hsize = self._header.itemsize
        super().__init__(map_fd, size_bytes)
        self._data = memoryview(self._prod)[self._page :]

    def drain(self, max_records: int | None = None) -> np.ndarray:
        """Copy out every committed record, release their space, return them (see RingBufferReader)."""
        pos = int(self._cons_pos[0])
        prod = int(self._prod_pos[0])
        self.peak = max(self.peak, prod - pos)
        data, mask, hsize = self._data, self._mask, self._hsize
        limit = max_records if max_records is not None else -1
        headers = bytearray()
        payloads: list[bytes] = []
        unpack = struct.Struct("<I").unpack_from
        while pos < prod and limit != 0:
            off = pos & mask
            (word,) = unpack(data, off)
            if word & _BUSY:
                break
            length = word & ~(_BUSY | _DISCARD)
            if word & _DISCARD or length < hsize:
                self.discarded += 1
            else:
                start = off + _HEADER
                if start + length <= len(data):
                    record = data[start : start + length]
                else:  # wraps around the end of the (singly mapped) data area
                    record = memoryview(bytes(data[start:]) + bytes(data[: (start + length) & mask]))
                headers += record[:hsize]
                payloads.append(bytes(record[hsize:length]))
                limit -= 1
            pos += (_HEADER + length + 7) & ~7
        self._cons_pos[0] = pos
        out: npt.NDArray[np.void] = np.empty(len(payloads), dtype=self.dtype)
        if payloads:
            out[self._header_names] = np.frombuffer(bytes(headers), dtype=self._header)
            out["data"] = payloads
        return out

    def close(self) -> None:
        self._data.release()
        self._unmap()
