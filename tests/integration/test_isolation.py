"""Two-stage failure isolation, proven with concurrent traffic on a live server."""

from __future__ import annotations

import concurrent.futures as cf
import json
import re

import httpx
import numpy as np
import pytest

from harness.packages import package_in
from harness.reference import Reference, normalise_reference
from harness.server import start_server
from harness.tiles import b64, encode_png, random_tiles

pytestmark = pytest.mark.integration


def v2_json(inputs, parameters=None):
    body = {"inputs": inputs}
    if parameters:
        body["parameters"] = parameters
    return body


def tiles_input(strings):
    return {"name": "tiles", "shape": [len(strings)], "datatype": "BYTES", "data": strings}


def pixels_input(tiles):
    return {
        "name": "pixels",
        "shape": list(tiles.shape),
        "datatype": "UINT8",
        "data": tiles.flatten().tolist(),
    }


def _malformed_requests():
    good = b64(encode_png(random_tiles(1, seed=50)[0]))
    png = encode_png(random_tiles(1, seed=51)[0])
    small = b64(encode_png(random_tiles(1, size=100, seed=52)[0]))
    return {
        "bad base64": (v2_json([tiles_input([good, "!!!not base64!!!"])]), ["tiles", "tile 1"]),
        "not an image": (
            v2_json([tiles_input([b64(b"hello, I am not a PNG")])]),
            ["tiles", "tile 0"],
        ),
        "truncated png": (
            v2_json([tiles_input([good, b64(png[: len(png) // 2])])]),
            ["tiles", "tile 1"],
        ),
        "wrong size": (v2_json([tiles_input([small])]), ["tiles", "tile 0", "224"]),
        "wrong dtype": (
            v2_json(
                [
                    {
                        "name": "pixels",
                        "shape": [1, 224, 224, 3],
                        "datatype": "FP32",
                        "data": [0.5] * (224 * 224 * 3),
                    }
                ]
            ),
            ["pixels"],
        ),
        "wrong shape": (
            v2_json(
                [
                    {
                        "name": "pixels",
                        "shape": [1, 224, 3],
                        "datatype": "UINT8",
                        "data": [0] * (224 * 3),
                    }
                ]
            ),
            ["pixels"],
        ),
        "uint8 out of range": (
            v2_json(
                [
                    {
                        "name": "pixels",
                        "shape": [1, 1, 1, 3],
                        "datatype": "UINT8",
                        "data": [300, 0, 0],
                    }
                ]
            ),
            ["pixels"],
        ),
        "unknown mode": (
            v2_json([tiles_input([good])], {"mode": "nonsense"}),
            ["mode", "nonsense"],
        ),
        "both tiles and pixels": (
            v2_json([tiles_input([good]), pixels_input(random_tiles(1, seed=53))]),
            ["tiles", "pixels"],
        ),
        "neither": (
            v2_json([{"name": "other", "shape": [1], "datatype": "BYTES", "data": ["x"]}]),
            ["other"],
        ),
    }


MALFORMED = _malformed_requests()


@pytest.fixture(scope="module")
def reference(embedding_package_dir):
    return Reference(package_in(embedding_package_dir))


def _post(server, body, raw=None):
    url = f"{server.base}/v2/models/{server.model_name}/infer"
    if raw is not None:
        return httpx.post(
            url, content=raw, headers={"content-type": "application/json"}, timeout=120
        )
    return httpx.post(url, json=body, timeout=120)


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_each_malformed_request_gets_a_400_naming_the_problem(embedding_server, case):
    body, words = MALFORMED[case]
    response = _post(embedding_server, body)
    assert response.status_code == 400, response.text
    message = response.json()["error"]
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


def test_malformed_json_is_400_not_422(embedding_server):
    response = _post(embedding_server, None, raw=b'{"inputs": [')
    assert response.status_code == 400 and "error" in response.json()
    response = _post(embedding_server, {"no_inputs": []})
    assert response.status_code == 400 and "error" in response.json()


def test_malformed_and_valid_traffic_concurrently(embedding_server, reference):
    tiles = random_tiles(24, seed=60)
    want = reference(normalise_reference(tiles))[0]
    jobs = [("valid", i) for i in range(24)] + [("bad", name) for name in sorted(MALFORMED)] * 2

    def run(job):
        kind, key = job
        if kind == "bad":
            return job, _post(embedding_server, MALFORMED[key][0])
        body = v2_json([tiles_input([b64(encode_png(tiles[key]))])])
        return job, _post(embedding_server, body)

    with cf.ThreadPoolExecutor(12) as pool:
        results = list(pool.map(run, jobs))
    for (kind, key), response in results:
        if kind == "bad":
            assert response.status_code == 400, (key, response.text)
            continue
        assert response.status_code == 200, response.text
        (out,) = response.json()["outputs"]
        np.testing.assert_allclose(
            np.asarray(out["data"], np.float32), want[key], atol=1e-4, rtol=1e-4
        )


@pytest.fixture(scope="module")
def faulty_server(embedding_package_dir, tmp_path_factory):
    # Fault hook: fail the batch holding a tile whose pixels are all 7 (test-only flag).
    server = start_server(
        embedding_package_dir,
        tmp_path_factory.mktemp("faulty"),
        "--fault_injection",
        "marker:7",
        "--max_batch_size",
        "4",
        "--max_latency_ms",
        "50",
    )
    yield server
    server.stop()


def test_forward_failure_fails_exactly_its_batch(faulty_server, reference):
    poison = np.full((1, 224, 224, 3), 7, dtype=np.uint8)
    response = _post(faulty_server, v2_json([pixels_input(poison)]))
    assert response.status_code == 503 and "injected" in response.json()["error"]
    tiles = random_tiles(2, seed=70)
    response = _post(faulty_server, v2_json([pixels_input(tiles)]))
    assert response.status_code == 200, response.text
    got = np.asarray(response.json()["outputs"][0]["data"], np.float32).reshape(2, -1)
    np.testing.assert_allclose(got, reference(normalise_reference(tiles))[0], atol=1e-4, rtol=1e-4)
    assert (
        httpx.get(f"{faulty_server.base}/v2/models/{faulty_server.model_name}/ready").status_code
        == 200
    )
    assert httpx.get(f"{faulty_server.base}/v2/health/live").status_code == 200


def test_concurrent_fault_gives_503_only_to_requests_in_the_failed_batch(faulty_server):
    """A poison tile fails its batch; failed tiles counted == tiles of the 503 requests."""
    metrics_before = _failed_tiles(faulty_server.metrics())
    poison = np.full((1, 224, 224, 3), 7, dtype=np.uint8)
    bodies = [v2_json([pixels_input(random_tiles(1, seed=80 + i))]) for i in range(12)]
    bodies.insert(5, v2_json([pixels_input(poison)]))
    with cf.ThreadPoolExecutor(13) as pool:
        responses = list(pool.map(lambda b: _post(faulty_server, b), bodies))
    statuses = [r.status_code for r in responses]
    assert statuses[5] == 503
    assert set(statuses) <= {200, 503}
    failed = statuses.count(503)
    assert failed <= 4, f"more requests failed than fit in one batch of 4: {statuses}"
    assert _failed_tiles(faulty_server.metrics()) - metrics_before == failed


def _failed_tiles(metrics: str) -> float:
    match = re.search(r'histoserve_tiles_total\{model="[^"]+",outcome="failed"\} (\S+)', metrics)
    return float(match.group(1)) if match else 0.0


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--spec", "tissue-seg"], "tissue-seg"),
        (["--checkpoint", "missing.pt2"], "missing.pt2"),
    ],
    ids=["spec-mismatch", "missing-checkpoint"],
)
def test_startup_is_fail_fast_with_one_clear_line(embedding_package_dir, tmp_path, extra, needle):
    server = start_server(embedding_package_dir, tmp_path, *extra, model_name="x", wait=False)
    assert server.proc.wait(240) == 2
    lines = [
        line for line in server.log().splitlines() if line.startswith("histoserve: cannot start")
    ]
    assert len(lines) == 1 and needle in lines[0], server.log()


def test_v1_bad_instance_is_400(embedding_server):
    url = f"{embedding_server.base}/v1/models/{embedding_server.model_name}:predict"
    response = httpx.post(url, json={"instances": [{"image_data": "%%%"}]}, timeout=30)
    assert response.status_code == 400 and "image_data" in response.json()["error"]
    response = httpx.post(url, content=b"{not json", timeout=30)
    assert response.status_code == 400
    assert json.loads(response.text)["error"]
