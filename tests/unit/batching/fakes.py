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
