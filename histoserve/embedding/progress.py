"""Progress of an embed run: a one-line bar on a terminal, plain log lines otherwise.

What a user wants to see while a cohort runs: slides done of total, tiles
done, tiles per second, and whether the run waits on slide reading (the client
is the bottleneck: add ``--read-workers``) or on the server (add replicas or
``--concurrency``). Reading and server time are summed over threads, so they
are shown as shares of their sum.

``auto`` draws the bar when the stream is a terminal and prints a plain line
every ``plain_interval_s`` otherwise (a pod's log, a CI job); ``none`` prints
nothing. Every finished slide gets its own line in every mode but ``none``.
No third-party dependency: the bar is a ``\\r`` line.

Slide ids, paths and error messages come from outside (file names, the
manifest, the server): every line goes through
:func:`~histoserve.text.printable`, so an escape code, CR or
newline in them is shown escaped (``\\x1b[2J``) instead of acting on the
terminal.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

from histoserve.embedding.batches import BatchStats
from histoserve.embedding.config import PROGRESS
from histoserve.text import printable

BAR_INTERVAL_S = 0.25
PLAIN_INTERVAL_S = 10.0


def resolve_mode(mode: str, stream: TextIO) -> str:
    """``auto`` -> ``bar`` on a terminal, ``plain`` otherwise; other modes as given."""
    if mode not in PROGRESS:
        raise ValueError(f"progress mode must be one of {PROGRESS}, got {mode!r}")
    if mode != "auto":
        return mode
    isatty = getattr(stream, "isatty", None)
    return "bar" if isatty is not None and isatty() else "plain"


class Progress:
    """Thread-safe counters of a run, drawn as a bar or logged as lines.

    Args:
        mode: ``auto``, ``bar``, ``plain`` or ``none``.
        total_slides: Slides this process will look at.
        stream: Where to write (stderr by default).
        plain_interval_s: Seconds between plain progress lines.
        stats: The run's reading / server timings (summed over threads).
    """

    def __init__(
        self,
        mode: str,
        total_slides: int,
        stream: TextIO | None = None,
        plain_interval_s: float = PLAIN_INTERVAL_S,
        stats: BatchStats | None = None,
    ):
        self._stream = stream if stream is not None else sys.stderr
        self.mode = resolve_mode(mode, self._stream)
        self._interval_s = BAR_INTERVAL_S if self.mode == "bar" else plain_interval_s
        self._lock = threading.Lock()
        self._start = time.monotonic()
        self._last_draw = float("-inf")
        self.total_slides, self.slides_seen = total_slides, 0
        self.tiles_done = self.tiles_total = 0
        self.stats = stats if stats is not None else BatchStats()
        self._current = ""

    def slide_started(self, slide_id: str, n_tiles: int) -> None:
        """A slide's tiles are being read and sent."""
        with self._lock:
            self._current = slide_id
            self.tiles_total += n_tiles
        self._maybe_draw()

    def tiles(self, n: int) -> None:
        """``n`` more tiles answered."""
        with self._lock:
            self.tiles_done += n
        self._maybe_draw()

    def slide_finished(
        self, slide_id: str, status: str, n_tiles: int, seconds: float, error: str = ""
    ) -> None:
        """One line per finished slide (``done``, ``skipped``, ``failed``)."""
        with self._lock:
            self.slides_seen += 1
            line = (
                f"[{self.slides_seen}/{self.total_slides}] {slide_id}: {status}"
                f" ({n_tiles} tiles, {seconds:.1f} s){': ' + error if error else ''}"
            )
        self._write_line(line)

    def rate(self) -> float:
        """Tiles per second since the start."""
        elapsed = time.monotonic() - self._start
        return self.tiles_done / elapsed if elapsed > 0 else 0.0

    def summary_line(self) -> str:
        """The status line (also the bar's text)."""
        read_s, server_s = self.stats.read_s, self.stats.server_s
        with self._lock:
            busy = read_s + server_s
            read_pct = 100.0 * read_s / busy if busy else 0.0
            return (
                f"slides {self.slides_seen}/{self.total_slides} | tiles {self.tiles_done}"
                f"/{self.tiles_total} | {self.rate():.0f} tiles/s | reading {read_pct:.0f}%"
                f" / server {100.0 - read_pct if busy else 0.0:.0f}% | {self._current}"
            )

    def close(self) -> None:
        """Final line."""
        if self.mode == "none":
            return
        self._write_line(self.summary_line())

    def _maybe_draw(self) -> None:
        if self.mode == "none":
            return
        now = time.monotonic()
        with self._lock:
            if now - self._last_draw < self._interval_s:
                return
            self._last_draw = now
        text = self.summary_line()
        if self.mode == "bar":
            self._stream.write("\r" + printable(text)[:160].ljust(160) + "\r")
            self._stream.flush()
        else:
            self._write_line(text)

    def _write_line(self, line: str) -> None:
        if self.mode == "none":
            return
        prefix = "\r" + " " * 160 + "\r" if self.mode == "bar" else ""
        with self._lock:
            self._stream.write(prefix + printable(line) + "\n")
            self._stream.flush()
