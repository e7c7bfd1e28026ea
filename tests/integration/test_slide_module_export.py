"""A lab's own slide head: a spec file and ``histoserve export --module``, served with [N, C] attention."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import torch
import tritonclient.http as httpclient

from harness.server import start_server
from predictor.export.build import main as export_main
from predictor.packages.metadata import read_metadata
from predictor.spec import spec_from_dict
from tests.integration.slide_heads import build

pytestmark = pytest.mark.integration
SPEC = {
    "name": "lab-head",
    "family": "slide",
    "tile_size": 224,
    "mean": None,
    "std": None,
    "embedding_dim": 64,
    "modes": ["prediction", "attention", "embedding"],
    "classes": ["luad", "lusc", "normal"],
    "feature_dim": 768,
    "tile_encoder": "my-encoder",
    "tile_encoder_sha256": "ab" * 32,
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lab-head")
    spec_file = folder / "lab-head.json"
    spec_file.write_text(json.dumps(SPEC))
    package = folder / "model" / "lab-head.pt2"
    argv = ["--spec", str(spec_file), "--module", "tests.integration.slide_heads:build"]
    assert export_main([*argv, "--max_batch", "50000", "--output", str(package)]) == 0
    outputs = json.loads(read_metadata(package)["histoserve.outputs"])
    assert [(o["name"], o["shape"]) for o in outputs] == [
        ("prediction", [3]),
        ("attention", [-1, 3]),
        ("slide_embedding", [64]),
    ]
    srv = start_server(package.parent, folder)
    yield srv
    srv.stop()


def test_the_served_head_equals_its_module(server) -> None:
    features = np.random.default_rng(0).normal(size=(5_000, 768)).astype(np.float32)
    with torch.no_grad():
        want = build(spec_from_dict(SPEC))(torch.from_numpy(features))
    client = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("features", list(features.shape), "FP32")
    inp.set_data_from_numpy(features, binary_data=True)
    result = client.infer(
        server.model_name, [inp], parameters={"mode": "prediction,embedding,attention"}
    )
    client.close()
    for name, expected in zip(("prediction", "attention", "slide_embedding"), want, strict=True):
        np.testing.assert_allclose(result.as_numpy(name), expected.numpy(), atol=1e-5, rtol=0)
    np.testing.assert_allclose(result.as_numpy("attention").sum(axis=0), np.ones(3), atol=1e-5)
    config = httpx.get(f"{server.base}/v2/models/{server.model_name}/config").json()
    assert config["classes"] == ["luad", "lusc", "normal"]
    assert config["tile_encoder"] == {
        "name": "my-encoder",
        "feature_dim": 768,
        "package_sha256": "ab" * 32,
    }
    assert config["max_tiles_per_slide"] == 50_000
