"""Classes of service in the batcher: urgency first, an age bound, a bound per class, deadlines.

The rule is read at the policy (:class:`~predictor.batching.queue.BatchPolicy`,
clock given, no threads) and through the batcher's public API with a held
fake worker, so a test controls what waits while the device is busy.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from predictor.batching.queue import URGENT_WINDOW_S, BatchPolicy, BatchQueue, DeviceTimes, Entry
from predictor.config import BatchingConfig
from predictor.errors import ConfigError, InvalidInput, Overloaded, QueueTimeout
from tests.unit.batching.fakes import Fake, FifoDevice, busy, outcomes, run, started


def _queue(
    arrivals: list[tuple[int, str, float]], *, levels: int = 2, limit: int = 100
) -> tuple[BatchQueue[str, None], list[Entry[str, None]]]:
    """A queue holding one item per ``(priority, name, enqueued_at)``, key ``k``."""
    loop = asyncio.new_event_loop()
    queue: BatchQueue[str, None] = BatchQueue(limit, priority_levels=levels)
    entries = []
    for priority, name, at in arrivals:
        (entry,) = queue.admit([name], "k", loop, at, priority)
        entries.append(entry)
    loop.close()
    return queue, entries


def _names(batch: list[Entry[str, None]]) -> list[str]:
    return [e.item for e in batch]


def test_the_most_urgent_class_leads_and_its_batch_carries_no_less_urgent_tiles() -> None:
    """Bulk arrived first, yet the interactive tiles go first, FIFO, in a batch of their
    own (never waiting for bulk tiles' compute); then bulk, FIFO."""
    queue, _ = _queue(
        [(2, "b0", 0.0), (2, "b1", 0.1), (1, "i0", 0.2), (2, "b2", 0.3), (1, "i1", 0.4)]
    )
    policy = BatchPolicy(3, max_latency_s=0.0, max_queue_delay_s=(None, 10.0))
    batch, expired = policy.take(queue, now=1.0)
    assert _names(batch) == ["i0", "i1"] and expired == []
    assert _names(policy.take(queue, now=1.0)[0]) == ["b0", "b1", "b2"]


def test_a_class_unserved_past_its_bound_leads_once_then_urgency_rules_again() -> None:
    """Interactive tiles flood full batches; bulk waits. Once bulk has gone unserved for
    its max_queue_delay, its oldest tile leads a batch; served, it waits its turn again."""
    flood = [(1, f"i{n}", 1.0 + n / 100) for n in range(8)]
    queue, _ = _queue([(2, "b0", 0.0), (2, "b1", 0.0), *flood])
    policy = BatchPolicy(2, max_latency_s=0.0, max_queue_delay_s=(None, 5.0))
    assert _names(policy.take(queue, now=2.0)[0]) == ["i0", "i1"]  # bulk waited 2 s < 5 s
    assert _names(policy.take(queue, now=4.9)[0]) == ["i2", "i3"]
    assert _names(policy.take(queue, now=5.0)[0]) == ["b0", "b1"]  # 5 s unserved: bulk leads
    loop = asyncio.new_event_loop()
    queue.admit(["b2"], "k", loop, 5.0, 2)
    loop.close()
    assert _names(policy.take(queue, now=6.0)[0]) == ["i4", "i5"]  # bulk served at 5.0
    assert _names(policy.take(queue, now=10.0)[0]) == ["b2", "i6"]  # unserved 5 s again


def test_without_a_bound_a_flooded_urgent_class_holds_bulk_back() -> None:
    """The bound is what frees bulk: with none, it waits as long as interactive tiles come."""
    queue, _ = _queue([(2, "b0", 0.0), *[(1, f"i{n}", 1.0) for n in range(4)]])
    policy = BatchPolicy(2, max_latency_s=0.0, max_queue_delay_s=(None, None))
    assert _names(policy.take(queue, now=100.0)[0]) == ["i0", "i1"]
    assert _names(policy.take(queue, now=200.0)[0]) == ["i2", "i3"]


def test_each_class_has_its_own_queue_bound() -> None:
    queue, _ = _queue([(2, f"b{n}", 0.0) for n in range(4)], limit=4)
    loop = asyncio.new_event_loop()
    assert queue.admit(["b4"], "k", loop, 0.0, 2) is None  # bulk full
    assert queue.admit(["i0", "i1", "i2", "i3"], "k", loop, 0.0, 1) is not None  # its own room
    assert queue.admit(["i4"], "k", loop, 0.0, 1) is None
    loop.close()
    assert (queue.depth_of(1), queue.depth_of(2), queue.depth) == (4, 4, 8)


def test_an_entry_past_its_deadline_is_popped_as_expired_never_in_the_batch() -> None:
    loop = asyncio.new_event_loop()
    queue: BatchQueue[str, None] = BatchQueue(10, priority_levels=2)
    queue.admit(["late"], "k", loop, 0.0, 1, deadline=0.5)
    queue.admit(["ok"], "k", loop, 0.0, 2, deadline=None)
    loop.close()
    batch, expired = BatchPolicy(4).take(queue, now=0.5)
    assert _names(batch) == ["ok"] and _names(expired) == ["late"]
    assert not expired[0].queued and len(queue) == 0


def _classes(**more: Any) -> BatchingConfig:
    return BatchingConfig(max_batch_size=2, max_latency_ms=0, max_queue_size=4, **more)


def test_batcher_runs_queued_interactive_tiles_before_earlier_bulk() -> None:
    fake = Fake()

    async def body() -> None:
        b = await started(fake, _classes())
        first = await busy(fake, b)
        bulk = b.submit(["b0", "b1"], priority=2)
        urgent = b.submit(["i0", "i1"], priority=1)
        fake.release()
        await outcomes([first, *bulk, *urgent])
        assert [items for items, _ in fake.calls] == [["busy"], ["i0", "i1"], ["b0", "b1"]]
        await b.close()

    run(body)


def test_batcher_refuses_a_full_class_and_admits_another() -> None:
    fake = Fake()

    async def body() -> None:
        b = await started(fake, _classes())
        first = await busy(fake, b)
        bulk = b.submit(["b0", "b1", "b2", "b3"], priority=2)
        with pytest.raises(Overloaded, match=r"queue full \(priority 2: 4 queued"):
            b.submit(["b4"], priority=2)
        urgent = b.submit(["i0"], priority=1)
        assert (b.depth_of(1), b.depth_of(2)) == (1, 4)
        fake.release()
        assert await outcomes([first, *bulk, *urgent]) == [
            "rbusy",
            "rb0",
            "rb1",
            "rb2",
            "rb3",
            "ri0",
        ]
        await b.close()

    run(body)


def test_a_deadline_passing_in_the_queue_fails_that_item_once_and_it_never_runs() -> None:
    """Queued behind a held batch, an item whose deadline passes fails at its deadline
    (not when the worker frees) with QueueTimeout naming the timeout; released, the
    worker never sees it; the others of the queue run. A second settle would be an
    InvalidStateError in a loop callback, which ``run`` turns into a failure."""
    fake = Fake()

    async def body() -> None:
        b = await started(fake, _classes())
        first = await busy(fake, b)
        (doomed,) = b.submit(["doomed"], priority=1, deadline=time.monotonic() + 0.05)
        (kept,) = b.submit(["kept"], priority=2, deadline=time.monotonic() + 60)
        with pytest.raises(QueueTimeout, match=r"request timeout expired.*'timeout'"):
            await asyncio.wait_for(asyncio.shield(doomed), 2.0)
        assert not first.done()  # failed while the worker was still busy
        fake.release()
        assert await outcomes([first, kept]) == ["rbusy", "rkept"]
        assert all("doomed" not in items for items, _ in fake.calls)
        assert b.queue_depth == 0
        await b.close()

    run(body)


def test_a_deadline_already_past_when_submitted_never_runs() -> None:
    fake = Fake()

    async def body() -> None:
        b = await started(fake, _classes())
        (late,) = b.submit(["late"], priority=1, deadline=time.monotonic() - 1)
        (result,) = await outcomes([late])
        assert isinstance(result, QueueTimeout)
        assert fake.calls == []
        await b.close()

    run(body)


def test_the_classes_config() -> None:
    config = BatchingConfig()
    assert (config.priority_levels, config.priority_of(None), config.priority_of(0)) == (2, 2, 2)
    assert config.priority_of(1) == 1
    with pytest.raises(InvalidInput, match=r"parameter 'priority' must be .* 1 .* to 2, got 3"):
        config.priority_of(3)
    assert config.queue_delays_s() == (None, 1.0)
    three = BatchingConfig(priority_levels=3, default_priority=2, max_queue_delay_ms=(0, 50, 0))
    assert (three.priority_of(None), three.queue_delays_s()) == (2, (None, 0.05, None))
    with pytest.raises(ConfigError, match="max_queue_delay_ms"):
        BatchingConfig(max_queue_delay_ms=(1.0, 2.0, 3.0))
    with pytest.raises(ConfigError, match="default_priority"):
        BatchingConfig(default_priority=3)
    with pytest.raises(ConfigError, match="urgent_wait_ms"):
        BatchingConfig(urgent_wait_ms=-1)


def test_device_times_fit_a_line_and_pick_the_largest_batch_within_the_bound() -> None:
    """Before any forward nothing is cut; one size seen, time is taken to grow with the
    batch from nothing; two sizes, the line through them (a GPU's fixed cost per call
    counts); a device that slows cuts further."""
    times = DeviceTimes(16, within_s=0.025)
    assert times.fits == 16 and times.estimate_s(4) == float("inf")
    times.observe(16, 0.112)  # 7 ms a tile
    assert times.fits == 3 and times.estimate_s(3) == pytest.approx(0.021)
    times.observe(4, 0.034)  # the line through both: t(n) = 0.008 + 0.0065 n
    assert times.estimate_s(2) == pytest.approx(0.008 + 0.013) and times.fits == 2
    gpu = DeviceTimes(64, within_s=0.025)
    gpu.observe(64, 0.040)
    gpu.observe(8, 0.012)  # 8 ms a call + 0.5 ms a tile
    assert gpu.fits == 34
    for _ in range(10):
        gpu.observe(34, 0.080)  # slowed
    assert gpu.fits < 34


def _cut_policy(fits_after: float) -> BatchPolicy:
    policy = BatchPolicy(8, max_latency_s=0.0, max_queue_delay_s=(None, 10.0), urgent_wait_s=0.02)
    policy.observe(8, fits_after)
    return policy


def test_bulk_batches_are_cut_while_an_urgent_class_is_active_and_whole_after() -> None:
    """The device cannot be preempted: a bulk batch on it is what an interactive arrival
    waits for. While interactive requests come (one in the last URGENT_WINDOW_S, or
    waiting), bulk batches take about urgent_wait_s (here 2 of 10 ms a tile); bulk alone
    runs whole batches."""
    queue, _ = _queue([(2, f"b{n}", 0.0) for n in range(20)])
    policy = _cut_policy(0.080)
    assert len(policy.take(queue, now=1.0)[0]) == 8  # no interactive request yet
    loop = asyncio.new_event_loop()
    queue.admit(["i0"], "k", loop, 1.0, 1)
    loop.close()
    assert _names(policy.take(queue, now=1.0)[0]) == ["i0"]
    assert policy.ready(queue, now=1.1)  # the cut batch is complete: cut at once
    assert _names(policy.take(queue, now=1.1)[0]) == ["b8", "b9"]
    assert len(policy.take(queue, now=1.0 + URGENT_WINDOW_S - 0.01)[0]) == 2
    assert len(policy.take(queue, now=1.0 + URGENT_WINDOW_S)[0]) == 8  # quiet: whole again


def test_a_cut_batch_is_never_smaller_than_the_urgent_class_s_own_last_batch() -> None:
    """Waiting for one bulk batch as long as its own at most doubles an urgent request's
    device time, which the 2x target allows: cutting finer only costs bulk throughput.
    A device slow enough that one tile passes urgent_wait_s still runs bulk in batches
    of the interactive request's size (3), not of 1."""
    queue, _ = _queue([(2, f"b{n}", 0.0) for n in range(10)])
    policy = _cut_policy(0.400)  # 50 ms a tile, 20 ms allowed: one tile already passes it
    loop = asyncio.new_event_loop()
    queue.admit(["i0", "i1", "i2"], "k", loop, 1.0, 1)
    loop.close()
    assert _names(policy.take(queue, now=1.0)[0]) == ["i0", "i1", "i2"]
    assert policy.times is not None and policy.times.fits == 1
    assert len(policy.take(queue, now=1.1)[0]) == 3


def test_without_urgent_wait_bulk_batches_are_never_cut() -> None:
    queue, _ = _queue([(2, f"b{n}", 0.0) for n in range(10)] + [(1, "i0", 0.5)])
    policy = BatchPolicy(8, max_latency_s=0.0, max_queue_delay_s=(None, 10.0))
    policy.observe(8, 10.0)
    assert _names(policy.take(queue, now=1.0)[0]) == ["i0"]
    assert len(policy.take(queue, now=1.0)[0]) == 8


def test_batcher_cuts_bulk_batches_while_interactive_requests_come() -> None:
    """A device taking 10 ms a tile, batches of 8, --urgent_wait_ms 35: once an
    interactive request has come, the next bulk request runs in batches of at most 3
    (about 30 ms each, learnt from the forwards); with --urgent_wait_ms 0 in one batch."""

    async def sizes(urgent_wait_ms: float) -> list[int]:
        device = FifoDevice(s_per_item=0.01)
        config = BatchingConfig(
            max_batch_size=8, max_latency_ms=0, max_queue_size=16, urgent_wait_ms=urgent_wait_ms
        )
        b = await started(device.run_batch("m"), config)
        await outcomes(b.submit(list(range(8)), priority=2))
        await outcomes(b.submit(["i"], priority=1))
        await outcomes(b.submit(list(range(8)), priority=2))
        await b.close()
        return [n for _, n, _, _ in device.log]

    cut = run(lambda: sizes(35.0))
    assert cut[:2] == [8, 1] and sum(cut[2:]) == 8 and max(cut[2:]) <= 3, cut
    assert run(lambda: sizes(0.0)) == [8, 1, 8]
