"""Every V2 answer names the package that made it, and ``histoserve embed`` holds it to that.

Issue 33, case 9: a package swapped behind one URL mid-run went unseen,
because answers did not say which package made them. The server answers
``parameters.package_sha256`` on every path (REST JSON and binary through
the fast path, gRPC; FastAPI's route, the front ends and the slide family
are checked beside their own servers in ``test_fast_infer.py``,
``test_frontends.py`` and ``test_slide_server.py``); the client compares it
with the digest the model's config reported at the start of the run.

The swap: two real servers serving two h0-mini packages (the demo, and
:func:`harness.factories.blank_overflow_model`: same spec and shapes, other
numbers) behind :class:`harness.switching_proxy.SwitchingProxy`, a fake
forwarding stand-in that switches from one to the other at a known request
(a restart on the same port would switch at whatever point it lands).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from harness import slides
from harness.embed import by_status, read_output, run_embed, status_rows
from harness.grpc_client import GrpcClient
from harness.packages import other_h0_mini_dir, package_digest
from harness.server import Server, start_server
from harness.switching_proxy import SwitchingProxy
from harness.tiles import b64, encode_png, random_tiles
from histoserve import wire

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def other_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another h0-mini package (same spec, outputs and shapes; other numbers)."""
    return other_h0_mini_dir(tmp_path_factory.mktemp("other-package"))


@pytest.fixture(scope="module")
def other(other_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A real server of that package."""
    server = start_server(other_dir, tmp_path_factory.mktemp("other"), "--max_batch_size", "8")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def slide(tmp_path_factory: pytest.TempPathFactory) -> slides.GeneratedSlide:
    """10 tissue tiles at 0.5 um/px, the model's mpp."""
    return slides.generic_tiff(tmp_path_factory.mktemp("provenance") / "s.tiff")


_digest = package_digest


def test_rest_json_rest_binary_and_grpc_answers_name_the_package(
    embedding_server: Server, embedding_package_dir: Path
) -> None:
    digest, url = _digest(embedding_package_dir), embedding_server.base
    name = embedding_server.model_name
    config = httpx.get(f"{url}/v2/models/{name}/config").json()
    assert config["package_sha256"] == digest
    tiles = random_tiles(2, seed=33)
    pngs = [b64(encode_png(t)) for t in tiles]
    body = {"inputs": [{"name": "tiles", "datatype": "BYTES", "shape": [2], "data": pngs}]}
    answer = httpx.post(f"{url}/v2/models/{name}/infer", json=body, timeout=60).json()
    assert answer["parameters"] == {"package_sha256": digest, "jpeg_decode": "cpu"}
    content, headers = wire.encode_request({"pixels": tiles})
    binary = httpx.post(f"{url}/v2/models/{name}/infer", content=content, headers=headers)
    assert binary.headers.get(wire.HEADER)  # the binary extension's answer
    _, header = wire.decode_response(binary.content, binary.headers[wire.HEADER])
    assert header["parameters"] == {"package_sha256": digest, "jpeg_decode": "cpu"}
    client = httpclient.InferenceServerClient(embedding_server.http_url)
    try:
        inp = httpclient.InferInput("pixels", list(tiles.shape), "UINT8")
        inp.set_data_from_numpy(tiles, binary_data=True)
        result = client.infer(name, [inp])
    finally:
        client.close()
    assert result.get_response()["parameters"] == {"package_sha256": digest, "jpeg_decode": "cpu"}
    grpc = GrpcClient(embedding_server.grpc_url)
    try:
        outputs, parameters = grpc.answer(name, {"pixels": ("UINT8", tiles)})
    finally:
        grpc.close()
    assert parameters == {"package_sha256": digest, "jpeg_decode": "cpu"} and outputs[
        "embedding"
    ].shape == (2, 1536)


def _embed(slide: slides.GeneratedSlide, out: Path, url: str) -> object:
    flags = ("--batch-size", "4", "--max-attempts", "2")
    return run_embed(slide.path, "--url", url, "--out", out, *flags)


def test_a_package_swapped_behind_the_url_mid_run_fails_the_slide(
    embedding_server: Server,
    embedding_package_dir: Path,
    other: Server,
    other_dir: Path,
    slide: slides.GeneratedSlide,
    tmp_path: Path,
) -> None:
    """The first answer comes from the config's package, every later one from another."""
    first, second = _digest(embedding_package_dir), _digest(other_dir)
    out = tmp_path / "out"
    with SwitchingProxy(embedding_server.base, other.base, switch_after=1) as proxy:
        result = _embed(slide, out, proxy.url)
        assert proxy.forwarded[0] == 1 and proxy.forwarded[1] >= 2  # refused, then retried
    assert result.returncode == 1, result.stderr
    (row,) = status_rows(out)
    assert row["status"] == "failed"
    assert f"answered with package {second[:16]}, not {first[:16]}" in row["error"], row["error"]
    assert "Traceback" not in result.stderr
    assert not list(out.rglob("*.h5"))


def test_an_answer_from_another_package_is_retried_and_never_written(
    embedding_server: Server, other: Server, slide: slides.GeneratedSlide, tmp_path: Path
) -> None:
    """One answer from the other package (a replica of it, once): retried, the slide is done.

    Every row written is the config's package's: the run equals one straight to it.
    """
    with SwitchingProxy(embedding_server.base, other.base, 1, switch_back_after=1) as proxy:
        result = _embed(slide, tmp_path / "mixed", proxy.url)
        assert proxy.forwarded[1] == 1
    assert result.returncode == 0, result.stderr
    assert by_status(status_rows(tmp_path / "mixed")) == {"done": ["s"]}
    direct = _embed(slide, tmp_path / "direct", embedding_server.base)
    assert direct.returncode == 0, direct.stderr
    got, want = read_output(tmp_path / "mixed/s.h5"), read_output(tmp_path / "direct/s.h5")
    np.testing.assert_array_equal(got["coords"], want["coords"])
    # Batched differently by the server: rows agree to float rounding; the other
    # package's rows (channel means through a projection) would differ by far more.
    np.testing.assert_allclose(got["features"], want["features"], rtol=1e-4, atol=1e-5)
