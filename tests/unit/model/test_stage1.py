"""Stage-1 pool: order kept, decoding spread over threads, the bad tile named."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time

import numpy as np
import pytest
import torch

from predictor.codecs.samples import ModelRequest, PreparedSample
from predictor.errors import InvalidInput
from predictor.model import stage1
from predictor.model.stage1 import COSTLY_PIXELS, CostOrderedPool, Stage1Pool

SIZE = 2  # the tile size these pools check prepared tiles against


def _prepare_recording(threads):
    def prepare(item: ModelRequest) -> PreparedSample:
        threads.add(threading.current_thread().name)
        if item.image_data == b"bad":
            raise InvalidInput("not an image")
        return PreparedSample(tile=np.full((SIZE, SIZE, 3), item.index, np.uint8))

    return prepare


def test_order_is_kept_and_work_is_spread_over_the_pool():
    pool = Stage1Pool(2, SIZE)
    threads: set[str] = set()
    items = [ModelRequest(i, image_data=b"png") for i in range(9)]
    samples = asyncio.run(pool.prepare(items, "tiles", _prepare_recording(threads)))
    assert [int(s.tile[0, 0, 0]) for s in samples] == list(range(9))
    assert all(name.startswith("histoserve-prep") for name in threads)
    pool.shutdown()


def test_raw_pixels_are_prepared_inline():
    pool = Stage1Pool(2, SIZE)
    threads: set[str] = set()
    items = [ModelRequest(i, pixels=np.zeros((1, 1, 3), np.uint8)) for i in range(3)]
    asyncio.run(pool.prepare(items, "pixels", _prepare_recording(threads)))
    assert threads == {threading.current_thread().name}
    pool.shutdown()


def test_first_bad_tile_is_named_with_its_input():
    pool = Stage1Pool(2, SIZE)
    items = [ModelRequest(i, image_data=b"bad" if i == 5 else b"png") for i in range(8)]
    with pytest.raises(InvalidInput, match="input 'tiles' tile 5: not an image"):
        asyncio.run(pool.prepare(items, "tiles", _prepare_recording(set())))
    pool.shutdown()


def test_a_plain_value_error_is_the_requests_400():
    """The seed's contract: ``prepare_sample`` raising ``ValueError`` refuses that request."""
    pool = Stage1Pool(1, SIZE)

    def prepare(item: ModelRequest) -> PreparedSample:
        raise ValueError("tile is blank")

    with pytest.raises(InvalidInput, match="input 'pixels' tile 0: tile is blank"):
        asyncio.run(pool.prepare([ModelRequest(0, pixels=np.zeros(1))], "pixels", prepare))
    pool.shutdown()


@pytest.mark.parametrize(
    ("tile", "ok"),
    [
        (np.zeros((SIZE, SIZE, 3), np.uint8), True),  # HWC, the fast layout
        (np.zeros((3, SIZE, SIZE), np.uint8), True),  # CHW, the seed's
        (torch.zeros(3, SIZE, SIZE, dtype=torch.uint8), True),  # a host tensor
        (np.zeros((SIZE, SIZE, 3), np.float32), False),
        (np.zeros((SIZE + 1, SIZE, 3), np.uint8), False),
        (np.zeros((4, SIZE, SIZE), np.uint8), False),
    ],
    ids=["hwc", "chw", "chw-tensor", "float", "not-square", "four-channels"],
)
def test_a_prepared_tile_must_be_hwc_or_chw_at_the_tile_size(tile, ok):
    pool = Stage1Pool(1, SIZE)
    items = [ModelRequest(3, pixels=np.zeros(1))]
    run = pool.prepare(items, "pixels", lambda item: PreparedSample(tile=tile))
    if ok:
        assert asyncio.run(run)[0].tile is tile  # checked, handed on unchanged
    else:
        with pytest.raises(
            InvalidInput, match=r"input 'pixels' tile 3: .*\(H, W, 3\) or \(3, H, W\)"
        ):
            asyncio.run(run)
    pool.shutdown()


def test_workers_must_be_positive():
    with pytest.raises(ValueError, match="workers"):
        Stage1Pool(0, SIZE)


def test_the_cheapest_waiting_job_runs_first():
    """Issue 53, case 5: an ordinary request queued behind a costly one's decoding waited
    for all of it (the pool was first in, first out)."""
    pool = CostOrderedPool(1, costly_pixels=100, pixels_per_s=1e-3)  # no ageing in the test
    gate = threading.Event()
    ran: list[str] = []
    blocker = pool.submit(0, lambda: gate.wait(5))
    jobs = [pool.submit(cost, lambda c=cost: ran.append(c)) for cost in (1000, 50, 10, 1000)]
    gate.set()
    for future in (blocker, *jobs):
        future.result(5)
    assert ran == [10, 50, 1000, 1000]
    pool.shutdown()


def test_costly_jobs_never_take_the_last_free_thread():
    pool = CostOrderedPool(2, costly_pixels=100, pixels_per_s=1e-3)
    gate = threading.Event()
    started: list[int] = []

    def costly(i: int):
        def run() -> None:
            started.append(i)
            gate.wait(5)

        return run

    costly_jobs = [pool.submit(1000, costly(i)) for i in range(2)]
    deadline = time.monotonic() + 10
    while not started and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # time enough for a second thread to take the second, were it allowed
    assert started == [0]  # the second waits: one thread stays free
    assert pool.submit(10, lambda: "ordinary").result(5) == "ordinary"  # not behind them
    gate.set()
    for future in costly_jobs:
        future.result(5)
    assert started == [0, 1]
    pool.shutdown()


def test_a_costly_request_is_prepared_one_box_a_chunk_in_order():
    """Each box a chunk of its own, never two at once on a pool of two (the last free
    thread stays for cheaper work); which thread takes the next is the pool's choice
    (its threads start with the first job, so either may be first to wait)."""
    pool = Stage1Pool(2, SIZE)
    lock = threading.Lock()
    running, most = 0, 0
    record = _prepare_recording(set())

    def prepare(item: ModelRequest) -> PreparedSample:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.01)
        with lock:
            running -= 1
        return record(item)

    items = [ModelRequest(i, image_data=b"png") for i in range(5)]
    samples = asyncio.run(pool.prepare(items, "tiles", prepare, COSTLY_PIXELS + 1))
    assert [int(s.tile[0, 0, 0]) for s in samples] == list(range(5))
    assert most == 1  # never the last free thread of two
    pool.shutdown()


def test_a_stream_of_cheaper_jobs_never_starves_a_costlier_one():
    """Shortest job first ages: a job costing 0.2 s of ageing is passed over by cheaper
    jobs arriving within 0.2 s of it, not by those arriving later (it starved for as
    long as cheaper ones kept coming)."""
    pool = CostOrderedPool(1, costly_pixels=10**9, pixels_per_s=1000.0)
    ran: list[str] = []
    gate = threading.Event()
    blocker = pool.submit(0, lambda: gate.wait(5))  # the one thread busy while both queue
    costly = pool.submit(200, lambda: ran.append("costly"))  # ages away in 0.2 s

    def cheap() -> None:
        ran.append("cheap")
        time.sleep(0.01)

    waiting = [pool.submit(1, cheap) for _ in range(3)]
    gate.set()
    blocker.result(5)
    deadline = time.monotonic() + 3
    while not costly.done() and time.monotonic() < deadline:  # always cheap ones waiting
        waiting.pop(0).result(5)
        waiting.append(pool.submit(1, cheap))
    assert costly.done(), "the costly job never ran while cheaper ones kept coming"
    assert 0 < ran.index("costly") < len(ran)  # cheaper ones went first for a while
    pool.shutdown()


def _niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread niceness: Linux")
def test_a_pool_made_at_a_lower_priority_runs_at_its_submitters():
    """A model loaded while others serve is built in a thread at a lower priority: its
    pool's threads start with the first job, from the serving loop, at its priority."""
    made: list[CostOrderedPool] = []

    def make() -> None:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(19, _niceness() + 5))
        made.append(CostOrderedPool(2))

    maker = threading.Thread(target=make)
    maker.start()
    maker.join(30)
    (pool,) = made
    assert pool.submit(1, _niceness).result(30) == _niceness()
    pool.shutdown()


def test_an_urgent_class_decodes_ahead_of_an_earlier_bulk_job_of_the_same_cost(monkeypatch):
    """A viewer's request (priority 1) queued behind a cohort's (priority 2) of the same
    cost went after it (cost alone ordered the pool); now it goes first, while a bulk
    job that has waited CLASS_LAG_S goes before an urgent one arriving after that."""
    monkeypatch.setattr(stage1, "CLASS_LAG_S", 0.05)
    pool = CostOrderedPool(1, costly_pixels=10**9, pixels_per_s=1e9)
    ran: list[str] = []
    for pause_s, order in ((0.0, ["urgent", "bulk"]), (0.1, ["bulk", "urgent"])):
        gate = threading.Event()
        ran.clear()
        blocker = pool.submit(0, lambda g=gate: g.wait(5))
        bulk = pool.submit(100, lambda: ran.append("bulk"), priority=2)
        time.sleep(pause_s)
        urgent = pool.submit(100, lambda: ran.append("urgent"), priority=1)
        gate.set()
        for future in (blocker, bulk, urgent):
            future.result(5)
        assert ran == order, pause_s
    pool.shutdown()
