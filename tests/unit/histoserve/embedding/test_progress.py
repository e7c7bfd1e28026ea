"""Progress: bar on a terminal, plain lines otherwise, nothing for none; one line per slide."""

from __future__ import annotations

import io
import re

import pytest

from histoserve.embedding.batches import BatchStats
from histoserve.embedding.progress import Progress, resolve_mode


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_auto_picks_bar_on_a_terminal_and_plain_otherwise() -> None:
    assert resolve_mode("auto", _Tty()) == "bar"
    assert resolve_mode("auto", io.StringIO()) == "plain"
    assert resolve_mode("none", _Tty()) == "none"
    with pytest.raises(ValueError, match="fancy"):
        resolve_mode("fancy", io.StringIO())


def test_bar_redraws_one_line_and_prints_finished_slides() -> None:
    stream = _Tty()
    progress = Progress("auto", 2, stream, stats=BatchStats(read_s=1.0, server_s=3.0))
    progress.slide_started("s1", 100)
    progress.tiles(64)
    progress.slide_finished("s1", "done", 100, 2.0)
    progress.close()
    text = stream.getvalue()
    assert "\r" in text and "tiles 64/100" in text
    assert "[1/2] s1: done (100 tiles, 2.0 s)" in text
    assert "reading 25% / server 75%" in progress.summary_line()


def test_plain_lines_have_no_carriage_returns() -> None:
    stream = io.StringIO()
    progress = Progress("plain", 3, stream, plain_interval_s=0.0)
    progress.slide_started("a", 10)
    progress.tiles(10)
    progress.slide_finished("a", "failed", 0, 0.1, "no mpp")
    progress.close()
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    assert "[1/3] a: failed (0 tiles, 0.1 s): no mpp" in lines
    assert lines[-1].startswith("slides 1/3 | tiles 10/10")


def test_none_prints_nothing() -> None:
    stream = _Tty()
    progress = Progress("none", 1, stream)
    progress.slide_started("a", 1)
    progress.tiles(1)
    progress.slide_finished("a", "done", 1, 0.1)
    progress.close()
    assert stream.getvalue() == ""


HOSTILE = "x\x1b[2J\x1b]0;pwned\x07\rback\x08\n[9/9] fake: done\x9b1m\u202egnp.exe"
ESCAPED = "x\\x1b[2J\\x1b]0;pwned\\x07\\rback\\x08\\n[9/9] fake: done\\x9b1m\\u202egnp.exe"


@pytest.mark.parametrize("stream", [io.StringIO(), _Tty()], ids=["plain", "bar"])
def test_control_characters_in_ids_and_errors_are_shown_escaped(stream: io.StringIO) -> None:
    progress = Progress("auto", 1, stream, plain_interval_s=0.0)
    progress.slide_started(HOSTILE, 4)
    progress.tiles(4)
    progress.slide_finished(HOSTILE, "failed", 0, 0.1, f"cannot open /d/{HOSTILE}.svs")
    progress.close()
    text = stream.getvalue()
    assert not any(c in text for c in "\x1b\x07\x08\x9b\u202e")
    assert f"[1/1] {ESCAPED}: failed (0 tiles, 0.1 s): cannot open /d/{ESCAPED}.svs" in text
    assert f"| {ESCAPED}" in text  # the status line names the slide in progress, escaped too
    # Every line (and bar redraw) is one of ours: no forged "[9/9]" line, no overwritten text.
    parts = [part.strip() for part in re.split(r"[\r\n]", text) if part.strip()]
    assert parts and all(part.startswith(("[1/1] ", "slides ")) for part in parts)
