"""``histoserve embed --transport``: the slide's own JPEG tiles on the wire, decoded by the server.

Real parts: Aperio-style SVS with shared JPEG tables (:mod:`harness.jpeg_slides`),
a deflate TIFF (OpenSlide only), the session's embedding server on loopback,
the CLI in its own interpreter, a recording HTTP proxy that counts request
bodies. Slide B has a level at the model's 0.5 um/px; slide A is read at
level 0 (448 px) and resized bicubic, on the server with jpeg transport.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from harness import jpeg_slides, slides
from harness.embed import by_status, read_output, run_embed, status_rows
from harness.recording_proxy import RecordingProxy
from harness.server import Server

pytestmark = pytest.mark.integration
LAYOUT = slides.standard_layout(448)
SPEC_B = slides.SlideSpec(mpp=(0.25, 0.25), vendor="aperio", **LAYOUT)
SPEC_A = slides.SlideSpec(mpp=(0.25, 0.25), vendor="aperio", downsamples=(1, 16), **LAYOUT)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("transport-slides")
    jpeg_slides.jpeg_tiff(root / "b.svs", SPEC_B)
    jpeg_slides.jpeg_tiff(root / "a.svs", SPEC_A)
    slides.generic_tiff(root / "deflate.tif")
    return root


def _embed(server: Server, out: Path, *args: str | Path, **kw: object) -> dict[str, list[str]]:
    result = run_embed(*args, "--url", server.base, "--out", out, "--batch-size", "8", **kw)
    assert result.returncode in (0, 1), result.stderr
    return by_status(status_rows(out))


@pytest.mark.parametrize("slide", ["b", "a"])
def test_jpeg_transport_features_equal_the_pixel_path(
    embedding_server: Server, folder: Path, tmp_path: Path, slide: str
) -> None:
    outputs = {}
    for transport in ("jpeg", "pixels"):
        out = tmp_path / transport
        # one request in flight: each request is one server batch of the same tiles either way
        status = _embed(
            embedding_server, out, folder / f"{slide}.svs", "--transport", transport,
            "--concurrency", "1",
        )  # fmt: skip
        assert status["done"] == [slide]
        outputs[transport] = read_output(out / f"{slide}.h5")
    jpeg, pixels = outputs["jpeg"], outputs["pixels"]
    assert jpeg["attrs"]["transport"] == "jpeg" and pixels["attrs"]["transport"] == "pixels"
    assert len(jpeg["coords"]) > 0
    np.testing.assert_array_equal(jpeg["coords"], pixels["coords"])
    np.testing.assert_array_equal(jpeg["features"], pixels["features"])


def test_auto_takes_jpeg_where_it_applies_and_pixels_otherwise(
    embedding_server: Server, folder: Path, tmp_path: Path
) -> None:
    paths = (folder / "b.svs", folder / "deflate.tif")
    assert sorted(_embed(embedding_server, tmp_path / "auto", *paths)["done"]) == ["b", "deflate"]
    used = {
        n: read_output(tmp_path / "auto" / f"{n}.h5")["attrs"]["transport"]
        for n in ("b", "deflate")
    }
    assert used == {"b": "jpeg", "deflate": "pixels"}
    area = _embed(embedding_server, tmp_path / "area", folder / "a.svs", "--resize", "area")
    assert area["done"] == ["a"]
    assert read_output(tmp_path / "area" / "a.h5")["attrs"]["transport"] == "pixels"
    forced = _embed(
        embedding_server, tmp_path / "forced", folder / "deflate.tif", "--transport", "jpeg"
    )
    assert forced.get("failed") == ["deflate"]
    error = status_rows(tmp_path / "forced")[-1]["error"]
    assert "--transport jpeg" in error and "natively" in error


def _infer_bytes(proxy: RecordingProxy) -> int:
    posts = [s for s in proxy.seen if s["method"] == "POST" and s["url"].endswith("/infer")]
    assert posts
    return sum(
        int(s["headers"].get("content-length") or s["headers"]["Content-Length"]) for s in posts
    )


def test_jpeg_request_bytes_are_at_most_a_third_of_raw_at_a_matching_level(
    embedding_server: Server, folder: Path, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    sent = {}
    for transport in ("jpeg", "pixels"):
        with RecordingProxy() as proxy:
            env_t = {**env, "HTTP_PROXY": proxy.url, "ALL_PROXY": proxy.url}
            out = tmp_path / transport
            status = _embed(
                embedding_server, out, folder / "b.svs", "--transport", transport,
                "--trust-env", env=env_t,
            )  # fmt: skip
            assert status["done"] == ["b"]
            sent[transport] = _infer_bytes(proxy)
    assert sent["jpeg"] * 3 <= sent["pixels"], sent
