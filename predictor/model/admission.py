"""Admission control: which requests are in, and whether a new one fits.

Two counts the model keeps outside the batcher, because stage 1 (decoding)
happens before a request's tiles reach the batcher's queue:

- admitted requests, so a drain can wait for requests still decoding;
- staged tiles (admitted, decoding, not yet queued), bounded together with
  the queue: under overload a request is refused *before* its tiles are
  decoded, so the 503 is fast and the CPU goes to admitted work.

All methods run on the event loop thread and never await between a check and
its update, so no lock is needed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from predictor.errors import ModelNotReady, Overloaded


class Admission:
    """Counts admitted requests and staged tiles for one model.

    Args:
        name: Model name, for messages.
        max_queue_size: Bound on staged + queued tiles, per class of service.
        retry_after_s: ``Retry-After`` hint for overload refusals.
        on_reject: Called with the tile count of each refused request (metrics).
    """

    def __init__(
        self,
        name: str,
        max_queue_size: int,
        retry_after_s: float,
        on_reject: Callable[[int], None] = lambda n: None,
    ):
        if max_queue_size < 1:
            raise ValueError(f"max_queue_size must be >= 1, got {max_queue_size}")
        self._name = name
        self._max_queue_size = max_queue_size
        self._retry_after_s = retry_after_s
        self._on_reject = on_reject
        self._admitted = 0
        self._staged: dict[int, int] = {}  # per class of service
        self._draining = False
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def draining(self) -> bool:
        """True once :meth:`start_draining` was called."""
        return self._draining

    @property
    def admitted(self) -> int:
        """Requests admitted and not yet finished."""
        return self._admitted

    @contextmanager
    def request(self) -> Iterator[None]:
        """Holds one admitted request; refuses with 503 once draining."""
        if self._draining:
            raise ModelNotReady(f"model {self._name!r} is draining for shutdown; retry elsewhere")
        self._admitted += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._admitted -= 1
            if self._admitted == 0:
                self._idle.set()

    @contextmanager
    def staged(self, n_tiles: int, queue_depth: int, priority: int = 1) -> Iterator[None]:
        """Holds ``n_tiles`` in stage 1, or refuses with a fast 503 when they don't fit.

        Counted per class of service (``priority``, with that class's ``queue_depth``),
        as the batcher bounds each class's queue.
        """
        waiting = self._staged.get(priority, 0) + queue_depth
        if waiting + n_tiles > self._max_queue_size:
            self._on_reject(n_tiles)
            raise Overloaded(
                f"{self._name}: queue full (priority {priority}: {waiting} tiles waiting + "
                f"{n_tiles} new > {self._max_queue_size})",
                retry_after_s=self._retry_after_s,
            )
        self._staged[priority] = self._staged.get(priority, 0) + n_tiles
        try:
            yield
        finally:
            self._staged[priority] -= n_tiles

    def start_draining(self) -> None:
        """Refuses every request from now on."""
        self._draining = True

    async def wait_idle(self, timeout_s: float) -> bool:
        """Waits until no admitted request is left; False at the deadline."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except asyncio.TimeoutError:
            return False
        return True
