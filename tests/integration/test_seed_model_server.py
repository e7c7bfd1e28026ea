"""A model written only from the seed's page, served live by ``--model_class``.

:mod:`harness.seed_model` subclasses ``BaseServerModel`` with its own
``prepare_sample`` (refuses blank tiles, hands the tile over as ``(C, H, W)``)
and ``forward_batch`` (unit-length embeddings), both calling ``super()``.
The real ``python -m predictor`` serves it on the real demo package; its
answers are checked against a direct forward of that package in this
process, over V2 raw pixels, V2 encoded tiles and V1.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from harness.packages import package_in
from harness.reference import Reference, normalise_reference
from harness.server import Server, start_server
from harness.tiles import encode_png, random_tiles
from histoserve import HistoserveClient, InferenceError

pytestmark = pytest.mark.integration

TARGET = "harness.seed_model:UnitNormEmbedder"


@pytest.fixture(scope="module")
def server(
    embedding_package_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    flags = ("--model_class", TARGET, "--model_name", "seed", "--max_batch_size", "4")
    server = start_server(embedding_package_dir, tmp_path_factory.mktemp("seed"), *flags)
    yield server
    server.stop()


def _direct(model_dir: Path, tiles: np.ndarray) -> np.ndarray:
    """The package run in this process on the vendor's preprocessing, rows scaled to unit length."""
    (embedding,) = Reference(package_in(model_dir))(normalise_reference(tiles))
    return embedding / np.linalg.norm(embedding, axis=1, keepdims=True)


def test_the_user_class_serves_and_answers_like_a_direct_forward(server, embedding_package_dir):
    tiles = random_tiles(6, seed=21)  # more than one batch of 4
    want = _direct(embedding_package_dir, tiles)
    with HistoserveClient(server.base, "seed") as client:
        pixels = client.infer_pixels(tiles)["embedding"]
        images = client.infer_images([encode_png(t) for t in tiles])["embedding"]
        meta = client.metadata()
    np.testing.assert_allclose(pixels, want, atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(images, want, atol=1e-5, rtol=1e-4)
    body = {"instances": [{"image_data": base64.b64encode(encode_png(t)).decode()} for t in tiles]}
    v1 = httpx.post(f"{server.base}/v1/models/seed:predict", json=body, timeout=60)
    assert v1.status_code == 200, v1.text
    got = np.stack([p["output"] for p in v1.json()["predictions"]])
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-4)
    assert meta["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, 1536]}]


def test_the_user_prepare_samples_value_error_is_a_400_for_that_request(server):
    tiles = random_tiles(3, seed=22)
    tiles[1] = 0  # blank
    with HistoserveClient(server.base, "seed") as client:
        with pytest.raises(InferenceError) as err:
            client.infer_pixels(tiles)
        assert client.infer_pixels(tiles[[0, 2]])["embedding"].shape == (2, 1536)
    assert err.value.status == 400
    assert "input 'pixels' tile 1: blank tile" in str(err.value)


def test_the_log_names_the_class_served(server):
    assert "served by harness.seed_model.UnitNormEmbedder" in server.log()
