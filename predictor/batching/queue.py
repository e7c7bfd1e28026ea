"""The batcher's queue (one bounded FIFO per class of service) and the batch rule (:class:`BatchPolicy`).

Contract:
    * Every entry has a class of service, ``priority`` (1 the most urgent,
      Triton's convention, up to ``priority_levels``), and may have a
      ``deadline`` (``time.monotonic()``) past which it must not run.
    * :meth:`BatchQueue.admit` adds a request's items, all of one class, all
      or none: when they do not fit under ``max_queue_size`` *in their class*
      (after dropping entries whose future is already settled) it returns
      ``None`` and adds nothing, so a full bulk class never refuses an
      interactive request. What counts against the bound is each item's
      weight (1 by default; a slide counts its tiles).
    * :class:`BatchPolicy` is the batch rule, written once
      (:meth:`BatchPolicy.head`). The *lead* class is the most urgent class
      with a live item, unless a less urgent class has gone unserved for its
      ``max_queue_delay_s`` (its oldest item has waited that long and no batch
      has taken any of its items since): then the longest-waiting such class
      leads, so bulk is never starved. A batch is the lead class's head
      item's key, FIFO, then the *more* urgent classes' items of that key in
      order of urgency (FIFO each, a class's run ending at its first item of
      another key), at most ``max_batch_size`` live items. A batch never
      carries tiles less urgent than its lead: an interactive tile never
      waits for bulk tiles' compute in its own batch (on a device whose time
      grows with the batch, filling with bulk would add up to a whole batch's
      time to the interactive latency), while a bulk-led batch still takes
      the interactive tiles waiting. :meth:`BatchPolicy.ready`
      says whether the dispatcher should cut it now (waiting cannot grow it:
      it is full or another key follows; or the oldest item has waited
      ``max_latency_s``), :meth:`BatchPolicy.take` pops it, with the entries
      whose deadline has passed among it, which never run. A change to how
      batches form is a change to this class only.
    * A device cannot be preempted, so an urgent arrival waits for the batch
      on the device. While a more urgent class than the lead is *active* (it
      has items, or one arrived within :data:`URGENT_WINDOW_S`), a batch is
      cut to the size whose forward takes at most ``urgent_wait_s``
      (:class:`DeviceTimes`, learnt from the forwards the batcher reports to
      :meth:`BatchPolicy.observe`), but never below the last batch that
      active class led: the urgent arrival then waits at most about one such
      chunk, and never for more than its own batch's device time again (what
      "at most twice its idle latency" allows), so bulk is not cut finer than
      that buys. Bulk alone keeps whole batches.

Only the event loop thread touches a queue; it knows nothing of workers.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

URGENT_WINDOW_S = 1.0
"""How long after a class's last arrival it counts as active, so batches of less urgent
classes stay cut: a viewer's requests come a few a second while someone looks at a
slide, so a second without any ends the cut and bulk runs whole batches again."""

DEVICE_TIME_SMOOTHING = 0.25
"""The newest forward's weight in a batch size's moving average (about the last four count)."""


@dataclass(eq=False)
class Entry(Generic[T, R]):
    """One queued item and the future its caller awaits.

    ``queued`` turns False once the entry leaves the queue (into a batch, or
    dropped): a deadline that passes after that no longer concerns it.
    """

    item: T
    key: Hashable
    future: asyncio.Future[R]
    enqueued_at: float
    weight: int = 1
    priority: int = 1
    deadline: float | None = None
    queued: bool = True

    def live(self, now: float) -> bool:
        """Still to run: its future is unsettled and its deadline (if any) not passed."""
        return not self.future.done() and (self.deadline is None or now < self.deadline)


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
    """One bounded FIFO of :class:`Entry` per class; :class:`BatchPolicy` cuts batches from them.

    Args:
        max_queue_size: Most weight (items, or tiles) each class holds at once.
        weight: An item's weight against ``max_queue_size``; 1 each when ``None``.
        priority_levels: Classes of service, 1 (most urgent) to this.
    """

    def __init__(
        self,
        max_queue_size: int,
        weight: Callable[[T], int] | None = None,
        priority_levels: int = 1,
    ) -> None:
        if priority_levels < 1:
            raise ValueError(f"priority_levels must be >= 1, got {priority_levels}")
        self._lanes: list[deque[Entry[T, R]]] = [deque() for _ in range(priority_levels)]
        self._depths = [0] * priority_levels
        self._served_at = [float("-inf")] * priority_levels
        self._arrived_at = [float("-inf")] * priority_levels
        self._limit = max_queue_size
        self._weigh = weight

    def __len__(self) -> int:
        return sum(len(lane) for lane in self._lanes)

    @property
    def levels(self) -> int:
        """How many classes (priorities 1 to ``levels``)."""
        return len(self._lanes)

    @property
    def depth(self) -> int:
        """The summed weight of the entries held, every class (settled ones until purged)."""
        return sum(self._depths)

    def depth_of(self, priority: int) -> int:
        """The summed weight of class ``priority``'s entries (settled ones until purged)."""
        return self._depths[priority - 1]

    def lane(self, priority: int) -> deque[Entry[T, R]]:
        """Class ``priority``'s entries, head first (read-only by contract)."""
        return self._lanes[priority - 1]

    def served_at(self, priority: int) -> float:
        """When a batch last took an item of class ``priority`` (``-inf``: never)."""
        return self._served_at[priority - 1]

    def arrived_at(self, priority: int) -> float:
        """When class ``priority`` last admitted a request (``-inf``: never)."""
        return self._arrived_at[priority - 1]

    def admit(
        self,
        items: Sequence[T],
        key: Hashable,
        loop: asyncio.AbstractEventLoop,
        now: float,
        priority: int = 1,
        deadline: float | None = None,
    ) -> list[Entry[T, R]] | None:
        """Adds one entry per item (with a fresh future) to class ``priority``, or none if they do not fit.

        Raises:
            ValueError: ``priority`` is not a class of this queue (the caller checks first).
        """
        if not 1 <= priority <= len(self._lanes):
            raise ValueError(f"priority {priority} is not in 1..{len(self._lanes)}")
        p = priority - 1
        weigh = self._weigh
        weights = [1] * len(items) if weigh is None else [weigh(item) for item in items]
        n = sum(weights)
        if self._depths[p] + n > self._limit:
            self._lanes[p] = deque(e for e in self._lanes[p] if not e.future.done())
            self._depths[p] = sum(e.weight for e in self._lanes[p])
        if self._depths[p] + n > self._limit:
            return None
        entries = [
            Entry(item, key, loop.create_future(), now, w, priority, deadline)
            for item, w in zip(items, weights, strict=True)
        ]
        self._lanes[p].extend(entries)
        self._depths[p] += n
        self._arrived_at[p] = now
        return entries

    def drop_cancelled_head(self) -> None:
        """Drop the entries at each class's head whose future is already settled."""
        for p, lane in enumerate(self._lanes):
            while lane and lane[0].future.done():
                self._pop(p)

    def pop(self, priority: int, n: int, now: float) -> list[Entry[T, R]]:
        """Pops class ``priority``'s first ``n`` entries (settled ones included), in order.

        The class counts as served at ``now`` when a live entry is among them.
        """
        p = priority - 1
        popped = [self._pop(p) for _ in range(n)]
        if any(e.live(now) for e in popped):
            self._served_at[p] = now
        return popped

    def _pop(self, p: int) -> Entry[T, R]:
        entry = self._lanes[p].popleft()
        self._depths[p] -= entry.weight
        entry.queued = False
        return entry

    def fail_all(self, error: BaseException) -> None:
        """Empty the queue, failing its pending futures with ``error``."""
        for p, lane in enumerate(self._lanes):
            fail(list(lane), error)
            for entry in lane:
                entry.queued = False
            lane.clear()
            self._depths[p] = 0


class DeviceTimes:
    """How long a batch of ``n`` items takes on the device, learnt from the forwards, and the
    largest batch that takes at most ``within_s``.

    Per batch size, a moving average of its forwards' seconds; through those,
    a line ``t(n) = a + b n`` (least squares, every size seen counting once;
    through the origin while one size alone was seen). A line is what both
    devices do near enough: a CPU's time grows about linearly from almost
    nothing, a GPU's from a fixed cost per call that a few more items hardly
    change. The pick shrinks when the device slows (another process on its
    CPU) and grows back as it recovers.

    Args:
        max_batch_size: The largest batch.
        within_s: The device time a batch may take.
    """

    def __init__(self, max_batch_size: int, within_s: float) -> None:
        self._seconds: dict[int, float] = {}
        self._max = max_batch_size
        self._within_s = within_s
        self._line = (math.inf, 0.0)
        self._fits = max_batch_size

    @property
    def fits(self) -> int:
        """The largest batch estimated to take at most ``within_s`` (at least 1); every
        size before any forward is seen (a first batch is not cut blind)."""
        return self._fits

    def estimate_s(self, n_items: int) -> float:
        """A batch of ``n_items``' seconds on the line (``inf``: no forward seen yet)."""
        a, b = self._line
        return a + b * n_items

    def observe(self, n_items: int, seconds: float) -> None:
        """A forward of ``n_items`` took ``seconds`` (sizes past ``max_batch_size`` are ignored)."""
        if not 1 <= n_items <= self._max or not seconds >= 0:
            return
        old = self._seconds.get(n_items)
        self._seconds[n_items] = (
            seconds if old is None else old + DEVICE_TIME_SMOOTHING * (seconds - old)
        )
        self._line = a, b = self._fit()
        if b <= 0:
            self._fits = self._max if a <= self._within_s else 1
        else:
            self._fits = max(1, min(self._max, math.floor((self._within_s - a) / b)))

    def _fit(self) -> tuple[float, float]:
        sizes, times = list(self._seconds), list(self._seconds.values())
        if len(sizes) == 1:
            return 0.0, times[0] / sizes[0]
        mean_n, mean_t = sum(sizes) / len(sizes), sum(times) / len(times)
        spread = sum((n - mean_n) ** 2 for n in sizes)
        b = sum((n - mean_n) * (t - mean_t) for n, t in zip(sizes, times, strict=True)) / spread
        return mean_t - b * mean_n, b


@dataclass(frozen=True)
class Cut:
    """The head batch as :meth:`BatchPolicy.head` reads it.

    Attributes:
        live: Live items in it.
        spans: Per class, ``(priority, entries)``: the entries to pop from
            that class's head (settled and expired ones among them included).
        complete: Waiting cannot grow it: full, or an item of another key follows.
    """

    live: int
    spans: tuple[tuple[int, int], ...]
    complete: bool


class BatchPolicy:
    """The batch rule: the lead class's head key, FIFO, then more urgent classes, at most ``max_batch_size``
    (less while a more urgent class is active: :meth:`limit`).

    Args:
        max_batch_size: Most items per batch.
        max_latency_s: Longest the oldest queued item waits for its batch to fill.
        max_queue_delay_s: Per class (index 0: priority 1), how long it may go
            unserved while it has items before it leads; ``None``: no bound.
            Shorter than the queue's classes: the missing ones have no bound.
        urgent_wait_s: The device time a batch may take while a class more
            urgent than its lead is active; ``None``: batches are never cut.
    """

    def __init__(
        self,
        max_batch_size: int,
        max_latency_s: float = 0.0,
        max_queue_delay_s: Sequence[float | None] = (),
        urgent_wait_s: float | None = None,
    ) -> None:
        self.max_batch_size = max_batch_size
        self.max_latency_s = max_latency_s
        self.max_queue_delay_s = tuple(max_queue_delay_s)
        self.times = DeviceTimes(max_batch_size, urgent_wait_s) if urgent_wait_s else None
        self._led: dict[int, int] = {}  # per class, the live items of the last batch it led

    def observe(self, n_items: int, seconds: float) -> None:
        """A batch of ``n_items`` ran on the device in ``seconds`` (what :meth:`limit` learns from)."""
        if self.times is not None:
            self.times.observe(n_items, seconds)

    def limit(self, queue: BatchQueue[T, R], lead: int, now: float) -> int:
        """Most live items in a batch led by class ``lead``: ``max_batch_size``, or, while a
        more urgent class has items or admitted a request in the last
        :data:`URGENT_WINDOW_S`, the largest batch estimated to take ``urgent_wait_s``,
        at least as large as the last batch such a class led."""
        if self.times is None:
            return self.max_batch_size
        active = [
            priority
            for priority in range(1, lead)
            if queue.lane(priority) or now - queue.arrived_at(priority) < URGENT_WINDOW_S
        ]
        if not active:
            return self.max_batch_size
        floor = max(self._led.get(priority, 1) for priority in active)
        return min(self.max_batch_size, max(self.times.fits, floor))

    def _delay_s(self, priority: int) -> float | None:
        delays = self.max_queue_delay_s
        return delays[priority - 1] if priority <= len(delays) else None

    def lead(self, queue: BatchQueue[T, R], now: float) -> int | None:
        """The class whose head leads the next batch (None: nothing live).

        The most urgent class with a live item, unless a class has gone
        unserved past its ``max_queue_delay_s``: the one unserved longest.
        """
        first: int | None = None
        overdue: tuple[float, int] | None = None
        for priority in range(1, queue.levels + 1):
            head = next((e for e in queue.lane(priority) if e.live(now)), None)
            if head is None:
                continue
            if first is None:
                first = priority
            bound = self._delay_s(priority)
            since = max(head.enqueued_at, queue.served_at(priority))
            if (
                bound is not None
                and now - since >= bound
                and (overdue is None or since < overdue[0])
            ):
                overdue = (since, priority)
        return overdue[1] if overdue is not None else first

    def head(self, queue: BatchQueue[T, R], now: float) -> Cut:
        """The head batch: its live items, the entries it spans per class, whether it is complete."""
        lead = self.lead(queue, now)
        if lead is None:
            return Cut(0, tuple((p, len(queue.lane(p))) for p in range(1, queue.levels + 1)), False)
        order = [lead, *range(1, lead)]  # never less urgent than the lead
        limit = self.limit(queue, lead, now)
        key: Hashable = None
        live, spans, complete = 0, [], False
        for priority in order:
            span = 0
            for entry in queue.lane(priority):
                if not entry.live(now):
                    span += 1
                    continue
                if live == 0:
                    key = entry.key
                elif entry.key != key or live >= limit:
                    complete = True
                    break
                live += 1
                span += 1
            if span:
                spans.append((priority, span))
        complete = complete or live >= limit
        return Cut(live, tuple(spans), complete)

    def deadline(self, queue: BatchQueue[T, R]) -> float:
        """Monotonic time at which the oldest head entry has waited ``max_latency_s``."""
        heads = [lane[0].enqueued_at for p in range(1, queue.levels + 1) if (lane := queue.lane(p))]
        return min(heads) + self.max_latency_s

    def ready(self, queue: BatchQueue[T, R], now: float) -> bool:
        """Whether to cut the head batch now: waiting cannot grow it, or its wait is over."""
        return self.head(queue, now).complete or now >= self.deadline(queue)

    def take(
        self, queue: BatchQueue[T, R], now: float
    ) -> tuple[list[Entry[T, R]], list[Entry[T, R]]]:
        """Pops the head batch (and the settled entries among it).

        Returns:
            ``(batch, expired)``: the live entries, lead class first, FIFO in
            each class; and the entries whose deadline passed (unsettled:
            the caller fails them, and they never run).
        """
        batch: list[Entry[T, R]] = []
        expired: list[Entry[T, R]] = []
        for priority, span in self.head(queue, now).spans:
            for entry in queue.pop(priority, span, now):
                if entry.live(now):
                    batch.append(entry)
                elif not entry.future.done():
                    expired.append(entry)
        if batch:
            self._led[batch[0].priority] = len(batch)
        return batch, expired
