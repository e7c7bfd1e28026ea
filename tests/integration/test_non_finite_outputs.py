"""Tile models never answer NaN or infinity with a 200 (issue 33, case 11, for the tile families).

Real packages that really overflow: :func:`harness.factories.blank_overflow_model`
exported for ``h0-mini`` (embedding), ``tissue-seg`` (segmentation) and, in
FP16, ``m-optimus`` (multimodal) gives infinity for a blank (all-white) tile
and finite rows for every other tile, as an FP16 package does on a tile far
from its training range. A blank tile's request is a 422 / gRPC
``FAILED_PRECONDITION`` naming the output and the tile; another request is
answered as before. (That the other requests of the very same batch get
their rows is shown in-process, where the batch is known:
``tests/unit/model/test_finite.py``.) A multimodal bulk-RNA value beyond the
FP16 package's range is a 400 naming the input and the tile. ``histoserve
embed`` fails the slide on the 422 with the server's message, without
retrying it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from harness import slides
from harness.embed import read_output, run_embed, status_rows
from harness.factories import BLANK_OVERFLOW_TARGET
from harness.grpc_client import GrpcClient, GrpcError
from harness.packages import copy_package_dir, module_package, package_in
from harness.reference import Reference, normalise_reference
from harness.server import Server, start_server
from harness.tiles import b64, encode_png, random_tiles
from histoserve import wire
from predictor.spec import BUILTIN_SPECS

pytestmark = pytest.mark.integration
BLANK = 255


def _serve(spec: str, tmp: pytest.TempPathFactory, *argv: str, flags: tuple = ()) -> Server:
    package = module_package(spec, BLANK_OVERFLOW_TARGET, *argv)
    model_dir = copy_package_dir(package, tmp.mktemp(f"{spec}-package"))
    return start_server(model_dir, tmp.mktemp(spec), "--max_batch_size", "8", *flags)


@pytest.fixture(scope="module")
def embedding(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = _serve("h0-mini", tmp_path_factory)
    yield server
    server.stop()


def _with_blank(n: int, blank: int, size: int = 224, seed: int = 0) -> np.ndarray:
    tiles = random_tiles(n, size=size, seed=seed)
    tiles[blank] = BLANK
    return tiles


def _post(server: Server, body: dict) -> httpx.Response:
    url = f"{server.base}/v2/models/{server.model_name}/infer"
    return httpx.post(url, json=body, timeout=120)


def _grpc(server: Server, inputs: dict) -> dict:
    client = GrpcClient(server.grpc_url)
    try:
        return client.infer(server.model_name, inputs)
    finally:
        client.close()


def test_a_blank_tile_is_a_422_naming_the_tile_over_rest_and_grpc(embedding: Server) -> None:
    tiles = _with_blank(4, blank=2)
    words = "output 'embedding' is not finite (NaN or infinity) for tile 2"
    pngs = [b64(encode_png(t)) for t in tiles]
    answer = _post(
        embedding, {"inputs": [{"name": "tiles", "datatype": "BYTES", "shape": [4], "data": pngs}]}
    )
    assert answer.status_code == 422 and words in answer.json()["error"], answer.text
    content, headers = wire.encode_request({"pixels": tiles})
    url = f"{embedding.base}/v2/models/{embedding.model_name}/infer"
    binary = httpx.post(url, content=content, headers=headers, timeout=120)
    assert binary.status_code == 422 and words in binary.json()["error"], binary.text
    with pytest.raises(GrpcError) as refused:
        _grpc(embedding, {"pixels": ("UINT8", tiles)})
    assert refused.value.status == "StatusCode.FAILED_PRECONDITION"
    assert words in refused.value.message


def test_the_next_request_is_answered_with_the_package_s_rows(embedding: Server) -> None:
    tiles = random_tiles(5, seed=3)
    got = _grpc(embedding, {"pixels": ("UINT8", tiles)})["embedding"]
    (want,) = Reference(package_in(_model_dir(embedding)))(normalise_reference(tiles))
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _model_dir(server: Server) -> Path:
    args = list(server.args)
    return Path(args[args.index("--model_dir") + 1])


def test_a_segmenter_s_infinite_logits_are_a_422_not_an_empty_mask(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Infinite logits used to come back as a 200 with a mask of zeros: tissue lost silently."""
    server = _serve("tissue-seg", tmp_path_factory)
    try:
        tiles = _with_blank(3, blank=0, size=512, seed=4)
        content, headers = wire.encode_request({"pixels": tiles})
        url = f"{server.base}/v2/models/{server.model_name}/infer"
        refused = httpx.post(url, content=content, headers=headers, timeout=120)
        assert refused.status_code == 422, refused.text
        assert "output 'logits' is not finite (NaN or infinity) for tile 0" in refused.text
        content, headers = wire.encode_request({"pixels": tiles[1:]})
        answer = httpx.post(url, content=content, headers=headers, timeout=120)
        assert answer.status_code == 200, answer.text
        outputs, _ = wire.decode_response(answer.content, answer.headers.get(wire.HEADER))
        spread = (tiles[1:].max(axis=-1).astype(int) - tiles[1:].min(axis=-1)) / 255
        np.testing.assert_array_equal(outputs["mask"], (spread > 0.08).astype(np.uint8))
    finally:
        server.stop()


def test_multimodal_fp16_bulk_rna_beyond_range_is_a_400_and_a_blank_tile_a_422(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """An FP16 package with a spec that feeds raw counts (no ``log1p``): 1e5 would overflow."""
    spec = BUILTIN_SPECS["m-optimus"].to_dict() | {"bulk_rna_transform": None}
    spec_file = tmp_path_factory.mktemp("spec") / "m-optimus-raw.json"
    spec_file.write_text(json.dumps(spec))
    server = _serve(
        "m-optimus", tmp_path_factory, "--dtype", "fp16", flags=("--spec", str(spec_file))
    )
    try:
        tiles = random_tiles(2, seed=5)
        rna = np.full((2, 8), 10.0, np.float32)
        rna[1, 3] = 1e5
        inputs = {"pixels": ("UINT8", tiles), "bulk_rna": ("FP32", rna)}
        with pytest.raises(GrpcError) as invalid:
            _grpc(server, inputs)
        assert invalid.value.status == "StatusCode.INVALID_ARGUMENT"
        message = invalid.value.message
        assert message.startswith("input 'bulk_rna' tile 1: value 100000"), message
        assert "float16 (+-65504)" in message
        rna[1, 3] = 60000.0  # within FP16: answered
        assert np.isfinite(_grpc(server, inputs)["prediction"]).all()
        blank = _with_blank(2, blank=1, seed=6)
        with pytest.raises(GrpcError) as refused:
            _grpc(server, {"pixels": ("UINT8", blank), "bulk_rna": ("FP32", rna)})
        assert refused.value.status == "StatusCode.FAILED_PRECONDITION"
        assert "output 'prediction' is not finite (NaN or infinity) for tile 1" in (
            refused.value.message
        )
    finally:
        server.stop()


def test_embed_fails_the_slide_on_a_422_with_the_server_s_message_without_retrying(
    embedding: Server, tmp_path: Path
) -> None:
    """Every tile embedded (``--tissue none``): the white glass around the tissue is blank."""
    slide = slides.generic_tiff(tmp_path / "s.tiff")
    out = tmp_path / "out"
    result = run_embed(slide.path, "--url", embedding.base, "--out", out, "--tissue", "none")
    assert result.returncode == 1, result.stderr
    (row,) = status_rows(out)
    assert row["status"] == "failed"
    assert "refused the request: HTTP 422" in row["error"], row["error"]
    assert "is not finite (NaN or infinity) for tile" in row["error"]
    assert "failed 8 times" not in row["error"] and "Traceback" not in result.stderr
    assert not list(out.rglob("*.h5"))
    grpc = f"grpc://{embedding.grpc_url}"
    flags = ("--model", "h0-mini", "--target-mpp", "0.5", "--tissue", "none")
    over_grpc = run_embed(slide.path, "--url", grpc, "--out", tmp_path / "grpc", *flags)
    assert over_grpc.returncode == 1, over_grpc.stderr
    (row,) = status_rows(tmp_path / "grpc")
    assert "refused the request: gRPC FAILED_PRECONDITION" in row["error"], row["error"]
    tissue = run_embed(slide.path, "--url", embedding.base, "--out", tmp_path / "tissue")
    assert tissue.returncode == 0, tissue.stderr  # tissue tiles only: every row finite
    assert np.isfinite(read_output(tmp_path / "tissue/s.h5")["features"]).all()
