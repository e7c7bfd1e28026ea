"""tissue-seg served live: masks over every protocol, padded packages trimmed."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from harness.grpc_client import GrpcClient
from harness.packages import package_in
from harness.reference import Reference, normalise_reference
from harness.server import start_server
from harness.tiles import b64, bytes_array, encode_png, random_tiles

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(segmentation_package_dir, tmp_path_factory):
    srv = start_server(
        segmentation_package_dir, tmp_path_factory.mktemp("seg"), "--max_batch_size", "4"
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def truth(segmentation_package_dir):
    ref = Reference(package_in(segmentation_package_dir))

    def run(tiles):
        (logits,) = ref(normalise_reference(tiles, mean=None, std=None))
        logits = logits[: len(tiles)]
        return (1.0 / (1.0 + np.exp(-logits.reshape(len(tiles), 512, 512))) > 0.5).astype(np.uint8)

    return run


def _tiles(n, seed):
    return random_tiles(n, size=512, seed=seed)


def test_metadata(server):
    meta = httpx.get(f"{server.base}/v2/models/{server.model_name}").json()
    assert meta["outputs"] == [{"name": "mask", "datatype": "UINT8", "shape": [-1, 512, 512]}]
    assert {"name": "pixels", "datatype": "UINT8", "shape": [-1, 512, 512, 3]} in meta["inputs"]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_v2_rest_mask(server, truth, binary):
    tiles = _tiles(2, 20)
    client = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("pixels", list(tiles.shape), "UINT8")
    inp.set_data_from_numpy(tiles, binary_data=binary)
    result = client.infer(
        server.model_name,
        [inp],
        outputs=[httpclient.InferRequestedOutput("mask", binary_data=binary)],
    )
    mask = result.as_numpy("mask")
    assert mask.dtype == np.uint8 and mask.shape == (2, 512, 512)
    want = truth(tiles)
    assert set(np.unique(mask)) <= {0, 1}
    assert (mask == want).mean() > 0.9999  # threshold ties at exactly 0.5 may flip a pixel
    client.close()


def test_v2_grpc_png_tiles(server, truth):
    tiles = _tiles(2, 21)
    client = GrpcClient(server.grpc_url)
    mask = client.infer(
        server.model_name, {"tiles": ("BYTES", bytes_array([encode_png(t) for t in tiles]))}
    )["mask"]
    assert (mask == truth(tiles)).mean() > 0.9999
    client.close()


def test_v1_flattened_mask(server, truth):
    tiles = _tiles(1, 22)
    response = httpx.post(
        f"{server.base}/v1/models/{server.model_name}:predict",
        json={"instances": [{"image_data": b64(encode_png(tiles[0])), "slide_name": "S"}]},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    (prediction,) = response.json()["predictions"]
    flat = np.asarray(prediction["output"], np.uint8)
    assert flat.shape == (512 * 512,) and prediction["slide_name"] == "S"
    assert (flat == truth(tiles).reshape(-1)).mean() > 0.9999


def test_wrong_tile_size_is_400(server):
    response = httpx.post(
        f"{server.base}/v2/models/{server.model_name}/infer",
        json={
            "inputs": [
                {
                    "name": "tiles",
                    "shape": [1],
                    "datatype": "BYTES",
                    "data": [b64(encode_png(random_tiles(1)[0]))],
                }
            ]
        },
    )
    assert response.status_code == 400 and "512" in response.json()["error"]


def test_padded_package_output_is_trimmed(padded_segmentation_package_dir, tmp_path):
    srv = start_server(padded_segmentation_package_dir, tmp_path, "--max_batch_size", "4")
    try:
        tiles = _tiles(3, 23)
        client = httpclient.InferenceServerClient(srv.http_url)
        inp = httpclient.InferInput("pixels", list(tiles.shape), "UINT8")
        inp.set_data_from_numpy(tiles)
        mask = client.infer(srv.model_name, [inp]).as_numpy("mask")
        assert mask.shape == (3, 512, 512)
        ref = Reference(package_in(padded_segmentation_package_dir))
        (logits,) = ref(normalise_reference(tiles, mean=None, std=None))
        assert logits.shape[0] > 3  # the package really pads
        want = (logits[:3].reshape(3, 512, 512) > 0).astype(np.uint8)
        assert (mask == want).mean() > 0.9999
        client.close()
    finally:
        srv.stop()
