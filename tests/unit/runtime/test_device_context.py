"""Every call into a package runs with that package's device current and its worker's stream.

Only a GPU can show the real failure (issue 17, defect 1: an AOTInductor
container leaves the last GPU current after its constructor, and its
completion event is created on whatever device is current at its first
run). This machine has none, so fakes stand in for what cannot exist here,
and say so:

* the devices: CPU devices with an index (``cpu:0``, ``cpu:1``) stand for
  ``cuda:0``, ``cuda:1`` (torch accepts ``cpu:N`` and keeps its tensors on
  the CPU), so start-up, the probe and the batcher run for real;
* the device context: a :class:`Recorder` injected through
  :func:`predictor.runtime.device_context.use_device_context` keeps, per
  thread, the current device and each device's current stream the way CUDA
  does, and the package's runner records them at every call;
* the workers' CUDA streams: one :class:`FakeStream` per worker.

The GPU check (``make gpu-check``) runs the same paths on a real GPU.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry

from predictor import startup
from predictor.codecs.samples import ModelRequest, PreparedSample
from predictor.config import BatchingConfig, LimitsConfig, ModelConfig
from predictor.device import streams as device_mod
from predictor.model.forward import BatchItem
from predictor.model.metrics import create_metrics
from predictor.runtime import loader
from predictor.runtime.device_context import on_device, use_device_context


class Recorder:
    """A fake device context: per thread, the current device and each device's current stream."""

    def __init__(self) -> None:
        self._local = threading.local()

    def _state(self) -> dict[str, Any]:
        if not hasattr(self._local, "state"):
            self._local.state = {"device": None, "streams": {}}
        return self._local.state

    def current(self) -> tuple[str | None, Any]:
        """(current device, that device's current stream) for the calling thread."""
        state = self._state()
        return state["device"], state["streams"].get(state["device"])

    @contextmanager
    def enter(self, device: torch.device, stream: Any) -> Iterator[None]:
        state = self._state()
        saved = state["device"], dict(state["streams"])
        state["device"] = str(device)
        if stream is not None:
            state["streams"][str(device)] = stream
        try:
            if stream is None:
                yield
            else:
                with stream.active():
                    yield
        finally:
            state["device"], state["streams"] = saved


class FakeStream:
    """A worker's CUDA stream's stand-in (no CUDA here)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    @contextmanager
    def active(self) -> Iterator[None]:
        yield

    def synchronize(self) -> None:
        """Nothing is queued on the CPU."""

    def __repr__(self) -> str:
        return f"FakeStream({self.device})"


class RecordingRunner:
    """Wraps a real runner; records (what it runs for, current device, current stream) per call."""

    def __init__(self, inner: Any, label: str, recorder: Recorder, calls: list[Any]) -> None:
        self.inner, self.label, self.recorder, self.calls = inner, label, recorder, calls

    def __call__(self, *inputs: torch.Tensor) -> Any:
        self.calls.append(("run", self.label, *self.recorder.current()))
        return self.inner(*inputs)

    def get_metadata(self) -> Any:
        return self.inner.get_metadata()


def _build(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch, devices: tuple[torch.device, ...]
) -> tuple[Any, Recorder, list[Any], dict[str, FakeStream]]:
    recorder, calls, streams = Recorder(), [], {}
    real_load = loader._load_runner

    def load(path: Path, device: torch.device, *args: Any, **kwargs: Any) -> Any:
        calls.append(("load", str(device), *recorder.current()))
        inner = real_load(path, torch.device("cpu"), *args, **kwargs)  # the CPU stands in
        return RecordingRunner(inner, str(device), recorder, calls)

    def stream_for(device: torch.device) -> FakeStream:
        streams[str(device)] = FakeStream(device)
        return streams[str(device)]

    monkeypatch.setattr(loader, "_load_runner", load)
    monkeypatch.setattr(startup, "resolve_devices", lambda requested: devices)
    monkeypatch.setattr(device_mod, "worker_stream", stream_for)
    monkeypatch.setattr(
        startup, "create_metrics", lambda name: create_metrics(name, CollectorRegistry())
    )
    # One worker per stand-in GPU, as ``auto`` gives on real ones (these devices say "cpu").
    config = ModelConfig(
        model_dir=model_dir, device="auto", preprocess_workers=1, instances_per_device=1
    )
    batching = BatchingConfig(max_batch_size=2, max_latency_ms=1, max_queue_size=16)
    with use_device_context(recorder):
        model = startup.build_model(config, batching, LimitsConfig())
    return model, recorder, calls, streams


def _serve(model: Any, recorder: Recorder, calls: list[Any], requests: int) -> None:
    """Serves ``requests`` one-tile requests; records the context of every copy back."""
    real_copy_back = model.family.output_to_host

    def copy_back(output: torch.Tensor) -> torch.Tensor:
        calls.append(("copy_back", None, *recorder.current()))
        return real_copy_back(output)

    model.family.output_to_host = copy_back
    pixels = np.zeros((224, 224, 3), dtype=np.uint8)
    tile = BatchItem(PreparedSample(tile=pixels), ModelRequest(0, pixels=pixels))

    async def body() -> None:
        await model.start_batching()
        batcher = model.batcher  # every request at once, so every worker gets some
        await asyncio.gather(
            *(f for _ in range(requests) for f in batcher.submit([tile], key="embedding"))
        )
        await batcher.close()

    with use_device_context(recorder):
        asyncio.run(body())
    model.stop()


def test_every_call_into_each_gpu_package_runs_on_its_device_and_stream(
    embedding_package_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    devices = (torch.device("cpu", 0), torch.device("cpu", 1))  # stand for cuda:0, cuda:1
    model, recorder, calls, streams = _build(embedding_package_dir, monkeypatch, devices)
    startup_calls = list(calls)
    # Load, then the probe (batches of 1 and 2) of each package, on its own device, default stream.
    loads = [c for c in startup_calls if c[0] == "load"]
    assert loads == [("load", "cpu:0", "cpu:0", None), ("load", "cpu:1", "cpu:1", None)]
    probes = [c for c in startup_calls if c[0] == "run"]
    assert len(probes) == 4
    assert all(c[2] == c[1] and c[3] is None for c in probes), probes
    calls.clear()
    _serve(model, recorder, calls, requests=6)
    runs = [c for c in calls if c[0] == "run"]
    assert {c[1] for c in runs} == {"cpu:0", "cpu:1"}  # both workers served
    for _, package, device, stream in runs:
        assert device == package and stream is streams[package], (package, device, stream)
    copies = [c for c in calls if c[0] == "copy_back"]
    assert len(copies) == len(runs)
    assert all(c[3] is streams[c[2]] for c in copies)


def test_the_lone_worker_of_another_gpu_runs_there_too(
    embedding_package_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--device cuda:1`` alone: one worker, no stream of its own, still on its device."""
    model, recorder, calls, streams = _build(
        embedding_package_dir, monkeypatch, (torch.device("cpu", 1),)
    )
    calls.clear()
    _serve(model, recorder, calls, requests=2)
    assert streams == {}
    assert [c[0] for c in calls][:2] == ["run", "copy_back"]
    assert all(c[2] == "cpu:1" and c[3] is None for c in calls), calls


def test_on_device_nests_like_cuda() -> None:
    """An inner block without a stream keeps the stream an outer block made current."""
    recorder, stream = Recorder(), FakeStream(torch.device("cpu", 1))
    with use_device_context(recorder):
        with on_device("cpu:1", stream):
            with on_device("cpu:1"):
                assert recorder.current() == ("cpu:1", stream)
            with on_device("cpu:0"):
                assert recorder.current() == ("cpu:0", None)
        assert recorder.current() == (None, None)
    with on_device("cpu"):  # the real context: nothing to do on the CPU
        assert recorder.current() == (None, None)
