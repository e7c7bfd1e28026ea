"""Reading ahead and sending: a thread pool of readers feeding a bounded queue.

One slide's tiles go out in batches of ``batch_size``. ``read_workers``
threads read batches (tile reads are CPU work: decoding, resizing) and put
them into a queue of at most ``queue_batches`` batches; ``concurrency``
sender threads take batches off the queue and send them. A full queue blocks
the readers (back pressure), so memory stays at about ``queue_batches +
concurrency`` batches whatever the slide size. Answers land in their batch's
rows of preallocated arrays, so rows are in the plan's order (y then x)
however the requests interleave.

A failing request (a 4xx, or retries used up) stops the slide: the readers
and senders stop taking new batches and the first error is raised.

Answers are checked per request by the dispatcher
(:mod:`~histoserve.remote.answers`); as a last line of defence an answer
whose rows, outputs, dtype or trailing shape do not fit its batch and the
batches before it is refused here too (an :class:`EmbedError` that fails the
slide), never broadcast over the batch's rows or left as zeros.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from histoserve.errors import EmbedError

ReadFn = Callable[[int], tuple[np.ndarray, np.ndarray]]
"""Reads batch ``i``: ``(tiles uint8 [n, T, T, 3], ok bool [n])``; tiles of bad rows are garbage."""
SendFn = Callable[[np.ndarray, slice], dict[str, np.ndarray]]
"""Sends good tiles of one batch (and its row slice, for per-row inputs); returns outputs."""

_DONE = object()


@dataclass
class BatchStats:
    """Seconds summed over threads: reading, in requests, senders waiting for reads."""

    read_s: float = 0.0
    server_s: float = 0.0
    starved_s: float = 0.0
    requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **seconds: float) -> None:
        with self.lock:
            for name, value in seconds.items():
                setattr(self, name, getattr(self, name) + value)


@dataclass
class Assembled:
    """Outputs of a slide in plan order, and which rows could not be read."""

    outputs: dict[str, np.ndarray]
    ok: np.ndarray


class _Results:
    """Output rows by batch, allocated on the first answer (dims come from the server)."""

    def __init__(self, n_rows: int):
        self.n_rows = n_rows
        self.ok = np.ones(n_rows, dtype=bool)
        self.outputs: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    def put(self, rows: slice, ok: np.ndarray, answer: dict[str, np.ndarray]) -> None:
        """Stores one batch's answer in its rows (``ok``: the rows that were sent).

        Raises:
            EmbedError: An answer that does not fit (see :meth:`_refuse`).
        """
        with self._lock:
            self._refuse(rows, int(ok.sum()), answer)
            self.ok[rows] = ok
            for name, values in answer.items():
                if name not in self.outputs:
                    shape = (self.n_rows, *values.shape[1:])
                    self.outputs[name] = np.zeros(shape, dtype=values.dtype)
                self.outputs[name][rows][ok] = values

    def _refuse(self, rows: slice, n_sent: int, answer: dict[str, np.ndarray]) -> None:
        """EmbedError unless ``answer`` has ``n_sent`` rows of the outputs, dtypes and
        trailing shapes of the answers before it (nothing when nothing was sent)."""
        where = f"the answer for rows {rows.start}-{rows.stop - 1}"
        if n_sent == 0:
            if answer:
                raise EmbedError(f"{where}: outputs for a batch that sent no tiles")
            return
        if self.outputs and set(answer) != set(self.outputs):
            raise EmbedError(
                f"{where}: outputs {sorted(answer)}, the batches before had {sorted(self.outputs)}"
            )
        if not answer:
            raise EmbedError(f"{where}: no outputs for {n_sent} tiles")
        for name, values in answer.items():
            shape = getattr(values, "shape", ())
            if not shape or shape[0] != n_sent:
                got = shape[0] if shape else 0
                raise EmbedError(
                    f"{where}: {got} rows of {name!r} for {n_sent} tiles (refused, not spread "
                    "over the batch)"
                )
            stored = self.outputs.get(name)
            if stored is not None and (stored.shape[1:], stored.dtype) != (
                shape[1:],
                values.dtype,
            ):
                raise EmbedError(
                    f"{where}: {name!r} is {values.dtype} {list(shape)}, the batches before "
                    f"were {stored.dtype} [n, {', '.join(map(str, stored.shape[1:]))}]"
                )


def run_batches(
    n_rows: int,
    batch_size: int,
    read: ReadFn,
    send: SendFn,
    *,
    read_workers: int,
    concurrency: int,
    queue_batches: int,
    on_batch: Callable[[int], None] | None = None,
    stats: BatchStats | None = None,
) -> Assembled:
    """Reads and sends every batch of one slide; returns outputs in row order.

    Args:
        n_rows: Tiles in the slide's plan.
        batch_size: Tiles per request.
        read: Reads batch ``i`` (rows ``i*batch_size`` onwards).
        send: Sends one batch's good tiles.
        read_workers: Reader threads.
        concurrency: Sender threads (requests in flight).
        queue_batches: Batches read and waiting at most.
        on_batch: Called with the number of tiles of each answered batch.
        stats: Where to add timings.

    Raises:
        The first exception of a reader or a sender (the rest are stopped).
    """
    job = _Job(n_rows, batch_size, read, send, on_batch, stats or BatchStats(), queue_batches)
    _run_threads(job.state, job.work, job.reader, job.sender, read_workers, concurrency)
    if job.state.error is not None:
        raise job.state.error
    return Assembled(job.results.outputs, job.results.ok)


class _Job:
    """One slide's batches: what readers and senders share."""

    def __init__(
        self,
        n_rows: int,
        batch_size: int,
        read: ReadFn,
        send: SendFn,
        on_batch: Callable[[int], None] | None,
        stats: BatchStats,
        queue_batches: int,
    ):
        self.n_rows, self.batch_size = n_rows, batch_size
        self.read, self.send, self.on_batch, self.stats = read, send, on_batch, stats
        self.results = _Results(n_rows)
        self.work: queue.Queue = queue.Queue(maxsize=max(1, queue_batches))
        self.state = _State(-(-n_rows // batch_size))

    def reader(self) -> None:
        """Reads batches in order until none is left (or the slide failed)."""
        while (index := self.state.next_index()) is not None:
            start = time.monotonic()
            tiles, ok = self.read(index)
            self.stats.add(read_s=time.monotonic() - start)
            if not self.state.put(self.work, (index, tiles, ok)):
                return

    def sender(self) -> None:
        """Sends queued batches until the end marker (or the slide failed)."""
        while True:
            start = time.monotonic()
            item = self.work.get()
            self.stats.add(starved_s=time.monotonic() - start)
            if item is _DONE or self.state.failed.is_set():
                return
            index, tiles, ok = item
            rows = slice(index * self.batch_size, min(self.n_rows, (index + 1) * self.batch_size))
            start = time.monotonic()
            good = tiles if ok.all() else tiles[ok]  # no copy in the usual case
            answer = self.send(good, rows) if len(good) else {}
            self.stats.add(server_s=time.monotonic() - start, requests=1)
            self.results.put(rows, ok, answer)
            if self.on_batch is not None:
                self.on_batch(int(ok.sum()))


class _State:
    """Shared between readers and senders: the next batch, the first error."""

    def __init__(self, n_batches: int):
        self._n, self._next = n_batches, 0
        self._lock = threading.Lock()
        self.failed = threading.Event()
        self.error: BaseException | None = None

    def next_index(self) -> int | None:
        with self._lock:
            if self.failed.is_set() or self._next >= self._n:
                return None
            self._next += 1
            return self._next - 1

    def put(self, work: queue.Queue, item: object) -> bool:
        """Queues ``item`` unless the slide failed (checked while blocked on a full queue)."""
        while not self.failed.is_set():
            try:
                work.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def fail(self, exc: BaseException) -> None:
        with self._lock:
            if self.error is None:
                self.error = exc
        self.failed.set()


def _run_threads(
    state: _State,
    work: queue.Queue,
    reader: Callable[[], None],
    sender: Callable[[], None],
    read_workers: int,
    concurrency: int,
) -> None:
    def guarded(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # handed to the caller, who re-raises it
                state.fail(exc)

        return run

    readers = [threading.Thread(target=guarded(reader), daemon=True) for _ in range(read_workers)]
    senders = [threading.Thread(target=guarded(sender), daemon=True) for _ in range(concurrency)]
    for thread in readers + senders:
        thread.start()
    for thread in readers:
        thread.join()
    for _ in senders:  # one end marker per sender, after every batch read
        while True:
            try:
                work.put(_DONE, timeout=0.1)
                break
            except queue.Full:
                if state.failed.is_set():
                    _drain(work)
    for thread in senders:
        thread.join()


def _drain(work: queue.Queue) -> None:
    while True:
        try:
            work.get_nowait()
        except queue.Empty:
            return
