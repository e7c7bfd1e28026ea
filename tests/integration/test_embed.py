"""``histoserve embed`` end to end against live servers: numbers, grids, tissue, failures.

Real parts only: slides generated as tiled pyramidal TIFF/SVS (``harness.slides``),
real demo ``.pt2`` packages served by ``python -m predictor`` on loopback, the
CLI in its own interpreter, HDF5 files read back. Numerical truth is the
package run in this process on tiles read independently with OpenSlide + PIL.
"""

from __future__ import annotations

import csv
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from harness import slides
from harness.embed import (
    by_status,
    independent_tiles,
    read_output,
    run_embed,
    status_rows,
    tiles_served,
)
from harness.packages import copy_package_dir, module_package, package_in
from harness.reference import Reference, normalise_reference
from harness.server import Server, start_server
from predictor.packages.digest import sha256_file

pytestmark = pytest.mark.integration
SAMPLE = 6  # tiles per slide checked against the package run in-process
RTOL, ATOL = 1e-4, 1e-5


def saturation_segmenter() -> nn.Module:
    """``--module`` factory: a tissue segmenter that really segments (tissue = saturated pixels).

    Input ``/255`` RGB ``[B, 3, H, W]``; logits ``[B, 1, H, W]`` positive where
    ``max(rgb) - min(rgb) > 0.08`` (H&E stain; white glass is ~0). The class is
    defined in here so the package cache key (this function's source) covers it.
    """

    class SaturationSegmenter(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            spread = x.amax(dim=1, keepdim=True) - x.amin(dim=1, keepdim=True)
            return 40.0 * (spread - 0.08)

    return SaturationSegmenter().eval()


@pytest.fixture(scope="module")
def slide_set(tmp_path_factory: pytest.TempPathFactory) -> dict[str, slides.GeneratedSlide]:
    root = tmp_path_factory.mktemp("slides")
    svs = slides.aperio_svs(root / "svs.svs")  # 0.25 um/px, levels 1/2/8, JPEG
    tiff = slides.generic_tiff(root / "tiff.tiff")  # 0.5 um/px in resolution tags, deflate
    nompp = slides.generic_tiff(root / "nompp.tiff", mpp=None)
    slides.truncated_copy(svs.path, root / "truncated.svs")
    return {"svs": svs, "tiff": tiff, "nompp": nompp}


@pytest.fixture(scope="module")
def emb(embedding_server: Server) -> Server:
    return embedding_server


@pytest.fixture(scope="module")
def seg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    package = module_package("tissue-seg", f"{__name__}:saturation_segmenter")
    model_dir = copy_package_dir(package, tmp_path_factory.mktemp("seg-model"))
    server = start_server(model_dir, tmp_path_factory.mktemp("seg"), "--max_batch_size", "4")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def clean_run(emb: Server, slide_set: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """svs + tiff at the model's mpp with Otsu tissue: the reference run of this module."""
    out = tmp_path_factory.mktemp("clean")
    paths = [slide_set["svs"].path, slide_set["tiff"].path]
    result = run_embed(*paths, "--url", emb.base, "--out", out, "--batch-size", "8")
    assert result.returncode == 0, result.stderr
    return out


def _check_truth(ref: Reference, slide: Path, out: dict, tile_size: int = 224) -> None:
    """Sampled rows of ``features`` equal the package on independently read tiles."""
    attrs = out["attrs"]
    rows = np.unique(np.linspace(0, len(out["coords"]) - 1, SAMPLE).astype(int))
    tiles = independent_tiles(
        slide, out["coords"][rows], attrs["read_level"], attrs["read_size"], tile_size
    )
    (expected,) = ref(normalise_reference(tiles))
    np.testing.assert_allclose(out["features"][rows], expected, rtol=RTOL, atol=ATOL)


def test_features_equal_the_package_on_independent_reads(
    clean_run: Path, slide_set: dict, embedding_package_dir: Path
) -> None:
    ref = Reference(package_in(embedding_package_dir))
    svs, tiff = read_output(clean_run / "svs.h5"), read_output(clean_run / "tiff.h5")
    # svs: 0.25 um/px -> level 1 (0.5) read as is; tiff: 0.5 um/px -> level 0 as is.
    assert (svs["attrs"]["read_level"], svs["attrs"]["read_size"]) == (1, 224)
    assert (tiff["attrs"]["read_level"], tiff["attrs"]["read_size"]) == (0, 224)
    _check_truth(ref, slide_set["svs"].path, svs)
    _check_truth(ref, slide_set["tiff"].path, tiff)
    assert svs["features"].shape == (len(svs["coords"]), 1536)


def test_features_when_tiles_are_resized(
    emb: Server, slide_set: dict, embedding_package_dir: Path, tmp_path: Path
) -> None:
    paths = [slide_set["svs"].path, slide_set["tiff"].path]
    result = run_embed(*paths, "--url", emb.base, "--out", tmp_path, "--target-mpp", "0.6")
    assert result.returncode == 0, result.stderr
    ref = Reference(package_in(embedding_package_dir))
    svs, tiff = read_output(tmp_path / "svs.h5"), read_output(tmp_path / "tiff.h5")
    # svs: level 1 (0.5 um/px) read larger and resized; tiff: level 0 read larger and resized.
    assert (svs["attrs"]["read_level"], svs["attrs"]["read_size"]) == (1, 269)
    assert (tiff["attrs"]["read_level"], tiff["attrs"]["read_size"]) == (0, 269)
    assert svs["attrs"]["patch_size_level0"] == 538
    _check_truth(ref, slide_set["svs"].path, svs)
    _check_truth(ref, slide_set["tiff"].path, tiff)


def _expected_grid(slide: slides.GeneratedSlide, patch: int) -> np.ndarray:
    spec = slide.spec
    return slides.expected_coords(spec.boxes, patch, (0, 0, spec.width, spec.height))


def test_otsu_coords_are_the_tissue_grid_and_attrs_are_written(
    clean_run: Path, slide_set: dict, embedding_package_dir: Path
) -> None:
    served_sha256 = sha256_file(package_in(embedding_package_dir))
    for name, patch, mpp in (("svs", 448, 0.25), ("tiff", 224, 0.5)):
        out = read_output(clean_run / f"{name}.h5")
        np.testing.assert_array_equal(out["coords"], _expected_grid(slide_set[name], patch))
        assert out["coords"].dtype == np.int64 and out["features"].dtype == np.float32
        assert (out["tissue_fraction"] >= 0.25).all() and "predictions" not in out
        attrs = out["attrs"]
        assert attrs["level0_mpp"] == pytest.approx(mpp) and attrs["target_mpp"] == 0.5
        assert attrs["mpp_source"] and attrs["tile_size"] == 224
        assert attrs["patch_size_level0"] == patch
        assert attrs["model"] == "h0-mini" and attrs["package_sha256"] == served_sha256
        assert json.loads(attrs["spec"])["name"] == "h0-mini"
        assert attrs["tissue"] == "otsu" and attrs["min_tissue"] == 0.25
        assert attrs["slide_id"] == name and attrs["slide_path"] == str(slide_set[name].path)
        assert len(attrs["config_hash"]) == 64 and attrs["histoserve_version"]
        assert out["coords_attrs"]["patch_size_level0"] == patch
        assert out["coords_attrs"]["level0_width"] == 3584
    assert {k: sorted(v) for k, v in by_status(status_rows(clean_run)).items()} == {
        "done": ["svs", "tiff"]  # two slides in flight: either may finish first
    }


def test_served_tissue_model_gives_the_tissue_grid(
    emb: Server, seg_server: Server, slide_set: dict, tmp_path: Path
) -> None:
    before = tiles_served(seg_server.base).get("ok", 0)
    result = run_embed(
        slide_set["svs"].path, slide_set["tiff"].path, "--url", emb.base, "--out", tmp_path,
        "--tissue", seg_server.model_name, "--tissue-url", seg_server.base,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    for name, patch in (("svs", 448), ("tiff", 224)):
        out = read_output(tmp_path / f"{name}.h5")
        np.testing.assert_array_equal(out["coords"], _expected_grid(slide_set[name], patch))
        assert out["attrs"]["tissue"] == seg_server.model_name
    assert tiles_served(seg_server.base).get("ok", 0) > before  # the model was asked


def test_bad_slides_fail_alone_with_their_reason(
    emb: Server, slide_set: dict, tmp_path: Path
) -> None:
    root = slide_set["svs"].path.parent
    manifest = tmp_path / "slides.csv"
    with open(manifest, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["slide_id", "path", "mpp"])
        writer.writerow(["good", slide_set["tiff"].path, ""])
        writer.writerow(["nompp", slide_set["nompp"].path, ""])
        writer.writerow(["nompp_given", slide_set["nompp"].path, "0.5"])
        writer.writerow(["truncated", root / "truncated.svs", ""])
    out = tmp_path / "out"
    result = run_embed("--manifest", manifest, "--url", emb.base, "--out", out)
    assert result.returncode == 1, result.stderr
    rows = {r["slide_id"]: r for r in status_rows(out)}
    assert {k: r["status"] for k, r in rows.items()} == {
        "good": "done", "nompp": "failed", "nompp_given": "done", "truncated": "failed",
    }  # fmt: skip
    assert "mpp" in rows["nompp"]["error"] and "--mpp-override" in rows["nompp"]["error"]
    assert rows["truncated"]["error"]
    assert read_output(out / "nompp_given.h5")["attrs"]["mpp_source"] == "manifest"
    assert not (out / "nompp.h5").exists() and not (out / "truncated.h5").exists()


@pytest.fixture(scope="module")
def mm_server(
    multimodal_package_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    server = start_server(multimodal_package_dir, tmp_path_factory.mktemp("mm"))
    yield server
    server.stop()


def test_bulk_rna_goes_with_every_tile_and_a_4xx_fails_its_slide(
    mm_server: Server, slide_set: dict, multimodal_package_dir: Path, tmp_path: Path
) -> None:
    counts = np.random.default_rng(3).poisson(20.0, 64).astype(np.float32)
    np.savetxt(tmp_path / "good.csv", counts[None], delimiter=",", fmt="%g")
    np.savetxt(tmp_path / "short.csv", counts[None, :63], delimiter=",", fmt="%g")
    shutil.copy(slide_set["tiff"].path, tmp_path / "other.tiff")
    manifest = tmp_path / "slides.csv"
    manifest.write_text(
        "slide_id,path,bulk_rna\n"
        f"good,{slide_set['tiff'].path},{tmp_path / 'good.csv'}\n"
        f"short,{tmp_path / 'other.tiff'},{tmp_path / 'short.csv'}\n"
    )
    out = tmp_path / "out"
    result = run_embed(
        "--manifest", manifest, "--url", mm_server.base, "--out", out,
        "--mode", "prediction_with_embedding",
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    rows = {r["slide_id"]: r for r in status_rows(out)}
    assert rows["good"]["status"] == "done" and rows["short"]["status"] == "failed"
    assert "HTTP 400" in rows["short"]["error"] and "bulk_rna" in rows["short"]["error"]
    good = read_output(out / "good.h5")
    rows_ = np.arange(min(SAMPLE, len(good["coords"])))
    tiles = independent_tiles(slide_set["tiff"].path, good["coords"][rows_], 0, 224, 224)
    log_rna = torch.from_numpy(np.log1p(np.tile(counts, (len(rows_), 1))))
    pred_log, emb_ = Reference(package_in(multimodal_package_dir))(
        normalise_reference(tiles), log_rna
    )
    np.testing.assert_allclose(good["features"][rows_], emb_, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(
        good["predictions"][rows_], np.round(np.expm1(pred_log), 3), rtol=RTOL, atol=2e-3
    )


def _corrupt_tiff_tile(path: Path, index: int) -> None:
    """Overwrites the middle of level 0's TIFF tile ``index`` with noise (deflate fails on it)."""
    import tifffile

    with tifffile.TiffFile(path) as tf:
        offset, count = tf.pages[0].dataoffsets[index], tf.pages[0].databytecounts[index]
    noise = np.random.default_rng(0).integers(0, 256, count - 20, dtype=np.uint8)
    with open(path, "r+b") as fh:
        fh.seek(offset + 10)
        fh.write(noise.tobytes())


def test_corrupt_tiles_are_retried_then_skipped_and_recorded(
    emb: Server, slide_set: dict, clean_run: Path, tmp_path: Path
) -> None:
    corrupt = tmp_path / "corrupt.tiff"
    shutil.copy(slide_set["tiff"].path, corrupt)
    _corrupt_tiff_tile(corrupt, 15)  # 256 px TIFF tiles, 14 per row: x, y in [256, 512)
    out = tmp_path / "out"
    result = run_embed(corrupt, slide_set["tiff"].path, "--url", emb.base, "--out", out)
    assert result.returncode == 1, result.stderr
    rows = {r["slide_id"]: r for r in status_rows(out)}
    assert rows["tiff"]["status"] == "done" and rows["corrupt"]["status"] == "failed"
    assert "4 of 10 tiles unreadable" in rows["corrupt"]["error"]
    assert not (out / "corrupt.h5").exists()  # held apart: incomplete/, complete=False
    got, clean = read_output(out / "incomplete" / "corrupt.h5"), read_output(clean_run / "tiff.h5")
    bad = np.array([[224, 224], [448, 224], [224, 448], [448, 448]])  # overlap the bad tile
    np.testing.assert_array_equal(got["attrs"]["bad_coords"], bad)
    keep = ~(clean["coords"][:, None, :] == bad[None]).all(axis=2).any(axis=1)
    np.testing.assert_array_equal(got["coords"], clean["coords"][keep])
    np.testing.assert_allclose(got["features"], clean["features"][keep], rtol=RTOL, atol=ATOL)
    assert got["attrs"]["n_bad_tiles"] == 4
