"""Masks in: QuPath GeoJSON and binary images on real generated slides, and where they are found.

Hostile files (:mod:`harness.hostile_inputs`) fail with a message that names
the file and what is wrong, within bounded memory, never a Python exception's name.
"""

from __future__ import annotations

import json
import re
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from harness.hostile_inputs import Hostile, hostile_masks, sparse_tiff
from harness.slides import GeneratedSlide, expected_coords
from histoserve.errors import SlideError
from histoserve.limits import MAX_MASK_CROSSINGS, MAX_THUMB_PIXELS
from histoserve.slides.grid import TilePlan, plan_tiles
from histoserve.slides.readers import MppInfo, SlideReader, resolve_mpp
from histoserve.tissue.detect import THUMB_MPP, thumbnail_grid
from histoserve.tissue.masks import (
    TissueMap,
    feature_collection,
    find_tissue,
    mask_file,
    read_geojson,
    read_mask,
)

TOL = 0.05
MIN_TISSUE = 0.25
BOUNDS = (0, 0, 3584, 2688)


def _tissue(slide: GeneratedSlide, mask: Path | None = None) -> tuple[TissueMap, TilePlan]:
    with SlideReader.open(slide.path) as reader:
        mpp = resolve_mpp(reader, None, None, TOL)
        plan = plan_tiles(reader, mpp, 0.5, 224, TOL)
        return find_tissue(reader, mpp, plan, "otsu", mask), plan


def _square(x: float, y: float, w: float, h: float) -> list[list[float]]:
    return [[x, y], [x + w, y], [x + w, y + h], [x, y + h], [x, y]]


def _write(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data))
    return path


def test_own_geojson_gives_back_the_same_mask_and_fractions(
    svs_slide: GeneratedSlide, tmp_path: Path
) -> None:
    otsu, plan = _tissue(svs_slide)
    collection = feature_collection(otsu.polygons_level0(plan.level0_mpp))
    path = _write(tmp_path / "svs.geojson", collection)
    again, _ = _tissue(svs_slide, path)
    assert again.source == "mask" and again.mask_mpp == otsu.mask_mpp
    np.testing.assert_array_equal(again.mask, otsu.mask)
    np.testing.assert_array_equal(again.fractions, otsu.fractions)
    kept = plan.coords[again.fractions >= MIN_TISSUE]
    np.testing.assert_array_equal(kept, expected_coords(svs_slide.boxes, 448, BOUNDS))


def test_a_qupath_rectangle_keeps_the_tiles_of_one_box(
    svs_slide: GeneratedSlide, tmp_path: Path
) -> None:
    box = svs_slide.boxes[0]
    feature = {
        "type": "Feature",
        "id": "b0c6c8f6",
        "geometry": {"type": "Polygon", "coordinates": [_square(*box)]},
        "properties": {"objectType": "annotation", "classification": {"name": "Tumor"}},
    }
    for data in ({"type": "FeatureCollection", "features": [feature]}, [feature], feature):
        tissue, plan = _tissue(svs_slide, _write(tmp_path / "m.geojson", data))
        kept = plan.coords[tissue.fractions >= MIN_TISSUE]
        np.testing.assert_array_equal(kept, expected_coords([box], 448, BOUNDS))


def test_holes_and_ignore_classes_are_cut_out(svs_slide: GeneratedSlide, tmp_path: Path) -> None:
    x, y, w, h = svs_slide.boxes[0]  # 3 x 2 tiles of 448 px
    middle = _square(x + 448, y, 448, 448)  # the top middle tile
    ring_with_hole = {"type": "Polygon", "coordinates": [_square(x, y, w, h), middle[::-1]]}
    pen = {
        "type": "Feature",
        "geometry": {"type": "MultiPolygon", "coordinates": [[_square(x, y + 448, 448, 448)]]},
        "properties": {"classification": {"name": "Ignore*"}},
    }
    data = {"type": "FeatureCollection", "features": [{"type": "Feature", "geometry": ring_with_hole}, pen]}  # fmt: skip
    tissue, plan = _tissue(svs_slide, _write(tmp_path / "m.geojson", data))
    kept = {tuple(c) for c in plan.coords[tissue.fractions >= MIN_TISSUE].tolist()}
    everything = {tuple(c) for c in expected_coords([svs_slide.boxes[0]], 448, BOUNDS).tolist()}
    assert everything - kept == {(x + 448, y), (x, y + 448)}


def test_a_binary_png_at_any_scale(svs_slide: GeneratedSlide, tmp_path: Path) -> None:
    box = svs_slide.boxes[1]
    png = np.zeros((2688 // 32, 3584 // 32), np.uint8)
    bx, by, bw, bh = (v // 32 for v in box)
    png[by : by + bh, bx : bx + bw] = 1  # any non-zero value is tissue
    Image.fromarray(png).save(tmp_path / "m.png")
    tissue, plan = _tissue(svs_slide, tmp_path / "m.png")
    assert tissue.mask_mpp == pytest.approx(8.0)
    kept = plan.coords[tissue.fractions >= MIN_TISSUE]
    np.testing.assert_array_equal(kept, expected_coords([box], 448, BOUNDS))


def test_bad_mask_files_fail_the_slide_with_the_reason(
    svs_slide: GeneratedSlide, tmp_path: Path
) -> None:
    Image.fromarray(np.zeros((100, 100), np.uint8)).save(tmp_path / "square.png")
    (tmp_path / "bad.geojson").write_text("{not json")
    _write(tmp_path / "points.geojson", {"type": "Polygon", "coordinates": [[1, 2]]})
    (tmp_path / "m.csv").write_text("x")
    cases = {
        "square.png": "aspect ratio",
        "bad.geojson": r"not JSON \(Expecting property name .* line 1 column 2\)",
        "points.geojson": r"\$\.coordinates\[0\]\[0\]: the number 1, not an \[x, y\] position",
        "m.csv": "unknown kind",
    }
    with SlideReader.open(svs_slide.path) as reader:
        mpp = MppInfo(0.25, "test")
        for name, reason in cases.items():
            with pytest.raises(SlideError, match=reason):
                read_mask(tmp_path / name, reader, mpp)


def test_lines_and_points_cover_nothing(tmp_path: Path) -> None:
    data = [
        {"type": "Feature", "geometry": {"type": "Point", "coordinates": [5, 5]}},
        {"type": "Feature", "geometry": None},
        {"type": "LineString", "coordinates": [[0, 0], [5, 5]]},
    ]
    assert read_geojson(_write(tmp_path / "m.json", data)) == ([], [])


def test_mask_file_prefers_the_manifest_then_the_folder(tmp_path: Path) -> None:
    (tmp_path / "S1.png").write_bytes(b"")
    (tmp_path / "S1.geojson").write_text("{}")
    own = tmp_path / "own.json"
    own.write_text("{}")
    assert mask_file("S1", own, tmp_path) == own
    assert mask_file("S1", None, tmp_path) == tmp_path / "S1.geojson"
    assert mask_file("S1", None, None) is None
    with pytest.raises(SlideError, match=r"no mask for slide 'S2'.*S2\.geojson"):
        mask_file("S2", None, tmp_path)
    with pytest.raises(SlideError, match="does not exist"):
        mask_file("S1", tmp_path / "gone.geojson", None)


def test_feature_collection_is_qupaths_form() -> None:
    polygons = [[[(0.0, 0.0), (16.0, 0.0), (16.0, 8.5), (0.0, 0.0)]]]
    (feature,) = feature_collection(polygons)["features"]
    assert feature["type"] == "Feature"
    assert feature["geometry"] == {
        "type": "Polygon",
        "coordinates": [[[0, 0], [16, 0], [16, 8.5], [0, 0]]],
    }
    assert feature["properties"]["objectType"] == "annotation"
    assert feature["properties"]["classification"]["name"] == "Tissue"


@pytest.mark.parametrize(("min_tissue", "kept"), [(0.25, 1), (0.75, 0)])
def test_min_tissue_applies_to_a_mask(
    svs_slide: GeneratedSlide, tmp_path: Path, min_tissue: float, kept: int
) -> None:
    x, y, _w, _h = svs_slide.boxes[0]
    half_a_tile = {"type": "Polygon", "coordinates": [_square(x, y, 224, 448)]}
    tissue, _plan = _tissue(svs_slide, _write(tmp_path / "m.geojson", half_a_tile))
    assert tissue.fractions.max() == pytest.approx(0.5)
    assert (tissue.fractions >= min_tissue).sum() == kept


# Python exception class names a message must never carry (IndexError, RecursionError, ...).
PYTHON_NAMES = re.compile(r"\b[A-Z][A-Za-z]*(Error|Exception|Warning)\b")


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Hostile]:
    return hostile_masks(tmp_path_factory.mktemp("hostile"))


@pytest.mark.parametrize(
    "name",
    ["deep", "not_a_feature", "nan", "inf", "huge", "too_many_bytes", "too_many_vertices",
     "bomb", "truncated", "not_an_image"],
)  # fmt: skip
def test_a_hostile_mask_fails_its_slide_naming_the_file_and_the_fault(
    svs_slide: GeneratedSlide, hostile: dict[str, Hostile], name: str
) -> None:
    case = hostile[name]
    with SlideReader.open(svs_slide.path) as reader, pytest.raises(SlideError) as caught:
        mask_file(name, None, case.path.parent)  # where it is found: its size is checked there
        read_mask(case.path, reader, MppInfo(0.25, "test"))
    message = str(caught.value)
    assert message.startswith(f"mask {case.path}: ") and re.search(case.reason, message), message
    assert not PYTHON_NAMES.search(message), message


def test_a_decompression_bomb_is_refused_from_its_header(
    svs_slide: GeneratedSlide, hostile: dict[str, Hostile]
) -> None:
    bomb = hostile["bomb"].path
    assert bomb.stat().st_size < 30_000  # 15,000 x 11,250 px in under 30 KB
    with SlideReader.open(svs_slide.path) as reader:
        tracemalloc.start()
        try:
            with pytest.raises(SlideError, match="more than the"):
                read_mask(bomb, reader, MppInfo(0.25, "test"))
            _now, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert peak < 16 << 20  # decoded it would be 169 MB (8-bit) at the least


def _zigzag(vertices: int, width: float, height: float) -> dict[str, object]:
    """A Polygon whose every edge runs from the top of the slide to the bottom."""
    xs = np.linspace(0, width, vertices)
    ys = np.where(np.arange(vertices) % 2, height - 1, 1)
    ring = np.stack([xs, ys], axis=1).tolist()
    return {"type": "Polygon", "coordinates": [[*ring, [0, height], ring[0]]]}


def test_outlines_too_costly_to_rasterise_are_refused_before_rasterising(tmp_path: Path) -> None:
    # 50 x 37.5 mm at 0.25 um/px: the tissue grid is as large as the thumbnail budget allows.
    slide = sparse_tiff(tmp_path / "large.tiff", 200_000, 150_000, mpp=0.25)
    path = _write(tmp_path / "zigzag.geojson", _zigzag(30_000, 200_000, 150_000))
    with SlideReader.open(slide) as reader:
        mpp = MppInfo(0.25, "test")
        _level, _factor, (rows, cols), _mpp = thumbnail_grid(reader, mpp, THUMB_MPP)
        assert rows * cols <= MAX_THUMB_PIXELS and 30_000 * (rows - 2) > MAX_MASK_CROSSINGS
        tracemalloc.start()
        try:
            with pytest.raises(SlideError, match=r"cross the \d+x\d+ px tissue grid's rows"):
                read_mask(path, reader, mpp)
            _now, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert peak < 64 << 20  # rasterised, its crossings alone would take gigabytes


def test_qc_contours_of_a_noisy_mask_stay_bounded() -> None:
    rng = np.random.default_rng(2)
    noise = rng.random((2048, 2048)) < 0.5  # speckle: about 4 million boundary sides
    tissue = TissueMap(noise, 4.0, "mask", np.zeros(0, np.float32))
    tracemalloc.start()
    try:
        polygons = tissue.polygons_level0(0.25)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert polygons and peak < 300 << 20  # traced as it is: about 800 MB
    xs = np.array([x for polygon in polygons for x, _ in polygon[0]])
    assert xs.min() >= 0 and xs.max() <= 2048 * 16  # still level-0 px of the whole slide
