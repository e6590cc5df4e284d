"""Outside-world text made safe for a terminal: every control character a value can carry
(C0, DEL, C1, the bidi overrides) comes out as a visible escape, a stream keeps its own lines,
and a log record stays one line whatever its arguments held."""

from __future__ import annotations

import io
import logging
import re
import sys

import pytest

from otelbpf.base.terminal import CleanFormatter, clean, cleaned, log_to_stderr

#: What a terminal acts on: any of these in output is a command to it, or text shown out of order.
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


@pytest.mark.parametrize(
    ("hostile", "shown"),
    [
        ("\x1b]0;owned\x07", "\\x1b]0;owned\\x07"),  # retitles the window
        ("\x1b[2J", "\\x1b[2J"),  # clears the screen
        ("ok\rfake", "ok\\x0dfake"),  # overwrites what was printed
        ("a\nb\tc", "a\\x0ab\\x09c"),  # a forged line or column in one value
        ("\x00\x7f", "\\x00\\x7f"),
        ("\x9b31m", "\\x9b31m"),  # C1 CSI: ESC [ in one character
        ("\u202egnp.exe", "\\u202egnp.exe"),  # right-to-left override
        ("\u2066x\u2069", "\\u2066x\\u2069"),  # isolates
        ("ünïcødé 名前 [/] ✓", "ünïcødé 名前 [/] ✓"),  # the rest is kept as it is
    ],
)
def test_clean_writes_each_control_character_as_a_visible_escape(hostile: str, shown: str) -> None:
    assert clean(hostile) == shown
    assert not CONTROL.search(clean(hostile))


def test_lines_keep_newlines_and_tabs_only() -> None:
    assert clean("one\ttwo\nthree\x1b[2J\r\n", lines=True) == "one\ttwo\nthree\\x1b[2J\\x0d\n"


def test_a_cleaned_stream_cleans_every_write_and_passes_the_rest_on() -> None:
    raw = io.StringIO()
    out = cleaned(raw)
    print("service \x1b]0;", end="", file=out)  # a sequence split across writes
    print("owned\x07 done", file=out)
    out.write("\u202eevil\n")
    out.flush()
    assert raw.getvalue() == "service \\x1b]0;owned\\x07 done\n\\u202eevil\n"
    assert out.isatty() is False and out.writable()


def test_a_log_record_stays_one_clean_line_and_its_traceback_keeps_its_lines() -> None:
    formatter = CleanFormatter("%(levelname)s %(name)s: %(message)s")
    record = logging.LogRecord(
        "otelbpf.x", logging.WARNING, __file__, 1, "process %s: %s", ("\x1b[2Jpy", "/a\nWARNING forged"), None
    )
    assert formatter.format(record) == "WARNING otelbpf.x: process \\x1b[2Jpy: /a\\x0aWARNING forged"
    try:
        raise ValueError("bad path /tmp/\x1b]0;owned\x07")
    except ValueError:
        record = logging.LogRecord("otelbpf.x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    text = formatter.format(record)
    assert text.startswith("ERROR otelbpf.x: failed\nTraceback (most recent call last):\n")
    assert "ValueError: bad path /tmp/\\x1b]0;owned\\x07" in text
    assert not CONTROL.search(text.replace("\n", ""))


def test_log_to_stderr_is_basic_config_with_records_cleaned(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    root.handlers[:] = []  # basicConfig does nothing over handlers already there (pytest's)
    try:
        log_to_stderr("INFO", "%(levelname)s %(message)s")
        logging.basicConfig(level="DEBUG", format="%(message)s")  # a library's own, later: a no-op
        logging.getLogger("otelbpf.test").info("comm %s", "\x1b]0;owned\x07")
    finally:
        root.handlers[:] = saved
        root.setLevel(level)
    assert capsys.readouterr().err == "INFO comm \\x1b]0;owned\\x07\n"
