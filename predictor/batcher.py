"""A protocol-agnostic dynamic batcher: opaque items in, one future per item out.

Contract:
    * :meth:`DynamicBatcher.submit` enqueues a request's items (all or none) in
      one bounded FIFO queue and returns one :class:`asyncio.Future` per item,
      in order. Every future is settled exactly once: with its result, with a
      :mod:`predictor.errors` error, or by the caller's cancellation.
    * ``run_batch(items, key)`` is synchronous and runs in one dedicated worker
      thread, never on the event loop, so the loop keeps admitting (and the
      next batch keeps filling) while the device runs the current one.
    * A batch holds at most ``max_batch_size`` items of one ``key`` (the head
      item's), taken in FIFO order; a request larger than a batch is split.

Why this policy: an idle worker dispatches a lone arrival at once (no latency
tax at low load); items that queue up while the device is busy wait at most
``max_latency_ms`` (from the oldest one's arrival) for their batch to fill, so
batches grow with load and latency stays bounded. The queue bound turns
overload into a fast :class:`~predictor.errors.Overloaded` instead of
unbounded memory. Failures stay inside their batch: CUDA out-of-memory splits
the batch and retries the halves; a sticky device error marks the batcher
unhealthy so liveness fails and the pod restarts.

All futures are created and settled on the event loop thread; observer hooks
are called there too. Nothing here knows about HTTP, gRPC, tensors or models.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from predictor.config import BatchingConfig
from predictor.errors import DeviceLost, ForwardError, HistoserveError, ModelNotReady, Overloaded

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


class ErrorKind(enum.Enum):
    """How a failure of ``run_batch`` is handled.

    Attributes:
        BATCH: Fail this batch's items with ``ForwardError``; keep serving.
        OOM: Split the batch in halves and retry each before failing.
        FATAL: Fail with ``DeviceLost`` and mark the batcher unhealthy.
    """

    BATCH = "batch"
    OOM = "oom"
    FATAL = "fatal"


class BatchObserver(Protocol):
    """Metrics hook. Called on the event loop thread; must not block or raise."""

    def on_enqueue(self, n_items: int, queue_depth: int) -> None:
        """A request of ``n_items`` was admitted; ``queue_depth`` is after it."""

    def on_reject(self, n_items: int) -> None:
        """A request of ``n_items`` was refused because the queue was full."""

    def on_dispatch(self, batch_size: int, queue_wait_s: Sequence[float], queue_depth: int) -> None:
        """A batch left the queue; per-item enqueue-to-dispatch waits in seconds."""

    def on_forward(self, batch_size: int, seconds: float, ok: bool) -> None:
        """One ``run_batch`` call (OOM retries included) took ``seconds``."""


class NullObserver(BatchObserver):
    """An observer that records nothing; subclass it to override some hooks."""


@dataclass(eq=False)
class _Entry(Generic[T, R]):
    """One queued item and the future its caller awaits."""

    item: T
    key: Hashable
    future: asyncio.Future[R]
    enqueued_at: float


@dataclass
class _Outcome(Generic[R]):
    """What one ``run_batch`` call produced, captured in the worker thread."""

    results: list[R] | None
    error: BaseException | None
    seconds: float
    kind: ErrorKind | None = None  # set when the batcher itself decides the kind


def _fail(entries: Iterable[_Entry[Any, Any]], error: BaseException) -> None:
    """Fail every future of ``entries`` not already done (e.g. cancelled by its caller)."""
    for entry in entries:
        if not entry.future.done():
            entry.future.set_exception(error)


class DynamicBatcher(Generic[T, R]):
    """Groups submitted items into batches and runs them in one worker thread.

    Args:
        run_batch: Synchronous ``(items, key) -> results``, one result per
            item, aligned. Runs in the batcher's own single worker thread.
        config: Batch size, latency, queue bound and ``Retry-After`` hint.
        classify_error: Maps an exception from ``run_batch`` to an
            :class:`ErrorKind`. ``DeviceLost`` is always ``FATAL``.
        observer: Metrics hook; :class:`NullObserver` when ``None``.
        name: Used in messages, logs and the worker thread's name.
    """

    def __init__(
        self,
        run_batch: Callable[[list[T], Hashable], list[R]],
        config: BatchingConfig,
        *,
        classify_error: Callable[[BaseException], ErrorKind] = lambda e: ErrorKind.BATCH,
        observer: BatchObserver | None = None,
        name: str = "model",
    ) -> None:
        self._run_batch = run_batch
        self._config = config
        self._classify_error = classify_error
        self._observer: Any = observer if observer is not None else NullObserver()
        self._name = name
        self._queue: deque[_Entry[T, R]] = deque()
        self._started = False
        self._closed = False
        self._draining = False
        self._healthy = True
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._worker: asyncio.Task[None] | None = None
        self._wakeup = asyncio.Event()  # set on every enqueue (and by the fill timer)
        self._quiescent = asyncio.Event()  # set while the queue is empty and no batch runs
        self._quiescent.set()

    @property
    def queue_depth(self) -> int:
        """Items waiting (not the running batch); cancelled ones count until purged."""
        return len(self._queue)

    @property
    def healthy(self) -> bool:
        """False once a fatal (device-lost) error was seen; never true again."""
        return self._healthy

    @property
    def accepting(self) -> bool:
        """True while :meth:`submit` admits work: started, healthy, not draining or closed."""
        return self._started and self._healthy and not (self._draining or self._closed)

    async def start(self) -> None:
        """Start the worker task on the running loop and the worker thread pool.

        Raises:
            RuntimeError: If already started or closed.
        """
        if self._started or self._closed:
            raise RuntimeError(f"{self._name}: batcher already started or closed")
        self._loop = asyncio.get_running_loop()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"batcher-{self._name}")
        self._worker = self._loop.create_task(self._work(), name=f"batcher-{self._name}")
        self._started = True

    def submit(self, items: Sequence[T], key: Hashable = None) -> list[asyncio.Future[R]]:
        """Enqueue all of ``items`` (or none) under ``key``; call on the loop thread.

        Args:
            items: The request's items, each its own queue entry.
            key: Batches never mix keys (e.g. the request mode).

        Returns:
            One future per item, in the order of ``items``.

        Raises:
            ModelNotReady: Not started, draining, closed or unhealthy.
            Overloaded: The queue cannot take all of ``items``; nothing enqueued.
        """
        if not self.accepting:
            raise ModelNotReady(f"{self._name}: {self._not_accepting_reason()}")
        n = len(items)
        if n == 0:
            return []
        limit = self._config.max_queue_size
        if len(self._queue) + n > limit:
            self._queue = deque(e for e in self._queue if not e.future.done())
        if len(self._queue) + n > limit:
            self._notify("on_reject", n)
            raise Overloaded(
                f"{self._name}: queue full ({len(self._queue)} queued + {n} new > {limit})",
                retry_after_s=self._config.retry_after_s,
            )
        assert self._loop is not None
        now = time.monotonic()
        entries = [_Entry(item, key, self._loop.create_future(), now) for item in items]
        self._queue.extend(entries)
        self._quiescent.clear()
        self._wakeup.set()
        self._notify("on_enqueue", n, len(self._queue))
        return [e.future for e in entries]

    async def drain(self, timeout_s: float) -> bool:
        """Stop admitting at once and wait for the admitted work to finish.

        Args:
            timeout_s: Longest wait. Items still queued then fail with
                ``ModelNotReady``; a batch already running is left to finish.

        Returns:
            True if the queue emptied and no batch was running in time.
        """
        self._draining = True
        if self._quiescent.is_set():
            return True
        try:
            await asyncio.wait_for(self._quiescent.wait(), timeout_s)
            return True
        except asyncio.TimeoutError:
            log.warning(
                "%s: drain timed out; failing %d queued items", self._name, len(self._queue)
            )
            self._fail_queued(ModelNotReady(f"{self._name}: draining deadline passed"))
            return False

    async def close(self) -> None:
        """Stop the worker; fail everything queued or running with ``ModelNotReady``.

        Does not wait for a ``run_batch`` call already in the worker thread;
        :meth:`drain` first for a graceful stop.
        """
        self._closed = True
        if self._worker is not None and not self._worker.done():
            self._worker.cancel()
            await asyncio.wait({self._worker})
        self._fail_queued(ModelNotReady(f"{self._name}: batcher closed"))
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        self._quiescent.set()

    # -- worker ---------------------------------------------------------------

    async def _work(self) -> None:
        """The worker loop: wait for work, form a batch, run it, repeat."""
        fresh = True  # the queue ran empty: the next arrival is dispatched at once
        try:
            while self._healthy:
                self._drop_cancelled_head()
                if not self._queue:
                    self._quiescent.set()
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    fresh = True
                    continue
                if not fresh:
                    await self._fill()
                fresh = False
                batch = self._take() if self._queue else []
                if batch:
                    await self._dispatch(batch)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s: batcher worker crashed", self._name)
            self._healthy = False
            self._fail_queued(ModelNotReady(f"{self._name}: batcher worker crashed"))
            self._quiescent.set()

    async def _fill(self) -> None:
        """Wait until the head batch is full or its oldest item's deadline passes."""
        assert self._loop is not None
        latency_s = self._config.max_latency_ms / 1000.0
        while True:
            self._drop_cancelled_head()
            if not self._queue or self._head_batch_complete():
                return
            remaining = self._queue[0].enqueued_at + latency_s - time.monotonic()
            if remaining <= 0:
                return
            self._wakeup.clear()
            timer = self._loop.call_later(remaining, self._wakeup.set)
            try:
                await self._wakeup.wait()
            finally:
                timer.cancel()

    def _drop_cancelled_head(self) -> None:
        """Drop entries at the head whose caller already went away."""
        while self._queue and self._queue[0].future.done():
            self._queue.popleft()

    def _head_batch_complete(self) -> bool:
        """True if waiting cannot grow the head batch: it is full or another key follows."""
        key = self._queue[0].key
        size = 0
        for entry in self._queue:
            if entry.future.done():
                continue
            if entry.key != key:
                return True
            size += 1
            if size >= self._config.max_batch_size:
                return True
        return False

    def _take(self) -> list[_Entry[T, R]]:
        """Pop the head batch: the head's key, FIFO, live items, at most max_batch_size."""
        batch: list[_Entry[T, R]] = []
        key = self._queue[0].key
        while self._queue and len(batch) < self._config.max_batch_size:
            entry = self._queue[0]
            if entry.future.done():
                self._queue.popleft()
            elif entry.key != key:
                break
            else:
                batch.append(self._queue.popleft())
        return batch

    async def _dispatch(self, batch: list[_Entry[T, R]]) -> None:
        """Run one batch; on cancellation settle its unsettled items with ModelNotReady."""
        now = time.monotonic()
        waits = [now - e.enqueued_at for e in batch]
        self._notify("on_dispatch", len(batch), waits, len(self._queue))
        try:
            await self._forward(batch, batch[0].key)
        except BaseException:  # cancelled by close() or a bug: settle, then propagate
            _fail(batch, ModelNotReady(f"{self._name}: batcher stopped while the batch ran"))
            raise

    async def _forward(self, entries: list[_Entry[T, R]], key: Hashable) -> None:
        """Run ``entries`` in the worker thread and settle them; split on OOM."""
        assert self._loop is not None
        items = [e.item for e in entries]
        outcome = await self._loop.run_in_executor(self._executor, self._call, items, key)
        self._notify("on_forward", len(entries), outcome.seconds, outcome.error is None)
        if outcome.error is None:
            assert outcome.results is not None
            for entry, result in zip(entries, outcome.results, strict=True):
                if not entry.future.done():
                    entry.future.set_result(result)
            return
        kind = outcome.kind or self._classify(outcome.error)
        if kind is ErrorKind.FATAL:
            self._go_fatal(entries, outcome.error)
        elif kind is ErrorKind.OOM and len(entries) > 1:
            log.warning("%s: out of memory on a batch of %d; splitting", self._name, len(entries))
            mid = len(entries) // 2
            for half in (entries[:mid], entries[mid:]):
                live = [e for e in half if not e.future.done()]
                if live and self._healthy:
                    await self._forward(live, key)
                elif live:
                    _fail(live, DeviceLost(f"{self._name}: device lost; not run"))
        else:
            error = self._wrap(ForwardError, outcome.error, len(entries))
            log.warning("%s", error)
            _fail(entries, error)

    def _call(self, items: list[T], key: Hashable) -> _Outcome[R]:
        """Worker thread: call ``run_batch``, capturing any exception and the time."""
        start = time.monotonic()
        try:
            results = list(self._run_batch(items, key))
        except BaseException as exc:  # everything is a batch outcome, never a dead thread
            return _Outcome(None, exc, time.monotonic() - start)
        seconds = time.monotonic() - start
        if len(results) != len(items):
            error = ForwardError(
                f"{self._name}: forward of a batch of {len(items)} failed: "
                f"returned {len(results)} results"
            )
            return _Outcome(None, error, seconds, ErrorKind.BATCH)
        return _Outcome(results, None, seconds)

    # -- failures ---------------------------------------------------------------

    def _classify(self, exc: BaseException) -> ErrorKind:
        """``DeviceLost`` is fatal; otherwise ask ``classify_error`` (BATCH if it fails)."""
        if isinstance(exc, DeviceLost):
            return ErrorKind.FATAL
        try:
            return self._classify_error(exc)
        except Exception:
            log.exception("%s: classify_error failed; treating as a batch error", self._name)
            return ErrorKind.BATCH

    def _wrap(self, cls: type[ForwardError], exc: BaseException, n: int) -> HistoserveError:
        """Pass histoserve errors (of ``cls`` when fatal) through; wrap the rest in ``cls``."""
        passes = isinstance(exc, cls) if cls is DeviceLost else isinstance(exc, HistoserveError)
        if passes:
            assert isinstance(exc, HistoserveError)
            return exc
        error = cls(f"{self._name}: forward of a batch of {n} failed: {type(exc).__name__}: {exc}")
        error.__cause__ = exc
        return error

    def _go_fatal(self, entries: list[_Entry[T, R]], exc: BaseException) -> None:
        """Mark unhealthy; fail this batch and everything queued with DeviceLost."""
        self._healthy = False
        error = self._wrap(DeviceLost, exc, len(entries))
        log.error("%s; marking %s unhealthy", error, self._name)
        _fail(entries, error)
        queued = DeviceLost(f"{self._name}: device lost in an earlier batch; not run")
        queued.__cause__ = error
        self._fail_queued(queued)
        self._quiescent.set()

    def _fail_queued(self, error: BaseException) -> None:
        """Empty the queue, failing its pending futures with ``error``."""
        _fail(list(self._queue), error)
        self._queue.clear()

    def _not_accepting_reason(self) -> str:
        """Why :meth:`submit` refuses, for the error message."""
        if not self._healthy:
            return "unhealthy (device lost)"
        if self._closed:
            return "closed"
        if self._draining:
            return "draining"
        return "not started"

    def _notify(self, hook: str, *args: Any) -> None:
        """Call an observer hook if it has it; an observer's bug never breaks serving."""
        method = getattr(self._observer, hook, None)
        if method is None:
            return
        try:
            method(*args)
        except Exception:
            log.exception("%s: observer %s failed", self._name, hook)
