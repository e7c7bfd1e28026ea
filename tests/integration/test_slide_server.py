"""abmil-demo served live: answers equal the module's forward over REST and gRPC; 400s per slide."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import torch
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from harness.grpc_client import GrpcClient, GrpcError
from harness.packages import copy_package_dir, demo_package
from harness.server import start_server
from predictor.families import build_demo_model
from predictor.families.slide import OUTPUT_OF_MODE
from predictor.spec import BUILTIN_SPECS

pytestmark = pytest.mark.integration
SPEC = BUILTIN_SPECS["abmil-demo"]
OUTPUTS = ("prediction", "attention", "slide_embedding")
LARGE_N = 100_000
BODY_LIMIT = 400 * 2**20  # the FP16 100,000-tile slide is 307 MB


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    package = demo_package("abmil-demo", max_batch=200_000)
    model_dir = copy_package_dir(package, tmp_path_factory.mktemp("abmil"))
    srv = start_server(
        model_dir, tmp_path_factory.mktemp("abmil-log"), "--max_body_bytes", str(BODY_LIMIT)
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def module():
    return build_demo_model(SPEC)


def _truth(module, features: np.ndarray) -> dict[str, np.ndarray]:
    with torch.no_grad():
        outputs = module(torch.from_numpy(features.astype(np.float32)))
    return {name: out.numpy() for name, out in zip(OUTPUTS, outputs, strict=True)}


def _slide(n: int, seed: int, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, SPEC.feature_dim)).astype(dtype)


def _rest(server, features: np.ndarray, mode: str, datatype: str = "FP32"):
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=600)
    inp = httpclient.InferInput("features", list(features.shape), datatype)
    inp.set_data_from_numpy(features, binary_data=True)
    names = [OUTPUT_OF_MODE[m] for m in mode.split(",")]
    outputs = [httpclient.InferRequestedOutput(n, binary_data=True) for n in names]
    try:
        return client.infer(server.model_name, [inp], outputs=outputs, parameters={"mode": mode})
    finally:
        client.close()


@pytest.fixture(scope="module")
def grpc(server):
    client = GrpcClient(server.grpc_url)
    yield lambda features, mode: client.infer(
        server.model_name, {"features": ("FP32", features)}, parameters={"mode": mode}
    )
    client.close()


def _check(result, want: dict[str, np.ndarray]) -> None:
    got = {n: result[n] if isinstance(result, dict) else result.as_numpy(n) for n in OUTPUTS}
    for name in OUTPUTS:
        assert got[name].shape == want[name].shape, name
        np.testing.assert_allclose(got[name], want[name], atol=1e-5, rtol=0, err_msg=name)
    assert float(got["attention"].sum()) == pytest.approx(1.0, abs=1e-5)


def test_metadata_names_the_inputs_outputs_and_encoder(server) -> None:
    meta = httpx.get(f"{server.base}/v2/models/{server.model_name}").json()
    assert {i["name"]: i["shape"] for i in meta["inputs"]} == {
        "features": [-1, 1536],
        "coords": [-1, 2],
    }
    assert {o["name"]: o["shape"] for o in meta["outputs"]} == {
        "prediction": [2],
        "attention": [-1],
        "slide_embedding": [512],
    }
    config = httpx.get(f"{server.base}/v2/models/{server.model_name}/config").json()
    assert config["classes"] == ["class_0", "class_1"]
    assert config["tile_encoder"]["name"] == "h0-mini" and config["max_tiles_per_slide"] == 200_000
    assert config["batching"]["max_batch_size"] == 1


@pytest.mark.parametrize("n", [1, 7, 2_000])
def test_rest_and_grpc_answers_equal_the_module(server, grpc, module, n) -> None:
    features = _slide(n, seed=n)
    want = _truth(module, features)
    all_modes = "prediction,embedding,attention"
    _check(_rest(server, features, all_modes), want)
    _check(grpc(features, all_modes), want)


@pytest.mark.slow  # one slide of LARGE_N FP16 features through the head (about 30 s): `make test-long`
def test_a_large_fp16_slide(server, module) -> None:
    features = _slide(LARGE_N, seed=1, dtype=np.float16)
    result = _rest(server, features, "prediction,embedding,attention", datatype="FP16")
    _check(result, _truth(module, features))


def test_each_mode_returns_its_output(server) -> None:
    features = _slide(5, seed=2)
    for mode, name in (("prediction", "prediction"), ("embedding", "slide_embedding")):
        body = {
            "inputs": [
                {
                    "name": "features",
                    "shape": [5, 1536],
                    "datatype": "FP32",
                    "data": features.ravel().tolist(),
                }
            ],
            "parameters": {"mode": mode},
        }
        answer = httpx.post(f"{server.base}/v2/models/{server.model_name}/infer", json=body).json()
        assert [o["name"] for o in answer["outputs"]] == [name]
    default = httpx.post(
        f"{server.base}/v2/models/{server.model_name}/infer",
        json={
            "inputs": [
                {"name": "features", "shape": [1, 1536], "datatype": "FP32", "data": [0.0] * 1536}
            ]
        },
    ).json()
    assert [(o["name"], o["shape"]) for o in default["outputs"]] == [("prediction", [2])]


def test_answers_name_the_package_over_rest_and_grpc(server) -> None:
    """Issue 33, case 9: the slide family's answers carry the package digest too."""
    config = httpx.get(f"{server.base}/v2/models/{server.model_name}/config").json()
    digest = config["package_sha256"]
    assert len(digest) == 64
    features = _slide(4, seed=9)
    rest = _rest(server, features, "prediction")
    assert rest.get_response()["parameters"] == {"package_sha256": digest, "jpeg_decode": "cpu"}
    client = GrpcClient(server.grpc_url)
    try:
        _, parameters = client.answer(server.model_name, {"features": ("FP32", features)})
    finally:
        client.close()
    assert parameters == {"package_sha256": digest, "jpeg_decode": "cpu"}


def test_named_outputs_decide_the_mode_and_a_conflicting_mode_is_a_400(server) -> None:
    """The V2 convention: outputs named without ``mode`` are what comes back."""
    features = _slide(3, seed=12)
    body = {
        "inputs": [
            {"name": "features", "shape": [3, 1536], "datatype": "FP32",
             "data": features.ravel().tolist()}
        ],
        "outputs": [{"name": "attention"}, {"name": "slide_embedding"}],
    }  # fmt: skip
    url = f"{server.base}/v2/models/{server.model_name}/infer"
    answer = httpx.post(url, json=body)
    assert answer.status_code == 200, answer.text
    shapes = {o["name"]: o["shape"] for o in answer.json()["outputs"]}
    assert shapes == {"attention": [3], "slide_embedding": [512]}
    conflict = httpx.post(url, json={**body, "parameters": {"mode": "prediction"}})
    assert conflict.status_code == 400
    message = conflict.json()["error"]
    assert "mode 'prediction'" in message and "['attention', 'slide_embedding']" in message
    client = GrpcClient(server.grpc_url)
    try:
        outputs, _ = client.answer(
            server.model_name, {"features": ("FP32", features)}, outputs=["slide_embedding"]
        )
        assert list(outputs) == ["slide_embedding"] and outputs["slide_embedding"].shape == (512,)
        with pytest.raises(GrpcError) as refused:
            client.answer(
                server.model_name,
                {"features": ("FP32", features)},
                parameters={"mode": "attention"},
                outputs=["prediction"],
            )
    finally:
        client.close()
    assert refused.value.status == "StatusCode.INVALID_ARGUMENT"
    assert "mode 'attention'" in refused.value.message


def test_an_output_that_overflows_is_a_422_never_a_200_with_nan(server, grpc, module) -> None:
    """Issue 33, case 11: finite features that overflow the head answered 200 with NaN."""
    features = _slide(5, seed=11)
    features[2] = 3e38  # finite in FP32; the projection's sum is not
    with torch.no_grad():
        assert not all(bool(torch.isfinite(o).all()) for o in module(torch.from_numpy(features)))
    with pytest.raises(InferenceServerException) as rest:
        _rest(server, features, "prediction,attention")
    assert rest.value.status() == "422", rest.value.message()
    assert "output 'prediction' is not finite" in rest.value.message()
    with pytest.raises(GrpcError) as refused:
        grpc(features, "prediction")
    assert refused.value.status == "StatusCode.FAILED_PRECONDITION"
    assert "is not finite" in refused.value.message
    good = _slide(3, seed=3)  # that slide only: the next one is answered
    _check(_rest(server, good, "prediction,embedding,attention"), _truth(module, good))


@pytest.mark.parametrize(
    ("features", "words"),
    [
        (np.zeros((7, 768), np.float32), ["features", "768", "1536"]),
        (np.zeros((0, 1536), np.float32), ["features", "empty slide"]),
        (
            np.where(np.arange(7 * 1536).reshape(7, 1536) == 4000, np.nan, 0).astype(np.float32),
            ["features", "tile 2", "non-finite"],
        ),
    ],
    ids=["wrong-width", "empty", "nan"],
)
def test_bad_slides_are_a_clear_400(server, grpc, module, features, words) -> None:
    with pytest.raises(InferenceServerException) as rest:
        _rest(server, features, "prediction")
    assert rest.value.status() == "400", rest.value.message()
    assert all(w in rest.value.message() for w in words), rest.value.message()
    with pytest.raises(GrpcError) as refused:
        grpc(features, "prediction")
    assert refused.value.status == "StatusCode.INVALID_ARGUMENT"
    assert all(w in refused.value.message for w in words)
    good = _slide(3, seed=3)  # the server still answers the next slide
    _check(_rest(server, good, "prediction,embedding,attention"), _truth(module, good))


@pytest.fixture(scope="module")
def mean_pool(tmp_path_factory):
    package = demo_package("mean-pool", max_batch=200_000)
    model_dir = copy_package_dir(package, tmp_path_factory.mktemp("mean-pool"))
    srv = start_server(model_dir, tmp_path_factory.mktemp("mean-pool-log"))
    yield srv
    srv.stop()


def test_mean_pool_embeds_a_slide_with_no_trained_head(mean_pool) -> None:
    features = _slide(9_000, seed=4)  # past the 4,096-row sums inductor used to guard on
    result = _rest(mean_pool, features, "embedding,attention")
    np.testing.assert_allclose(
        result.as_numpy("slide_embedding"), features.mean(axis=0), atol=1e-5, rtol=0
    )
    np.testing.assert_allclose(result.as_numpy("attention"), np.full(9_000, 1 / 9_000), rtol=1e-6)
    with pytest.raises(InferenceServerException) as refused:
        _rest(mean_pool, features[:2], "embedding,prediction")
    assert refused.value.status() == "400" and "parameters.mode" in refused.value.message()


def test_a_failed_forward_is_a_503_for_that_slide_only(module, tmp_path_factory) -> None:
    """The second forward fails (injected: no GPU here to fail for real); the slides around it don't."""
    package = demo_package("abmil-demo", max_batch=200_000)
    model_dir = copy_package_dir(package, tmp_path_factory.mktemp("abmil-fault"))
    srv = start_server(
        model_dir, tmp_path_factory.mktemp("abmil-fault-log"), "--fault_injection", "nth:2"
    )
    try:
        slides = [_slide(n, seed) for n, seed in ((5, 71), (9, 72), (13, 73))]
        first = _rest(srv, slides[0], "prediction,attention,embedding")
        with pytest.raises(InferenceServerException) as failed:
            _rest(srv, slides[1], "prediction,attention,embedding")
        third = _rest(srv, slides[2], "prediction,attention,embedding")
        assert failed.value.status() == "503", failed.value
        _check(first, _truth(module, slides[0]))
        _check(third, _truth(module, slides[2]))
        live = httpx.get(f"{srv.base}/v2/health/live", timeout=5)
        assert live.status_code == 200  # a failed batch is not a lost device
    finally:
        assert srv.stop() == 0
