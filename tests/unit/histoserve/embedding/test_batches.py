"""run_batches: rows land in order, memory is bounded, bad rows are masked, errors stop it."""

from __future__ import annotations

import queue
import re
import sys
import threading
import time

import numpy as np
import pytest

from harness.waiting import wait_until
from histoserve.embedding.batches import BatchStats, run_batches
from histoserve.errors import EmbedError


def _read_factory(n_rows: int, batch: int, bad_rows: set[int] = frozenset()):
    def read(index: int) -> tuple[np.ndarray, np.ndarray]:
        rows = np.arange(index * batch, min(n_rows, (index + 1) * batch))
        tiles = np.broadcast_to(rows[:, None, None, None] % 251, (len(rows), 2, 2, 3))
        ok = np.array([r not in bad_rows for r in rows])
        return np.ascontiguousarray(tiles, dtype=np.uint8), ok

    return read


def _echo(tiles: np.ndarray, rows: slice) -> dict[str, np.ndarray]:
    time.sleep(0.001 * (rows.start % 3))  # answers come back out of order
    return {
        "embedding": tiles[:, 0, 0, :].astype(np.float32),
        "rows": np.asarray(tiles[:, 0, 0, 0]),
    }


def test_rows_are_in_plan_order_whatever_the_interleaving() -> None:
    done: list[int] = []
    out = run_batches(
        1000,
        7,
        _read_factory(1000, 7),
        _echo,
        read_workers=3,
        concurrency=5,
        queue_batches=4,
        on_batch=done.append,
    )
    expected = np.arange(1000) % 251
    np.testing.assert_array_equal(out.outputs["embedding"][:, 0], expected.astype(np.float32))
    assert out.ok.all() and sum(done) == 1000 and len(done) == 143


def test_bad_rows_are_masked_and_not_sent() -> None:
    sent: list[int] = []

    def send(tiles: np.ndarray, rows: slice) -> dict[str, np.ndarray]:
        sent.append(len(tiles))
        return _echo(tiles, rows)

    out = run_batches(
        20,
        8,
        _read_factory(20, 8, {3, 9, 10}),
        send,
        read_workers=1,
        concurrency=2,
        queue_batches=2,
    )
    assert sorted(np.flatnonzero(~out.ok)) == [3, 9, 10]
    good = np.setdiff1d(np.arange(20), [3, 9, 10])
    np.testing.assert_array_equal(out.outputs["embedding"][good, 0], good % 251)
    assert sum(sent) == 17


def _blocked_on_a_full_queue(ident: int) -> bool:
    """Whether thread ``ident`` has ended or waits inside ``Queue.put`` on a full queue."""
    frame = sys._current_frames().get(ident)
    while frame is not None:
        if frame.f_code is queue.Queue.put.__code__:
            return frame.f_locals["self"].full()
        frame = frame.f_back
    return ident not in {t.ident for t in threading.enumerate()}


def test_read_ahead_is_bounded_by_the_queue() -> None:
    release = threading.Event()
    read_count = 0
    readers: set[int] = set()  # the threads that read, by identity
    sending: set[int] = set()  # the threads held in slow_send
    lock = threading.Lock()
    read = _read_factory(400, 4)

    def counting_read(index: int):
        nonlocal read_count
        with lock:
            read_count += 1
            readers.add(threading.get_ident())
        return read(index)

    def slow_send(tiles: np.ndarray, rows: slice):
        with lock:
            sending.add(threading.get_ident())
        assert release.wait(60), "the test never released the senders"
        return _echo(tiles, rows)

    def nothing_can_move() -> bool:
        """Both senders held, both readers blocked on the full queue (or done): no more reads."""
        with lock:
            held, reading = len(sending), set(readers)
        return held == 2 and len(reading) == 2 and all(map(_blocked_on_a_full_queue, reading))

    result: list = []
    worker = threading.Thread(
        target=lambda: result.append(
            run_batches(
                400, 4, counting_read, slow_send, read_workers=2, concurrency=2, queue_batches=3
            )
        )
    )
    worker.start()
    try:
        wait_until(nothing_can_move, "both senders held and both readers blocked")
        # in flight (2) + queued (3) + one held by each blocked reader (2)
        assert read_count == 7
    finally:
        release.set()
        worker.join(60)
    assert result[0].ok.all() and read_count == 100


def test_first_error_stops_the_slide() -> None:
    calls = 0
    lock = threading.Lock()

    def send(tiles: np.ndarray, rows: slice):
        nonlocal calls
        with lock:
            calls += 1
        if rows.start == 40:
            raise RuntimeError("HTTP 400: bad tile")
        return _echo(tiles, rows)

    stats = BatchStats()
    with pytest.raises(RuntimeError, match="bad tile"):
        run_batches(
            10_000,
            10,
            _read_factory(10_000, 10),
            send,
            read_workers=2,
            concurrency=3,
            queue_batches=4,
            stats=stats,
        )
    assert calls < 100  # stopped early, not after all 1000 batches


def test_reader_error_propagates() -> None:
    def read(index: int):
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        run_batches(50, 10, read, _echo, read_workers=2, concurrency=2, queue_batches=2)


def test_empty_slide() -> None:
    out = run_batches(
        0, 10, _read_factory(0, 10), _echo, read_workers=2, concurrency=2, queue_batches=2
    )
    assert out.outputs == {} and out.ok.shape == (0,)


def _answer_with(later: dict[str, np.ndarray]):
    """A sender whose first batch is answered right and every later one with ``later(n)``."""

    def send(tiles: np.ndarray, rows: slice) -> dict[str, np.ndarray]:
        if rows.start == 0:
            return {"embedding": np.ones((len(tiles), 6), np.float32)}
        return later

    return send


@pytest.mark.parametrize(
    ("later", "message"),
    [
        ({"embedding": np.ones((1, 6), np.float32)}, "1 rows of 'embedding' for 4 tiles"),
        ({}, "outputs [], the batches before had ['embedding']"),
        ({"embeddings": np.ones((4, 6), np.float32)}, "outputs ['embeddings']"),
        ({"embedding": np.ones((4, 1), np.float32)}, "'embedding' is float32 [4, 1]"),
        ({"embedding": np.ones((4, 6), np.float64)}, "'embedding' is float64 [4, 6]"),
    ],
)
def test_an_answer_that_does_not_fit_its_batch_is_refused_never_spread(
    later: dict[str, np.ndarray], message: str
) -> None:
    """The last line of defence behind the dispatcher's checks: no broadcast, no zeros left."""
    with pytest.raises(EmbedError, match=re.escape(message)):
        run_batches(
            12, 4, _read_factory(12, 4), _answer_with(later), read_workers=1, concurrency=1,
            queue_batches=1,
        )  # fmt: skip
