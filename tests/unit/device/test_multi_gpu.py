"""``--device auto`` with several GPUs: one device worker (and package) per GPU.

This machine has no GPU, so fakes stand in for what cannot exist here:
the host's GPU count (``HostFacts`` with several compute capabilities), the
per-device load (``open_package`` loads the real package on the CPU, once
per fake GPU, and records the device it was asked for) and, with several
instances, each worker's CUDA stream. Everything else is real: start-up,
the probe per package, the batcher and its workers.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry

from predictor import startup
from predictor.codecs.samples import ModelRequest, PreparedSample
from predictor.config import BatchingConfig, LimitsConfig, ModelConfig
from predictor.device import streams as device_mod
from predictor.device.slot import DeviceSlot
from predictor.device.workers import DeviceWorkers
from predictor.errors import DeviceLost, StartupError
from predictor.model.forward import BatchItem
from predictor.model.metrics import create_metrics
from predictor.packages.host import HostFacts
from predictor.runtime.devices import resolve_devices
from predictor.runtime.loader import open_package

FLAGS = frozenset({"avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq"})


def _host(gpus: int) -> HostFacts:
    return HostFacts("linux", "x86_64", FLAGS, cuda_capabilities=("90",) * gpus)


@pytest.mark.parametrize(
    ("requested", "gpus", "expected"),
    [
        ("auto", 3, ["cuda:0", "cuda:1", "cuda:2"]),
        ("auto", 1, ["cuda:0"]),
        ("auto", 0, ["cpu"]),
        ("cuda:1", 3, ["cuda:1"]),  # an explicit GPU stays one device
        ("cuda", 2, ["cuda:0"]),
        ("cpu", 2, ["cpu"]),
    ],
)
def test_resolve_devices(requested: str, gpus: int, expected: list[str]) -> None:
    assert [str(d) for d in resolve_devices(requested, _host(gpus))] == expected


def test_resolve_devices_keeps_the_errors() -> None:
    with pytest.raises(StartupError, match="has 2 GPU"):
        resolve_devices("cuda:2", _host(2))


class _Runner:
    """Wraps a real runner; records which fake GPU ran, and can be told to fail or wait."""

    def __init__(self, inner: Any, name: str, ran: list[str]) -> None:
        self.inner, self.name, self.ran = inner, name, ran
        self.armed = False
        self.lost = False
        self.wait_for: threading.Event | None = None
        self.done = threading.Event()

    def __call__(self, *inputs: torch.Tensor) -> Any:
        if self.armed:
            if self.lost:
                raise DeviceLost(f"{self.name}: device lost (fake)")
            if self.wait_for is not None:
                assert self.wait_for.wait(30), f"{self.name}: the other worker never ran"
            self.ran.append(self.name)
            self.done.set()
        return self.inner(*inputs)

    def get_metadata(self) -> Any:
        return self.inner.get_metadata()


def _build(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch, gpus: int, instances: int = 1
) -> tuple[Any, dict[str, _Runner], list[str]]:
    monkeypatch.setattr(
        startup, "create_metrics", lambda name: create_metrics(name, CollectorRegistry())
    )
    monkeypatch.setattr(
        startup, "resolve_devices", lambda requested: resolve_devices(requested, _host(gpus))
    )
    runners: dict[str, _Runner] = {}
    ran: list[str] = []

    def load_on_cpu(path: Path, device: torch.device, facts: Any, phases: Any, **kw: Any) -> Any:
        package = open_package(path, torch.device("cpu"), facts, phases, **kw)  # fake GPU
        runners[str(device)] = _Runner(package.runner, str(device), ran)
        return replace(package, runner=runners[str(device)])

    monkeypatch.setattr(startup, "open_package", load_on_cpu)
    config = ModelConfig(
        model_dir=model_dir,
        device="auto",
        preprocess_workers=1,
        instances_per_device=instances,
        load_probe="off",  # a fake GPU's package cannot be probed in a child process
    )
    batching = BatchingConfig(max_batch_size=1, max_latency_ms=1, max_queue_size=16)
    return startup.build_model(config, batching, LimitsConfig()), runners, ran


def _tiles(n: int) -> list[BatchItem]:
    """``n`` random tiles as the batcher carries them: prepared sample and request."""
    rng = np.random.default_rng(3)
    tiles = [rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for _ in range(n)]
    return [
        BatchItem(PreparedSample(tile=t), ModelRequest(i, pixels=t)) for i, t in enumerate(tiles)
    ]


def test_one_worker_and_package_per_gpu(
    embedding_package_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, runners, ran = _build(embedding_package_dir, monkeypatch, gpus=2)
    assert list(runners) == ["cuda:0", "cuda:1"]  # the package loaded once per GPU
    for runner in runners.values():
        runner.armed = True
    # cuda:0 takes the first batch and holds it until cuda:1 has run the second.
    runners["cuda:0"].wait_for = runners["cuda:1"].done
    tile = _tiles(1)[0]

    async def body() -> list[Any]:
        await model.start_batching()
        assert [w.name for w in model.batcher.workers] == ["cuda:0", "cuda:1"]
        first = model.batcher.submit([tile], key="embedding")
        second = model.batcher.submit([tile], key="embedding")
        results = await asyncio.gather(*first, *second)
        await model.batcher.close()
        return results

    a, b = asyncio.run(body())
    model.stop()
    assert ran == ["cuda:1", "cuda:0"]
    np.testing.assert_array_equal(a.outputs["embedding"], b.outputs["embedding"])


def test_the_pod_stays_live_while_any_gpu_worker_is(
    embedding_package_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, runners, ran = _build(embedding_package_dir, monkeypatch, gpus=2)
    for runner in runners.values():
        runner.armed = True
    runners["cuda:0"].lost = True
    tile = _tiles(1)[0]

    async def body() -> None:
        await model.start_batching()
        batcher = model.batcher
        lost = await asyncio.gather(
            *batcher.submit([tile], key="embedding"), return_exceptions=True
        )
        assert isinstance(lost[0], Exception)  # cuda:0 was idle first, took it and was lost
        assert model.live
        assert [w.alive for w in batcher.workers] == [False, True]
        for _ in range(2):
            await asyncio.gather(*batcher.submit([tile], key="embedding"))
        runners["cuda:1"].lost = True
        await asyncio.gather(*batcher.submit([tile], key="embedding"), return_exceptions=True)
        assert not model.live  # no worker left: liveness fails, the pod restarts
        await batcher.close()

    asyncio.run(body())
    model.stop()
    assert ran == ["cuda:1", "cuda:1"]


class _FakeStream:
    """Stands in for a worker's CUDA stream (no CUDA here): records the slot bound inside it.

    The first entry waits at ``barrier`` until every worker is inside its
    stream, so the workers provably run at once.
    """

    def __init__(self, device: torch.device, model: Any, barrier: threading.Barrier) -> None:
        self.device, self.model, self.barrier = device, model, barrier
        self.seen: list[Any] = []

    @contextmanager
    def active(self) -> Iterator[None]:
        barrier, self.barrier = self.barrier, None
        if barrier is not None:
            barrier.wait(timeout=30)
        yield

    def synchronize(self) -> None:
        self.seen.append(self.model.active_slot())


def test_instances_on_every_gpu_each_with_its_own_slot(
    embedding_package_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, runners, ran = _build(embedding_package_dir, monkeypatch, gpus=2, instances=2)
    streams: list[_FakeStream] = []
    barrier = threading.Barrier(4)

    def fake_worker_stream(device: torch.device) -> _FakeStream:  # a CUDA stream's stand-in
        streams.append(_FakeStream(device, model, barrier))
        return streams[-1]

    monkeypatch.setattr(device_mod, "worker_stream", fake_worker_stream)
    for runner in runners.values():
        runner.armed = True
    tiles = _tiles(4)

    async def body() -> list[str]:
        await model.start_batching()
        names = [w.name for w in model.batcher.workers]
        futures = [f for t in tiles for f in model.batcher.submit([t], key="embedding")]
        await asyncio.gather(*futures)
        await model.batcher.close()
        return names

    names = asyncio.run(body())
    model.stop()
    assert names == ["cuda:0#0", "cuda:0#1", "cuda:1#0", "cuda:1#1"]
    assert sorted(ran) == ["cuda:0", "cuda:0", "cuda:1", "cuda:1"]  # all four at once
    slots = [s.seen[0] for s in streams]
    assert [slot.stream for slot in slots] == streams  # each worker ran in its own stream
    assert len({id(slot.normalizer) for slot in slots}) == 4
    assert [slot.package.runner.name for slot in slots] == ["cuda:0", "cuda:0", "cuda:1", "cuda:1"]


def test_worker_names_per_device_and_instance() -> None:
    def forward(samples: list[Any], mode: Any) -> list[Any]:
        return samples

    cpu = SimpleNamespace(device=torch.device("cpu"))
    first = DeviceSlot(package=cpu, normalizer=_FakeNormalizer())  # type: ignore[arg-type]
    workers = DeviceWorkers()
    lone = workers.runs("cpu", first, forward, 1)
    assert callable(lone) and lone([7], None) == [7]  # one callable, as before
    assert list(workers.runs("cpu", first, forward, 2)) == ["cpu#0", "cpu#1"]
    workers.slots["cuda:1"] = first
    runs = workers.runs("cuda:0", first, forward, 2)
    assert list(runs) == ["cuda:0#0", "cuda:0#1", "cuda:1#0", "cuda:1#1"]
    bound: list[Any] = []
    made: list[str] = []
    workers = DeviceWorkers(stream_factory=lambda d: made.append(str(d)))  # no stream: CPU-like
    workers.slots["cuda:1"] = slot = DeviceSlot(package=cpu, normalizer=_FakeNormalizer())  # type: ignore[arg-type]
    runs = workers.runs("cuda:0", first, lambda s, m: bound.append(workers.current()) or s, 1)
    assert list(runs) == ["cuda:0", "cuda:1"] and made == ["cpu", "cpu"]
    runs["cuda:0"]([1], None)
    runs["cuda:1"]([1], None)
    assert [b.normalizer for b in bound] == [first.normalizer, slot.normalizer]
    assert workers.current() is None  # unbound after the forward
    with pytest.raises(ValueError, match="must be >= 1, got 0"):
        workers.runs("cpu", first, forward, 0)


class _FakeNormalizer:
    """Only what worker slots ask of a normaliser: a copy for another instance."""

    def for_another_worker(self) -> _FakeNormalizer:
        return _FakeNormalizer()

    def reserve(self, max_batch: int) -> None:
        """Sizing the staging buffer: nothing to size here."""
