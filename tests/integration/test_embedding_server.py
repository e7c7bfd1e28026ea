"""The embedding backbone served live: every protocol, numerical truth, batching, metadata."""

from __future__ import annotations

import concurrent.futures as cf
import re

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from harness.grpc_client import GrpcClient
from harness.packages import package_in
from harness.reference import Reference, normalise_reference
from harness.tiles import b64, bytes_array, encode_png, random_tiles

pytestmark = pytest.mark.integration

ATOL = 1e-4


@pytest.fixture(scope="module")
def reference(embedding_package_dir):
    return Reference(package_in(embedding_package_dir))


@pytest.fixture(scope="module")
def http(embedding_server):
    client = httpclient.InferenceServerClient(embedding_server.http_url, concurrency=8)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc(embedding_server):
    client = GrpcClient(embedding_server.grpc_url)
    yield client
    client.close()


def expected(reference, tiles):
    return reference(normalise_reference(tiles))[0]


def http_infer(http, server, name, data, datatype, *, binary, mode=None):
    inp = httpclient.InferInput(name, list(data.shape), datatype)
    inp.set_data_from_numpy(data, binary_data=binary)
    out = httpclient.InferRequestedOutput("embedding", binary_data=binary)
    params = {"mode": mode} if mode else None
    return http.infer(server.model_name, [inp], outputs=[out], parameters=params)


def test_ready_and_metadata(http, embedding_server):
    assert http.is_server_live() and http.is_model_ready(embedding_server.model_name)
    meta = http.get_model_metadata(embedding_server.model_name)
    inputs = {i["name"]: i for i in meta["inputs"]}
    assert inputs["tiles"]["datatype"] == "BYTES" and inputs["tiles"]["shape"] == [-1]
    assert inputs["pixels"]["shape"] == [-1, 224, 224, 3]
    (output,) = meta["outputs"]
    assert output == {"name": "embedding", "datatype": "FP32", "shape": [-1, 1536]}


def test_config_endpoint_shows_spec_and_batching(embedding_server):
    config = httpx.get(
        f"{embedding_server.base}/v2/models/{embedding_server.model_name}/config"
    ).json()
    assert config["spec"]["name"] == "h0-mini"
    assert config["spec"]["mean"] == pytest.approx([0.707223, 0.578729, 0.703617])
    assert config["batching"]["max_batch_size"] == 8
    assert "histoserve.spec" in config["package_metadata"]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_v2_rest_tiles(http, embedding_server, reference, binary):
    tiles = random_tiles(3, seed=1)
    pngs = [encode_png(t) for t in tiles]
    data = np.array(pngs if binary else [b64(p) for p in pngs], dtype=np.object_)
    result = http_infer(http, embedding_server, "tiles", data, "BYTES", binary=binary)
    got = result.as_numpy("embedding")
    assert got.shape == (3, 1536) and got.dtype == np.float32
    np.testing.assert_allclose(got, expected(reference, tiles), atol=ATOL, rtol=1e-4)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_v2_rest_pixels(http, embedding_server, reference, binary):
    tiles = random_tiles(4, seed=2)
    result = http_infer(http, embedding_server, "pixels", tiles, "UINT8", binary=binary)
    np.testing.assert_allclose(
        result.as_numpy("embedding"), expected(reference, tiles), atol=ATOL, rtol=1e-4
    )


@pytest.mark.parametrize("name", ["tiles", "pixels"])
def test_v2_grpc(grpc, embedding_server, reference, name):
    tiles = random_tiles(2, seed=3)
    if name == "tiles":
        data, datatype = bytes_array([encode_png(t) for t in tiles]), "BYTES"
    else:
        data, datatype = tiles, "UINT8"
    result = grpc.infer(
        embedding_server.model_name, {name: (datatype, data)}, parameters={"mode": "embedding"}
    )
    np.testing.assert_allclose(
        result["embedding"], expected(reference, tiles), atol=ATOL, rtol=1e-4
    )


def test_grpc_large_request_beyond_default_4mib(grpc, embedding_server, reference):
    tiles = random_tiles(32, seed=4)  # ~4.8 MB raw, over gRPC's default cap
    result = grpc.infer(embedding_server.model_name, {"pixels": ("UINT8", tiles)})
    np.testing.assert_allclose(
        result["embedding"], expected(reference, tiles), atol=ATOL, rtol=1e-4
    )


def test_v1_instances_echo_metadata_in_order(embedding_server, reference):
    tiles = random_tiles(3, seed=5)
    instances = [
        {"image_data": b64(encode_png(t)), "slide_name": "S1", "x": i * 224, "y": 7, "patch_idx": i}
        for i, t in enumerate(tiles)
    ]
    response = httpx.post(
        f"{embedding_server.base}/v1/models/{embedding_server.model_name}:predict",
        json={"instances": instances},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    predictions = response.json()["predictions"]
    want = expected(reference, tiles)
    for i, prediction in enumerate(predictions):
        assert (
            prediction["slide_name"] == "S1"
            and prediction["x"] == i * 224
            and prediction["patch_idx"] == i
        )
        np.testing.assert_allclose(
            np.asarray(prediction["output"], dtype=np.float32), want[i], atol=ATOL, rtol=1e-4
        )


def test_request_larger_than_batch_is_split_and_stitched_in_order(
    http, embedding_server, reference
):
    tiles = random_tiles(19, seed=6)  # max_batch_size is 8: three batches
    result = http_infer(http, embedding_server, "pixels", tiles, "UINT8", binary=True)
    np.testing.assert_allclose(
        result.as_numpy("embedding"), expected(reference, tiles), atol=ATOL, rtol=1e-4
    )


def test_unknown_mode_is_400_naming_it(http, embedding_server):
    tiles = random_tiles(1, seed=7)
    with pytest.raises(InferenceServerException) as err:
        http_infer(http, embedding_server, "pixels", tiles, "UINT8", binary=True, mode="segment")
    assert (
        err.value.status() == "400"
        and "mode" in err.value.message()
        and "segment" in err.value.message()
    )


def _histogram_sum_count(metrics: str, name: str) -> tuple[float, float]:
    total = float(re.search(rf"^{name}_sum\{{[^}}]*\}} (\S+)", metrics, re.M).group(1))
    count = float(re.search(rf"^{name}_count\{{[^}}]*\}} (\S+)", metrics, re.M).group(1))
    return total, count


def test_concurrent_single_tile_requests_are_merged(embedding_server, reference):
    before = _histogram_sum_count(embedding_server.metrics(), "histoserve_batch_size")
    tiles = random_tiles(48, seed=8)
    want = expected(reference, tiles)

    def one(i):
        client = httpclient.InferenceServerClient(embedding_server.http_url)
        try:
            return http_infer(
                client, embedding_server, "pixels", tiles[i : i + 1], "UINT8", binary=True
            ).as_numpy("embedding")
        finally:
            client.close()

    with cf.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(48)))
    for i, got in enumerate(results):
        np.testing.assert_allclose(got[0], want[i], atol=ATOL, rtol=1e-4)
    after = _histogram_sum_count(embedding_server.metrics(), "histoserve_batch_size")
    tiles_run, batches = after[0] - before[0], after[1] - before[1]
    assert tiles_run == 48
    assert batches < 48, f"no batching: {batches} batches for 48 concurrent tiles"


def test_metrics_exposed(embedding_server):
    text = embedding_server.metrics()
    for name in (
        "histoserve_batch_size",
        "histoserve_queue_depth",
        "histoserve_inflight_requests",
        "histoserve_tiles_total",
        "histoserve_queue_wait_seconds",
        "histoserve_forward_seconds",
        "histoserve_preprocess_seconds",
    ):
        assert name in text, name
    assert re.search(r'histoserve_tiles_total\{model="h0-mini",outcome="ok"\} [1-9]', text)
