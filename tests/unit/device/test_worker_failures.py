"""A failed forward on a GPU worker: sticky errors on the failing batch, library OOMs split (issue 28).

No GPU here: the package claims ``cuda:0`` (the device context is a
recorder, so nothing touches CUDA), the device sync and the allocator's
counters are injected; the worker wrapper and the real batcher decide.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from predictor.batching.batcher import DynamicBatcher
from predictor.config import BatchingConfig
from predictor.device.failures import classify_error
from predictor.device.normalizer import Normalizer
from predictor.device.slot import DeviceSlot
from predictor.device.workers import DeviceWorkers
from predictor.errors import DeviceLost, ErrorKind
from predictor.runtime.device_context import use_device_context
from predictor.spec import BUILTIN_SPECS
from tests.unit.device.fakes import SHIM, STICKY, FakeGpuPackage, Nowhere, Stats


def _worker(failure: Any, sync_error: str | None = None, stats: Stats | None = None) -> Any:
    """The lone GPU worker's callable; the forward raises ``failure`` (or runs) per batch."""
    synced: list[torch.device] = []

    def sync(device: torch.device) -> None:
        synced.append(device)
        if sync_error:
            raise RuntimeError(sync_error)

    workers = DeviceWorkers(memory_stats=stats or Stats(), pipeline=False, device_sync=sync)
    normalizer = Normalizer(BUILTIN_SPECS["h0-mini"], torch.device("cpu"), torch.float32)
    slot = DeviceSlot(FakeGpuPackage(), normalizer)  # type: ignore[arg-type]

    def forward(samples: list[Any], mode: Any) -> list[Any]:
        exc = failure(samples) if callable(failure) else failure
        if exc is not None:
            raise exc
        return [f"ok {s}" for s in samples]

    run = workers.runs("cuda:0", slot, forward, instances=1)
    run.synced = synced  # type: ignore[attr-defined]
    return run


def test_a_sticky_error_behind_the_shims_message_is_fatal_on_the_failing_batch() -> None:
    run = _worker(RuntimeError(SHIM), sync_error=STICKY)
    with use_device_context(Nowhere()), pytest.raises(DeviceLost) as caught:
        run([1, 2], None)
    assert classify_error(caught.value) is ErrorKind.FATAL
    assert STICKY in str(caught.value) and SHIM in str(caught.value)
    assert run.synced == [torch.device("cuda", 0)]


def test_a_batch_failure_on_a_healthy_device_stays_a_batch_failure() -> None:
    run = _worker(RuntimeError(SHIM))
    with use_device_context(Nowhere()), pytest.raises(RuntimeError) as caught:
        run([1], None)
    assert str(caught.value) == SHIM and classify_error(caught.value) is ErrorKind.BATCH
    assert run.synced == [torch.device("cuda", 0)]  # checked once, found healthy


def test_an_oom_needs_no_sync() -> None:
    run = _worker(torch.OutOfMemoryError("CUDA out of memory"), sync_error=STICKY)
    with use_device_context(Nowhere()), pytest.raises(torch.OutOfMemoryError):
        run([1], None)
    assert run.synced == []


def test_the_batcher_takes_the_device_out_on_the_batch_that_failed() -> None:
    """Without the sync the batch would be a 503 and the next batch would find the device dead."""
    run = _worker(RuntimeError(SHIM), sync_error=STICKY)

    async def body() -> tuple[list[Any], bool]:
        batcher = DynamicBatcher(run, BatchingConfig(4, 1, 64), classify_error=classify_error)
        await batcher.start()
        results = await asyncio.gather(*batcher.submit([1, 2]), return_exceptions=True)
        healthy = batcher.healthy
        await batcher.close()
        return results, healthy

    with use_device_context(Nowhere()):
        results, healthy = asyncio.run(body())
    assert all(isinstance(r, DeviceLost) for r in results) and not healthy


@pytest.mark.parametrize(
    "message",
    [
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
        "cuDNN error: CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",
        "CUDA error: out of memory",
    ],
)
def test_library_allocation_failures_split_the_batch(message: str) -> None:
    assert classify_error(RuntimeError(message)) is ErrorKind.OOM
    seen: list[int] = []

    def fail_big(samples: list[Any]) -> Exception | None:
        seen.append(len(samples))
        return RuntimeError(message) if len(samples) > 2 else None

    run = _worker(fail_big)

    async def body() -> list[Any]:
        batcher = DynamicBatcher(run, BatchingConfig(4, 1, 64), classify_error=classify_error)
        await batcher.start()
        results = await asyncio.gather(*batcher.submit([1, 2, 3, 4]))
        await batcher.close()
        return results

    with use_device_context(Nowhere()):
        assert asyncio.run(body()) == ["ok 1", "ok 2", "ok 3", "ok 4"]
    assert seen == [4, 2, 2]
    assert run.synced == []  # an OOM is not a reason to check the device


def test_allocator_counters_are_read_only_after_a_failure() -> None:
    stats = Stats()
    failing = {"now": False}

    def maybe(samples: list[Any]) -> Exception | None:
        if not failing["now"]:
            return None
        stats.num_ooms += 1  # the allocator failed inside the package
        return RuntimeError(SHIM)

    run = _worker(maybe, stats=stats)
    assert stats.reads == 1  # once, when the worker was built
    with use_device_context(Nowhere()):
        for _ in range(5):
            run([1], None)
        assert stats.reads == 1  # never around a forward that succeeds
        failing["now"] = True
        with pytest.raises(torch.OutOfMemoryError):
            run([1, 2], None)
    assert stats.reads == 2
