"""Admission control: which requests are in, and whether a new one fits.

Two counts the model keeps outside the batcher, because stage 1 (decoding)
happens before a request's tiles reach the batcher's queue:

- admitted requests, so a drain can wait for requests still decoding;
- staged tiles (admitted, decoding, not yet queued), bounded together with
  the queue: under overload a request is refused *before* its tiles are
  decoded, so the 503 is fast and the CPU goes to admitted work;
- staged decode pixels: what stage 1 will decode and resize for the
  requests it holds (the jpeg transport's slide tiles' declared pixels and
  its boxes' pixels, :func:`~predictor.codecs.jpeg_input.decode_pixels`),
  bounded by ``max_decode_pixels``. A jpeg request of four tiles may ask for
  a second of CPU, so its tile count says nothing of its cost: without this
  bound a few clients sending such requests filled the decode pool while
  holding 4 tiles each of a 1,024-tile queue, and every other request waited
  behind them (issue 53). A request decoding nothing is never refused by it,
  and a request is always admitted to an empty stage 1 (a request the
  limits allow is never refused forever).

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
        max_decode_pixels: Bound on the decode pixels of staged requests.
        on_reject: Called with the tile count of each refused request (metrics).
    """

    def __init__(
        self,
        name: str,
        max_queue_size: int,
        retry_after_s: float,
        max_decode_pixels: int = 1 << 62,
        on_reject: Callable[[int], None] = lambda n: None,
    ):
        if max_queue_size < 1:
            raise ValueError(f"max_queue_size must be >= 1, got {max_queue_size}")
        if max_decode_pixels < 1:
            raise ValueError(f"max_decode_pixels must be >= 1, got {max_decode_pixels}")
        self._name = name
        self._max_queue_size = max_queue_size
        self._max_decode_pixels = max_decode_pixels
        self._decoding = 0
        self._retry_after_s = retry_after_s
        self._on_reject = on_reject
        self._admitted = 0
        self._staged: dict[int, int] = {}  # per class of service
        self._draining = False
        self._why = "shutdown"
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
            raise ModelNotReady(
                f"model {self._name!r} is draining for {self._why}; retry elsewhere"
            )
        self._admitted += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._admitted -= 1
            if self._admitted == 0:
                self._idle.set()

    @property
    def decoding_pixels(self) -> int:
        """Decode pixels of the requests in stage 1 now."""
        return self._decoding

    @contextmanager
    def staged(
        self, n_tiles: int, queue_depth: int, decode_pixels: int = 0, priority: int = 1
    ) -> Iterator[None]:
        """Holds ``n_tiles`` and ``decode_pixels`` in stage 1, or refuses with a fast 503.

        Refused when the tiles don't fit under ``max_queue_size`` with those
        staged and queued, counted per class of service (``priority``, with
        that class's ``queue_depth``, as the batcher bounds each class's
        queue), or when ``decode_pixels`` don't fit under ``max_decode_pixels``
        with those of the requests in stage 1 (unless none is: a request alone
        is always admitted).
        """
        waiting = self._staged.get(priority, 0) + queue_depth
        if waiting + n_tiles > self._max_queue_size:
            self._on_reject(n_tiles)
            raise Overloaded(
                f"{self._name}: queue full (priority {priority}: {waiting} tiles waiting + "
                f"{n_tiles} new > {self._max_queue_size})",
                retry_after_s=self._retry_after_s,
            )
        decoding = self._decoding
        if decode_pixels and decoding and decoding + decode_pixels > self._max_decode_pixels:
            self._on_reject(n_tiles)
            raise Overloaded(
                f"{self._name}: decode budget full ({decoding} pixels being decoded + "
                f"{decode_pixels} new > {self._max_decode_pixels}, max_decode_pixels)",
                retry_after_s=self._retry_after_s,
            )
        self._staged[priority] = self._staged.get(priority, 0) + n_tiles
        self._decoding += decode_pixels
        try:
            yield
        finally:
            self._staged[priority] -= n_tiles
            self._decoding -= decode_pixels

    def start_draining(self, why: str = "shutdown") -> None:
        """Refuses every request from now on (their 503 says ``why``: shutdown, unload)."""
        self._why = why
        self._draining = True

    async def wait_idle(self, timeout_s: float) -> bool:
        """Waits until no admitted request is left; False at the deadline."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except asyncio.TimeoutError:
            return False
        return True
