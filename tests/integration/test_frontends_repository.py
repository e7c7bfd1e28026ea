"""``--frontends 2`` before a ``--model_dir`` of model folders, on a real server.

Two folders with different packages of one spec (``h0-mini`` and another
``h0-mini``, other weights) and a folder whose package is not a package: the
device owner loads every folder (``--model_control none``), each front end
decodes for every model and submits to the owner's one scheduler. Each
model's answers, over binary REST and gRPC whichever front end takes the
connection, are its own package's run in this process; the index lists the
folders with their states from every front end; what the owner could not
load is refused naming its state; load and unload are refused naming the flag.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from harness.grpc_client import GrpcClient, GrpcError
from harness.packages import copy_package_dir, demo_package, other_h0_mini_dir, package_digest
from harness.reference import Reference, normalise_reference
from harness.server import Server, start_server
from harness.tiles import random_tiles
from histoserve import wire

pytestmark = pytest.mark.integration
MODELS = ("h0-mini", "other")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("frontends-repository") / "models"
    copy_package_dir(demo_package("h0-mini"), root / "h0-mini")
    other_h0_mini_dir(root / "other")
    (root / "corrupt").mkdir()
    (root / "corrupt" / "model.pt2").write_bytes(b"not a zip")
    return root


@pytest.fixture(scope="module")
def server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_server(
        model_dir,
        tmp_path_factory.mktemp("logs"),
        *("--frontends", "2", "--load_probe", "off", "--max_latency_ms", "5"),
        model_name="h0-mini",
    )
    yield server
    assert server.stop() == 0


def _rest(server: Server, model: str, tiles: np.ndarray) -> tuple[np.ndarray, dict]:
    content, headers = wire.encode_request({"pixels": tiles})
    url = f"{server.base}/v2/models/{model}/infer"
    response = httpx.post(url, content=content, headers=headers, timeout=120)
    assert response.status_code == 200, response.text
    outputs, answer = wire.decode_response(response.content, response.headers.get(wire.HEADER))
    return outputs["embedding"], answer


def test_each_model_answers_as_its_own_package_over_rest_and_grpc(server, model_dir):
    tiles = random_tiles(3, seed=41)
    grpc = GrpcClient(server.grpc_url)
    try:
        for model in MODELS:
            folder = model_dir / model
            (want,) = Reference(next(folder.glob("*.pt2")))(normalise_reference(tiles))
            for _ in range(3):  # connections spread over both front ends
                got, answer = _rest(server, model, tiles)
                np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
                assert answer["parameters"]["package_sha256"] == package_digest(folder)
                by_grpc = grpc.infer(model, {"pixels": ("UINT8", tiles)})["embedding"]
                np.testing.assert_allclose(by_grpc, want, atol=1e-4, rtol=1e-4)
    finally:
        grpc.close()
    assert not np.allclose(_rest(server, MODELS[0], tiles)[0], _rest(server, MODELS[1], tiles)[0])
    log = server.log()
    for model in MODELS:
        assert f"{model}: takes turns on device(s) cpu" in log  # the owner's one scheduler
    assert "[frontend-0]" in log and "[frontend-1]" in log


def test_the_index_lists_every_folder_from_every_front_end(server):
    for _ in range(4):  # each request its own connection: both front ends answer
        rows = httpx.post(f"{server.base}/v2/repository/index", json={}, timeout=10).json()
        states = {row["name"]: row["state"] for row in rows}
        assert states == {"h0-mini": "READY", "other": "READY", "corrupt": "UNAVAILABLE"}
        memory = {row["name"]: row["memory_bytes"] for row in rows}
        assert memory["h0-mini"] and memory["other"] and memory["corrupt"] is None
    grpc = GrpcClient(server.grpc_url)
    try:
        models = {m["name"]: m["state"] for m in grpc.repository("index")["models"]}
        assert models == {"h0-mini": "READY", "other": "READY", "corrupt": "UNAVAILABLE"}
        with pytest.raises(GrpcError) as err:
            grpc.repository("unload", "other")
        assert "--model_control none" in err.value.message
    finally:
        grpc.close()


def test_a_folder_that_did_not_load_and_a_load_are_refused_naming_why(server):
    refused = httpx.post(f"{server.base}/v2/models/corrupt/infer", json={"inputs": []})
    assert refused.status_code == 503
    assert "'corrupt' is UNAVAILABLE (load failed" in refused.json()["error"]
    load = httpx.post(f"{server.base}/v2/repository/models/other/load", timeout=10)
    assert load.status_code == 409 and "--model_control none" in load.json()["error"]
    bad = httpx.post(f"{server.base}/v2/repository/models/absent/unload", timeout=10)
    assert bad.status_code == 400 and "'absent' is no model folder" in bad.json()["error"]
    config = httpx.get(f"{server.base}/v2/models/other/config", timeout=10).json()
    assert config["name"] == "other" and config["checkpoint"].endswith(".pt2")
