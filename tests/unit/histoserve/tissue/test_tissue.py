"""Tissue detection: exact expected grids on real slides, none on white glass, pale tissue
measured against slides whose tissue is known; the thumbnail within its pixel budget."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from harness.hostile_inputs import sparse_tiff
from harness.slides import GeneratedSlide, SlideSpec, expected_coords, render_region, write_slide
from harness.tissue_truth import pale_layout, tissue_truth
from histoserve.limits import MAX_THUMB_PIXELS
from histoserve.slides.grid import TilePlan, plan_tiles
from histoserve.slides.readers import MppInfo, SlideReader, resolve_mpp
from histoserve.tissue.detect import (
    THUMB_MPP,
    fractions_from_mask,
    otsu_mask,
    otsu_threshold,
    saturation,
    thumbnail,
    thumbnail_grid,
    tissue_fractions,
)
from histoserve.tissue.masks import find_tissue

TOL = 0.05
MIN_TISSUE = 0.25


def _kept(
    slide: GeneratedSlide, target: float, method: str = "otsu"
) -> tuple[np.ndarray, TilePlan]:
    with SlideReader.open(slide.path) as reader:
        plan = plan_tiles(reader, resolve_mpp(reader, None, None, TOL), target, 224, TOL)
        fractions = tissue_fractions(reader, plan, method)
    assert fractions.dtype == np.float32 and fractions.shape == (len(plan.coords),)
    return plan.coords[fractions >= MIN_TISSUE], plan


@pytest.mark.parametrize(("name", "target"), [("svs_slide", 0.5), ("tiff_slide", 0.5)])
def test_otsu_keeps_exactly_the_tiles_inside_tissue(
    request: pytest.FixtureRequest, name: str, target: float
) -> None:
    slide: GeneratedSlide = request.getfixturevalue(name)
    kept, plan = _kept(slide, target)
    expected = expected_coords(slide.boxes, plan.patch_size_level0, (0, 0, 3584, 2688))
    assert len(expected) == 10
    assert np.array_equal(kept, expected)


def test_otsu_finds_nothing_on_white_glass(blank_slide: GeneratedSlide) -> None:
    with SlideReader.open(blank_slide.path) as reader:
        plan = plan_tiles(reader, MppInfo(0.25, "x"), 0.5, 224, TOL)
        fractions = tissue_fractions(reader, plan, "otsu")
    assert len(plan.coords) == 48 and fractions.max() == 0.0


def test_none_keeps_every_tile_inside_the_bounds(svs_slide: GeneratedSlide) -> None:
    kept, plan = _kept(svs_slide, 0.5, "none")
    assert np.array_equal(kept, plan.coords) and len(kept) == 48


def test_unknown_method(svs_slide: GeneratedSlide) -> None:
    with SlideReader.open(svs_slide.path) as reader:
        plan = plan_tiles(reader, MppInfo(0.25, "x"), 0.5, 224, TOL)
        with pytest.raises(ValueError, match="tissue method"):
            tissue_fractions(reader, plan, "magic")


def test_thumbnail_scale_is_exact(svs_slide: GeneratedSlide) -> None:
    with SlideReader.open(svs_slide.path) as reader:
        rgb, mpp = thumbnail(reader, MppInfo(0.25, "x"), 4.0)
        assert mpp == 4.0 and rgb.shape == (2688 // 16, 3584 // 16, 3)
        rgb8, mpp8 = thumbnail(reader, MppInfo(0.25, "x"), 7.0)  # 2.0 x 3 is the closest below
        assert mpp8 == 6.0 and rgb8.shape == (2688 // 24, 3584 // 24, 3)
        # White outside the boxes, coloured inside.
        assert saturation(rgb[:20, :20]).max() < 10
        assert saturation(rgb[30:50, 30:80]).mean() > 40


def _plan(coords: list[tuple[int, int]], patch: int, mpp: float = 1.0) -> TilePlan:
    return TilePlan(
        target_mpp=mpp,
        level0_mpp=mpp,
        mpp_source="x",
        tile_size=patch,
        read_level=0,
        read_size=patch,
        patch_size_level0=patch,
        coords=np.array(coords, np.int64).reshape(-1, 2),
        level0_width=1000,
        level0_height=1000,
    )


def test_fractions_from_a_known_mask() -> None:
    mask = np.zeros((100, 100), bool)
    mask[:, :50] = True  # left half tissue
    mask[:10, 50:60] = True  # a 10x10 patch right of it
    # Level-0 mpp 1.0, mask mpp 2.0: a 40-px tile covers 20x20 mask px.
    plan = _plan([(0, 0), (80, 0), (100, 0), (100, 20), (180, 180), (190, 190)], 40)
    got = fractions_from_mask(mask, 2.0, plan)
    # The last tile hangs over the mask's edge: outside counts as background.
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, [1.0, 0.75, 0.25, 0.0, 0.0, 0.0])


def test_otsu_threshold_splits_two_modes() -> None:
    values = np.concatenate([np.full(500, 10), np.full(300, 120)]).astype(np.uint8)
    assert 10 <= otsu_threshold(values) < 120


def test_otsu_mask_fills_holes_closes_gaps_and_drops_specks() -> None:
    rgb = np.full((300, 300, 3), 255, np.uint8)
    rgb[20:220, 20:220] = (150, 60, 160)  # tissue, 800 um a side at 4 um/px
    rgb[40:44, 40:44] = 255  # a small hole: filled
    rgb[50:90, 150:190] = 255  # 1,600 px (25,600 um2), under the hole limit: filled
    rgb[120:200, 60:140] = 255  # 6,400 px (102,400 um2), a lumen over the limit: kept
    rgb[100:220, 200:205] = 255  # a 20 um slit open to the glass: closed
    rgb[280:282, 280:282] = (150, 60, 160)  # a speck (64 um2): dropped
    mask = otsu_mask(rgb, mpp=4.0)
    assert mask[40:44, 40:44].all() and mask[50:90, 150:190].all()
    assert mask[100:220, 200:205].all()
    assert not mask[280:282, 280:282].any()
    assert not mask[125:195, 65:135].any()  # the lumen, less the closing's reach at its rim
    assert not mask[:18].any() and not mask[:, 222:].any()  # the glass around stays glass


def test_large_bench_slide_is_all_tissue(tmp_path) -> None:
    from harness.slides import large_slide

    slide = large_slide(tmp_path / "large.tiff", 8, 6)
    assert slide.level_dimensions[0] == (8 * 224, 6 * 224)
    kept, plan = _kept(slide, 0.5)
    assert len(plan.coords) == 48 and np.array_equal(kept, plan.coords)


def test_threshold_without_background_does_not_split_the_tissue() -> None:
    from histoserve.tissue.detect import MIN_SATURATION, tissue_threshold

    rng = np.random.default_rng(3)
    pink_and_purple = np.concatenate([rng.integers(50, 70, 500), rng.integers(120, 150, 500)])
    assert tissue_threshold(pink_and_purple.astype(np.uint8)) == MIN_SATURATION
    with_glass = np.concatenate([rng.integers(0, 6, 2000), pink_and_purple]).astype(np.uint8)
    assert MIN_SATURATION <= tissue_threshold(with_glass) < 50


# What "covers the tissue" means, measured on slides whose tissue is known.
MIN_COVERED = 0.95  # of the known tissue area
MIN_INSIDE_FRACTION = 0.95  # of every tile wholly inside tissue
MAX_GLASS = 0.01  # share of the glass counted as tissue


@pytest.fixture(scope="module")
def pale_slides(tmp_path_factory: pytest.TempPathFactory) -> dict[str, GeneratedSlide]:
    """Pale tissue, a pale fragment and a lumen (``harness.slides.pale_layout``), three ways."""
    root = tmp_path_factory.mktemp("pale")
    jpeg = {**pale_layout(448), "vendor": "aperio"}
    deflate = {**pale_layout(224), "vendor": "generic", "compression": "deflate"}
    specs = {
        "pale_svs": SlideSpec(mpp=(0.25, 0.25), **jpeg),
        "pale_tiff": SlideSpec(mpp=(0.5, 0.5), **deflate),
        "pale_on_tinted_glass": SlideSpec(mpp=(0.25, 0.25), background=(236, 236, 240), **jpeg),
    }
    suffix = {"aperio": ".svs", "generic": ".tiff"}
    return {k: write_slide(root / f"{k}{suffix[v.vendor]}", v) for k, v in specs.items()}


def _truth_fractions(spec: SlideSpec, plan: TilePlan, step: int = 16) -> np.ndarray:
    """The known tissue fraction of every planned tile (truth sampled every ``step`` px)."""
    truth = tissue_truth(spec, (spec.height // step, spec.width // step), step)
    p = plan.patch_size_level0 // step
    cells = (plan.coords // step).tolist()
    return np.array([truth[y : y + p, x : x + p].mean() for x, y in cells])


def measure_tissue(slide: GeneratedSlide) -> dict[str, float]:
    """Otsu against the known tissue: area covered, glass counted, tiles inside and on glass."""
    with SlideReader.open(slide.path) as reader:
        mpp = resolve_mpp(reader, None, None, TOL)
        plan = plan_tiles(reader, mpp, 0.5, 224, TOL)
        tissue = find_tissue(reader, mpp, plan, "otsu")
    truth = tissue_truth(slide.spec, tissue.mask.shape, tissue.mask_mpp / mpp.mpp)
    known = _truth_fractions(slide.spec, plan)
    return {
        "covered": float((tissue.mask & truth).sum() / truth.sum()),
        "glass": float((tissue.mask & ~truth).sum() / (~truth).sum()),
        "min_inside": float(tissue.fractions[known == 1].min()),
        "max_on_glass": float(tissue.fractions[known == 0].max()),
        "tiles_inside": int((known == 1).sum()),
    }


@pytest.mark.parametrize(
    "name", ["svs_slide", "tiff_slide", "pale_svs", "pale_tiff", "pale_on_tinted_glass"]
)
def test_otsu_covers_pale_tissue_and_little_glass(
    request: pytest.FixtureRequest, pale_slides: dict[str, GeneratedSlide], name: str
) -> None:
    slide = pale_slides.get(name) or request.getfixturevalue(name)
    got = measure_tissue(slide)
    assert got["tiles_inside"] >= 10
    assert got["covered"] >= MIN_COVERED, got
    assert got["min_inside"] >= MIN_INSIDE_FRACTION, got
    assert got["glass"] <= MAX_GLASS, got
    assert got["max_on_glass"] < MIN_TISSUE, got  # the lumen and the glass: never kept


def test_noisy_glass_stays_glass_and_pale_tissue_stays_tissue() -> None:
    spec = SlideSpec(mpp=(0.25, 0.25), **pale_layout(448))
    clean = render_region(spec, 0, 0, spec.width // 16, spec.height // 16, 16)  # 4 um/px
    truth = tissue_truth(spec, clean.shape[:2], 16)
    rng = np.random.default_rng(11)
    noisy = np.clip(clean + rng.normal(0, 2.0, clean.shape), 0, 255).astype(np.uint8)
    for rgb in (clean, noisy):
        mask = otsu_mask(rgb, THUMB_MPP)
        assert (mask & truth).sum() >= MIN_COVERED * truth.sum()
        assert (mask & ~truth).sum() <= MAX_GLASS * (~truth).sum()


def test_the_thumbnail_gets_coarser_not_larger_over_its_budget(svs_slide: GeneratedSlide) -> None:
    with SlideReader.open(svs_slide.path) as reader:
        mpp = MppInfo(0.25, "x")
        full, full_mpp = thumbnail(reader, mpp, THUMB_MPP)
        small, small_mpp = thumbnail(reader, mpp, THUMB_MPP, max_pixels=10_000)
    assert full.shape[0] * full.shape[1] > 10_000 >= small.shape[0] * small.shape[1]
    assert small_mpp > full_mpp and (small_mpp / 0.25) == int(small_mpp / 0.25)
    assert small.shape[:2] == (2688 * 0.25 // small_mpp, 3584 * 0.25 // small_mpp)


def test_otsu_none_and_geojson_share_one_bounded_grid_on_a_large_slide(tmp_path: Path) -> None:
    # 32.8 mm a side at 0.25 um/px: 8192 x 8192 px at 4 um/px, twice the budget.
    slide = sparse_tiff(tmp_path / "large.tiff", 1 << 17, 1 << 17, mpp=0.25)
    square = [[[0, 0], [65536, 0], [65536, 65536], [0, 65536], [0, 0]]]
    (tmp_path / "m.geojson").write_text(json.dumps({"type": "Polygon", "coordinates": square}))
    with SlideReader.open(slide) as reader:
        mpp = MppInfo(0.25, "x")
        plan = plan_tiles(reader, mpp, 0.5, 224, TOL)
        _level, _factor, shape, grid_mpp = thumbnail_grid(reader, mpp, THUMB_MPP)
        none = find_tissue(reader, mpp, plan, "none")
        given = find_tissue(reader, mpp, plan, "otsu", tmp_path / "m.geojson")
    assert shape[0] * shape[1] <= MAX_THUMB_PIXELS < (1 << 17) ** 2 // 16**2
    assert none.mask.shape == given.mask.shape == shape
    assert none.mask_mpp == given.mask_mpp == grid_mpp > THUMB_MPP
    assert given.mask.mean() == pytest.approx(0.25, abs=0.01)
