"""Tile a slide in microns, not pyramid levels: which level to read, how much, where.

A model wants ``tile_size`` px at ``target_mpp`` um/px. :func:`plan_tiles`
picks the coarsest pyramid level whose mpp is at most the target (within the
relative ``tolerance``). When that level's mpp matches the target within the
tolerance, tiles are read there as they are; otherwise a larger square is read
and resized down to ``tile_size`` with Lanczos (antialiased). A target finer
than level 0 would need upsampling, which invents detail the scanner never
saw: that is a SlideError, never a silent guess.

The grid covers the scanned bounds (``openslide.bounds-*``, which MRXS needs)
with non-overlapping tiles that lie wholly inside them, starting at the
bounds' origin; ``coords`` are level-0 top-left corners ordered by y then x,
which is also the order of every per-tile array in the output file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image

from predictor.client.embed.errors import SlideError
from predictor.client.embed.slides import MppInfo, SlideReader


@dataclass(frozen=True)
class TilePlan:
    """How one slide is tiled.

    Attributes:
        target_mpp: Microns per pixel of the tiles (as asked).
        level0_mpp: Level-0 microns per pixel of the slide.
        mpp_source: Where ``level0_mpp`` came from (see ``MppInfo``).
        tile_size: Tile edge sent to the model (px).
        read_level: Pyramid level the tiles are read from.
        read_size: Edge of the square read at ``read_level`` (px); resized to
            ``tile_size`` when different.
        patch_size_level0: Tile footprint and grid step at level 0 (px).
        coords: int64 ``[N, 2]`` level-0 (x, y) of every grid tile inside the
            bounds, ordered by y then x.
        level0_width: Level-0 width of the slide (px).
        level0_height: Level-0 height of the slide (px).
    """

    target_mpp: float
    level0_mpp: float
    mpp_source: str
    tile_size: int
    read_level: int
    read_size: int
    patch_size_level0: int
    coords: np.ndarray
    level0_width: int
    level0_height: int

    @property
    def resized(self) -> bool:
        """Whether tiles are resized after reading (the level's mpp is not the target's)."""
        return self.read_size != self.tile_size


def choose_level(level_mpps: tuple[float, ...], target_mpp: float, tolerance: float) -> int:
    """Index of the coarsest level whose mpp is at most ``target_mpp * (1 + tolerance)``.

    Raises:
        SlideError: Every level is coarser than the target (upsampling needed).
    """
    limit = target_mpp * (1.0 + tolerance)
    candidates = [i for i, m in enumerate(level_mpps) if m <= limit]
    if not candidates:
        raise SlideError(
            f"target {target_mpp:g} um/px is finer than the slide's level 0 "
            f"({level_mpps[0]:g} um/px): tiles would have to be upsampled; use a model or "
            "--target-mpp at or above the slide's mpp, or check the slide's mpp "
            "(--mpp-override / the manifest's mpp column)"
        )
    return max(candidates, key=lambda i: level_mpps[i])


def plan_tiles(
    reader: SlideReader, mpp: MppInfo, target_mpp: float, tile_size: int, tolerance: float
) -> TilePlan:
    """Plan the tiles of ``reader``'s slide at ``target_mpp`` and ``tile_size``.

    Raises:
        ValueError: A non-positive ``target_mpp`` or ``tile_size``, or a negative ``tolerance``.
        SlideError: The target needs upsampling (see :func:`choose_level`).
    """
    if not (math.isfinite(target_mpp) and target_mpp > 0):
        raise ValueError(f"target_mpp must be a positive number, got {target_mpp}")
    if tile_size < 1:
        raise ValueError(f"tile_size must be at least 1, got {tile_size}")
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    downsamples = reader.level_downsamples
    level = choose_level(tuple(mpp.mpp * d for d in downsamples), target_mpp, tolerance)
    downsample = downsamples[level]
    if abs(mpp.mpp * downsample - target_mpp) <= tolerance * target_mpp:
        read_size = tile_size
        patch = round(tile_size * downsample)
    else:
        patch = round(tile_size * target_mpp / mpp.mpp)
        read_size = max(1, round(patch / downsample))
    width, height = reader.dimensions
    return TilePlan(
        target_mpp=float(target_mpp),
        level0_mpp=mpp.mpp,
        mpp_source=mpp.source,
        tile_size=int(tile_size),
        read_level=level,
        read_size=int(read_size),
        patch_size_level0=int(patch),
        coords=grid_coords(reader.bounds(), patch),
        level0_width=width,
        level0_height=height,
    )


def grid_coords(bounds: tuple[int, int, int, int], step: int) -> np.ndarray:
    """Top-left corners of the ``step``-px tiles wholly inside ``bounds``, y then x (int64 [N, 2])."""
    bx, by, bw, bh = bounds
    xs = bx + step * np.arange(max(0, bw // step), dtype=np.int64)
    ys = by + step * np.arange(max(0, bh // step), dtype=np.int64)
    gy, gx = np.meshgrid(ys, xs, indexing="ij")
    return np.stack([gx.ravel(), gy.ravel()], axis=1)


def _resize(region: np.ndarray, tile_size: int) -> np.ndarray:
    if region.shape[0] == tile_size and region.shape[1] == tile_size:
        return region
    image = Image.fromarray(region).resize((tile_size, tile_size), Image.Resampling.LANCZOS)
    return np.asarray(image)


def read_tile(reader: SlideReader, plan: TilePlan, xy: np.ndarray | tuple[int, int]) -> np.ndarray:
    """One tile at level-0 ``xy``: uint8 ``[tile_size, tile_size, 3]``.

    Raises:
        SlideError: The region cannot be read.
    """
    size = (plan.read_size, plan.read_size)
    region = reader.read_region((int(xy[0]), int(xy[1])), plan.read_level, size)
    return _resize(region, plan.tile_size)


def read_tiles(reader: SlideReader, plan: TilePlan, coords: np.ndarray) -> np.ndarray:
    """The tiles at ``coords`` (level-0 x, y rows): uint8 ``[n, tile_size, tile_size, 3]``.

    One backend call per tile into one preallocated batch array. Reading
    adjacent tiles as one wide strip was measured and was no faster (OpenSlide
    caches decoded slide tiles), so the simple form stays.

    Raises:
        SlideError: A region cannot be read.
    """
    coords = np.asarray(coords, dtype=np.int64).reshape(-1, 2)
    t = plan.tile_size
    out = np.empty((len(coords), t, t, 3), np.uint8)
    for i, xy in enumerate(coords):
        out[i] = read_tile(reader, plan, xy)
    return out
