"""The batcher's queue (one bounded FIFO of keyed items) and the batch rule (:class:`BatchPolicy`).

Contract:
    * :meth:`BatchQueue.admit` adds a request's items all or none: when they
      do not fit under ``max_queue_size`` (after dropping entries whose caller
      already went away) it returns ``None`` and adds nothing. What counts
      against that bound is each item's weight (1 by default; a slide counts
      its tiles), summed in :attr:`BatchQueue.depth`.
    * :class:`BatchPolicy` is the batch rule, written once
      (:meth:`BatchPolicy.head`): a batch is the head item's key, FIFO, at
      most ``max_batch_size`` live items (cancelled entries are skipped).
      :meth:`BatchPolicy.ready` says whether the dispatcher should cut it
      now (waiting cannot grow it: it is full or another key follows; or the
      oldest item has waited ``max_latency_s``), :meth:`BatchPolicy.take`
      pops it. A change to how batches form is a change to this class only.

Only the event loop thread touches a queue; it knows nothing of workers.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


@dataclass(eq=False)
class Entry(Generic[T, R]):
    """One queued item and the future its caller awaits."""

    item: T
    key: Hashable
    future: asyncio.Future[R]
    enqueued_at: float
    weight: int = 1


def settle(entries: Sequence[Entry[Any, Any]], results: Sequence[Any]) -> None:
    """Settle each entry not already done with its result, aligned.

    A result that is an exception fails that item only (a forward that went
    well for the batch but not for one item, e.g. its row came out non-finite):
    the rest of the batch keeps its results.
    """
    for entry, result in zip(entries, results, strict=True):
        if entry.future.done():
            continue
        if isinstance(result, BaseException):
            entry.future.set_exception(result)
        else:
            entry.future.set_result(result)


def fail(entries: Iterable[Entry[Any, Any]], error: BaseException) -> None:
    """Fail every future of ``entries`` not already done (e.g. cancelled by its caller)."""
    for entry in entries:
        if not entry.future.done():
            entry.future.set_exception(error)


class BatchQueue(Generic[T, R]):
    """A bounded FIFO of :class:`Entry`; :class:`BatchPolicy` cuts batches from its head.

    Args:
        max_queue_size: Most weight (items, or tiles) held at once.
        weight: An item's weight against ``max_queue_size``; 1 each when ``None``.
    """

    def __init__(self, max_queue_size: int, weight: Callable[[T], int] | None = None) -> None:
        self._entries: deque[Entry[T, R]] = deque()
        self._limit = max_queue_size
        self._weigh = weight
        self._depth = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def depth(self) -> int:
        """The summed weight of the entries held (cancelled ones until purged)."""
        return self._depth

    def _popleft(self) -> Entry[T, R]:
        entry = self._entries.popleft()
        self._depth -= entry.weight
        return entry

    def admit(
        self, items: Sequence[T], key: Hashable, loop: asyncio.AbstractEventLoop, now: float
    ) -> list[Entry[T, R]] | None:
        """Adds one entry per item (with a fresh future), or none if they do not fit."""
        weigh = self._weigh
        weights = [1] * len(items) if weigh is None else [weigh(item) for item in items]
        n = sum(weights)
        if self._depth + n > self._limit:
            self._entries = deque(e for e in self._entries if not e.future.done())
            self._depth = sum(e.weight for e in self._entries)
        if self._depth + n > self._limit:
            return None
        entries = [
            Entry(item, key, loop.create_future(), now, w)
            for item, w in zip(items, weights, strict=True)
        ]
        self._entries.extend(entries)
        self._depth += n
        return entries

    def drop_cancelled_head(self) -> None:
        """Drop entries at the head whose caller already went away."""
        while self._entries and self._entries[0].future.done():
            self._popleft()

    def pop_head(self, n: int) -> list[Entry[T, R]]:
        """Pops the first ``n`` entries (cancelled ones included), in order."""
        return [self._popleft() for _ in range(n)]

    @property
    def entries(self) -> deque[Entry[T, R]]:
        """The entries, head first (read-only by contract: only the queue mutates them)."""
        return self._entries

    def fail_all(self, error: BaseException) -> None:
        """Empty the queue, failing its pending futures with ``error``."""
        fail(list(self._entries), error)
        self._entries.clear()
        self._depth = 0


class BatchPolicy:
    """The batch rule: the head item's key, FIFO, live items, at most ``max_batch_size``.

    Args:
        max_batch_size: Most items per batch.
        max_latency_s: Longest the oldest queued item waits for its batch to fill.
    """

    def __init__(self, max_batch_size: int, max_latency_s: float = 0.0) -> None:
        self.max_batch_size = max_batch_size
        self.max_latency_s = max_latency_s

    def head(self, queue: BatchQueue[T, R]) -> tuple[int, int, bool]:
        """The head batch: its live items, the entries it spans, whether waiting cannot grow it.

        Returns:
            ``(live, span, complete)``: ``span`` counts the cancelled entries
            among the batch's too (popped with it); ``complete`` is true once
            the batch is full or an entry of another key follows it.
        """
        key: Hashable = None
        live = 0
        for span, entry in enumerate(queue.entries):
            if entry.future.done():
                continue
            if live == 0:
                key = entry.key
            elif entry.key != key:
                return live, span, True
            live += 1
            if live >= self.max_batch_size:
                return live, span + 1, True
        return live, len(queue), False

    def deadline(self, queue: BatchQueue[T, R]) -> float:
        """Monotonic time at which the oldest entry has waited ``max_latency_s``."""
        return queue.entries[0].enqueued_at + self.max_latency_s

    def ready(self, queue: BatchQueue[T, R], now: float) -> bool:
        """Whether to cut the head batch now: waiting cannot grow it, or its wait is over."""
        return self.head(queue)[2] or now >= self.deadline(queue)

    def take(self, queue: BatchQueue[T, R]) -> list[Entry[T, R]]:
        """Pops the head batch (and the cancelled entries among it); its live entries, in order."""
        _, span, _ = self.head(queue)
        return [e for e in queue.pop_head(span) if not e.future.done()]
