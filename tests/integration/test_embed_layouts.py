"""``histoserve embed --layout flat|trident|clam`` end to end against a live server.

Real parts only: generated slides, the demo ``.pt2`` served by ``python -m
predictor`` on loopback, the CLI in its own interpreter. Files are read back
the way TRIDENT and CLAM read them (their loader conventions are listed in
``tests/unit/histoserve/results/test_layouts.py``); CLAM's ``patch_size``/``patch_level``
are checked by reading the slide exactly as ``Whole_Slide_Bag_FP`` does and
running the package on those tiles.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

import histoserve
from harness import slides
from harness.embed import by_status, independent_tiles, run_embed, status_rows
from harness.packages import package_in
from harness.reference import Reference, normalise_reference
from harness.server import Server

pytestmark = pytest.mark.integration
RTOL, ATOL = 1e-4, 1e-5
# 0.6 um/px tiles: no level matches, so every slide is read larger and resized.
ARGS = ("--target-mpp", "0.6", "--batch-size", "8", "--concurrency", "1", "--slides-in-flight", "1")


@pytest.fixture(scope="module")
def slide_set(tmp_path_factory: pytest.TempPathFactory) -> dict[str, slides.GeneratedSlide]:
    root = tmp_path_factory.mktemp("layout-slides")
    blank = slides.SlideSpec(width=1792, height=1792, boxes=())
    return {
        "svs": slides.aperio_svs(root / "case-1.svs"),
        "ome": slides.generic_tiff(root / "case-2.ome.tiff"),
        "blank": slides.write_slide(root / "blank.svs", blank),
    }


@pytest.fixture(scope="module")
def runs(
    embedding_server: Server, slide_set: dict, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """One run per layout over the same three slides."""
    out = {}
    paths = [s.path for s in slide_set.values()]
    for layout in ("flat", "trident", "clam"):
        folder = tmp_path_factory.mktemp(layout)
        url = embedding_server.base
        result = run_embed(*paths, "--url", url, "--out", folder, "--layout", layout, *ARGS)
        assert result.returncode == 0, result.stderr
        out[layout] = folder
    return out


def _features(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with h5py.File(path, "r") as f:
        return f["features"][:], f["coords"][:]


def test_each_layout_has_its_tools_names_and_the_same_numbers(runs: dict[str, Path]) -> None:
    job = next(runs["trident"].glob("*x_224px_0px_overlap"))
    assert job.name == "16.6667x_224px_0px_overlap"
    files = {
        "flat": {"svs": runs["flat"] / "case-1.h5", "ome": runs["flat"] / "case-2.ome.h5"},
        "trident": {"svs": job / "features_h0-mini/case-1.h5", "ome": job / "features_h0-mini/case-2.h5"},
        "clam": {"svs": runs["clam"] / "h5_files/case-1.h5", "ome": runs["clam"] / "h5_files/case-2.ome.h5"},
    }  # fmt: skip
    assert (job / "patches/case-2_patches.h5").is_file()
    assert (runs["clam"] / "pt_files/case-2.ome.pt").is_file()
    for name in ("svs", "ome"):
        flat_features, flat_coords = _features(files["flat"][name])
        for layout in ("trident", "clam"):
            features, coords = _features(files[layout][name])
            np.testing.assert_array_equal(coords, flat_coords)
            np.testing.assert_allclose(features, flat_features, rtol=RTOL, atol=ATOL)


def test_empty_slide_is_zero_by_d_everywhere(runs: dict[str, Path]) -> None:
    job = next(runs["trident"].glob("*x_224px_0px_overlap"))
    for path in (runs["flat"] / "blank.h5", job / "features_h0-mini/blank.h5"):
        with h5py.File(path, "r") as f:
            assert f["features"].shape == (0, 1536) and f["coords"].shape == (0, 2)
    import torch

    assert tuple(torch.load(runs["clam"] / "pt_files/blank.pt").shape) == (0, 1536)
    clam = runs["clam"]
    for path in (
        runs["flat"] / "blank.h5", job / "features_h0-mini/blank.h5",
        clam / "h5_files/blank.h5", clam / "pt_files/blank.pt",
    ):  # fmt: skip
        back = histoserve.read_features(path)  # what a notebook loop over the cohort calls
        assert back.features.shape == (0, 1536) and back.coords.shape == (0, 2), path
        assert back.attrs["slide_id"] == "blank"


def test_clam_patch_attributes_are_the_area_read(
    runs: dict[str, Path], slide_set: dict, embedding_package_dir: Path
) -> None:
    """Reading as CLAM does (patch_size px at patch_level) and resizing gives the embedded tiles."""
    import torch

    ref = Reference(package_in(embedding_package_dir))
    path = runs["clam"] / "h5_files/case-1.h5"
    with h5py.File(path, "r") as f:
        coords = f["coords"][:]
        level, size = int(f["coords"].attrs["patch_level"]), int(f["coords"].attrs["patch_size"])
    # 0.25 um/px, levels 1/2/8 -> 0.6 um/px: 269 px read at level 1 (0.5 um/px), not 224.
    assert (level, size) == (1, 269)
    rows = np.unique(np.linspace(0, len(coords) - 1, 5).astype(int))
    tiles = independent_tiles(slide_set["svs"].path, coords[rows], level, size, 224)
    (expected,) = ref(normalise_reference(tiles))
    features = torch.load(runs["clam"] / "pt_files/case-1.pt").numpy()
    np.testing.assert_allclose(features[rows], expected, rtol=RTOL, atol=ATOL)


def test_resume_and_shards_work_the_same_in_every_layout(
    embedding_server: Server, runs: dict[str, Path], slide_set: dict, tmp_path: Path
) -> None:
    paths = [s.path for s in slide_set.values()]
    url = embedding_server.base
    for layout in ("trident", "clam"):
        again = run_embed(*paths, "--url", url, "--out", runs[layout], "--layout", layout, *ARGS)
        assert again.returncode == 0, again.stderr
        ids = {"trident": ["blank", "case-1", "case-2"], "clam": ["blank", "case-1", "case-2.ome"]}
        assert sorted(by_status(status_rows(runs[layout]))["skipped"]) == ids[layout]
    out = tmp_path / "sharded"
    for shard in ("0/2", "1/2"):
        result = run_embed(*paths, "--url", url, "--out", out, "--layout", "trident",
                           "--shard", shard, *ARGS)  # fmt: skip
        assert result.returncode == 0, result.stderr
    assert sorted(by_status(status_rows(out))["done"]) == ["blank", "case-1", "case-2"]
