"""One device shared fairly by several models' batchers (:mod:`predictor.batching.scheduler`).

Two models' real :class:`~predictor.batching.batcher.DynamicBatcher` run on a
fake device (:class:`~tests.unit.batching.fakes.FifoDevice`: one batch at a
time, first come first served, as fair as a device can be on its own); the
scheduler decides which model's batch goes next. Without it the device
alternates batches, whatever their size or the models' weights, which the
share tests below catch.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from predictor.batching.batcher import DynamicBatcher
from predictor.batching.scheduler import DeviceScheduler
from predictor.config import BatchingConfig
from predictor.errors import ModelNotReady
from tests.unit.batching.fakes import WAIT_S, Fake, FifoDevice, busy, outcomes, run


def _config(**kw: Any) -> BatchingConfig:
    return BatchingConfig(**{"max_latency_ms": 0.0, "max_queue_size": 4096, **kw})


async def _models(
    device: FifoDevice, scheduler: DeviceScheduler | None, **configs: BatchingConfig
) -> dict[str, DynamicBatcher[Any, Any]]:
    out: dict[str, DynamicBatcher[Any, Any]] = {}
    for name, config in configs.items():
        batcher: DynamicBatcher[Any, Any] = DynamicBatcher(
            device.run_batch(name), config, name=name, scheduler=scheduler, device="dev"
        )
        await batcher.start()
        out[name] = batcher
    return out


async def _until(predicate: Any) -> None:
    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.002)

    await asyncio.wait_for(poll(), WAIT_S)


def _settled_once(futures: list[asyncio.Future[Any]]) -> Counter[int]:
    """Counts each future's settlements (a second would raise on the loop, failing ``run``)."""
    counts: Counter[int] = Counter()
    for i, future in enumerate(futures):
        future.add_done_callback(lambda _f, i=i: counts.update([i]))
    return counts


def test_weights_3_to_1_split_the_device_3_to_1_under_saturation() -> None:
    device = FifoDevice(s_per_batch=0.002)

    async def body() -> float:
        models = await _models(
            device,
            DeviceScheduler(),
            a=_config(max_batch_size=4, weight=3.0),
            b=_config(max_batch_size=4, weight=1.0),
        )
        a = models["a"].submit(list(range(600)))
        b = models["b"].submit(list(range(600)))
        await _until(lambda: len(device.log) >= 124)
        for batcher in models.values():
            await batcher.close()
        await outcomes(a + b)
        return device.seconds("a", 4, 124) / device.seconds("b", 4, 124)

    ratio = run(body)
    assert 2.2 <= ratio <= 4.0, f"device time a:b = {ratio:.2f}, weights 3:1; log {device.log}"


def test_a_flooded_model_cannot_starve_a_lighter_one_of_its_share() -> None:
    """A floods with big batches, B asks for small ones: while B has work it gets about half
    (without the scheduler under a fifth). Batches of milliseconds, so a busy machine's
    jitter is small beside them, and a margin under the half for the rest."""
    device = FifoDevice(s_per_batch=0.002, s_per_item=0.002)

    async def body() -> tuple[float, list[Any]]:
        models = await _models(
            device,
            DeviceScheduler(),
            a=_config(max_batch_size=8),
            b=_config(max_batch_size=1),
        )
        flood = models["a"].submit(list(range(2000)))
        light = models["b"].submit(list(range(16)))
        answers = await outcomes(light)
        last_b = max(i for i, (m, *_) in enumerate(device.log) if m == "b")
        share = device.seconds("b", 0, last_b + 1) / sum(
            end - start for _, _, start, end in device.log[: last_b + 1]
        )
        for batcher in models.values():
            await batcher.close()
        await outcomes(flood)
        return share, answers

    share, answers = run(body)
    assert answers == [f"b:{i}" for i in range(16)]
    assert share >= 0.35, f"b held {share:.0%} of the device while it had work; weights 1:1"


@pytest.mark.parametrize("shared", [False, True], ids=["alone", "with-scheduler"])
def test_a_lone_model_batches_as_without_the_scheduler(shared: bool) -> None:
    fake = Fake()

    async def body() -> list[int]:
        scheduler = DeviceScheduler() if shared else None
        batcher: DynamicBatcher[Any, Any] = DynamicBatcher(
            fake, _config(max_batch_size=4, max_latency_ms=50.0), scheduler=scheduler
        )
        await batcher.start()
        first = await busy(fake, batcher)
        rest = batcher.submit(list(range(10)))
        fake.release()
        await outcomes([first, *rest])
        lone = batcher.submit(["alone"])
        assert await outcomes(lone) == ["ralone"]
        await batcher.close()
        return fake.sizes

    assert run(body) == [1, 4, 4, 2, 1]


def test_an_idle_device_runs_a_lone_batch_at_once() -> None:
    """The other model joined but idle: one arrival runs without waiting for a batch to fill."""
    device = FifoDevice()

    async def body() -> list[Any]:
        slow_fill = _config(max_batch_size=32, max_latency_ms=60_000.0)
        models = await _models(device, DeviceScheduler(), a=slow_fill, b=slow_fill)
        answer = await outcomes(models["b"].submit(["x"]))
        after_a = models["a"].submit(["y"])
        await outcomes(after_a)
        answer += await outcomes(models["b"].submit(["z"]))
        for batcher in models.values():
            await batcher.close()
        return answer

    assert run(body) == ["b:x", "b:z"]


def test_every_future_is_settled_exactly_once_on_stop() -> None:
    """B waits for a turn while A's batch holds the device; B closes, then A; nothing is lost."""
    fake_a, fake_b = Fake(), Fake()

    async def body() -> None:
        scheduler = DeviceScheduler()
        config = _config(max_batch_size=2)
        a: DynamicBatcher[Any, Any] = DynamicBatcher(
            fake_a, config, name="a", scheduler=scheduler, device="dev"
        )
        b: DynamicBatcher[Any, Any] = DynamicBatcher(
            fake_b, config, name="b", scheduler=scheduler, device="dev"
        )
        await a.start()
        await b.start()
        running = await busy(fake_a, a)
        queued_a = a.submit(list(range(5)))
        waiting_b = b.submit(list(range(5)))
        futures = [running, *queued_a, *waiting_b]
        counts = _settled_once(futures)
        await asyncio.sleep(0.05)
        assert fake_b.calls == [], "b ran while a held the device's only slot"
        await b.close()
        assert all(isinstance(r, ModelNotReady) for r in await outcomes(waiting_b))
        fake_a.release()
        assert await outcomes(queued_a[:2]) == ["r0", "r1"]
        await a.close()
        results = await outcomes(futures)
        assert results[0] == "rbusy"
        assert all(f.done() for f in futures)
        assert set(counts.values()) == {1} and len(counts) == len(futures)
        assert scheduler.devices() == {"dev": (0, 1)}

    run(body)


def test_a_closing_model_hands_its_slot_to_a_waiting_one() -> None:
    fake_a, fake_b = Fake(), Fake()

    async def body() -> list[Any]:
        scheduler = DeviceScheduler()
        config = _config(max_batch_size=2)
        a: DynamicBatcher[Any, Any] = DynamicBatcher(
            fake_a, config, name="a", scheduler=scheduler, device="dev"
        )
        b: DynamicBatcher[Any, Any] = DynamicBatcher(
            fake_b, config, name="b", scheduler=scheduler, device="dev"
        )
        await a.start()
        await b.start()
        running = await busy(fake_a, a)
        waiting_b = b.submit(["x"])
        await asyncio.sleep(0.02)
        assert fake_b.calls == []
        await a.close()
        answer = await outcomes(waiting_b)
        fake_a.release()
        assert isinstance((await outcomes([running]))[0], ModelNotReady)
        await b.close()
        return answer

    assert run(body) == ["rx"]


def test_a_weight_must_be_positive() -> None:
    with pytest.raises(ValueError, match="weight"):
        DeviceScheduler().join("m", 0.0, {"0": "dev"})
