"""Masks to pixel-edge polygons and back: exact round trips, holes, corners, QuPath shapes."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from predictor.client.embed.contours import mask_polygons, rasterize, signed_area


def test_random_masks_round_trip_pixel_for_pixel() -> None:
    rng = np.random.default_rng(7)
    for _ in range(300):
        shape = tuple(rng.integers(1, 24, 2))
        mask = rng.random(shape) < rng.random()
        assert (rasterize(mask_polygons(mask), shape) == mask).all()


def test_a_blob_with_holes_and_islands_round_trips() -> None:
    rng = np.random.default_rng(1)
    rows, cols = np.indices((300, 400))
    disk = (rows - 150) ** 2 + (cols - 200) ** 2 < 120**2
    holes = ndimage.binary_dilation(rng.random((300, 400)) < 0.002, iterations=3)
    mask = (disk & ~holes) | (rng.random((300, 400)) < 0.01)  # holes, specks, islands in holes
    polygons = mask_polygons(mask)
    assert any(len(p) > 1 for p in polygons)  # holes were found
    assert (rasterize(polygons, mask.shape) == mask).all()


def test_a_square_with_a_hole_is_one_polygon_with_one_hole() -> None:
    mask = np.zeros((6, 6), bool)
    mask[1:5, 1:5] = True
    mask[2:4, 2:4] = False
    (polygon,) = mask_polygons(mask)
    outer, hole = polygon
    assert outer == [(1.0, 1.0), (5.0, 1.0), (5.0, 5.0), (1.0, 5.0), (1.0, 1.0)]
    assert sorted(set(hole)) == [(2.0, 2.0), (2.0, 4.0), (4.0, 2.0), (4.0, 4.0)]
    assert signed_area(outer) == 16.0 and signed_area(hole) == -4.0


def test_pixels_touching_at_a_corner_are_separate_polygons() -> None:
    mask = np.array([[1, 0], [0, 1]], bool)
    polygons = mask_polygons(mask)
    assert len(polygons) == 2 and all(len(p) == 1 for p in polygons)
    assert sorted(abs(signed_area(p[0])) for p in polygons) == [1.0, 1.0]


def test_an_empty_mask_has_no_polygons() -> None:
    assert mask_polygons(np.zeros((4, 5), bool)) == []
    assert not rasterize([], (4, 5)).any()


def test_rasterize_samples_pixel_centres_of_any_polygon() -> None:
    # A QuPath-drawn triangle (open ring, counter-clockwise, float vertices).
    triangle = [[(0.0, 0.0), (10.0, 0.0), (0.0, 10.0)]]
    mask = rasterize([triangle], (10, 10))
    rows, cols = np.indices((10, 10))
    np.testing.assert_array_equal(mask, (cols + 0.5) + (rows + 0.5) < 10)
    # Overlapping polygons are a union (not even-odd across polygons).
    a = [[(0, 0), (6, 0), (6, 6), (0, 6)]]
    b = [[(3, 3), (9, 3), (9, 9), (3, 9)]]
    both = rasterize([a, b], (10, 10))
    assert both[4, 4] and both[1, 1] and both[8, 8] and not both[1, 8]


@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (7, 1)])
def test_thin_masks(shape: tuple[int, int]) -> None:
    mask = np.ones(shape, bool)
    (polygon,) = mask_polygons(mask)
    assert abs(signed_area(polygon[0])) == mask.size
    assert (rasterize([polygon], shape) == mask).all()
