"""``histoserve embed --reader/--resize`` against the session's embedding server.

Real parts: Aperio-style SVS written with shared JPEG tables
(:mod:`harness.jpeg_slides`), a deflate TIFF (OpenSlide only), the demo
``.pt2`` served on loopback, the CLI in its own interpreter. Slide B has a
level at the model's 0.5 um/px (tiles read as they are); slide A has levels
1/16 (448 px read at level 0 and resized).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness import jpeg_slides
from harness.embed import by_status, read_output, run_embed, status_rows
from harness.server import Server

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return jpeg_slides.slides_a_and_b(tmp_path_factory.mktemp("native-slides"))


def _embed(server: Server, out: Path, *args: str | Path) -> dict[str, list[str]]:
    result = run_embed(*args, "--url", server.base, "--out", out, "--batch-size", "8")
    assert result.returncode in (0, 1), result.stderr
    return by_status(status_rows(out))


def test_native_features_equal_openslides_at_a_matching_level(
    embedding_server: Server, folder: Path, tmp_path: Path
) -> None:
    outputs = {}
    for reader in ("native", "openslide"):
        out = tmp_path / reader
        # One request in flight: both runs' batches are the same, so the features are
        # bit for bit the same when the pixels are (the CPU forward's sums depend on
        # the batch it shares). jpeg: test_embed_transport.py.
        args = ("--reader", reader, "--transport", "pixels", "--concurrency", "1")
        assert _embed(embedding_server, out, folder / "b.svs", *args)["done"] == ["b"]
        outputs[reader] = read_output(out / "b.h5")
    native, reference = outputs["native"], outputs["openslide"]
    assert native["attrs"]["slide_backend"] == "native"
    assert reference["attrs"]["slide_backend"] == "openslide"
    assert native["attrs"]["resize"] == "bicubic" and native["attrs"]["reader"] == "native"
    assert len(native["coords"]) == 10
    np.testing.assert_array_equal(native["coords"], reference["coords"])
    np.testing.assert_array_equal(native["features"], reference["features"])


def test_auto_reads_jpeg_svs_natively_and_the_rest_with_openslide_and_resumes_by_hash(
    embedding_server: Server, folder: Path, tmp_path: Path
) -> None:
    paths = (folder / "b.svs", folder / "deflate.tif")
    assert sorted(_embed(embedding_server, tmp_path, *paths)["done"]) == ["b", "deflate"]
    backends = {
        n: read_output(tmp_path / f"{n}.h5")["attrs"]["slide_backend"] for n in ("b", "deflate")
    }
    assert backends == {"b": "native", "deflate": "openslide"}
    assert read_output(tmp_path / "b.h5")["attrs"]["reader"] == "auto"

    def statuses(*args: str) -> dict[str, list[str]]:
        rows = status_rows(tmp_path)
        _embed(embedding_server, tmp_path, folder / "b.svs", *args)
        return by_status(status_rows(tmp_path)[len(rows) :])

    assert statuses() == {"skipped": ["b"]}
    refused = run_embed(folder / "b.svs", "--url", embedding_server.base, "--out", tmp_path,
                        "--reader", "openslide")  # fmt: skip
    assert (
        refused.returncode == 2 and "slide reader (--reader): auto -> openslide" in refused.stderr
    )
    assert statuses("--reader", "openslide", "--force") == {
        "done": ["b"]
    }  # the folder's new record
    assert read_output(tmp_path / "b.h5")["attrs"]["slide_backend"] == "openslide"
    assert statuses("--reader", "openslide") == {"skipped": ["b"]}
    assert statuses("--reader", "openslide", "--resize", "area", "--force") == {"done": ["b"]}


def test_resize_choices_on_slide_a_and_reduced_refused_without_the_native_reader(
    embedding_server: Server, folder: Path, tmp_path: Path
) -> None:
    features = {}
    for resize in ("bicubic", "area", "reduced"):
        out = tmp_path / resize
        assert _embed(embedding_server, out, folder / "a.svs", "--resize", resize)["done"] == ["a"]
        written = read_output(out / "a.h5")
        assert written["attrs"]["resize"] == resize
        features[resize] = written["features"]
    assert not np.array_equal(features["area"], features["bicubic"])
    assert not np.array_equal(features["reduced"], features["area"])
    status = _embed(
        embedding_server,
        tmp_path / "refused",
        folder / "a.svs",
        "--resize",
        "reduced",
        "--reader",
        "openslide",
    )
    assert status.get("failed") == ["a"]
    error = status_rows(tmp_path / "refused")[-1]["error"]
    assert "--resize reduced" in error and "a.svs" in error


def test_a_corrupt_jpeg_tile_fails_the_slide_naming_the_file_and_tile(
    embedding_server: Server, folder: Path, tmp_path: Path
) -> None:
    # Level 0 tile (2, 2) of slide A lies inside the first tissue box (448..1792 px).
    bad = jpeg_slides.patch_tile(folder / "a.svs", tmp_path / "bad.svs", 30, lambda d: d[:40])
    out = tmp_path / "out"
    status = _embed(embedding_server, out, bad, "--reader", "native")
    assert status.get("failed") == ["bad"]
    error = status_rows(out)[-1]["error"]
    assert "unreadable" in error and str(bad) in error and "level 0 tile (2, 2)" in error
