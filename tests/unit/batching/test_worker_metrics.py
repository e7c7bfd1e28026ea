"""Per-device-worker metrics: forwards by outcome, and whether each worker still serves.

Driven through the real batcher with two workers; each worker's ``run_batch``
stands in for one GPU (this machine has none).
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Any

from prometheus_client import CollectorRegistry

from predictor.batching.batcher import DynamicBatcher, ErrorKind
from predictor.config import BatchingConfig
from predictor.model.metrics import create_metrics


class FakeDeviceError(RuntimeError):
    """Stands in for a sticky CUDA error."""


def test_device_metrics_follow_the_workers() -> None:
    registry = CollectorRegistry()
    metrics = create_metrics("m", registry)

    def ok(items: list[Any], key: Hashable) -> list[Any]:
        return items

    def lost(items: list[Any], key: Hashable) -> list[Any]:
        raise FakeDeviceError("illegal memory access")

    def classify(exc: BaseException) -> ErrorKind:
        return ErrorKind.FATAL if isinstance(exc, FakeDeviceError) else ErrorKind.BATCH

    async def body() -> None:
        batcher: DynamicBatcher[Any, Any] = DynamicBatcher(
            {"cuda:0": lost, "cuda:1": ok},
            BatchingConfig(max_batch_size=1, max_latency_ms=1, max_queue_size=16),
            classify_error=classify,
            observer=metrics,
            name="m",
        )
        await batcher.start()
        metrics.workers_started([w.name for w in batcher.workers])
        first = batcher.submit([1])  # the idle first worker takes it, and is lost
        await asyncio.gather(*first, return_exceptions=True)
        for _ in range(3):
            assert await asyncio.gather(*batcher.submit([2])) == [2]
        await batcher.close()

    asyncio.run(body())

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"model": "m", **labels})

    assert value("histoserve_device_up", worker="cuda:0") == 0
    assert value("histoserve_device_up", worker="cuda:1") == 1
    assert value("histoserve_device_forwards_total", worker="cuda:0", outcome="failed") == 1
    assert value("histoserve_device_forwards_total", worker="cuda:1", outcome="ok") == 3
