"""A protocol-agnostic dynamic batcher: opaque items in, one future per item out.

Contract:
    * :meth:`DynamicBatcher.submit` enqueues a request's items (all or none) in
      its class's bounded FIFO queue and returns one :class:`asyncio.Future`
      per item, in order. Every future is settled exactly once: with its
      result, with a :mod:`predictor.errors` error, or by the caller's
      cancellation. A ``run_batch`` result that is an exception fails its
      item alone.
    * Classes of service: a request has a ``priority`` (1 the most urgent, to
      ``--priority_levels``) and may have a ``deadline``
      (``time.monotonic()``). More urgent classes go first, with an age bound
      (``--max_queue_delay_ms``) so no class starves; each class has its own
      queue bound (:mod:`predictor.batching.queue` holds the rule). An item
      whose deadline passes while queued never runs: its future fails with
      :class:`~predictor.errors.QueueTimeout` at the deadline.
    * ``run_batch(items, key)`` is synchronous and runs in a dedicated worker
      thread, never on the event loop, so the loop keeps admitting (and the
      next batch keeps filling) while the device runs the current one.
    * Several workers (one per GPU, or N per device: Triton's instance
      groups) pull from the one queue: ``run_batch`` may be a mapping of
      worker name to callable, each with its own thread; a batch goes to the
      first free worker (in the mapping's order).
    * A batch holds at most ``max_batch_size`` items of one ``key`` (the lead
      class's head item's), FIFO within each class, never items less urgent
      than its lead's; a request larger than a batch is split. While a more
      urgent class is active, a less urgent batch is cut to about
      ``--urgent_wait_ms`` of device time (learnt from each forward's time).
    * Several models on one device: given the process's
      :class:`~predictor.batching.scheduler.DeviceScheduler`, the batcher asks
      it for a turn on a free worker's device once its batch is ready, cuts
      the batch when granted and gives the turn back when the batch ends, so
      which model's batch runs next is decided there (weighted fair sharing);
      its own queue, bounds and batch rule stay its own. Without one (a lone
      model) it dispatches as below, unasked.

Why this policy: an idle worker dispatches a lone arrival at once (no latency
tax at low load); items that queue up while the device is busy wait at most
``max_latency_ms`` (from the oldest one's arrival) for their batch to fill, so
batches grow with load and latency stays bounded. The queue bound turns
overload into a fast :class:`~predictor.errors.Overloaded` instead of
unbounded memory. Failures stay inside their batch: CUDA out-of-memory splits
the batch and retries the halves (on the same worker; the failed batch's
error, and the tensors its traceback holds, are dropped first); a sticky
device error takes out every worker of that device (workers ``dev#i``; its
batch fails, the queue stays for the others) and marks the batcher unhealthy
only when no worker is left, so liveness fails and the pod restarts.

Futures are created and settled (and observer hooks called) on the event loop
thread. Nothing here knows about HTTP, gRPC, tensors or models. The queue lives
in :mod:`predictor.batching.queue`, workers and observer hooks in :mod:`~.worker`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, Protocol, TypeVar

from predictor.batching.queue import BatchPolicy, BatchQueue, Entry, fail, settle
from predictor.batching.scheduler import DeviceScheduler, Share, Turn
from predictor.batching.worker import (
    BatchObserver,
    GuardedObserver,
    NullObserver,
    Outcome,
    Worker,
    WorkerState,
    classify,
    forget,
    take_out,
)
from predictor.config import BatchingConfig
from predictor.errors import (
    DeviceLost,
    ErrorKind,
    ModelNotReady,
    Overloaded,
    QueueTimeout,
    forward_failure,
)

__all__ = ["BatchObserver", "Batcher", "DynamicBatcher", "ErrorKind", "NullObserver", "WorkerState"]

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


class Batcher(Protocol):
    """What a served model needs of its batcher: the seam between the model and the device.

    Two implement it: :class:`DynamicBatcher` (the device owner's, in process)
    and a front end's :class:`~predictor.multiprocess.proxy.BatcherProxy`
    (``--frontends``), which forwards every submit to the device owner's.
    ``tests/unit/batching/test_policy.py`` checks both against this protocol.
    """

    @property
    def queue_depth(self) -> int:
        """Weight waiting, for the model's fast 503 (a proxy: the owner's, last heard)."""

    def depth_of(self, priority: int) -> int:
        """Weight waiting in class ``priority``, for the model's fast 503 per class."""

    @property
    def healthy(self) -> bool:
        """False once no device can serve (the model's liveness)."""

    @property
    def workers(self) -> tuple[Any, ...]:
        """The device workers' states (none where the device lives in another process)."""

    async def start(self) -> None:
        """Starts on the running loop (called once, by the server)."""

    def submit(
        self,
        items: Sequence[Any],
        key: Hashable = None,
        priority: int = 1,
        deadline: float | None = None,
    ) -> list[asyncio.Future[Any]]:
        """Enqueues ``items`` (all or none) under ``key`` in class ``priority``; one future each."""

    async def drain(self, timeout_s: float) -> bool:
        """Refuses new items, waits for admitted ones; True when all ended in time."""

    async def close(self) -> None:
        """Stops for good; unsettled items fail with ``ModelNotReady``."""

    def close_nowait(self) -> list[asyncio.Task[None]]:
        """:meth:`close` for a synchronous caller on the loop's thread; the tasks it cancelled."""


class DynamicBatcher(Generic[T, R]):
    """Groups submitted items into batches and runs them on one or more workers.

    Args:
        run_batch: Synchronous ``(items, key) -> results``, one result per
            item, aligned; or a mapping of worker name to such a callable, one
            worker (and thread) each. A lone callable is one worker named ``0``.
        config: Batch size, latency, queue bound and ``Retry-After`` hint.
        classify_error: Maps an exception from ``run_batch`` to an
            :class:`ErrorKind`. ``DeviceLost`` is always ``FATAL``.
        observer: Metrics hook with every :class:`BatchObserver` hook;
            :class:`NullObserver` when ``None``.
        name: Used in messages, logs and the worker threads' names.
        weight: An item's count in ``max_queue_size`` (a slide: its tiles); 1 when ``None``.
        scheduler: The process's device scheduler, shared with the other
            models' batchers (joined at :meth:`start` with ``config.weight``);
            ``None``: this batcher's workers are the device's alone.
        device: The device of a lone ``run_batch`` (worker ``0``); named
            workers' devices are their names up to ``#``.
        on_admit: Told the items of every submit it admits, on the loop's
            thread, before their futures are returned (a request's trace
            starts its queue wait there); ``None``: nothing.

    Raises:
        ValueError: An empty mapping of workers, or a worker that is not callable.
        TypeError: An observer without every hook of :class:`BatchObserver`.
    """

    def __init__(
        self,
        run_batch: Callable[[list[T], Hashable], list[R]]
        | Mapping[str, Callable[[list[T], Hashable], list[R]]],
        config: BatchingConfig,
        *,
        classify_error: Callable[[BaseException], ErrorKind] = lambda e: ErrorKind.BATCH,
        observer: BatchObserver | None = None,
        name: str = "model",
        weight: Callable[[T], int] | None = None,
        scheduler: DeviceScheduler | None = None,
        device: str = "0",
        on_admit: Callable[[Sequence[T]], None] | None = None,
    ) -> None:
        runs = dict(run_batch) if isinstance(run_batch, Mapping) else {"0": run_batch}
        if not runs:
            raise ValueError(f"{name}: at least one worker is needed, got {run_batch!r}")
        for worker, fn in runs.items():
            if not callable(fn):
                raise ValueError(f"{name}: worker {worker!r} is not callable: {fn!r}")
        lone = not isinstance(run_batch, Mapping)
        self._workers = [Worker(str(w), fn, on=device if lone else "") for w, fn in runs.items()]
        self._scheduler = scheduler
        self._share: Share | None = None
        self._on_admit = on_admit
        self._config = config
        self._classify_error = classify_error
        inner = observer if observer is not None else NullObserver()
        self._observer: BatchObserver = GuardedObserver(inner, name)
        self._name = name
        self._queue = BatchQueue[T, R](config.max_queue_size, weight, config.priority_levels)
        self._policy = BatchPolicy(
            config.max_batch_size,
            config.max_latency_ms / 1000.0,
            config.queue_delays_s(),
            config.urgent_wait_ms / 1000.0 or None,
        )
        self._started = False
        self._closed = False
        self._draining = False
        self._stop_reason = "batcher stopped"  # why a batch cancelled by close() failed
        self._healthy = True
        self._loop: asyncio.AbstractEventLoop | None = None
        self._dispatcher: asyncio.Task[None] | None = None
        self._running: dict[asyncio.Task[None], list[Entry[T, R]]] = {}  # a task per batch
        self._wakeup = asyncio.Event()  # set on enqueue, a worker freed, the fill timer
        self._quiescent = asyncio.Event()  # set while the queue is empty and no batch runs
        self._quiescent.set()

    @property
    def queue_depth(self) -> int:
        """Weight waiting (items, a slide's tiles), not running; cancelled count until purged."""
        return self._queue.depth

    def depth_of(self, priority: int) -> int:
        """Weight waiting in class ``priority`` (cancelled count until purged)."""
        return self._queue.depth_of(priority)

    @property
    def healthy(self) -> bool:
        """False once no worker is left (every device lost) or the batcher crashed."""
        return self._healthy

    @property
    def workers(self) -> tuple[WorkerState, ...]:
        """Every worker's state, in dispatch order (alive or not)."""
        return tuple(w.state for w in self._workers)

    @property
    def accepting(self) -> bool:
        """True while :meth:`submit` admits work: started, healthy, not draining or closed."""
        return self._started and self._healthy and not (self._draining or self._closed)

    async def start(self) -> None:
        """Start the dispatcher task on the running loop and one thread per worker.

        Raises:
            RuntimeError: If already started or closed.
        """
        if self._started or self._closed:
            raise RuntimeError(f"{self._name}: batcher already started or closed")
        self._loop = asyncio.get_running_loop()
        for worker in self._workers:
            prefix = f"batcher-{self._name}-{worker.name}"
            worker.executor = ThreadPoolExecutor(1, thread_name_prefix=prefix)
        if self._scheduler is not None:
            workers = {w.name: w.device for w in self._workers}
            self._share = self._scheduler.join(self._name, self._config.weight, workers)
            log.info(
                "%s: takes turns on device(s) %s with weight %g",
                self._name,
                ", ".join(sorted(set(workers.values()))),
                self._config.weight,
            )
        self._dispatcher = self._loop.create_task(
            self._dispatch_loop(), name=f"batcher-{self._name}"
        )
        self._started = True

    def submit(
        self,
        items: Sequence[T],
        key: Hashable = None,
        priority: int = 1,
        deadline: float | None = None,
    ) -> list[asyncio.Future[R]]:
        """Enqueue all of ``items`` (or none) under ``key``; call on the loop thread.

        Args:
            items: The request's items, each its own queue entry and future (returned in order).
            key: Batches never mix keys (e.g. the request mode).
            priority: The class of service, 1 (most urgent) to ``priority_levels``.
            deadline: ``time.monotonic()`` past which an item still queued
                fails with :class:`~predictor.errors.QueueTimeout` instead of
                running; ``None``: none.

        Raises:
            ModelNotReady: Not started, draining, closed or unhealthy.
            Overloaded: The class's queue cannot take all of ``items``; nothing enqueued.
            ValueError: ``priority`` is not a class (the model checks the request's first).
        """
        if not self.accepting:
            raise ModelNotReady(f"{self._name}: {self._not_accepting_reason()}")
        if not items:
            return []
        assert self._loop is not None
        now = time.monotonic()
        entries = self._queue.admit(items, key, self._loop, now, priority, deadline)
        if entries is None:
            self._observer.on_reject(len(items))
            raise Overloaded(
                f"{self._name}: queue full (priority {priority}: "
                f"{self._queue.depth_of(priority)} queued + {len(items)} new item(s)"
                f" > {self._config.max_queue_size})",
                retry_after_s=self._config.retry_after_s,
            )
        if deadline is not None:
            self._arm(entries, deadline - now)
        if self._on_admit is not None:
            self._on_admit(items)
        self._quiescent.clear()
        self._wakeup.set()
        self._observer.on_enqueue(len(items), self._queue.depth_of(priority), priority)
        return [e.future for e in entries]

    def _arm(self, entries: list[Entry[T, R]], delay_s: float) -> None:
        """Fail ``entries`` still queued when ``delay_s`` has passed; disarmed once all settle."""
        assert self._loop is not None
        timer = self._loop.call_later(max(0.0, delay_s), self._expire, entries)
        left = len(entries)

        def settled(_: asyncio.Future[R]) -> None:
            nonlocal left
            left -= 1
            if left == 0:
                timer.cancel()  # drops its hold on the entries (and their tiles)

        for entry in entries:
            entry.future.add_done_callback(settled)

    def _expire(self, entries: Sequence[Entry[T, R]], *, popped: bool = False) -> None:
        """Fail the entries still queued, or just ``popped`` by the cut: their deadline passed."""
        now = time.monotonic()
        for entry in entries:
            if (popped or entry.queued) and not entry.future.done():
                waited_ms = (now - entry.enqueued_at) * 1000.0
                entry.future.set_exception(
                    QueueTimeout(
                        f"{self._name}: request timeout expired: not run after {waited_ms:.0f} ms "
                        f"in the queue of priority {entry.priority} (the request's 'timeout')"
                    )
                )
        self._wakeup.set()

    async def drain(self, timeout_s: float) -> bool:
        """Stop admitting at once and wait for the admitted work to finish.

        Args:
            timeout_s: Longest wait. Items still queued then fail with
                ``ModelNotReady``; a batch already running is left to finish,
                and fails with the deadline named if :meth:`close` comes first.

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
            self._stop_reason = "draining deadline passed"
            self._queue.fail_all(ModelNotReady(f"{self._name}: {self._stop_reason}"))
            return False

    async def close(self) -> None:
        """Stop the workers; fail everything queued or running with ``ModelNotReady``.

        Does not wait for a ``run_batch`` call already in a worker thread;
        :meth:`drain` first for a graceful stop.
        """
        tasks = self.close_nowait()
        if tasks:
            await asyncio.wait(tasks)

    def close_nowait(self) -> list[asyncio.Task[None]]:
        """:meth:`close` for synchronous callers (a model's ``stop``), on the loop's thread.

        Returns:
            The cancelled tasks, which end at the loop's next turn. After the
            loop has closed, only the worker threads are stopped.
        """
        self._closed = True
        if self._loop is not None and self._loop.is_closed():
            tasks: list[asyncio.Task[None]] = []
        else:
            tasks = [t for t in (self._dispatcher, *self._running) if t and not t.done()]
            for task in tasks:
                task.cancel()
            for batch in self._running.values():  # a task cancelled before its first step
                fail(batch, ModelNotReady(f"{self._name}: {self._stop_reason} while the batch ran"))
            self._queue.fail_all(ModelNotReady(f"{self._name}: batcher closed"))
            self._quiescent.set()
        self._leave_scheduler()
        for worker in self._workers:
            if worker.executor is not None:
                worker.executor.shutdown(wait=False, cancel_futures=True)
        return tasks

    # -- the dispatcher --------------------------------------------------------

    async def _dispatch_loop(self) -> None:
        """The dispatcher: wait for work and a free worker, form a batch, hand it over."""
        fresh = True  # the queue ran empty: the next arrival is dispatched at once
        try:
            while self._healthy:
                self._queue.drop_cancelled_head()
                if not self._queue:
                    if self._share is not None:
                        self._share.idle()
                    self._settle_quiescent()
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    fresh = True
                    continue
                worker = next((w for w in self._workers if w.alive and not w.busy), None)
                if worker is None:  # items queue while every worker is busy
                    fresh = False
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                if not fresh:
                    await self._fill()
                fresh = False
                turn: Turn | None = None
                if self._share is not None:
                    worker, turn = await self._turn()
                    if worker is None:
                        continue
                batch, expired = self._policy.take(self._queue, time.monotonic())
                self._expire(expired, popped=True)
                if batch and worker is not None:
                    self._launch(worker, batch, turn)
                elif turn is not None:
                    turn.release(charge=False)
        except asyncio.CancelledError:
            raise
        except Exception:
            self._crash("batcher dispatcher crashed")

    async def _turn(self) -> tuple[Worker | None, Turn]:
        """The scheduler's turn on a free worker's device, and that worker (None: gone meanwhile)."""
        assert self._share is not None
        free = [w for w in self._workers if w.alive and not w.busy]
        devices = list(dict.fromkeys(w.device for w in free))
        turn = self._share.take(devices) or await self._share.turn(devices)
        worker = next(
            (w for w in self._workers if w.alive and not w.busy and w.device == turn.device), None
        )
        if worker is None:
            turn.release(charge=False)
        return worker, turn

    def _ready_again(self, worker: Worker) -> bool:
        """Whether ``worker`` could run another batch now: alive, and the policy's head is ready."""
        self._queue.drop_cancelled_head()
        if not (worker.alive and self._healthy and not self._closed and self._queue):
            return False
        return self._policy.ready(self._queue, time.monotonic())

    def _leave_scheduler(self) -> None:
        """Hands this model's slots and waiting request back to the other models."""
        if self._share is not None:
            self._share.leave()

    def _settle_quiescent(self) -> None:
        """Set the quiescent event when nothing is queued and no batch runs."""
        if not self._queue and not self._running:
            self._quiescent.set()

    def _crash(self, what: str) -> None:
        """A bug in the batcher itself: stop serving (liveness fails), settle the queue."""
        log.exception("%s: %s", self._name, what)
        self._healthy = False
        self._queue.fail_all(ModelNotReady(f"{self._name}: {what}"))
        self._wakeup.set()
        self._quiescent.set()
        self._leave_scheduler()

    async def _fill(self) -> None:
        """Wait until the policy says the head batch is ready (full, or its wait is over)."""
        assert self._loop is not None
        while True:
            self._queue.drop_cancelled_head()
            now = time.monotonic()
            if not self._queue or self._policy.ready(self._queue, now):
                return
            remaining = self._policy.deadline(self._queue) - now
            self._wakeup.clear()
            timer = self._loop.call_later(remaining, self._wakeup.set)
            try:
                await self._wakeup.wait()
            finally:
                timer.cancel()

    def _launch(self, worker: Worker, batch: list[Entry[T, R]], turn: Turn | None) -> None:
        """Mark ``worker`` busy and run ``batch`` on it in its own task (holding ``turn``)."""
        assert self._loop is not None
        worker.busy = True
        task = self._loop.create_task(self._dispatch(worker, batch))
        self._running[task] = batch
        task.add_done_callback(self._batch_done(worker, turn))

    def _batch_done(
        self, worker: Worker, turn: Turn | None
    ) -> Callable[[asyncio.Task[None]], None]:
        def done(task: asyncio.Task[None]) -> None:
            self._running.pop(task, None)
            worker.busy = False
            if turn is not None:
                turn.release(again=self._ready_again(worker))
            self._wakeup.set()
            self._settle_quiescent()

        return done

    async def _dispatch(self, worker: Worker, batch: list[Entry[T, R]]) -> None:
        """Run one batch; if stopped or broken, settle its unsettled items with ModelNotReady."""
        now = time.monotonic()
        waits: dict[int, list[float]] = {}
        for entry in batch:
            waits.setdefault(entry.priority, []).append(now - entry.enqueued_at)
        depths = {p: self._queue.depth_of(p) for p in range(1, self._queue.levels + 1)}
        self._observer.on_dispatch(len(batch), waits, depths)
        try:
            await self._forward(worker, batch, batch[0].key)
        except asyncio.CancelledError:  # close(): settle, then let the task end cancelled
            fail(batch, ModelNotReady(f"{self._name}: {self._stop_reason} while the batch ran"))
            raise
        except Exception:
            fail(batch, ModelNotReady(f"{self._name}: batcher failed while the batch ran"))
            self._crash("batcher crashed while a batch ran")

    async def _forward(self, worker: Worker, entries: list[Entry[T, R]], key: Hashable) -> None:
        """Run ``entries`` in ``worker``'s thread and settle them; split on OOM."""
        assert self._loop is not None
        items = [e.item for e in entries]
        worker.batches += 1
        outcome: Outcome[R] = await self._loop.run_in_executor(
            worker.executor, worker.call, items, key, self._name
        )
        ok = outcome.error is None
        self._observer.on_forward(len(entries), outcome.seconds, ok)
        self._observer.on_worker_forward(worker.name, len(entries), outcome.seconds, ok)
        if outcome.error is None:
            assert outcome.results is not None
            self._policy.observe(len(entries), outcome.seconds)
            settle(entries, outcome.results)
            return
        kind = outcome.kind or classify(outcome.error, self._classify_error, self._name)
        if kind is ErrorKind.FATAL:
            self._go_fatal(worker, entries, outcome.error)
        elif kind is ErrorKind.OOM and len(entries) > 1:
            log.warning("%s: out of memory on a batch of %d; splitting", self._name, len(entries))
            self._observer.on_oom_split(len(entries))
            forget(outcome)  # frees the failed batch's tensors before its halves run
            mid = len(entries) // 2
            for half in (entries[:mid], entries[mid:]):
                live = [e for e in half if not e.future.done()]
                if live and worker.alive:
                    await self._forward(worker, live, key)
                elif live:
                    fail(live, DeviceLost(f"{self._name}: device {worker.name} lost; not run"))
        else:
            error = forward_failure(
                outcome.error, name=self._name, n_items=len(entries), fatal=False
            )
            log.warning("%s", error)
            fail(entries, error)

    def _go_fatal(self, worker: Worker, entries: list[Entry[T, R]], exc: BaseException) -> None:
        """Take ``worker``'s device out (all its workers) and fail its batch; the last fails the queue."""
        error = forward_failure(exc, name=self._name, n_items=len(entries), fatal=True)
        fail(entries, error)
        lost = take_out(self._workers, worker)
        left = sum(w.alive for w in self._workers)
        for gone in lost:
            self._observer.on_worker_lost(gone.name, left)
        if left:
            log.error("%s; worker(s) %s taken out, %d left", error, [w.name for w in lost], left)
            return
        self._healthy = False
        log.error("%s; no worker left, marking %s unhealthy", error, self._name)
        queued = DeviceLost(f"{self._name}: device lost in an earlier batch; not run")
        queued.__cause__ = error
        self._queue.fail_all(queued)
        self._wakeup.set()
        self._quiescent.set()
        self._leave_scheduler()

    def _not_accepting_reason(self) -> str:
        """Why :meth:`submit` refuses, for the error message."""
        if not self._healthy:
            lost = not any(w.alive for w in self._workers)
            return "unhealthy (device lost)" if lost else "unhealthy (batcher crashed)"
        if self._closed:
            return "closed"
        if self._draining:
            return "draining"
        return "not started"
