"""The batch rule (:class:`~predictor.batching.queue.BatchPolicy`) and the batcher seam.

The rule is written once: ``ready`` and ``take`` read the same head batch, so
the batch the dispatcher waits for is the batch it cuts. Both batchers a model
may hold (the in-process one and a front end's proxy) meet the
:class:`~predictor.batching.batcher.Batcher` protocol, member for member.
"""

from __future__ import annotations

import asyncio
import inspect

import pytest

from predictor.batching.batcher import Batcher, DynamicBatcher
from predictor.batching.queue import BatchPolicy, BatchQueue, Entry
from predictor.multiprocess.proxy import BatcherProxy


def _queue(keys: str, *, cancelled: str = "") -> tuple[BatchQueue[int, None], list[Entry]]:
    """A queue holding one item per letter of ``keys`` (its key), enqueued at 0.0, 1.0, ...

    The items at the positions listed in ``cancelled`` (digits) have their futures cancelled.
    """
    loop = asyncio.new_event_loop()
    queue: BatchQueue[int, None] = BatchQueue(100)
    entries = []
    for i, key in enumerate(keys):
        (entry,) = queue.admit([i], key, loop, float(i))
        entries.append(entry)
    for i in cancelled:
        entries[int(i)].future.cancel()
    loop.close()
    return queue, entries


@pytest.mark.parametrize(
    ("keys", "cancelled", "size", "taken", "complete"),
    [
        ("aaa", "", 4, [0, 1, 2], False),  # could still grow
        ("aaaa", "", 4, [0, 1, 2, 3], True),  # full
        ("aab", "", 4, [0, 1], True),  # another key follows
        ("aaaaa", "1", 3, [0, 2, 3], True),  # a cancelled entry does not count
        ("abab", "1", 4, [0, 2], True),  # the cancelled b does not end the batch; the live one does
        ("baa", "0", 4, [1, 2], False),  # the key is the first live entry's
        ("", "", 4, [], False),
    ],
)
def test_ready_and_take_read_one_rule(keys, cancelled, size, taken, complete):
    queue, _ = _queue(keys, cancelled=cancelled)
    policy = BatchPolicy(size, max_latency_s=100.0)
    if keys:
        assert policy.ready(queue, now=0.0) is complete
    batch, expired = policy.take(queue, now=0.0)
    assert [e.item for e in batch] == taken and expired == []
    assert all(not e.future.done() for e in batch)


def test_the_wait_is_over_at_the_oldest_items_deadline():
    queue, _ = _queue("aa")
    policy = BatchPolicy(4, max_latency_s=0.5)
    assert policy.deadline(queue) == 0.5
    assert not policy.ready(queue, now=0.4)
    assert policy.ready(queue, now=0.5)


def test_take_pops_the_cancelled_entries_among_the_batch_and_leaves_the_rest():
    queue, _ = _queue("aaab", cancelled="1")
    assert len(BatchPolicy(2).take(queue, now=0.0)[0]) == 2
    assert [e.item for e in queue.lane(1)] == [3]
    assert queue.depth == 1


def _members(cls: type) -> dict[str, str]:
    """Every public member the protocol declares, as ``kind(signature)``."""
    found = {}
    for name, value in inspect.getmembers(cls):
        if name.startswith("_"):
            continue
        if isinstance(value, property):
            found[name] = "property"
        elif inspect.isfunction(value):
            kind = "async" if inspect.iscoroutinefunction(value) else "sync"
            params = list(inspect.signature(value).parameters)
            found[name] = f"{kind}{params}"
    return found


@pytest.mark.parametrize("cls", [DynamicBatcher, BatcherProxy])
def test_both_batchers_meet_the_protocol(cls):
    declared = _members(Batcher)
    assert {"submit", "drain", "start", "close", "close_nowait", "queue_depth"} <= set(declared)
    has = _members(cls)
    assert {name: has.get(name) for name in declared} == declared
