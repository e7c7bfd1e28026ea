"""Tile a slide in microns, not pyramid levels: which level to read, how much, where.

A model wants ``tile_size`` px at ``target_mpp`` um/px. :func:`plan_tiles`
picks the coarsest pyramid level whose mpp is at most the target (within the
relative ``tolerance``). When that level's mpp matches the target within the
tolerance, tiles are read there as they are; otherwise a larger square is read
and resized down to ``tile_size`` with the model spec's interpolation
(``bicubic`` for every spec shipped, as the vendors' cards say; Pillow's
resize is antialiased whatever the filter). A target finer than level 0 would
need upsampling, which invents detail the scanner never saw: that is a
SlideError, never a silent guess.

Before anything is read, the slide must be a size glass can have (level 0
times its mpp within ``limits.MAX_SLIDE_EDGE_MM`` an edge, and at most
``limits.MAX_SLIDE_PIXELS`` level-0 pixels whatever the mpp) and its grid
must hold at most ``--max-tiles-per-slide`` tiles, each read as a square of
at most ``limits.MAX_READ_PX``: a hostile header or a wrong mpp fails its
slide at once, not after hours or gigabytes.

The grid covers the scanned bounds (``openslide.bounds-*``, which MRXS needs)
with non-overlapping tiles that lie wholly inside them, starting at the
bounds' origin; ``coords`` are level-0 top-left corners ordered by y then x,
which is also the order of every per-tile array in the output file.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from histoserve.errors import SlideError
from histoserve.limits import (
    DEFAULT_MAX_TILES_PER_SLIDE,
    MAX_READ_PX,
    MAX_SLIDE_EDGE_MM,
    MAX_SLIDE_PIXELS,
)
from histoserve.slides.readers import MppInfo, SlideReader
from histoserve.slides.resample import INTERPOLATIONS, RESIZES, reduced_factor, resize_square


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
        interpolation: How read squares are resized to ``tile_size`` (a key of
            ``INTERPOLATIONS``).
        overlap: Pixels (at the target mpp) a tile shares with its neighbour
            (``--overlap``, TRIDENT's ``overlap``); the grid step at level 0 is
            :attr:`step_level0`.
        resize: How a larger read square becomes the tile (``--resize``, one of
            ``RESIZES``; :mod:`~histoserve.slides.resample`).
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
    interpolation: str = "bicubic"
    overlap: int = 0
    resize: str = "bicubic"

    @property
    def step_level0(self) -> int:
        """The grid step at level 0: the footprint less the overlap, at least 1 px."""
        return step_level0(self.patch_size_level0, self.tile_size, self.overlap)

    @property
    def resized(self) -> bool:
        """Whether tiles are resized after reading (the level's mpp is not the target's)."""
        return self.read_size != self.tile_size


def interpolation_of(spec: Mapping[str, Any], model: str) -> str:
    """The resize filter the model's spec names (``bicubic`` when it names none).

    Raises:
        SlideError: A name not in ``INTERPOLATIONS``.
    """
    name = str(spec.get("interpolation") or "bicubic").strip().lower()
    if name not in INTERPOLATIONS:
        raise SlideError(
            f"model {model}: its spec resizes with {name!r}, which histoserve embed does not "
            f"know ({', '.join(INTERPOLATIONS)}); fix the spec or read at the model's mpp"
        )
    return name


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
    reader: SlideReader,
    mpp: MppInfo,
    target_mpp: float,
    tile_size: int,
    tolerance: float,
    max_tiles: int = DEFAULT_MAX_TILES_PER_SLIDE,
    interpolation: str = "bicubic",
    overlap: int = 0,
    resize: str = "bicubic",
) -> TilePlan:
    """Plan the tiles of ``reader``'s slide at ``target_mpp`` and ``tile_size``.

    ``overlap``: pixels at the target mpp neighbouring tiles share (0: none);
    ``resize``: one of ``RESIZES``.

    Reads no pixels: the size checks come first.

    Raises:
        ValueError: A non-positive ``target_mpp`` or ``tile_size``, a negative
            ``tolerance``, or an unknown ``interpolation``.
        SlideError: The slide is larger than glass, its grid has more than
            ``max_tiles`` tiles, a tile's read square is over ``MAX_READ_PX``, or
            the target needs upsampling (see :func:`choose_level`), or ``reduced``
            cannot take the read square to the tile (not native, not 2x/4x/8x).
    """
    _check_arguments(target_mpp, tile_size, tolerance, interpolation)
    if resize not in RESIZES:
        raise ValueError(f"resize must be one of {RESIZES}, got {resize!r}")
    if not 0 <= overlap < tile_size:
        raise ValueError(f"overlap must be in [0, {tile_size}) px, got {overlap!r}")
    check_physical_size(reader, mpp)
    level, read_size, patch = _read_geometry(reader, mpp, target_mpp, tile_size, tolerance)
    if resize == "reduced" and read_size != tile_size:
        _check_reduced(reader, read_size, tile_size)
    bounds = reader.bounds()
    step = step_level0(patch, tile_size, overlap)
    _check_tile_count(reader, bounds, patch, max_tiles, step)
    width, height = reader.dimensions
    return TilePlan(
        target_mpp=float(target_mpp),
        level0_mpp=mpp.mpp,
        mpp_source=mpp.source,
        tile_size=int(tile_size),
        read_level=level,
        read_size=int(read_size),
        patch_size_level0=int(patch),
        coords=grid_coords(bounds, patch, step),
        level0_width=width,
        level0_height=height,
        interpolation=interpolation,
        overlap=int(overlap),
        resize=resize,
    )


def _check_reduced(reader: SlideReader, read_size: int, tile_size: int) -> None:
    """SlideError unless a reduced-scale decode takes ``read_size`` px to ``tile_size`` exactly."""
    why = None
    if reader.backend != "native":
        why = f"it is read with {reader.backend}, not the native reader (JPEG-tiled TIFF/SVS)"
    elif reduced_factor(read_size, tile_size) is None:
        why = f"{read_size} px to {tile_size} px is not an exact 2x, 4x or 8x step"
    if why is not None:
        raise SlideError(
            f"slide {reader.path}: --resize reduced cannot make its tiles: {why}; use "
            "--resize area or bicubic for this cohort"
        )


def _read_geometry(
    reader: SlideReader, mpp: MppInfo, target_mpp: float, tile_size: int, tolerance: float
) -> tuple[int, int, int]:
    """``(level, read_size, patch_size_level0)``; a read square over ``MAX_READ_PX`` is refused."""
    downsamples = reader.level_downsamples
    level = choose_level(tuple(mpp.mpp * d for d in downsamples), target_mpp, tolerance)
    downsample = downsamples[level]
    if abs(mpp.mpp * downsample - target_mpp) <= tolerance * target_mpp:
        read_size, patch = tile_size, round(tile_size * downsample)
    else:
        patch = round(tile_size * target_mpp / mpp.mpp)
        read_size = max(1, round(patch / downsample))
    if read_size > MAX_READ_PX:
        raise SlideError(
            f"slide {reader.path}: a {tile_size} px tile at {target_mpp:g} um/px would be read "
            f"as a {read_size} px square at level {level} ({mpp.mpp * downsample:g} um/px), "
            f"more than {MAX_READ_PX} px; use a --target-mpp nearer the slide's levels, a "
            "smaller --tile-size, or a slide with a pyramid"
        )
    return level, read_size, patch


def _check_arguments(
    target_mpp: float, tile_size: int, tolerance: float, interpolation: str
) -> None:
    if not (math.isfinite(target_mpp) and target_mpp > 0):
        raise ValueError(f"target_mpp must be a positive number, got {target_mpp}")
    if tile_size < 1:
        raise ValueError(f"tile_size must be at least 1, got {tile_size}")
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    if interpolation not in INTERPOLATIONS:
        raise ValueError(
            f"interpolation must be one of {sorted(INTERPOLATIONS)}, got {interpolation!r}"
        )


def check_physical_size(reader: SlideReader, mpp: MppInfo) -> None:
    """Refuse a slide larger than any glass slide: ``MAX_SLIDE_EDGE_MM``, ``MAX_SLIDE_PIXELS``.

    Raises:
        SlideError: Naming the slide, its size in px and mm, the mpp's source and the limit.
    """
    width, height = reader.dimensions
    mm = (width * mpp.mpp / 1000.0, height * mpp.mpp / 1000.0)
    size = f"level 0 is {width}x{height} px at {mpp.mpp:g} um/px ({mpp.source}), "
    size += f"{mm[0]:,.0f} x {mm[1]:,.0f} mm"
    fix = "check the slide's mpp (--mpp-override / the manifest's mpp column) or the file"
    if max(mm) > MAX_SLIDE_EDGE_MM:
        raise SlideError(
            f"slide {reader.path}: {size}: larger than any glass slide (the limit is "
            f"{MAX_SLIDE_EDGE_MM:g} mm an edge); {fix}"
        )
    if width * height > MAX_SLIDE_PIXELS:
        raise SlideError(
            f"slide {reader.path}: {size}: {width * height:,} px, more than the "
            f"{MAX_SLIDE_PIXELS:,} px of any real scan; {fix}"
        )


def step_level0(patch: int, tile_size: int, overlap: int) -> int:
    """The level-0 grid step of ``patch``-px footprints sharing ``overlap`` of ``tile_size`` px."""
    return max(1, patch - round(overlap * patch / tile_size))


def _check_tile_count(
    reader: SlideReader,
    bounds: tuple[int, int, int, int],
    patch: int,
    max_tiles: int,
    step: int | None = None,
) -> None:
    columns, rows = (_count(n, patch, step or patch) for n in bounds[2:])
    if columns * rows > max_tiles:
        raise SlideError(
            f"slide {reader.path}: {columns} x {rows} = {columns * rows:,} tiles of {patch} px "
            f"planned, more than --max-tiles-per-slide {max_tiles:,}; check --target-mpp, "
            "--tile-size and the slide's mpp, or raise the limit for a slide this large"
        )


def _count(length: int, patch: int, step: int) -> int:
    """How many ``patch``-px tiles ``step`` px apart fit wholly in ``length`` px."""
    return 0 if length < patch else (length - patch) // step + 1


def grid_coords(
    bounds: tuple[int, int, int, int], patch: int, step: int | None = None
) -> np.ndarray:
    """Top-left corners of the ``patch``-px tiles ``step`` px apart (default: ``patch``) wholly
    inside ``bounds``, y then x (int64 [N, 2])."""
    bx, by, bw, bh = bounds
    step = step or patch
    xs = bx + step * np.arange(_count(bw, patch, step), dtype=np.int64)
    ys = by + step * np.arange(_count(bh, patch, step), dtype=np.int64)
    gy, gx = np.meshgrid(ys, xs, indexing="ij")
    return np.stack([gx.ravel(), gy.ravel()], axis=1)


def read_tile(reader: SlideReader, plan: TilePlan, xy: np.ndarray | tuple[int, int]) -> np.ndarray:
    """One tile at level-0 ``xy``: uint8 ``[tile_size, tile_size, 3]``.

    Raises:
        SlideError: The region cannot be read.
    """
    size, xy = (plan.read_size, plan.read_size), (int(xy[0]), int(xy[1]))
    if plan.resize == "reduced" and plan.resized:
        return reader.read_reduced(xy, plan.read_level, size, plan.read_size // plan.tile_size)
    region = reader.read_region(xy, plan.read_level, size)
    return resize_square(region, plan.tile_size, plan.interpolation, plan.resize)


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
