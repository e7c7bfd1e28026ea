"""``histoserve embed`` QC, masks in and incomplete slides, end to end against a live server.

Real parts only: slides generated as tiled pyramidal TIFF/SVS with real H&E
texture (``harness.slides``), the demo H0-mini ``.pt2`` served by
``python -m predictor`` on loopback, the CLI in its own interpreter, files read
back with h5py, PIL and json.

- a slide with a corrupt tile region fails on every run (exit 1, never done
  or skipped) and its file is never under the final name, until
  ``--accept-bad-tiles`` accepts it;
- every slide has a QC picture and a QuPath GeoJSON, the report lists every
  slide, suspicious ones first;
- the run's own GeoJSON given back with ``--masks`` reproduces the run; an
  edited one (half the tissue) and a binary PNG mask give the tiles of the
  tissue they keep.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from harness import slides
from harness.embed import read_output, run_embed, status_rows
from harness.server import Server

pytestmark = pytest.mark.integration
RTOL, ATOL = 1e-4, 1e-5


@pytest.fixture(scope="module")
def slide_set(tmp_path_factory: pytest.TempPathFactory) -> dict[str, slides.GeneratedSlide]:
    root = tmp_path_factory.mktemp("qc-slides")
    tiff = slides.generic_tiff(root / "tiff.tiff")  # 0.5 um/px, boxes on a 224 grid
    svs = slides.aperio_svs(root / "svs.svs")  # 0.25 um/px, boxes on a 448 grid
    blank = slides.write_slide(root / "blank.svs", slides.SlideSpec(3584, 2688, boxes=()))
    return {"tiff": tiff, "svs": svs, "blank": blank}


@pytest.fixture(scope="module")
def first_run(
    embedding_server: Server, slide_set: dict, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """tiff + svs + blank + a truncated file, Otsu tissue: exit 1 for the truncated one only."""
    out = tmp_path_factory.mktemp("qc-run")
    broken = slides.truncated_copy(slide_set["svs"].path, out.parent / "broken.svs")
    paths = [slide_set[k].path for k in ("tiff", "svs", "blank")] + [broken]
    result = run_embed(*paths, "--url", embedding_server.base, "--out", out, "--batch-size", "8")
    assert result.returncode == 1, result.stderr
    return out


def _expected(slide: slides.GeneratedSlide, patch: int, boxes: tuple | None = None) -> np.ndarray:
    spec = slide.spec
    return slides.expected_coords(boxes or spec.boxes, patch, (0, 0, spec.width, spec.height))


def _statuses(out: Path, since: int = 0) -> dict[str, str]:
    return {r["slide_id"]: r["status"] for r in status_rows(out)[since:]}


def test_corrupt_tiles_fail_every_run_until_accepted(
    embedding_server: Server, slide_set: dict, tmp_path: Path
) -> None:
    corrupt = slides.corrupt_tiles_copy(slide_set["tiff"].path, tmp_path / "corrupt.tiff", [15])
    out = tmp_path / "out"
    args = (corrupt, "--url", embedding_server.base, "--out", out, "--batch-size", "4")
    for run in range(2):  # the same command twice: failed both times, never done or skipped
        since = len(status_rows(out))
        result = run_embed(*args)
        assert result.returncode == 1, (run, result.stderr)
        rows = status_rows(out)[since:]
        assert [r["status"] for r in rows] == ["failed"], run
        assert "4 of 10 tiles unreadable" in rows[0]["error"]
        assert "448,448" in rows[0]["error"] and "incomplete/corrupt.h5" in rows[0]["error"]
        assert "1 failed" in result.stderr
        assert not (out / "corrupt.h5").exists()  # no loader globbing <out>/*.h5 takes it
        held = read_output(out / "incomplete" / "corrupt.h5")
        assert held["attrs"]["complete"] == np.False_ and held["attrs"]["n_bad_tiles"] == 4
        assert len(held["coords"]) == 6
    facts = json.loads((out / "qc" / "corrupt.json").read_text())
    assert facts["n_bad"] == 4 and [448, 448] in facts["bad_coords"]

    since = len(status_rows(out))
    accepted = run_embed(*args, "--accept-bad-tiles", "4")
    assert accepted.returncode == 0, accepted.stderr
    row = status_rows(out)[since]
    assert row["status"] == "done" and "4 unreadable tiles accepted" in row["error"]
    done = read_output(out / "corrupt.h5")
    assert done["attrs"]["complete"] == np.True_ and done["attrs"]["n_bad_tiles"] == 4
    assert not (out / "incomplete" / "corrupt.h5").exists()
    # Without the opt-in, a slide with holes is not done: it is tried (and fails) again.
    since = len(status_rows(out))
    assert run_embed(*args).returncode == 1
    assert _statuses(out, since) == {"corrupt": "failed"}
    # With it, it is done and skipped like any other.
    since = len(status_rows(out))
    assert run_embed(*args, "--accept-bad-tiles", "4").returncode == 0
    assert _statuses(out, since) == {"corrupt": "skipped"}


def test_every_slide_has_qc_files_and_the_report_lists_it(first_run: Path) -> None:
    assert _statuses(first_run) == {
        "blank": "done", "broken": "failed", "svs": "done", "tiff": "done",
    }  # fmt: skip
    for slide_id in ("tiff", "svs", "blank"):
        with Image.open(first_run / "qc" / f"{slide_id}.jpg") as picture:
            assert picture.format == "JPEG" and max(picture.size) >= 640
        collection = json.loads((first_run / "qc" / f"{slide_id}.geojson").read_text())
        assert collection["type"] == "FeatureCollection"
        for feature in collection["features"]:
            assert feature["type"] == "Feature"
            assert feature["geometry"]["type"] in ("Polygon", "MultiPolygon")
            assert feature["properties"]["objectType"] == "annotation"
            assert feature["properties"]["classification"]["name"] == "Tissue"
    tiff = json.loads((first_run / "qc" / "tiff.geojson").read_text())
    points = np.array([p for f in tiff["features"] for p in f["geometry"]["coordinates"][0]])
    # Level-0 pixels: the contours lie around the tissue boxes (224..1792 x 224..1344).
    assert points.min() >= 224 - 16 and points[:, 0].max() <= 1792 + 16
    assert len(json.loads((first_run / "qc" / "blank.geojson").read_text())["features"]) == 0

    page = (first_run / "report.html").read_text()
    order = [page.index(f"<td>{slide_id}") for slide_id in ("broken", "blank", "svs", "tiff")]
    assert order == sorted(order)  # failed, then no tissue, then the others by id
    assert 'src="qc/tiff.jpg"' in page and 'href="qc/svs.geojson"' in page
    assert "no tissue" in page and "failed" in page
    assert "0.25 (openslide.mpp)" in page and "level 1, 224 px" in page


def test_the_runs_own_geojson_reproduces_it(
    embedding_server: Server, first_run: Path, slide_set: dict, tmp_path: Path
) -> None:
    masks = tmp_path / "masks"
    masks.mkdir()
    for slide_id in ("tiff", "svs"):
        shutil.copy(first_run / "qc" / f"{slide_id}.geojson", masks)
    out = tmp_path / "out"
    paths = [slide_set["tiff"].path, slide_set["svs"].path]
    result = run_embed(*paths, "--url", embedding_server.base, "--out", out, "--masks", masks)
    assert result.returncode == 0, result.stderr
    for slide_id in ("tiff", "svs"):
        got, want = read_output(out / f"{slide_id}.h5"), read_output(first_run / f"{slide_id}.h5")
        np.testing.assert_array_equal(got["coords"], want["coords"])
        np.testing.assert_array_equal(got["tissue_fraction"], want["tissue_fraction"])
        np.testing.assert_allclose(got["features"], want["features"], rtol=RTOL, atol=ATOL)
        assert got["attrs"]["tissue"] == "mask"
        assert got["attrs"]["config_hash"] != want["attrs"]["config_hash"]


def _left_box_only(collection: dict, x_limit: int) -> dict:
    """The edit a pathologist makes in QuPath: delete the contours right of ``x_limit``."""
    features = collection["features"]
    keep = [f for f in features if max(p[0] for p in f["geometry"]["coordinates"][0]) < x_limit]
    assert 0 < len(keep) < len(features)
    return {**collection, "features": keep}


def test_an_edited_geojson_and_a_png_mask_keep_half_the_tissue(
    embedding_server: Server, first_run: Path, slide_set: dict, tmp_path: Path
) -> None:
    tiff, svs = slide_set["tiff"], slide_set["svs"]
    qc_geojson = json.loads((first_run / "qc" / "tiff.geojson").read_text())
    edited = _left_box_only(qc_geojson, x_limit=tiff.boxes[1][0])
    (tmp_path / "tiff.geojson").write_text(json.dumps(edited))
    # A binary mask of the whole svs at 1/16 scale: only the right-hand box is tissue.
    x, y, w, h = (v // 16 for v in svs.boxes[1])
    png = np.zeros((2688 // 16, 3584 // 16), np.uint8)
    png[y : y + h, x : x + w] = 255
    Image.fromarray(png).save(tmp_path / "svs_mask.png")
    manifest = tmp_path / "slides.csv"
    manifest.write_text(
        f"slide_id,path,mask\ntiff,{tiff.path},tiff.geojson\nsvs,{svs.path},svs_mask.png\n"
    )
    out = tmp_path / "out"
    result = run_embed("--manifest", manifest, "--url", embedding_server.base, "--out", out)
    assert result.returncode == 0, result.stderr
    got = read_output(out / "tiff.h5")
    np.testing.assert_array_equal(got["coords"], _expected(tiff, 224, tiff.boxes[:1]))
    full = read_output(first_run / "tiff.h5")
    rows = (full["coords"][:, None] == got["coords"][None]).all(axis=2).any(axis=1)
    np.testing.assert_allclose(got["features"], full["features"][rows], rtol=RTOL, atol=ATOL)
    got_svs = read_output(out / "svs.h5")
    np.testing.assert_array_equal(got_svs["coords"], _expected(svs, 448, svs.boxes[1:]))
    assert got_svs["attrs"]["mask"].endswith("svs_mask.png")
    # The QC of the masked run shows the mask it used.
    masked = json.loads((out / "qc" / "tiff.json").read_text())
    assert masked["tissue"] == "mask" and masked["n_kept"] == len(got["coords"])


def test_masks_folder_without_the_slides_mask_fails_that_slide(
    embedding_server: Server, slide_set: dict, tmp_path: Path
) -> None:
    masks = tmp_path / "masks"
    masks.mkdir()
    out = tmp_path / "out"
    result = run_embed(
        slide_set["tiff"].path, "--url", embedding_server.base, "--out", out, "--masks", masks
    )
    assert result.returncode == 1, result.stderr
    (row,) = status_rows(out)
    assert row["status"] == "failed" and "no mask for slide 'tiff'" in row["error"]
    assert "tiff.geojson" in row["error"]


def test_a_killed_runs_qc_and_report_temps_are_swept_at_the_next_start(
    embedding_server: Server, slide_set: dict, tmp_path: Path
) -> None:
    """Temp files no live process holds (their writer was killed) go; a live one's stays."""
    import fcntl
    import os

    out = tmp_path / "out"
    (out / "qc").mkdir(parents=True)
    dead = [out / f".report.html.{'a' * 32}.tmp", out / "qc" / f".x.jpg.{'b' * 32}.tmp"]
    live = out / "qc" / f".y.jpg.{'c' * 32}.tmp"
    for path in (*dead, live):
        path.write_bytes(b"half a picture")
        os.utime(path, (1e9, 1e9))  # long ago
    holder = os.open(live, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)  # as a live writer in another run holds it
    try:
        result = run_embed(slide_set["tiff"].path, "--url", embedding_server.base, "--out", out)
        assert live.exists()
    finally:
        os.close(holder)
    assert result.returncode == 0, result.stderr
    assert not any(p.exists() for p in dead)
