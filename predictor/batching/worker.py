"""The worker side of :mod:`predictor.batching.batcher`: workers, one forward call, observer hooks.

Contract:
    * A :class:`Worker` is one device (or one of N instances on a device): its
      ``run_batch`` and its own single thread. :meth:`Worker.call` runs in
      that thread and never raises: every outcome (results, the exception,
      a wrong number of results) comes back as an :class:`Outcome` with the
      time it took, so a failing forward never kills the thread.
    * :func:`classify` decides how a failure is handled (:class:`ErrorKind`):
      ``DeviceLost`` is always fatal; a buggy classifier counts as a batch error.
    * :class:`BatchObserver` is the metrics hook, a Protocol declaring every
      hook the batcher calls; :class:`GuardedObserver` calls them (typed, never
      by name) and contains the observer's own bugs.

Kept apart from the queue and the dispatch policy so each stays small.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from predictor.errors import DeviceLost, ErrorKind, ForwardError

log = logging.getLogger(__name__)

R = TypeVar("R")


class BatchObserver(Protocol):
    """Metrics hook. Called on the event loop thread; must not block or raise."""

    def on_enqueue(self, n_items: int, queue_depth: int, priority: int) -> None:
        """A request of ``n_items`` was admitted to class ``priority``; its depth after it."""

    def on_reject(self, n_items: int) -> None:
        """A request of ``n_items`` was refused because the queue was full."""

    def on_dispatch(
        self,
        batch_size: int,
        queue_wait_s: Mapping[int, Sequence[float]],
        queue_depth: Mapping[int, int],
    ) -> None:
        """A batch left the queue: per class, its items' enqueue-to-dispatch waits (s); every class's depth."""

    def on_forward(self, batch_size: int, seconds: float, ok: bool) -> None:
        """One ``run_batch`` call (OOM retries included) took ``seconds``."""

    def on_worker_forward(self, worker: str, batch_size: int, seconds: float, ok: bool) -> None:
        """The same call, with the name of the worker (device) that ran it."""

    def on_worker_lost(self, worker: str, workers_left: int) -> None:
        """A fatal error took ``worker`` out; ``workers_left`` still serve."""

    def on_oom_split(self, batch_size: int) -> None:
        """A batch of ``batch_size`` ran out of device memory and is split in halves."""


HOOKS = tuple(
    name
    for name in vars(BatchObserver)
    if name.startswith("on_") and callable(vars(BatchObserver)[name])
)
"""The hooks :class:`BatchObserver` declares, in declaration order."""


class NullObserver(BatchObserver):
    """An observer that records nothing; subclass it to override some hooks."""


class GuardedObserver(NullObserver):
    """Hands every hook to ``inner``; an observer's bug is logged, never raised into serving.

    Args:
        inner: The observer; it must have every hook :class:`BatchObserver`
            declares (subclass :class:`NullObserver` to implement only some).
        name: The model's name, for the log line.

    Raises:
        TypeError: ``inner`` lacks a declared hook (a misspelt hook would
            otherwise record nothing, silently).
    """

    def __init__(self, inner: BatchObserver, name: str = "model") -> None:
        missing = [h for h in HOOKS if not callable(getattr(inner, h, None))]
        if missing:
            raise TypeError(f"{name}: observer {inner!r} lacks the hooks {missing}")
        self._inner = inner
        self._name = name

    def on_enqueue(self, n_items: int, queue_depth: int, priority: int) -> None:
        self._guard(self._inner.on_enqueue, n_items, queue_depth, priority)

    def on_reject(self, n_items: int) -> None:
        self._guard(self._inner.on_reject, n_items)

    def on_dispatch(
        self,
        batch_size: int,
        queue_wait_s: Mapping[int, Sequence[float]],
        queue_depth: Mapping[int, int],
    ) -> None:
        self._guard(self._inner.on_dispatch, batch_size, queue_wait_s, queue_depth)

    def on_forward(self, batch_size: int, seconds: float, ok: bool) -> None:
        self._guard(self._inner.on_forward, batch_size, seconds, ok)

    def on_worker_forward(self, worker: str, batch_size: int, seconds: float, ok: bool) -> None:
        self._guard(self._inner.on_worker_forward, worker, batch_size, seconds, ok)

    def on_worker_lost(self, worker: str, workers_left: int) -> None:
        self._guard(self._inner.on_worker_lost, worker, workers_left)

    def on_oom_split(self, batch_size: int) -> None:
        self._guard(self._inner.on_oom_split, batch_size)

    def _guard(self, hook: Callable[..., None], *args: Any) -> None:
        try:
            hook(*args)
        except Exception:
            log.exception("%s: observer %s failed", self._name, hook.__name__)


@dataclass(frozen=True)
class WorkerState:
    """A snapshot of one worker, for health and metrics per device.

    Attributes:
        name: The worker's name (e.g. ``cuda:1`` or ``cpu#0``).
        alive: False once a fatal (device-lost) error took it out.
        busy: True while it runs a batch.
        batches: ``run_batch`` calls it made (OOM retries included).
    """

    name: str
    alive: bool
    busy: bool
    batches: int


@dataclass
class Outcome(Generic[R]):
    """What one ``run_batch`` call produced, captured in the worker thread."""

    results: list[R] | None
    error: BaseException | None
    seconds: float
    kind: ErrorKind | None = None  # set when the batcher itself decides the kind


@dataclass(eq=False)
class Worker:
    """One worker: its ``run_batch``, its own thread (set by the batcher's start), its state."""

    name: str
    run_batch: Callable[[list[Any], Hashable], list[Any]]
    executor: ThreadPoolExecutor | None = None
    on: str = ""
    """Its device's name where its own name does not say it (a lone worker, ``0``)."""
    alive: bool = True
    busy: bool = False
    batches: int = 0

    @property
    def state(self) -> WorkerState:
        """A snapshot of this worker."""
        return WorkerState(self.name, self.alive, self.busy, self.batches)

    @property
    def device(self) -> str:
        """The device it serves: ``on``, or its name up to ``#`` (``cuda:0#1`` is an instance of ``cuda:0``)."""
        return self.on or self.name.partition("#")[0]

    def call(self, items: list[Any], key: Hashable, model: str) -> Outcome[Any]:
        """Worker thread: call ``run_batch``, capturing any exception and the time."""
        start = time.monotonic()
        try:
            results = list(self.run_batch(items, key))
        except BaseException as exc:  # everything is a batch outcome, never a dead thread
            return Outcome(None, exc, time.monotonic() - start)
        seconds = time.monotonic() - start
        if len(results) != len(items):
            error = ForwardError(
                f"{model}: forward of a batch of {len(items)} failed: "
                f"returned {len(results)} results"
            )
            return Outcome(None, error, seconds, ErrorKind.BATCH)
        return Outcome(results, None, seconds)


def classify(
    exc: BaseException, classify_error: Callable[[BaseException], ErrorKind], model: str
) -> ErrorKind:
    """``DeviceLost`` is fatal; otherwise ask ``classify_error`` (BATCH if it fails)."""
    if isinstance(exc, DeviceLost):
        return ErrorKind.FATAL
    try:
        return classify_error(exc)
    except Exception:
        log.exception("%s: classify_error failed; treating as a batch error", model)
        return ErrorKind.BATCH


def take_out(workers: Sequence[Worker], lost: Worker) -> list[Worker]:
    """Marks ``lost`` and every other live worker of its device dead and stops their threads.

    A sticky error leaves the whole device unusable, so its other instances
    would each fail one more batch before being taken out; a batch one of
    them is running finishes (or fails) on its own.

    Returns:
        The workers taken out now (``lost`` first while it was still alive).
    """
    gone = [w for w in workers if w.alive and (w is lost or w.device == lost.device)]
    for worker in gone:
        worker.alive = False
        if worker.executor is not None:
            worker.executor.shutdown(wait=False)
    return gone


def forget(outcome: Outcome[Any]) -> None:
    """Drops a failed outcome's error after clearing the locals of every frame its tracebacks hold.

    The traceback of a failed forward holds the frames that raised, and with
    them the batch's device tensors (inputs, activations). An OOM retry runs
    the halves while that memory is short, so the failed batch must be freed
    first; clearing the frames frees it even where the exception itself
    lingers in a reference cycle until the next garbage collection.
    """
    seen: set[int] = set()
    error = outcome.error
    outcome.error = None
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if error.__traceback__ is not None:
            traceback.clear_frames(error.__traceback__)
        error = error.__cause__ or error.__context__
