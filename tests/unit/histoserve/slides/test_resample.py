"""``--resize``: bicubic (the spec's filter), area and the reduced-scale decode, planned strictly.

Slide A type (levels 1/16: a 0.5 um/px tile is read as 448 px at level 0 and
resized) written by :mod:`harness.jpeg_slides`; the real H&E texture.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness import jpeg_slides, slides
from histoserve.errors import SlideError
from histoserve.slides.grid import plan_tiles, read_tiles
from histoserve.slides.readers import SlideReader, resolve_mpp
from histoserve.slides.resample import reduced_factor, resize_square

SLIDE_A = slides.SlideSpec(
    mpp=(0.25, 0.25), vendor="aperio", downsamples=(1, 16), **slides.standard_layout(448)
)


@pytest.fixture(scope="module")
def slide_a(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return jpeg_slides.jpeg_tiff(tmp_path_factory.mktemp("a") / "a.svs", SLIDE_A).path


def _tiles(path: Path, reader: str, resize: str) -> np.ndarray:
    with SlideReader.open(path, reader) as slide:
        plan = plan_tiles(
            slide, resolve_mpp(slide, None, None, 0.05), 0.5, 224, 0.05, resize=resize
        )
        assert (plan.read_level, plan.read_size, plan.resize) == (0, 448, resize)
        return read_tiles(slide, plan, plan.coords[:12])


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float(10 * np.log10(255.0**2 / mse))


def test_bicubic_is_the_same_on_either_reader(slide_a: Path) -> None:
    np.testing.assert_array_equal(
        _tiles(slide_a, "native", "bicubic"), _tiles(slide_a, "openslide", "bicubic")
    )


@pytest.mark.parametrize("resize", ["area", "reduced"])
def test_area_and_reduced_are_close_to_bicubic_but_not_it(slide_a: Path, resize: str) -> None:
    reference, other = _tiles(slide_a, "native", "bicubic"), _tiles(slide_a, "native", resize)
    assert other.shape == reference.shape == (12, 224, 224, 3)
    assert 28.0 < _psnr(other, reference) < 60.0


def test_reduced_needs_the_native_reader_and_an_exact_step(slide_a: Path, tmp_path: Path) -> None:
    with (
        SlideReader.open(slide_a, "openslide") as slide,
        pytest.raises(SlideError, match=r"--resize reduced.*openslide, not the native reader"),
    ):
        plan_tiles(slide, resolve_mpp(slide, None, None, 0.05), 0.5, 224, 0.05, resize="reduced")
    with (
        SlideReader.open(slide_a, "native") as slide,
        pytest.raises(SlideError, match="not an exact 2x, 4x or 8x step"),
    ):
        plan_tiles(slide, resolve_mpp(slide, None, None, 0.05), 0.4, 224, 0.05, resize="reduced")


def test_area_is_the_box_mean_and_reduced_factors_are_exact() -> None:
    region = np.arange(4 * 4 * 3, dtype=np.uint8).reshape(4, 4, 3)
    expected = np.floor(region.reshape(2, 2, 2, 2, 3).mean(axis=(1, 3)) + 0.5).astype(np.uint8)
    np.testing.assert_array_equal(resize_square(region, 2, resize="area"), expected)
    assert [reduced_factor(s, 224) for s in (448, 896, 1792, 672, 300)] == [2, 4, 8, None, None]
