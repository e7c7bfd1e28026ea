"""Tiling in microns: level choice, read size, resize, grid, bounds, on real slides."""

from __future__ import annotations

import numpy as np
import openslide
import pytest
from PIL import Image

from harness.hostile_inputs import hostile_slides
from harness.slides import GeneratedSlide, expected_coords, generic_tiff
from histoserve.errors import SlideError
from histoserve.slides.grid import (
    choose_level,
    grid_coords,
    interpolation_of,
    plan_tiles,
    read_tile,
    read_tiles,
)
from histoserve.slides.readers import MppInfo, SlideReader

TOL = 0.05


def _independent_tile(path, xy, level, read_size, tile_size) -> np.ndarray:
    """Read with OpenSlide directly and resize with PIL bicubic (the specs'), outside the code under test."""
    with openslide.OpenSlide(str(path)) as slide:
        image = slide.read_region((int(xy[0]), int(xy[1])), level, (read_size, read_size))
    image = image.convert("RGB")  # fully opaque inside the slide
    if read_size != tile_size:
        image = image.resize((tile_size, tile_size), Image.Resampling.BICUBIC)
    return np.asarray(image)


@pytest.mark.parametrize(
    ("target", "level", "read_size", "patch"),
    [
        (0.25, 0, 224, 224),  # level 0 as is
        (0.26, 0, 224, 224),  # within tolerance: as is, footprint from the level
        (0.5, 1, 224, 448),  # a coarser level as is
        (0.4, 0, 358, 358),  # between levels: read larger at level 0, resize
        (1.0, 1, 448, 896),  # between levels 1 and 2: read at level 1, resize
        (2.0, 2, 224, 1792),  # the coarsest level as is
        (4.0, 2, 448, 3584),  # coarser than every level: coarsest level, resize
    ],
)
def test_level_and_read_size(
    svs_slide: GeneratedSlide, target: float, level: int, read_size: int, patch: int
) -> None:
    with SlideReader.open(svs_slide.path) as reader:
        plan = plan_tiles(reader, MppInfo(0.25, "openslide.mpp"), target, 224, TOL)
        assert (plan.read_level, plan.read_size, plan.patch_size_level0) == (
            level,
            read_size,
            patch,
        )
        assert plan.resized == (read_size != 224)
        assert (plan.level0_width, plan.level0_height) == (3584, 2688)
        assert plan.mpp_source == "openslide.mpp" and plan.level0_mpp == 0.25
        # Tiles read through the plan equal an independent read + resize.
        picks = plan.coords[:: max(1, len(plan.coords) // 5)][:5]
        tiles = read_tiles(reader, plan, picks)
    assert tiles.shape == (len(picks), 224, 224, 3) and tiles.dtype == np.uint8
    for tile, xy in zip(tiles, picks, strict=True):
        assert np.array_equal(tile, _independent_tile(svs_slide.path, xy, level, read_size, 224))


def test_resize_is_antialiased(tiff_slide: GeneratedSlide) -> None:
    """A tile read at 1 um/px from 0.5 um/px data stays close to a box average; decimation does not."""
    with SlideReader.open(tiff_slide.path) as reader:
        plan = plan_tiles(reader, MppInfo(0.5, "x"), 0.75, 224, TOL)
        assert (plan.read_level, plan.read_size, plan.resized) == (0, 336, True)
        xy = (224, 224)  # inside a tissue box: real texture
        tile = read_tile(reader, plan, xy).astype(float)
        full = reader.read_region(xy, 0, (336, 336))
    box = np.asarray(Image.fromarray(full).resize((224, 224), Image.Resampling.BOX), float)
    decimated = full[::3, ::3][:112].repeat(2, 0).repeat(2, 1)[:224, :224].astype(float)
    assert np.abs(tile - box).mean() < 0.5 * np.abs(decimated - box).mean()


def test_upsampling_is_refused(tiff_slide: GeneratedSlide) -> None:
    with (
        SlideReader.open(tiff_slide.path) as reader,
        pytest.raises(SlideError, match=r"finer than the slide's level 0.*--target-mpp"),
    ):
        plan_tiles(reader, MppInfo(0.5, "x"), 0.25, 224, TOL)


def test_choose_level_picks_the_coarsest_fine_enough_level() -> None:
    assert choose_level((0.25, 0.5, 2.0), 0.5, 0.0) == 1
    assert choose_level((0.25, 0.5, 2.0), 0.49, 0.0) == 0
    assert choose_level((0.25, 0.5, 2.0), 0.49, 0.05) == 1
    assert choose_level((0.25, 0.5, 2.0), 100.0, 0.05) == 2


def test_coords_are_the_full_grid_by_y_then_x(svs_slide: GeneratedSlide) -> None:
    with SlideReader.open(svs_slide.path) as reader:
        plan = plan_tiles(reader, MppInfo(0.25, "x"), 0.5, 224, TOL)
    assert plan.coords.dtype == np.int64 and plan.coords.shape == (8 * 6, 2)
    order = np.lexsort((plan.coords[:, 0], plan.coords[:, 1]))
    assert np.array_equal(order, np.arange(len(plan.coords)))
    assert np.array_equal(plan.coords[:3], [[0, 0], [448, 0], [896, 0]])
    assert np.array_equal(plan.coords[8], [0, 448])
    everything = expected_coords([(0, 0, 3584, 2688)], 448, (0, 0, 3584, 2688))
    assert np.array_equal(plan.coords, everything)


def test_grid_respects_bounds(svs_slide: GeneratedSlide) -> None:
    handle = openslide.OpenSlide(str(svs_slide.path))
    # No writable format carries bounds (MRXS/SCN), so they are injected beside the real file.
    props = {
        "openslide.bounds-x": "100",
        "openslide.bounds-y": "300",
        "openslide.bounds-width": "1400",
        "openslide.bounds-height": "1000",
    }
    with SlideReader(handle, svs_slide.path, "openslide", props) as reader:
        plan = plan_tiles(reader, MppInfo(0.25, "x"), 0.5, 224, TOL)
    xs = 100 + 448 * np.arange(3)
    ys = 300 + 448 * np.arange(2)
    expected = np.array([(x, y) for y in ys for x in xs])
    assert np.array_equal(plan.coords, expected)


def test_grid_coords_of_a_slide_smaller_than_a_tile() -> None:
    assert grid_coords((0, 0, 100, 100), 224).shape == (0, 2)


def test_bad_arguments(svs_slide: GeneratedSlide) -> None:
    with SlideReader.open(svs_slide.path) as reader:
        mpp = MppInfo(0.25, "x")
        with pytest.raises(ValueError, match="target_mpp"):
            plan_tiles(reader, mpp, 0.0, 224, TOL)
        with pytest.raises(ValueError, match="tile_size"):
            plan_tiles(reader, mpp, 0.5, 0, TOL)
        with pytest.raises(ValueError, match="tolerance"):
            plan_tiles(reader, mpp, 0.5, 224, -1.0)


@pytest.mark.parametrize("name", ["wider_than_glass", "too_many_pixels"])
def test_a_slide_no_glass_has_fails_before_anything_is_read(tmp_path, name: str) -> None:
    case = hostile_slides(tmp_path)[name]
    assert case.path.stat().st_size < 1 << 20  # well under a megabyte, "2^20 px a side"
    with SlideReader.open(case.path) as reader:
        assert reader.dimensions == (1 << 20, 1 << 20)
        mpp = MppInfo(float(reader.properties["openslide.mpp-x"]), "openslide.mpp")
        with pytest.raises(SlideError, match=case.reason) as caught:
            plan_tiles(reader, mpp, 0.5, 224, TOL)
    assert str(caught.value).startswith(f"slide {case.path}: ")


def test_too_many_planned_tiles_fail_naming_the_flag(svs_slide: GeneratedSlide) -> None:
    with SlideReader.open(svs_slide.path) as reader:
        mpp = MppInfo(0.25, "x")
        assert len(plan_tiles(reader, mpp, 0.5, 224, TOL, max_tiles=48).coords) == 48
        with pytest.raises(SlideError, match=r"8 x 6 = 48 tiles .* --max-tiles-per-slide 47"):
            plan_tiles(reader, mpp, 0.5, 224, TOL, max_tiles=47)


def test_the_resize_filter_is_the_specs() -> None:
    assert interpolation_of({"interpolation": "bicubic"}, "h0-mini") == "bicubic"
    assert interpolation_of({}, "grpc-only") == "bicubic"  # no spec over gRPC: the specs' own
    assert interpolation_of({"interpolation": "Lanczos"}, "m") == "lanczos"
    with pytest.raises(SlideError, match=r"model m: its spec resizes with 'sinc'"):
        interpolation_of({"interpolation": "sinc"}, "m")


def test_tiles_are_resized_with_the_plans_filter(svs_slide: GeneratedSlide) -> None:
    with SlideReader.open(svs_slide.path) as reader:
        tiles = {}
        for name in ("bicubic", "lanczos"):
            plan = plan_tiles(reader, MppInfo(0.25, "x"), 0.4, 224, TOL, interpolation=name)
            assert plan.interpolation == name and plan.resized
            tiles[name] = read_tile(reader, plan, (448, 448))
        full = reader.read_region((448, 448), 0, (358, 358))
    for name, tile in tiles.items():
        method = getattr(Image.Resampling, name.upper())
        assert np.array_equal(tile, np.asarray(Image.fromarray(full).resize((224, 224), method)))
    assert not np.array_equal(tiles["bicubic"], tiles["lanczos"])


def test_a_read_square_far_larger_than_the_tile_is_refused(tmp_path) -> None:
    flat = generic_tiff(tmp_path / "flat.tiff", mpp=0.25, downsamples=(1,))  # no pyramid
    with SlideReader.open(flat.path) as reader:
        mpp = MppInfo(0.25, "x")
        assert plan_tiles(reader, mpp, 4.0, 224, TOL).read_size == 3584  # 16x: still read
        with pytest.raises(SlideError, match=r"read as a 17920 px square at level 0 .* 4096"):
            plan_tiles(reader, mpp, 20.0, 224, TOL)
        with pytest.raises(SlideError, match=r"a 22400 px tile at 0.25 um/px .* 4096 px"):
            plan_tiles(reader, mpp, 0.25, 22_400, TOL)  # a --tile-size typo
