"""Seconds spent in each start-up phase of a package, exclusive of one another.

Start-up hashes a package, reads its metadata, extracts and loads it, probes
and warms it up; on a multi-GB package the split says where a cold start
goes. :class:`StartupPhases` records each phase's duration (logged once and
served by ``GET /v2/models/{name}/config`` as ``startup_seconds``); the
facts side (:mod:`predictor.packages.facts`) times the hash and the read, the
running side (:mod:`predictor.runtime.loader`) the extraction and the load,
the model its probe and warm-up.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class StartupPhases:
    """Seconds spent in each start-up phase, in the order they ran.

    Phases: ``digest`` (SHA-256 of the package), ``metadata`` (read from the
    zip), ``extraction`` (the GIL-free runner's model library out of the zip;
    absent with torch's loader, whose ``load`` includes it), ``load`` (host
    checks and load), then the model's ``probe`` (output check) and
    ``warmup``. Timed with ``time.monotonic()``. Phases are exclusive: time
    spent in a phase nested inside another counts for the inner one only, so
    the phases add up to the time they cover.
    """

    def __init__(self) -> None:
        self._seconds: dict[str, float] = {}
        self._open: list[float] = []  # per open phase: seconds of its nested phases

    @contextmanager
    def time(self, phase: str) -> Iterator[None]:
        """Times the ``with`` block as ``phase`` (added to an earlier run of it).

        A phase timed inside this block is subtracted from this one.
        """
        start = time.monotonic()
        self._open.append(0.0)
        try:
            yield
        finally:
            elapsed = time.monotonic() - start
            nested = self._open.pop()
            self._seconds[phase] = self._seconds.get(phase, 0.0) + elapsed - nested
            if self._open:
                self._open[-1] += elapsed

    def as_dict(self) -> dict[str, float]:
        """Phase name to seconds (rounded to the millisecond), in run order."""
        return {name: round(seconds, 3) for name, seconds in self._seconds.items()}

    def summary(self) -> str:
        """One log line: ``digest 1.234s, metadata 0.002s, ...``."""
        return ", ".join(f"{name} {seconds:.3f}s" for name, seconds in self.as_dict().items())
