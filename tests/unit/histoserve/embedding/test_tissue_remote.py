"""Cutting a thumbnail into the segmentation model's tiles and stitching the masks back."""

from __future__ import annotations

import numpy as np

from histoserve.embedding.tissue_remote import from_tiles, to_tiles


def test_tiles_round_trip_and_white_padding() -> None:
    image = np.random.default_rng(0).integers(0, 256, (70, 45, 3), dtype=np.uint8)
    tiles, grid = to_tiles(image, 32)
    assert grid == (3, 2) and tiles.shape == (6, 32, 32, 3)
    np.testing.assert_array_equal(tiles[0], image[:32, :32])
    np.testing.assert_array_equal(tiles[3][:, :13], image[32:64, 32:45])
    assert (tiles[3][:, 13:] == 255).all() and (tiles[5][6:] == 255).all()
    masks = tiles[..., 0]  # any per-pixel answer stitches back to the image's layout
    np.testing.assert_array_equal(from_tiles(masks, grid, 70, 45), image[..., 0])
