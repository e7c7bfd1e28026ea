"""Masks to pixel-edge polygons and back: exact round trips, holes, corners, QuPath shapes;
rasterising in bounded memory."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from scipy import ndimage

from histoserve.tissue import contours
from histoserve.tissue.contours import crossing_count, mask_polygons, rasterize, signed_area


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


def _star(vertices: int, height: int, width: int, seed: int = 0) -> np.ndarray:
    """A star polygon: random radii at sorted angles, so most edges cross many rows."""
    rng = np.random.default_rng(seed)
    angles = np.sort(rng.uniform(0, 2 * np.pi, vertices))
    radii = rng.uniform(0.05, 0.45, vertices) * height
    return np.stack([width / 2 + np.cos(angles) * radii, height / 2 + np.sin(angles) * radii], 1)


def test_rasterize_in_bands_and_chunks_equals_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(5)
    cases = []
    for seed in range(12):
        h, w = (int(v) for v in rng.integers(5, 300, 2))
        polygons = [[_star(int(rng.integers(3, 200)), h, w, seed)] for _ in range(3)]
        polygons[0].append(_star(20, h // 2 + 1, w // 2 + 1, seed + 100))  # a hole
        cases.append(((h, w), polygons, rasterize(polygons, (h, w))))
    monkeypatch.setattr(contours, "_BAND_PIXELS", 37)  # a row or two per band
    monkeypatch.setattr(contours, "_CHUNK_CROSSINGS", 5)  # a few crossings at a time
    for shape, polygons, whole in cases:
        assert whole.any() and (rasterize(polygons, shape) == whole).all()


def test_rasterize_memory_is_bounded_whatever_the_crossings() -> None:
    shape = (3000, 4000)  # 12 MB of mask
    star = _star(25_000, *shape)
    crossings = crossing_count([[star]], shape[0])
    assert crossings > 5_000_000  # materialised at once: over 250 MB
    tracemalloc.start()
    try:
        mask = rasterize([[star]], shape)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert 0.05 < mask.mean() < 0.5
    assert peak < 120 << 20  # the mask, one band of winding counts, one chunk of crossings


def test_crossing_count_is_rows_crossed() -> None:
    square = [[(0.5, 0.5), (4.5, 0.5), (4.5, 7.5), (0.5, 7.5)]]
    assert crossing_count([square], 10) == 14  # two vertical edges, 7 row centres each
    assert crossing_count([square], 3) == 6  # clipped to the grid


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 1e300])
def test_rasterize_refuses_coordinates_it_cannot_place(bad: float) -> None:
    ring = [(0.0, 0.0), (5.0, 0.0), (5.0, bad), (0.0, 5.0)]
    with pytest.raises(ValueError, match="finite"):
        rasterize([[ring]], (8, 8))
