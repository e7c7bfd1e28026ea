"""m-optimus served live: every mode over every protocol, bulk RNA validation, mixed batches."""

from __future__ import annotations

import concurrent.futures as cf

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from harness.grpc_client import GrpcClient, GrpcError
from harness.packages import copy_package_dir, demo_package, package_in
from harness.reference import Reference, normalise_reference
from harness.server import start_server
from harness.tiles import b64, bytes_array, encode_png, random_tiles
from predictor.families.multimodal.genes import read_gene_ids

pytestmark = pytest.mark.integration
MODES = ("prediction", "embedding", "prediction_with_embedding")
OUTPUTS = {
    "prediction": ("prediction",),
    "embedding": ("embedding",),
    "prediction_with_embedding": ("prediction", "embedding"),
}


@pytest.fixture(scope="module")
def server(multimodal_package_dir, tmp_path_factory):
    srv = start_server(
        multimodal_package_dir,
        tmp_path_factory.mktemp("mm"),
        "--max_batch_size",
        "8",
        "--max_latency_ms",
        "20",
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def n_genes(multimodal_package_dir):
    return (
        len(read_gene_ids(multimodal_package_dir / "genes_in.csv")),
        len(read_gene_ids(multimodal_package_dir / "genes_out.csv")),
    )


@pytest.fixture(scope="module")
def truth(multimodal_package_dir):
    ref = Reference(package_in(multimodal_package_dir))

    def run(tiles, rna):
        """rna: float32 [N, G] with NaN rows for tiles without bulk RNA."""
        import torch

        log_rna = torch.from_numpy(np.log1p(rna).astype(np.float32))
        pred_log, emb = ref(normalise_reference(tiles), log_rna)
        return {"prediction": np.round(np.expm1(pred_log), 3), "embedding": emb}

    return run


def _counts(n, g, seed):
    return np.random.default_rng(seed).poisson(20.0, size=(n, g)).astype(np.float32)


def test_metadata_and_gene_lists(server, n_genes):
    g_in, g_out = n_genes
    meta = httpx.get(f"{server.base}/v2/models/{server.model_name}").json()
    inputs = {i["name"]: i for i in meta["inputs"]}
    assert inputs["bulk_rna"] == {"name": "bulk_rna", "datatype": "FP32", "shape": [-1, g_in]}
    outputs = {o["name"]: o for o in meta["outputs"]}
    assert outputs["prediction"]["shape"] == [-1, g_out] and outputs["embedding"]["shape"] == [
        -1,
        1536,
    ]
    config = httpx.get(f"{server.base}/v2/models/{server.model_name}/config").json()
    assert len(config["genes_in"]) == g_in and config["genes_out"][0].startswith("ENSG")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_v2_rest_every_mode(server, truth, n_genes, mode, binary):
    tiles, rna = random_tiles(3, seed=10), _counts(3, n_genes[0], 10)
    client = httpclient.InferenceServerClient(server.http_url)
    pix = httpclient.InferInput("pixels", list(tiles.shape), "UINT8")
    pix.set_data_from_numpy(tiles, binary_data=binary)
    bulk = httpclient.InferInput("bulk_rna", list(rna.shape), "FP32")
    bulk.set_data_from_numpy(rna, binary_data=binary)
    outs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in OUTPUTS[mode]]
    result = client.infer(server.model_name, [pix, bulk], outputs=outs, parameters={"mode": mode})
    want = truth(tiles, rna)
    for name in OUTPUTS[mode]:
        np.testing.assert_allclose(result.as_numpy(name), want[name], atol=2e-3, rtol=1e-4)
    client.close()


@pytest.mark.parametrize("mode", MODES)
def test_v2_grpc_every_mode_with_png_tiles(server, truth, n_genes, mode):
    tiles, rna = random_tiles(2, seed=11), _counts(2, n_genes[0], 11)
    client = GrpcClient(server.grpc_url)
    inputs = {
        "tiles": ("BYTES", bytes_array([encode_png(t) for t in tiles])),
        "bulk_rna": ("FP32", rna),
    }
    result = client.infer(server.model_name, inputs, parameters={"mode": mode})
    want = truth(tiles, rna)
    assert sorted(result) == sorted(OUTPUTS[mode])
    for name in OUTPUTS[mode]:
        np.testing.assert_allclose(result[name], want[name], atol=2e-3, rtol=1e-4)
    client.close()


@pytest.mark.parametrize("mode", MODES)
def test_named_outputs_without_a_mode_decide_it_over_rest_and_grpc(server, truth, n_genes, mode):
    """The V2 convention: a request naming its outputs gets them; the mode follows."""
    tiles, rna = random_tiles(2, seed=13), _counts(2, n_genes[0], 13)
    want = truth(tiles, rna)
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        pix = httpclient.InferInput("pixels", list(tiles.shape), "UINT8")
        pix.set_data_from_numpy(tiles, binary_data=True)
        bulk = httpclient.InferInput("bulk_rna", list(rna.shape), "FP32")
        bulk.set_data_from_numpy(rna, binary_data=True)
        outs = [httpclient.InferRequestedOutput(n, binary_data=True) for n in OUTPUTS[mode]]
        result = client.infer(server.model_name, [pix, bulk], outputs=outs)
    finally:
        client.close()
    assert [o["name"] for o in result.get_response()["outputs"]] == list(OUTPUTS[mode])
    grpc = GrpcClient(server.grpc_url)
    try:
        inputs = {"pixels": ("UINT8", tiles), "bulk_rna": ("FP32", rna)}
        answered, _ = grpc.answer(server.model_name, inputs, outputs=list(OUTPUTS[mode]))
    finally:
        grpc.close()
    assert sorted(answered) == sorted(OUTPUTS[mode])
    for name in OUTPUTS[mode]:
        np.testing.assert_allclose(result.as_numpy(name), want[name], atol=2e-3, rtol=1e-4)
        np.testing.assert_allclose(answered[name], want[name], atol=2e-3, rtol=1e-4)


def test_a_mode_that_conflicts_with_the_named_outputs_is_a_400_naming_both(server, n_genes):
    tiles = random_tiles(1, seed=14)
    body = {
        "inputs": [
            {"name": "pixels", "shape": [1, 224, 224, 3], "datatype": "UINT8",
             "data": tiles.ravel().tolist()}
        ],
        "outputs": [{"name": "embedding"}],
        "parameters": {"mode": "prediction"},
    }  # fmt: skip
    answer = httpx.post(f"{server.base}/v2/models/{server.model_name}/infer", json=body)
    assert answer.status_code == 400, answer.text
    message = answer.json()["error"]
    assert (
        "parameters.mode" in message and "mode 'prediction' gives outputs ['prediction']" in message
    )
    assert "['embedding']" in message
    grpc = GrpcClient(server.grpc_url)
    try:
        with pytest.raises(GrpcError) as refused:
            grpc.answer(
                server.model_name,
                {"pixels": ("UINT8", tiles)},
                parameters={"mode": "embedding"},
                outputs=["prediction"],
            )
    finally:
        grpc.close()
    assert refused.value.status == "StatusCode.INVALID_ARGUMENT"
    assert "mode 'embedding' gives outputs ['embedding']" in refused.value.message


@pytest.mark.parametrize("mode", MODES)
def test_v1_every_mode_with_and_without_bulk_rna(server, truth, n_genes, mode):
    tiles, rna = random_tiles(2, seed=12), _counts(2, n_genes[0], 12)
    instances = [
        {"image_data": b64(encode_png(tiles[0])), "bulk_rna": rna[0].tolist(), "slide_name": "A"},
        {"image_data": b64(encode_png(tiles[1])), "slide_name": "B"},
    ]
    response = httpx.post(
        f"{server.base}/v1/models/{server.model_name}:predict",
        json={"instances": instances, "parameters": {"mode": mode}},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    rna[1] = np.nan
    want = truth(tiles, rna)
    primary = OUTPUTS[mode][0]
    for i, prediction in enumerate(response.json()["predictions"]):
        assert prediction["slide_name"] == "AB"[i]
        np.testing.assert_allclose(
            np.asarray(prediction["output"], np.float32), want[primary][i], atol=2e-3, rtol=1e-4
        )
        if mode == "prediction_with_embedding":
            np.testing.assert_allclose(
                np.asarray(prediction["embedding"], np.float32),
                want["embedding"][i],
                atol=1e-4,
                rtol=1e-4,
            )
        else:
            assert "embedding" not in prediction


def test_tile_without_bulk_rna_is_served(server, truth):
    tiles = random_tiles(2, seed=13)
    client = httpclient.InferenceServerClient(server.http_url)
    pix = httpclient.InferInput("pixels", list(tiles.shape), "UINT8")
    pix.set_data_from_numpy(tiles)
    result = client.infer(server.model_name, [pix])
    want = truth(tiles, np.full((2, 64), np.nan, np.float32))
    np.testing.assert_allclose(
        result.as_numpy("prediction"), want["prediction"], atol=2e-3, rtol=1e-4
    )
    client.close()


def _bad_rna_cases(g):
    good = _counts(1, g, 0)
    neg, nan, inf = good.copy(), good.copy(), good.copy()
    neg[0, 3], nan[0, 5], inf[0, 7] = -1.0, np.nan, np.inf
    return {
        "wrong gene count": (_counts(1, g + 1, 0), "expected"),
        "negative": (neg, "negative"),
        "nan": (nan, "finite"),
        "inf": (inf, "finite"),
        "wrong N": (_counts(2, g, 0), "bulk_rna"),
    }


@pytest.mark.parametrize("case", ["wrong gene count", "negative", "nan", "inf", "wrong N"])
def test_bad_bulk_rna_is_400_for_that_request_only(server, n_genes, case):
    rna, needle = _bad_rna_cases(n_genes[0])[case]
    tile = random_tiles(1, seed=14)
    client = GrpcClient(server.grpc_url)
    with pytest.raises(GrpcError) as err:
        client.infer(server.model_name, {"pixels": ("UINT8", tile), "bulk_rna": ("FP32", rna)})
    assert err.value.status == "StatusCode.INVALID_ARGUMENT"
    assert "bulk_rna" in err.value.message and needle in err.value.message
    assert client.infer(server.model_name, {"pixels": ("UINT8", tile)})["prediction"].shape[0] == 1
    client.close()


def test_concurrent_mixed_batches_with_and_without_bulk_rna(server, truth, n_genes):
    n = 24
    tiles, rna = random_tiles(n, seed=15), _counts(n, n_genes[0], 15)
    has_rna = np.arange(n) % 2 == 0

    def one(i):
        client = httpclient.InferenceServerClient(server.http_url)
        pix = httpclient.InferInput("pixels", [1, 224, 224, 3], "UINT8")
        pix.set_data_from_numpy(tiles[i : i + 1])
        inputs = [pix]
        if has_rna[i]:
            bulk = httpclient.InferInput("bulk_rna", [1, n_genes[0]], "FP32")
            bulk.set_data_from_numpy(rna[i : i + 1])
            inputs.append(bulk)
        try:
            return client.infer(
                server.model_name, inputs, parameters={"mode": "prediction_with_embedding"}
            )
        finally:
            client.close()

    with cf.ThreadPoolExecutor(12) as pool:
        results = list(pool.map(one, range(n)))
    masked = rna.copy()
    masked[~has_rna] = np.nan
    want = truth(tiles, masked)
    for i, result in enumerate(results):
        np.testing.assert_allclose(
            result.as_numpy("prediction")[0], want["prediction"][i], atol=2e-3, rtol=1e-4
        )
        np.testing.assert_allclose(
            result.as_numpy("embedding")[0], want["embedding"][i], atol=1e-4, rtol=1e-4
        )


def test_gene_list_mismatch_fails_start_up(multimodal_package_dir, tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    for path in multimodal_package_dir.iterdir():
        (model_dir / path.name).write_bytes(path.read_bytes())
    lines = (model_dir / "genes_out.csv").read_text().splitlines()
    (model_dir / "genes_out.csv").write_text("\n".join(lines[:-1]) + "\n")
    srv = start_server(model_dir, tmp_path, model_name="x", wait=False)
    assert srv.proc.wait(240) == 2
    assert "genes" in srv.log() and "cannot start" in srv.log()


@pytest.fixture(scope="module")
def bf16_server(tmp_path_factory):
    """A bf16 m-optimus demo package: bf16 weights and tiles, bulk_rna kept float32 by the exporter."""
    model_dir = copy_package_dir(
        demo_package("m-optimus", dtype="bf16"), tmp_path_factory.mktemp("mm-bf16")
    )
    srv = start_server(model_dir, tmp_path_factory.mktemp("mm-bf16-srv"), "--max_batch_size", "4")
    yield srv, Reference(package_in(model_dir))
    srv.stop()


def test_a_bf16_package_serves_every_mode(bf16_server, n_genes):
    """It used to start, then answer 503 (``unmatched dtype``) to every request: bulk_rna was cast to bf16."""
    server, ref = bf16_server
    tiles, rna = random_tiles(3, seed=16), _counts(3, n_genes[0], 16)
    rna[2] = np.nan  # one tile without bulk RNA in the same batch
    import torch

    log_rna = torch.from_numpy(np.log1p(rna).astype(np.float32))
    pred_log, emb = ref(normalise_reference(tiles).to(torch.bfloat16), log_rna)
    want = {"prediction": np.expm1(pred_log), "embedding": emb}
    client = GrpcClient(server.grpc_url)
    for mode in MODES:
        inputs = {"pixels": ("UINT8", tiles[:2]), "bulk_rna": ("FP32", rna[:2])}
        result = client.infer(server.model_name, inputs, parameters={"mode": mode})
        assert sorted(result) == sorted(OUTPUTS[mode])
        for name in OUTPUTS[mode]:
            np.testing.assert_allclose(result[name], want[name][:2], atol=5e-2, rtol=5e-2)
    alone = client.infer(server.model_name, {"pixels": ("UINT8", tiles[2:])})  # no bulk RNA
    np.testing.assert_allclose(alone["prediction"], want["prediction"][2:], atol=5e-2, rtol=5e-2)
    client.close()
