"""Tissue detection: exact expected grids on real slides, none on white glass."""

from __future__ import annotations

import numpy as np
import pytest

from harness.slides import GeneratedSlide, expected_coords
from predictor.client.embed.grid import TilePlan, plan_tiles
from predictor.client.embed.slides import MppInfo, SlideReader, resolve_mpp
from predictor.client.embed.tissue import (
    fractions_from_mask,
    otsu_mask,
    otsu_threshold,
    saturation,
    thumbnail,
    tissue_fractions,
)

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


def test_otsu_mask_fills_small_holes_and_drops_specks() -> None:
    rgb = np.full((200, 200, 3), 255, np.uint8)
    rgb[20:120, 20:120] = (150, 60, 160)  # tissue
    rgb[60:64, 60:64] = 255  # a small hole: filled
    rgb[30:110, 90:110] = 255  # a 1600 px hole: too big to fill
    rgb[180:182, 180:182] = (150, 60, 160)  # a speck: dropped
    mask = otsu_mask(rgb, mpp=4.0)  # 16 um2 px: hole limit ~784 px, speck limit 250 px
    assert mask[60:64, 60:64].all()
    assert not mask[180:182, 180:182].any()
    assert not mask[40:100, 95:105].any()
    assert mask[20:120, 20:90].sum() >= 100 * 70 - 16


def test_large_bench_slide_is_all_tissue(tmp_path) -> None:
    from harness.slides import large_slide

    slide = large_slide(tmp_path / "large.tiff", 8, 6)
    assert slide.level_dimensions[0] == (8 * 224, 6 * 224)
    kept, plan = _kept(slide, 0.5)
    assert len(plan.coords) == 48 and np.array_equal(kept, plan.coords)


def test_threshold_without_background_does_not_split_the_tissue() -> None:
    from predictor.client.embed.tissue import MIN_SATURATION, tissue_threshold

    rng = np.random.default_rng(3)
    pink_and_purple = np.concatenate([rng.integers(50, 70, 500), rng.integers(120, 150, 500)])
    assert tissue_threshold(pink_and_purple.astype(np.uint8)) == MIN_SATURATION
    with_glass = np.concatenate([rng.integers(0, 6, 2000), pink_and_purple]).astype(np.uint8)
    assert MIN_SATURATION <= tissue_threshold(with_glass) < 50
