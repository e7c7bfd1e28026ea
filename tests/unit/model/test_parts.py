"""The served model's parts: its family's ``outputs(mode)``, a front end said at construction,
a request's path that never comes back into the model class.

``outputs`` is the one description of what a model returns: the metadata's
outputs, the codec's datatypes and each mode's names all read it, so they
cannot disagree. A front end is built with a :class:`FrontEnd` (the owner's
batcher and config): it loads no package, and what its answers say of the
package is the owner's.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import pytest

from harness.packages import package_in
from harness.tiles import b64, encode_png, random_tiles
from predictor.families import server_model
from predictor.model.base import BaseServerModel, FrontEnd
from predictor.spec import BUILTIN_SPECS


@pytest.mark.parametrize("name", ["h0-mini", "m-optimus", "tissue-seg", "abmil-demo", "mean-pool"])
def test_each_modes_outputs_are_among_the_models_outputs(name: str) -> None:
    spec = BUILTIN_SPECS[name]
    model = server_model(spec, "absent.pt2", device="cpu")
    every = {o["name"]: o for o in model.get_output_types()}
    assert every, name
    for mode in spec.modes:
        names = model.output_names(mode)
        assert names and set(names) <= set(every), (mode, names)
        for output in model.family.outputs(mode):
            assert output.as_v2() == every[output.name]


class _OwnersBatcher:
    """A stand-in for the owner's batcher: records what the model asks of it."""

    def __init__(self) -> None:
        self.started = False
        self.queue_depth = 0
        self.healthy = True
        self.workers: tuple[Any, ...] = ()

    async def start(self) -> None:
        self.started = True

    def submit(self, items: Sequence[Any], key: Hashable = None) -> list[asyncio.Future[Any]]:
        raise AssertionError("not called here")

    async def drain(self, timeout_s: float) -> bool:
        return True

    async def close(self) -> None:
        pass

    def close_nowait(self) -> list[asyncio.Task[None]]:
        return []


def test_a_front_end_loads_no_package_and_names_the_owners(tmp_path: Path) -> None:
    spec = BUILTIN_SPECS["h0-mini"]
    batcher = _OwnersBatcher()
    owner = {"package_sha256": "ab" * 32, "package_metadata": {}}
    model = BaseServerModel(
        spec, "absent.pt2", device="cpu", model_root=tmp_path, front_end=FrontEnd(batcher, owner)
    )
    assert model.load()  # no package file exists: a front end never opens one
    assert model.served.package is None
    assert model.served.answer_parameters()["package_sha256"] == "ab" * 32
    asyncio.run(model.start_batching())
    assert batcher.started and model.batcher is batcher
    model.stop()


def test_a_model_without_a_front_end_loads_its_package(embedding_package_dir: Path) -> None:
    spec = BUILTIN_SPECS["h0-mini"]
    path = package_in(embedding_package_dir)
    model = BaseServerModel(spec, path.name, device="cpu", model_root=embedding_package_dir)
    assert model.load()
    assert model.served.package is not None
    assert model.served.answer_parameters()["package_sha256"] == model.served.package.sha256
    model.stop()


def _model_class_frames(model_cls: type, body: Any, embedding_package_dir: Path) -> set[str]:
    """The functions of ``predictor/model/base.py`` that ran while one request was served
    (every thread: the loop, the decode pool, the device worker), past the model's ``__call__``."""
    from predictor.model import base

    spec = BUILTIN_SPECS["h0-mini"]
    path = package_in(embedding_package_dir)
    ran: set[str] = set()
    serving = False

    def profile(frame: Any, event: str, arg: Any) -> None:
        if serving and event == "call" and frame.f_code.co_filename == base.__file__:
            ran.add(frame.f_code.co_name)

    async def scenario() -> Any:
        nonlocal serving
        model = model_cls(spec, path.name, device="cpu", model_root=embedding_package_dir)
        model.load()
        await model.start_batching()
        serving = True
        answer, _ = await model(body)
        serving = False
        await model.drain(5.0)
        model.stop()
        return answer

    sys.setprofile(profile)
    threading.setprofile(profile)  # the threads the model starts: pool and device worker
    try:
        answer = asyncio.run(scenario())
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    assert len(answer["predictions"]) == 2
    return ran


def test_a_request_does_not_come_back_into_the_model_class(embedding_package_dir: Path) -> None:
    """KServe's entry point hands the request to the pipeline; decode, the batcher, the
    forward and the answer are the pipeline's, the family's and the device side's."""
    tiles = random_tiles(2, seed=3)
    body = {"instances": [{"image_data": b64(encode_png(t))} for t in tiles]}
    assert _model_class_frames(BaseServerModel, body, embedding_package_dir) == {"__call__"}

    class Overriding(BaseServerModel):  # the seed's hooks, overridden: called, and only they
        def prepare_sample(self, request):  # type: ignore[no-untyped-def]
            return super().prepare_sample(request)

        def forward_batch(self, samples, requests, mode="prediction"):  # type: ignore[no-untyped-def]
            return super().forward_batch(samples, requests, mode)

    ran = _model_class_frames(Overriding, body, embedding_package_dir)
    assert ran == {"__call__", "prepare_sample", "forward_batch", "active_slot"}
