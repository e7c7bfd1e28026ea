"""The seed's extension API (``seed/server_model.md``), in-process.

The seed's names import from the package root without torch or KServe until
``BaseServerModel`` is asked for; a ``(C, H, W)`` tile, the seed's layout,
gives the same answers as the fast ``(H, W, 3)`` one; ``forward_batch``
gets each sample's own request; ``--model_class`` names a subclass, and
every way of naming something else is one clear start-up error. Models are
built through the public constructor, on the real demo package.
"""

from __future__ import annotations

import asyncio
import base64
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from harness.packages import package_in
from harness.reference import Reference, normalise_reference
from harness.seed_model import UnitNormEmbedder
from harness.tiles import encode_png, random_tiles
from predictor.errors import InvalidInput, StartupError
from predictor.families import load_model_class
from predictor.spec import BUILTIN_SPECS

ROOT = Path(__file__).resolve().parents[2]
SPEC = BUILTIN_SPECS["h0-mini"]


def _load(cls: type, model_dir: Path) -> Any:
    model = cls(SPEC, package_in(model_dir).name, device="cpu", model_root=model_dir)
    model.load()
    return model


@pytest.fixture(scope="module")
def base(embedding_package_dir: Path) -> Any:
    from predictor import BaseServerModel

    return _load(BaseServerModel, embedding_package_dir)


def test_the_seed_names_import_from_the_root_without_torch_or_kserve():
    code = (
        "import sys, predictor, histoserve.remote.client\n"
        "from predictor import PreparedSample, ModelRequest, ModelResponse\n"
        "print(sorted({'torch', 'kserve'} & set(sys.modules)))\n"
        "from predictor import BaseServerModel\n"
        "from predictor.model.base import BaseServerModel as Defined\n"
        "print(BaseServerModel is Defined, 'torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.split("\n")[:2] == ["[]", "True True"]
    import predictor

    assert {"BaseServerModel", "PreparedSample", "ModelRequest", "ModelResponse"} <= set(
        dir(predictor)
    )
    with pytest.raises(AttributeError, match="no attribute 'TileServerModel'"):
        predictor.TileServerModel  # noqa: B018


def test_a_chw_tile_answers_like_the_hwc_one(base: Any, embedding_package_dir: Path):
    from predictor import ModelRequest, PreparedSample

    tiles = random_tiles(4, seed=11)
    requests = [ModelRequest(i, pixels=t) for i, t in enumerate(tiles)]
    hwc = [base.prepare_sample(r) for r in requests]
    layouts = {
        "hwc": hwc,
        "chw": [PreparedSample(np.ascontiguousarray(t.transpose(2, 0, 1))) for t in tiles],
        "chw-view": [PreparedSample(t.transpose(2, 0, 1)) for t in tiles],
        "chw-tensor": [PreparedSample(torch.from_numpy(t.copy()).permute(2, 0, 1)) for t in tiles],
    }
    answers = {
        name: np.stack(
            [r.outputs["embedding"] for r in base.forward_batch(s, requests, "embedding")]
        )
        for name, s in layouts.items()
    }
    for name, got in answers.items():
        np.testing.assert_array_equal(got, answers["hwc"], err_msg=name)
    want = Reference(package_in(embedding_package_dir))(normalise_reference(tiles))[0]
    np.testing.assert_allclose(answers["hwc"], want, atol=1e-4, rtol=1e-4)
    legacy = base.forward(requests)  # the seed's legacy path: the primary output, on the host
    assert isinstance(legacy, torch.Tensor) and tuple(legacy.shape) == (4, SPEC.embedding_dim)
    np.testing.assert_allclose(legacy.numpy(), want, atol=1e-4, rtol=1e-4)


def test_a_user_subclass_prepares_chw_and_sees_each_samples_request(embedding_package_dir):
    """The seed-page model in-process: its own hooks run, through the real stages and batcher."""
    seen: list[tuple[int, int]] = []

    class Recording(UnitNormEmbedder):
        def forward_batch(self, samples, requests, mode="prediction"):
            for sample, request in zip(samples, requests, strict=True):
                assert np.asarray(sample.tile).shape == (3, 224, 224)  # the user's layout
                seen.append((int(np.asarray(sample.tile)[0, 0, 0]), request.index))
            return super().forward_batch(samples, requests, mode)

    model = _load(Recording, embedding_package_dir)
    tiles = random_tiles(5, seed=12)
    tiles[:, 0, 0, 0] = np.arange(5) + 100  # each tile's mark
    body = {"instances": [{"image_data": base64.b64encode(encode_png(t)).decode()} for t in tiles]}
    blank = {"instances": [{"image_data": base64.b64encode(encode_png(tiles[0] * 0)).decode()}]}

    async def scenario() -> Any:
        await model.start_batching()
        result = await model.postprocess(await model.predict(await model.preprocess(body)))
        with pytest.raises(InvalidInput, match="input 'image_data' tile 0: blank tile"):
            await model.preprocess(blank)
        assert await model.drain(5.0)
        return result

    result = asyncio.run(scenario())
    model.stop()
    assert sorted(seen) == [(100 + i, i) for i in range(5)]
    got = np.stack([np.asarray(p["output"]) for p in result["predictions"]])
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-5)


@pytest.mark.parametrize(
    ("target", "needle"),
    [
        ("harness.seed_model", "expected MODULE:CLASS"),
        ("no_such_module_xyz:Model", "cannot import 'no_such_module_xyz': ModuleNotFoundError"),
        ("harness.seed_model:Missing", "module 'harness.seed_model' has no 'Missing'"),
        ("harness.seed_model:BLANK_BELOW", "is not a subclass of predictor.BaseServerModel"),
        ("predictor.codecs.samples:PreparedSample", "is not a subclass"),
    ],
)
def test_model_class_errors_are_startup_errors(target, needle):
    with pytest.raises(StartupError, match=needle):
        load_model_class(target)


def test_model_class_names_a_subclass():
    assert load_model_class("harness.seed_model:UnitNormEmbedder") is UnitNormEmbedder
