"""One batch bound per model: every part reads the model's resolved ``--max_batch_size``.

A family may bound its batch below the flag: a slide head serves one slide a
forward whatever ``--max_batch_size`` says (the flag is server-wide, so a
repository serving an encoder at 512 tiles a batch serves its slide head
beside it under the same flag). The package's batch axis is then a slide's
tiles, bounded by the family from the package's own range. Each part must use
the model's one resolved value (``BaseServerModel.batching``), never the raw
flag: start-up's check of the package's batch range and its choice in a
package set, the batcher, the device workers, the front ends' shared-memory
slab, ``/config`` and gRPC ``ModelConfig``.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from kserve import InferInput, InferRequest

from harness.packages import copy_package_dir, demo_package, package_in
from predictor import startup
from predictor.config import BatchingConfig, LimitsConfig, ModelConfig
from predictor.device.workers import DeviceWorkers
from predictor.http.grpc_config import _TYPES, SERVICE, describe_handler
from predictor.multiprocess.supervisor import slot_layout
from predictor.spec import BUILTIN_SPECS

SPEC = BUILTIN_SPECS["abmil-demo"]
PACKAGE_N = 200_000  # the package's batch axis: tiles of one slide (test_slide_server's export)
FLAG = 262_144  # a server-wide --max_batch_size above it


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    package = demo_package(SPEC.name, max_batch=PACKAGE_N)
    return copy_package_dir(package, tmp_path_factory.mktemp("abmil"))


def _build(model_dir: Path):
    config = ModelConfig(model_dir=str(model_dir), device="cpu", load_probe="off")
    batching = BatchingConfig(max_batch_size=FLAG, max_queue_size=FLAG)
    return startup.build_model(config, batching, LimitsConfig())


@pytest.fixture(scope="module")
def model(model_dir: Path):
    return _build(model_dir)


def test_start_up_checks_the_package_against_the_family_s_bound(model) -> None:
    """Served, not refused for a batch range (1..200,000 tiles) the flag's 262,144 is above."""
    assert model.batching.max_batch_size == 1
    assert model.get_metadata()["batching"]["max_batch_size"] == 1  # GET .../config


def test_a_package_set_is_judged_by_the_family_s_bound(model_dir: Path, tmp_path: Path) -> None:
    for name in ("a.pt2", "b.pt2"):  # one build twice: a set of one key, the same bytes
        shutil.copy(package_in(model_dir), tmp_path / name)
    model = _build(tmp_path)
    assert model.batching.max_batch_size == 1
    choice = model.get_metadata()["package_choice"]
    assert choice["chosen"] == "a.pt2"
    assert choice["rejected"] == [{"file": "b.pt2", "mismatch": "fits, ranked below a.pt2"}]


def test_grpc_model_config_says_one(model) -> None:
    handler = describe_handler(SimpleNamespace(get_model=lambda name: model))
    method = handler.service(SimpleNamespace(method=f"/{SERVICE}/ModelConfig"))
    request = _TYPES["ModelConfigRequest"](name=model.name)
    response = asyncio.run(method.unary_unary(request, None))
    assert response.config.max_batch_size == 1


def test_the_front_ends_slab_holds_one_slide_a_running_batch(model) -> None:
    batching = model.batching
    for workers in (1, 3):
        queued = batching.max_queue_size * batching.priority_levels
        assert slot_layout(model, workers).slots == 2 * (queued + 1 * workers)


def test_the_batcher_and_the_workers_run_one_slide_a_forward(
    model, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two slides of one size queued behind the running ones: a forward each, never two slides."""
    bounds: list[int] = []
    real_runs = DeviceWorkers.runs

    def runs(self, first, first_slot, forward, instances, max_batch=0, **kwargs):
        bounds.append(max_batch)
        return real_runs(self, first, first_slot, forward, instances, max_batch, **kwargs)

    monkeypatch.setattr(DeviceWorkers, "runs", runs)
    sizes: list[int] = []
    gate = threading.Event()
    forward_batch = model.family.forward_batch

    def recording(samples, requests, mode, slot):
        sizes.append(len(samples))
        gate.wait(30)  # the running forwards wait until every slide is queued
        return forward_batch(samples, requests, mode, slot)

    monkeypatch.setattr(model.family, "forward_batch", recording)
    features = np.random.default_rng(0).normal(size=(5, SPEC.feature_dim)).astype(np.float32)

    def request() -> InferRequest:
        inp = InferInput("features", list(features.shape), "FP32")
        inp._raw_data = features.tobytes()
        return InferRequest(model_name=model.name, infer_inputs=[inp])

    async def scenario() -> int:
        await model.start_batching()
        slides = len(model.batcher.workers) + 2  # every worker busy, two slides queued
        prepared = [await model.preprocess(request()) for _ in range(slides)]
        tasks = [asyncio.create_task(model.predict(p)) for p in prepared]
        deadline = time.monotonic() + 30
        n = len(features)

        def waiting() -> bool:  # until two slides queue behind the running ones, or a forward
            queued = model.batcher.queue_depth  # took several (the bound is not 1)
            return max(sizes, default=1) == 1 and (
                queued < 2 * n or len(sizes) + queued // n < slides
            )

        while waiting():
            assert time.monotonic() < deadline, (sizes, model.batcher.queue_depth)
            await asyncio.sleep(0.01)
        gate.set()
        await asyncio.gather(*tasks)
        await model.drain(10.0)
        return slides

    slides = asyncio.run(scenario())
    assert bounds == [1]
    assert sizes == [1] * slides
