"""Server-sent event framing on synthetic byte streams: every split point, gaps, hostile sizes."""

from __future__ import annotations

from otelbpf.families.http.protocols.sse import EventStream

STREAM = (
    b": keep-alive comment\n\n"
    b'data: {"a": 1}\n\n'
    b"event: delta\r\ndata: line one\r\ndata:line two\r\nid: 7\r\n\r\n"
    b"retry: 100\n\n"  # no data: not an event
    b"data\n\n"  # a field without a colon: empty data
    b"data: [DONE]\n\n"
)
EXPECTED = [(b'{"a": 1}', "message"), (b"line one\nline two", "delta"), (b"", "message"), (b"[DONE]", "message")]


def events_of(pieces: list[bytes]) -> list[tuple[bytes, str]]:
    s = EventStream()
    out = []
    for i, piece in enumerate(pieces):
        out += [(e.data, e.type) for e in s.feed(piece, i)]
    return out


def test_events_whatever_the_split():
    assert events_of([STREAM]) == EXPECTED
    for cut in range(len(STREAM) + 1):
        assert events_of([STREAM[:cut], STREAM[cut:]]) == EXPECTED, cut
    assert events_of([bytes([b]) for b in STREAM]) == EXPECTED


def test_the_stamp_is_the_piece_that_ended_the_event():
    s = EventStream()
    assert s.feed(b"data: x\n", "first") == []
    (event,) = s.feed(b"\n", "second")
    assert event.stamp == "second"


def test_a_gap_drops_the_event_under_way_and_resumes_after_a_blank_line():
    s = EventStream()
    assert [e.data for e in s.feed(b"data: one\n\ndata: tw", 0)] == [b"one"]
    s.gap(100)  # the rest of "two" and whatever followed it
    # Bytes after the gap up to a blank line may be the tail of any event: never made into one.
    assert s.feed(b"o-tail\ndata: half\n\ndata: three\n\n", 1)[0].data == b"three"
    assert s.problems == {"event_lost_in_gap": 1}


def test_long_lines_and_data_are_bounded():
    s = EventStream(max_line=64, max_data=100)
    out = s.feed(b"data: " + b"x" * 500 + b"\n\n", 0)
    assert out[0].truncated and out[0].data == b""  # the line was not kept, the event still counted
    assert s.problems == {"line_too_long": 1}
    out = []
    for _ in range(10):
        out += s.feed(b"data: " + b"y" * 40 + b"\n", 1)
    out += s.feed(b"\n", 2)
    assert len(out[0].data) == 100 and out[0].truncated
    # A line that grows piece by piece past the bound is dropped as it goes, not held.
    for _ in range(100):
        s.feed(b"z" * 50, 3)
    assert len(s._line) <= 64
    assert s.feed(b"\ndata: ok\n\n", 4)[0].data == b"ok"
