"""The batcher's queue: one bounded FIFO of keyed items, and how a batch is cut from it.

Contract:
    * :meth:`BatchQueue.admit` adds a request's items all or none: when they
      do not fit under ``max_queue_size`` (after dropping entries whose caller
      already went away) it returns ``None`` and adds nothing. What counts
      against that bound is each item's weight (1 by default; a slide counts
      its tiles), summed in :attr:`BatchQueue.depth`.
    * :meth:`BatchQueue.take` pops the head batch: the head item's key, FIFO,
      at most ``max_batch_size`` live items; cancelled entries are skipped.
    * :meth:`BatchQueue.head_batch_complete` says whether waiting could still
      grow the head batch (it cannot once it is full or another key follows),
      and :meth:`BatchQueue.head_deadline` when the oldest item's wait ends.

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
    """A bounded FIFO of :class:`Entry` with batch cutting.

    Args:
        max_queue_size: Most weight (items, or tiles) held at once.
        max_batch_size: Most items per batch.
        weight: An item's weight against ``max_queue_size``; 1 each when ``None``.
    """

    def __init__(
        self,
        max_queue_size: int,
        max_batch_size: int,
        weight: Callable[[T], int] | None = None,
    ) -> None:
        self._entries: deque[Entry[T, R]] = deque()
        self._limit = max_queue_size
        self._batch = max_batch_size
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

    def head_deadline(self, latency_s: float) -> float:
        """Monotonic time at which the oldest entry has waited ``latency_s``."""
        return self._entries[0].enqueued_at + latency_s

    def head_batch_complete(self) -> bool:
        """True if waiting cannot grow the head batch: it is full or another key follows."""
        key = self._entries[0].key
        size = 0
        for entry in self._entries:
            if entry.future.done():
                continue
            if entry.key != key:
                return True
            size += 1
            if size >= self._batch:
                return True
        return False

    def take(self) -> list[Entry[T, R]]:
        """Pop the head batch: the head's key, FIFO, live items, at most max_batch_size."""
        batch: list[Entry[T, R]] = []
        if not self._entries:
            return batch
        key = self._entries[0].key
        while self._entries and len(batch) < self._batch:
            entry = self._entries[0]
            if entry.future.done():
                self._popleft()
            elif entry.key != key:
                break
            else:
                batch.append(self._popleft())
        return batch

    def fail_all(self, error: BaseException) -> None:
        """Empty the queue, failing its pending futures with ``error``."""
        fail(list(self._entries), error)
        self._entries.clear()
        self._depth = 0
