"""``--instances_per_device N``: N device workers on one queue, each with its own slot.

Every worker gets its own normaliser (so its own staging buffer) and, on
CUDA, its own stream. This machine has no GPU, so where a CUDA stream would
be, a fake one (:class:`FakeStream`) is injected in place of
:func:`predictor.device.worker_stream`; it records which worker ran inside
it and can hold workers until they all are inside at once, or fail the way
a sticky CUDA error surfaces at a stream sync. Everything else is real: the
package on the CPU, start-up, the batcher and its worker threads, and a
real server with two instances.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry

from harness.reference import Reference, normalise_reference
from histoserve import HistoserveClient
from predictor import startup
from predictor.cli import build_parser, configs_from_args
from predictor.codecs.samples import ModelRequest, PreparedSample
from predictor.config import BatchingConfig, LimitsConfig, ModelConfig
from predictor.device import streams as device_mod
from predictor.model.forward import BatchItem
from predictor.model.metrics import create_metrics


class FakeStream:
    """Stands in for a worker's CUDA stream (no CUDA here); same protocol as ``WorkerStream``.

    Args:
        model: Asked, from inside the stream, which slot the thread has bound.
        barrier: When given, the first entry waits there until every stream
            sharing it has been entered (so the workers provably overlap).
    """

    def __init__(self, model: Any, barrier: threading.Barrier | None = None) -> None:
        self.model, self.barrier = model, barrier
        self.threads: set[int] = set()
        self.seen: list[Any] = []  # the slot bound at each sync
        self.sticky_error: str | None = None

    @contextmanager
    def active(self) -> Iterator[FakeStream]:
        self.threads.add(threading.get_ident())
        barrier, self.barrier = self.barrier, None
        if barrier is not None:
            barrier.wait(timeout=30)
        yield self

    def synchronize(self) -> None:
        self.seen.append(self.model.active_slot())
        if self.sticky_error:
            raise RuntimeError(self.sticky_error)


def _build(
    model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    instances: int,
    barrier: threading.Barrier | None = None,
) -> tuple[Any, list[FakeStream], CollectorRegistry]:
    registry = CollectorRegistry()
    monkeypatch.setattr(startup, "create_metrics", lambda name: create_metrics(name, registry))
    config = ModelConfig(
        model_dir=model_dir, device="cpu", preprocess_workers=1, instances_per_device=instances
    )
    batching = BatchingConfig(max_batch_size=2, max_latency_ms=1, max_queue_size=64)
    model = startup.build_model(config, batching, LimitsConfig())
    streams: list[FakeStream] = []

    def fake_worker_stream(device: torch.device) -> FakeStream:  # a CUDA stream's stand-in
        streams.append(FakeStream(model, barrier))
        return streams[-1]

    monkeypatch.setattr(device_mod, "worker_stream", fake_worker_stream)
    return model, streams, registry


def _tiles(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 224, 224, 3), dtype=np.uint8)


def _items(tiles: np.ndarray) -> list[BatchItem]:
    """The batcher's items for raw tiles: each prepared sample with its request."""
    return [
        BatchItem(PreparedSample(tile=t), ModelRequest(i, pixels=t)) for i, t in enumerate(tiles)
    ]


async def _serve(model: Any, requests: list[np.ndarray]) -> list[Any]:
    """Every request submitted at once; each one's responses (or its exception)."""
    await model.start_batching()
    batcher = model.batcher
    waits = [asyncio.gather(*batcher.submit(_items(tiles), key="embedding")) for tiles in requests]
    results = await asyncio.gather(*waits, return_exceptions=True)
    await batcher.close()
    return results


def test_flag_and_config_validate() -> None:
    args = build_parser().parse_args(["--instances_per_device", "3"])
    assert configs_from_args(args)[0].instances_per_device == 3
    assert build_parser().parse_args([]).instances_per_device is None  # auto
    with pytest.raises(ValueError, match="instances_per_device must be >= 1, got 0"):
        ModelConfig(instances_per_device=0)


def test_each_instance_has_its_own_normaliser_buffer_and_stream(
    embedding_package_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Both workers must be inside their streams at once before either goes on.
    model, streams, _ = _build(embedding_package_dir, monkeypatch, 2, threading.Barrier(2))
    requests = [_tiles(2, seed) for seed in range(6)]
    results = asyncio.run(_serve(model, requests))
    model.stop()
    assert not [r for r in results if isinstance(r, BaseException)]
    assert len(streams) == 2 and all(s.seen for s in streams)  # both workers ran
    a, b = (s.seen[0] for s in streams)
    assert all(slot is s.seen[0] for s in streams for slot in s.seen)  # one slot per worker
    assert a.stream is streams[0] and b.stream is streams[1]  # each forward ran in its stream
    assert a.normalizer is not b.normalizer
    assert a.package is b.package  # one container, one model copy per instance
    buffers = [slot.normalizer.host_buffer for slot in (a, b)]
    assert all(buf is not None for buf in buffers)
    assert buffers[0].data_ptr() != buffers[1].data_ptr()
    assert len(streams[0].threads | streams[1].threads) == 2  # one thread per worker


def test_two_instances_answer_tile_for_tile_like_the_package(
    embedding_package_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, streams, _ = _build(embedding_package_dir, monkeypatch, 2, threading.Barrier(2))
    requests = [_tiles(1 + seed % 3, seed) for seed in range(10)]
    results = asyncio.run(_serve(model, requests))
    model.stop()
    assert all(s.seen for s in streams)  # both instances served, overlapping at least once
    (package,) = sorted(embedding_package_dir.glob("*.pt2"))
    reference = Reference(package)
    for tiles, responses in zip(requests, results, strict=True):
        (want,) = reference(normalise_reference(tiles))
        got = np.stack([r.outputs["embedding"] for r in responses])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_lost_instance_takes_every_instance_of_its_device_out(
    embedding_package_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sticky error leaves the device's one context unusable: its siblings go at once."""
    model, streams, registry = _build(embedding_package_dir, monkeypatch, 2)

    async def body() -> None:
        await model.start_batching()
        batcher = model.batcher
        # A sticky CUDA error surfaces at the sync of cpu#0 (idle first, takes the first batch).
        streams[0].sticky_error = "CUDA error: an illegal memory access was encountered (fake)"
        tile = _items(_tiles(1, 0))
        lost = await asyncio.gather(*batcher.submit(tile, key="embedding"), return_exceptions=True)
        assert isinstance(lost[0], Exception)
        assert [(w.name, w.alive) for w in batcher.workers] == [("cpu#0", False), ("cpu#1", False)]
        assert not model.live  # no worker left: liveness fails, the pod restarts
        await batcher.close()

    asyncio.run(body())
    model.stop()
    up = {
        w: registry.get_sample_value("histoserve_device_up", {"model": model.name, "worker": w})
        for w in ("cpu#0", "cpu#1")
    }
    assert up == {"cpu#0": 0.0, "cpu#1": 0.0}
    assert len(streams[1].seen) == 0 and len(streams[0].seen) == 1  # cpu#1 never ran a batch


@pytest.mark.integration
def test_two_instances_serve_concurrent_clients(
    embedding_package_dir: Path, tmp_path: Path
) -> None:
    from harness.server import start_server

    flags = ("--instances_per_device", "2", "--forward_runner", "gil_free", "--max_batch_size", "2")
    server = start_server(embedding_package_dir, tmp_path, *flags)
    rng = np.random.default_rng(9)
    requests = [rng.integers(0, 256, (2, 224, 224, 3), dtype=np.uint8) for _ in range(8)]

    def call(tiles: np.ndarray) -> np.ndarray:
        with HistoserveClient(server.base, server.model_name) as client:
            return client.infer_pixels(tiles)["embedding"]

    try:
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(call, requests))
        metrics = server.metrics()
    finally:
        assert server.stop() == 0
    assert "2 device worker(s): cpu#0, cpu#1" in server.log()
    for worker in ("cpu#0", "cpu#1"):
        assert (
            f'histoserve_device_up{{model="{server.model_name}",worker="{worker}"}} 1.0' in metrics
        )
    assert "histoserve_device_forwards_total{" in metrics
    (package,) = sorted(embedding_package_dir.glob("*.pt2"))
    reference = Reference(package)
    for tiles, got in zip(requests, answers, strict=True):
        (want,) = reference(normalise_reference(tiles))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_normaliser_for_another_worker_computes_the_same_with_its_own_state(
    embedding_package_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, _, _ = _build(embedding_package_dir, monkeypatch, 1)
    first = model.active_slot().normalizer
    twin = first.for_another_worker()
    tiles = list(_tiles(3, 5))
    torch.testing.assert_close(twin(tiles), first(tiles), rtol=0, atol=0)
    assert twin.scale is first.scale  # read-only constants, shared
    assert twin.host_buffer.data_ptr() != first.host_buffer.data_ptr()
    model.stop()


def test_streams_are_for_cuda_only() -> None:
    assert device_mod.worker_stream(torch.device("cpu")) is None
    with pytest.raises(ValueError, match="needs a CUDA device, got cpu"):
        device_mod.WorkerStream(torch.device("cpu"))
