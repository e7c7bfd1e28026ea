"""Stage 1 in a thread pool: prepare every tile of a request, in order.

Decoding PNG/JPEG releases the GIL, so a request's tiles are split into one
chunk per pool thread and prepared in parallel. Raw ``pixels`` need no decoding:
they are prepared inline, where a thread hop would cost more than the work.
A slide's features (one item, up to hundreds of MB) go to a thread too.
The first invalid tile fails the whole request with its index named: a
``ValueError`` from ``prepare_sample`` (the seed's contract for a bad
request), and a prepared tile in neither layout
(:func:`~predictor.codecs.samples.tile_hwc`), are a 400, never a batch's
failure.

The pool runs the cheapest waiting work first (:class:`CostOrderedPool`): each
chunk carries its request's decode cost in pixels
(:func:`~predictor.codecs.jpeg_input.decode_pixels`, the measure admission
bounds), so an ordinary request never queues behind a costly one's decoding
(issue 53: a jpeg request of 4 tiles may ask for a second of CPU). A costly
request (over :data:`COSTLY_PIXELS`) is split box by box, so no chunk of it
holds a thread long, and its chunks never take the pool's last free thread,
so ordinary work always finds one. A request's class of service
(``priority``) orders it too: a less urgent class's job waits behind more
urgent ones arriving up to :data:`CLASS_LAG_S` a class later, so a viewer's
tiles decode ahead of a cohort's backlog (which the batcher's queue then also
puts behind them) and bulk still moves.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from predictor.codecs.samples import ModelRequest, PreparedSample, tile_hwc
from predictor.errors import InvalidInput

PrepareFn = Callable[[ModelRequest], PreparedSample]
COSTLY_PIXELS = 32 * 1024 * 1024
"""A request decoding more pixels than this is costly (half the default
``--max_request_pixels``, about a quarter of a second of CPU here): more than
``histoserve embed``'s request of 64 boxes of 448 px over 256 px slide tiles
(24.5 Mi). Its boxes are prepared one a chunk, and never on the last free thread."""


AGEING_PIXELS_PER_S = 128 * 1024 * 1024
"""How fast a waiting job's cost ages away: about what stage 1 decodes and resizes
in a second of one core here (2 x 2 slide tiles of 4096 px and their 4 boxes,
128 Mi, took about a second), so a job waits behind later, cheaper ones at
most about as long as its own decode would take."""


CLASS_LAG_S = 1.0
"""How far each class of service's jobs start behind the class above's, in virtual time:
the batcher's default age bound (``--max_queue_delay_ms`` 1000), so an urgent
stream holds bulk back in stage 1 no longer than it may in the queue."""


class CostOrderedPool:
    """Threads that run the waiting job of the earliest virtual start first: its arrival
    plus its cost at ``pixels_per_s`` plus :data:`CLASS_LAG_S` per class below the
    most urgent (shortest job first, urgent classes first, with ageing).

    A job's cost is its request's decode pixels. Among jobs waiting together
    the cheapest goes first, but a job is never passed over for ever: a job
    arriving ``cost / pixels_per_s`` seconds after it no longer goes before it
    (a stream of cheap requests cannot starve a costly one). Jobs costing more
    than ``costly_pixels`` run on at most ``threads - 1`` threads at once (one,
    with one thread), so a thread is always left for cheaper work.

    The threads start with the first job, from the thread that submits it (the
    serving loop's), not where the pool is made: a model loaded while others
    serve is built in a thread at a lower priority
    (:mod:`predictor.repository.background`), which threads started there would keep.

    Args:
        threads: The pool's threads.
        costly_pixels: The cost above which a job may not take the last free thread.
        pixels_per_s: How fast a waiting job's cost ages away.
    """

    def __init__(
        self,
        threads: int,
        costly_pixels: int = COSTLY_PIXELS,
        pixels_per_s: float = AGEING_PIXELS_PER_S,
    ):
        self._costly_pixels = costly_pixels
        self._pixels_per_s = pixels_per_s
        self._costly_cap = max(1, threads - 1)
        self._costly_running = 0
        self._heap: list[tuple[float, int, int, Callable[[], Any], Future[Any]]] = []
        self._order = itertools.count()
        self._ready = threading.Condition()
        self._stopped = False
        self._threads = [
            threading.Thread(target=self._serve, name=f"histoserve-prep_{i}", daemon=True)
            for i in range(threads)
        ]
        self._started = False

    def submit(self, cost: int, job: Callable[[], Any], priority: int = 1) -> Future[Any]:
        """``job()``'s future, run when it is the first waiting job in order that may run
        (``priority``: its request's class of service, 1 the most urgent)."""
        future: Future[Any] = Future()
        with self._ready:
            if self._stopped:
                raise RuntimeError("stage-1 pool is shut down")
            if not self._started:
                self._started = True
                for thread in self._threads:
                    thread.start()
            lag_s = (priority - 1) * CLASS_LAG_S
            start = time.monotonic() + cost / self._pixels_per_s + lag_s
            heapq.heappush(self._heap, (start, next(self._order), cost, job, future))
            self._ready.notify()
        return future

    def shutdown(self) -> None:
        """Stops the threads after their running jobs; waiting jobs are cancelled."""
        with self._ready:
            self._stopped = True
            waiting, self._heap = self._heap, []
            self._ready.notify_all()
        for *_, future in waiting:
            future.cancel()

    def _next(self) -> tuple[int, Callable[[], Any], Future[Any]] | None:
        """The next job to run (None: stopped); waits for one this thread may take."""
        with self._ready:
            while not self._stopped:
                picked = self._pick()
                if picked is not None:
                    return picked
                self._ready.wait()
            return None

    def _pick(self) -> tuple[int, Callable[[], Any], Future[Any]] | None:
        """The first job in order this thread may take (a costly one only while a thread
        is left for cheaper work); called holding the lock."""
        if not self._heap:
            return None
        blocked = self._costly_running >= self._costly_cap
        if not blocked or self._heap[0][2] <= self._costly_pixels:
            entry = heapq.heappop(self._heap)
        else:  # a costly head waits for a thread: the first cheap job behind it goes
            cheap = [e for e in self._heap if e[2] <= self._costly_pixels]
            if not cheap:
                return None
            entry = min(cheap)
            self._heap.remove(entry)
            heapq.heapify(self._heap)
        _, _, cost, job, future = entry
        self._costly_running += cost > self._costly_pixels
        return cost, job, future

    def _serve(self) -> None:
        while (picked := self._next()) is not None:
            cost, job, future = picked
            try:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(job())
                    except BaseException as exc:  # the caller's to raise
                        future.set_exception(exc)
            finally:
                if cost > self._costly_pixels:
                    with self._ready:
                        self._costly_running -= 1
                        self._ready.notify_all()


class Stage1Pool:
    """Runs ``prepare_sample`` over a request's tiles on ``threads`` pool threads.

    Its size is the ``--preprocess_workers`` flag (the flag's name is a
    contract; inside the server these are the decode pool's threads, and a
    "worker" is a device worker, :mod:`predictor.batching.worker`).

    Args:
        threads: The pool's threads.
        tile_size: The spec's tile size, that every prepared tile must have.
    """

    def __init__(self, threads: int, tile_size: int):
        if threads < 1:
            raise ValueError(f"preprocess_workers (the pool's threads) must be >= 1, got {threads}")
        self._threads = threads
        self._tile_size = tile_size
        self._pool = CostOrderedPool(threads)

    async def prepare(
        self,
        items: Sequence[ModelRequest],
        tile_input: str,
        prepare: PrepareFn,
        decode_pixels: int = 0,
        priority: int = 1,
    ) -> list[PreparedSample]:
        """Prepared samples in item order; ``InvalidInput`` located at the first bad tile.

        ``decode_pixels``: the request's decode cost, which orders its chunks
        in the pool (cheapest first) and, over :data:`COSTLY_PIXELS`, makes
        each item a chunk of its own. ``priority``: its class of service,
        which orders them too (:class:`CostOrderedPool`).
        """
        if not any(_decodes(item) for item in items):
            return prepare_chunk(items, tile_input, prepare, self._tile_size)
        size = 1 if decode_pixels > COSTLY_PIXELS else max(1, -(-len(items) // self._threads))
        chunks = [items[i : i + size] for i in range(0, len(items), size)]
        jobs = [
            asyncio.wrap_future(
                self._pool.submit(
                    decode_pixels,
                    lambda c=chunk: prepare_chunk(c, tile_input, prepare, self._tile_size),
                    priority,
                )
            )
            for chunk in chunks
        ]
        results = await asyncio.gather(*jobs, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return [sample for chunk in results for sample in chunk]

    def shutdown(self) -> None:
        """Stops the threads; queued work is cancelled."""
        self._pool.shutdown()


def _decodes(item: ModelRequest) -> bool:
    """Whether preparing ``item`` is work worth a thread: all but raw pixels (decoding, a slide's features)."""
    return item.pixels is None


def prepare_chunk(
    items: Sequence[ModelRequest], tile_input: str, prepare: PrepareFn, tile_size: int
) -> list[PreparedSample]:
    """Prepares ``items`` one by one, naming the input and tile of a failure.

    Raises:
        InvalidInput: ``prepare`` raised a ``ValueError`` (``InvalidInput``
            included), or returned a tile that is not ``tile_size`` square
            RGB ``uint8`` in HWC or CHW.
    """
    prepared = []
    for item in items:
        try:
            sample = prepare(item)
            if item.has_tile and sample.tile is not item.jpeg:  # not a slide, nor a deferred region
                tile_hwc(sample.tile, tile_size)
        except InvalidInput as exc:
            raise exc.at(input_name=tile_input, tile=item.index) from exc
        except ValueError as exc:
            raise InvalidInput(str(exc), input_name=tile_input, tile=item.index) from exc
        prepared.append(sample)
    return prepared
