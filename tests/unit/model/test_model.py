"""A family model in-process: prepare_sample, forward_batch, metadata, the whole request path."""

from __future__ import annotations

import asyncio
import base64
import threading

import numpy as np
import pytest

from harness.packages import package_in
from harness.reference import Reference, normalise_reference
from harness.tiles import encode_png, random_tiles
from predictor.codecs.samples import ModelRequest
from predictor.device.faults import parse_fault_spec
from predictor.errors import ForwardError, InvalidInput, ModelNotReady
from predictor.families import server_model
from predictor.model.base import BaseServerModel, ServingOptions
from predictor.spec import BUILTIN_SPECS


def _model(model_dir, spec_name="h0-mini", **kwargs):
    spec = BUILTIN_SPECS[spec_name]
    path = package_in(model_dir)
    model = server_model(spec, path.name, device="cpu", model_root=model_dir, **kwargs)
    model.load()
    return model


@pytest.fixture(scope="module")
def model(embedding_package_dir):
    return _model(embedding_package_dir)


@pytest.fixture(scope="module")
def reference(embedding_package_dir):
    return Reference(package_in(embedding_package_dir))


def test_prepare_sample_keeps_uint8_hwc(model):
    tile = random_tiles(1, seed=1)[0]
    from_png = model.prepare_sample(ModelRequest(0, image_data=encode_png(tile)))
    from_pixels = model.prepare_sample(ModelRequest(0, pixels=tile))
    assert from_png.tile.dtype == np.uint8 and from_png.tile.shape == (224, 224, 3)
    assert from_pixels.tile is tile  # raw pixels stay the request's own view
    np.testing.assert_array_equal(from_png.tile, from_pixels.tile)


@pytest.mark.parametrize(
    ("request_", "needle"),
    [
        (ModelRequest(0), "no image"),
        (ModelRequest(0, pixels=np.zeros((100, 224, 3), np.uint8)), "224x224"),
        (ModelRequest(0, pixels=np.zeros((224, 224, 3), np.float32)), "uint8"),
        (ModelRequest(0, image_data=b"GIF89a-not-really"), "image|format|decod"),
    ],
)
def test_prepare_sample_rejects_bad_tiles(model, request_, needle):
    with pytest.raises(InvalidInput, match=needle):
        model.prepare_sample(request_)


def test_forward_batch_matches_the_package(model, reference):
    tiles = random_tiles(5, seed=2)
    samples = [model.prepare_sample(ModelRequest(i, pixels=t)) for i, t in enumerate(tiles)]
    requests = [ModelRequest(i, pixels=t) for i, t in enumerate(tiles)]
    responses = model.forward_batch(samples, requests, mode="embedding")
    want = reference(normalise_reference(tiles))[0]
    assert len(responses) == 5
    for i, response in enumerate(responses):
        np.testing.assert_allclose(response.outputs["embedding"], want[i], atol=1e-4, rtol=1e-4)


def test_forward_batch_failure_is_a_forward_error(embedding_package_dir):
    model = _model(embedding_package_dir, fault_hook=parse_fault_spec("nth:1"))
    tile = random_tiles(1, seed=4)[0]
    request = ModelRequest(0, pixels=tile)
    with pytest.raises(ForwardError, match="injected"):
        model.forward_batch([model.prepare_sample(request)], [request], "embedding")
    second = model.forward_batch([model.prepare_sample(request)], [request], "embedding")
    assert second[0].outputs["embedding"].shape == (1536,)


def test_metadata_describes_model_and_config(embedding_package_dir):
    from predictor.config import BatchingConfig

    options = ServingOptions(
        batching=BatchingConfig(max_batch_size=7, max_queue_size=70), name="enc"
    )
    model = _model(embedding_package_dir, options=options)
    meta = model.get_metadata()
    assert meta["name"] == "enc" and model.model_name == "enc"
    assert meta["batching"]["max_batch_size"] == 7 and meta["spec"]["embedding_dim"] == 1536
    names = {i["name"] for i in meta["inputs"]}
    assert names == {"tiles", "pixels", "jpeg_tiles", "jpeg_layout", "jpeg_boxes"}
    assert meta["transports"] == ["pixels", "jpeg"]
    assert meta["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, 1536]}]
    assert list(meta["startup_seconds"]) == ["digest", "metadata", "load", "probe", "warmup"]
    assert meta["forward_runner"] == "torch"  # loaded by the model itself: torch's loader


@pytest.mark.parametrize(("spec_name", "log1p"), [("m-optimus", True), ("h0-mini", False)])
def test_preprocess_bulk_rna_is_the_specs_transform_on_the_base(spec_name, log1p):
    """The seed's ``preprocess_bulk_rna`` is on every model; no package needed to call it."""
    spec = BUILTIN_SPECS[spec_name]
    model = server_model(spec, "absent.pt2", device="cpu")
    raw = [0.0, 1.0, 9.0]
    want = np.log1p(raw) if log1p else np.asarray(raw)
    got = model.preprocess_bulk_rna(raw)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-6)


class ScaledCounts(BaseServerModel):
    """The seed's hook overridden: counts per thousand, then the spec's ``log1p``."""

    def preprocess_bulk_rna(self, raw):
        if np.any(np.asarray(raw) > 1e6):
            raise ValueError("counts above 1e6: not raw counts")
        return super().preprocess_bulk_rna(np.asarray(raw, np.float32) / 1000.0)


class WrongLength(BaseServerModel):
    def preprocess_bulk_rna(self, raw):
        return np.asarray(raw, np.float32)[:-1]


def _rna_request(counts: np.ndarray) -> ModelRequest:
    return ModelRequest(0, pixels=random_tiles(1, seed=3)[0], family_input=counts)


def test_a_model_class_s_preprocess_bulk_rna_is_what_stage_1_applies(multimodal_package_dir):
    counts = np.arange(64, dtype=np.float32) * 100
    model = _model(multimodal_package_dir, "m-optimus", model_class=ScaledCounts)
    sample = model.prepare_sample(_rna_request(counts))
    np.testing.assert_allclose(
        sample.extra_tensors["bulk_rna"], np.log1p(counts / 1000.0), rtol=1e-6
    )
    base = _model(multimodal_package_dir, "m-optimus").prepare_sample(_rna_request(counts))
    np.testing.assert_allclose(base.extra_tensors["bulk_rna"], np.log1p(counts), rtol=1e-6)
    with pytest.raises(ValueError, match="not raw counts"):
        model.prepare_sample(_rna_request(np.full(64, 2e6, np.float32)))
    wrong = _model(multimodal_package_dir, "m-optimus", model_class=WrongLength)
    with pytest.raises(InvalidInput, match=r"preprocess_bulk_rna returned shape \[63\] for \[64\]"):
        wrong.prepare_sample(_rna_request(counts))


def test_end_to_end_through_the_batcher_and_drain(embedding_package_dir, reference):
    model = _model(embedding_package_dir)
    tiles = random_tiles(3, seed=5)

    async def scenario():
        await model.start_batching()
        body = {
            "instances": [{"image_data": base64.b64encode(encode_png(t)).decode()} for t in tiles]
        }
        prepared = await model.preprocess(body)
        result = await model.postprocess(await model.predict(prepared))
        assert await model.drain(5.0)
        assert not await model.healthy()
        with pytest.raises(ModelNotReady):
            await model.preprocess(body)
        return result

    result = asyncio.run(scenario())
    want = reference(normalise_reference(tiles))[0]
    got = np.stack([np.asarray(p["output"]) for p in result["predictions"]])
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


def test_stop_closes_the_batcher_and_its_worker_threads(embedding_package_dir):
    model = _model(embedding_package_dir, options=ServingOptions(name="stop-closes"))
    tile = base64.b64encode(encode_png(random_tiles(1, seed=6)[0])).decode()

    workers: list[threading.Thread] = []  # this model's device worker threads, by identity

    async def scenario():
        await model.start_batching()
        payload = await model.preprocess({"instances": [{"image_data": tile}]})
        _, (response,) = await model.predict(payload)  # the worker thread exists now
        assert response.outputs["embedding"].shape == (1536,)
        workers.extend(t for t in threading.enumerate() if t.name.startswith("batcher-stop-closes"))
        assert workers
        model.stop()  # synchronous, on the loop's thread, as the server's shutdown calls it
        with pytest.raises(ModelNotReady, match="closed"):
            await model.predict(payload)

    asyncio.run(scenario())
    for thread in workers:
        thread.join(60)  # a generous bound: they end at once when stop() works
    assert not [t.name for t in workers if t.is_alive()], "device worker threads outlived stop()"
