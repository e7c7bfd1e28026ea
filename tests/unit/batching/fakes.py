"""Shared fakes of the batcher's unit tests: a recording ``run_batch`` and bounded loops."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Any, TypeVar

from predictor.batching.batcher import DynamicBatcher
from predictor.config import BatchingConfig

WAIT_S = 5.0
X = TypeVar("X")


class Fake:
    """A ``run_batch`` that records calls; ``hold`` blocks it until released.

    Args:
        fail: Called with (items, key) before returning; may raise.
    """

    def __init__(self, fail: Callable[[list[Any], Hashable], None] | None = None) -> None:
        self.calls: list[tuple[list[Any], Hashable]] = []
        self.times: list[float] = []
        self.threads: set[int] = set()
        self.started: queue.Queue[list[Any]] = queue.Queue()
        self.gate = threading.Event()
        self.gate.set()
        self.fail = fail

    def hold(self) -> None:
        self.gate.clear()

    def release(self) -> None:
        self.gate.set()

    def __call__(self, items: list[Any], key: Hashable) -> list[Any]:
        self.calls.append((list(items), key))
        self.times.append(time.monotonic())
        self.threads.add(threading.get_ident())
        self.started.put(list(items))
        assert self.gate.wait(WAIT_S), "test never released the fake"
        if self.fail is not None:
            self.fail(items, key)
        return [f"r{x}" for x in items]

    async def next_call(self) -> list[Any]:
        """Wait (bounded) until the worker enters the next batch."""
        return await asyncio.to_thread(self.started.get, True, WAIT_S)

    @property
    def sizes(self) -> list[int]:
        return [len(items) for items, _ in self.calls]


def run(body: Callable[[], Awaitable[X]]) -> X:
    """Run ``body`` in a fresh loop with a bound; fail on any loop-level error."""
    errors: list[dict[str, Any]] = []

    async def main() -> X:
        asyncio.get_running_loop().set_exception_handler(lambda _l, ctx: errors.append(ctx))
        return await asyncio.wait_for(body(), 20)

    result = asyncio.run(main())
    assert not errors, errors
    return result


async def started(fake: Fake, config: BatchingConfig, **kwargs: Any) -> DynamicBatcher[Any, Any]:
    batcher: DynamicBatcher[Any, Any] = DynamicBatcher(fake, config, **kwargs)
    await batcher.start()
    return batcher


async def outcomes(futures: Sequence[asyncio.Future[Any]]) -> list[Any]:
    return await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), WAIT_S)


async def busy(fake: Fake, batcher: DynamicBatcher[Any, Any]) -> asyncio.Future[Any]:
    """Hold the worker inside a one-item batch; return that item's future."""
    fake.hold()
    (first,) = batcher.submit(["busy"])
    assert await fake.next_call() == ["busy"]
    return first


class FifoDevice:
    """One device shared by several models' workers: one batch at a time, first come first served.

    A fake of what cannot exist here (a GPU several models share): each
    model's ``run_batch`` (:meth:`run_batch`) waits its turn in arrival order
    (a ticket lock, fair by construction, so it plays no favourite), then
    holds the device ``s_per_batch + s_per_item * len(items)``. ``log`` is
    ``(model, items, start, end)`` per batch, in the device's order.
    """

    def __init__(self, s_per_batch: float = 0.0, s_per_item: float = 0.0) -> None:
        self.s_per_batch = s_per_batch
        self.s_per_item = s_per_item
        self.log: list[tuple[str, int, float, float]] = []
        self._cond = threading.Condition()
        self._next_ticket = 0
        self._serving = 0

    def run_batch(self, model: str) -> Callable[[list[Any], Hashable], list[Any]]:
        def run(items: list[Any], key: Hashable) -> list[Any]:
            with self._cond:
                ticket = self._next_ticket
                self._next_ticket += 1
                assert self._cond.wait_for(lambda: self._serving == ticket, WAIT_S)
            start = time.monotonic()
            time.sleep(self.s_per_batch + self.s_per_item * len(items))
            end = time.monotonic()
            with self._cond:
                self.log.append((model, len(items), start, end))
                self._serving += 1
                self._cond.notify_all()
            return [f"{model}:{x}" for x in items]

        return run

    def seconds(self, model: str, first: int = 0, last: int | None = None) -> float:
        """Device seconds ``model``'s batches held among the log's ``[first:last]``."""
        return sum(end - start for m, _, start, end in self.log[first:last] if m == model)

    def turns(self, model: str, first: int = 0, last: int | None = None) -> int:
        return sum(1 for m, *_ in self.log[first:last] if m == model)
