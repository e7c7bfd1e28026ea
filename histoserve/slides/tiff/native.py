"""JPEG-tiled TIFF and Aperio SVS read directly: tile bytes from the file, libjpeg-turbo decode.

:class:`NativeTiff` gives such a slide the OpenSlide-like surface
:class:`~histoserve.slides.readers.SlideReader` wraps (``level_dimensions``,
``level_downsamples``, ``properties``, ``read_region``, ``close``) at a
fraction of OpenSlide's cost per region: each pyramid level's tile offsets,
byte counts and shared ``JPEGTables`` come from the TIFF (``tifffile``), a
tile's bytes are read with one ``os.pread`` on one descriptor, and decoded
slide tiles are kept in a :class:`TileCache` bounded in bytes, so model tiles
read in row order decode each slide tile about once.

Same slide, same numbers, same pixels:

- The geometry and properties are OpenSlide's own (the slide is opened with
  OpenSlide once, for its metadata), so the mpp, levels, dimensions and
  identity are what the OpenSlide path reports, by construction.
- A region at whole level pixels is decoded as OpenSlide decodes
  (:mod:`~histoserve.slides.tiff.jpeg_tiles`), edge tiles cropped at the level's
  edge, and white beyond it (OpenSlide's transparent, composited on white).
- A region starting between level pixels (a level-0 position that is not a
  multiple of the level's downsample) is resampled by OpenSlide (cairo); such
  reads go to that OpenSlide handle, so they are OpenSlide's pixels too.

:func:`native_problem` says why a slide is not read natively: not an Aperio
or generic tiled TIFF for OpenSlide (NDPI, MRXS, Philips, ... keep
OpenSlide), a level that is not JPEG-tiled with three 8-bit samples (JPEG
2000 SVS, deflate, stripped), RGB-coded JPEG, or a tile size, byte count,
``JPEGTables`` size (:data:`~histoserve.limits.MAX_JPEG_TABLES_BYTES`) or
JPEG header beyond bounds. A missing tile (``TileByteCounts`` 0, as a
scanner leaves one it skipped) reads as OpenSlide reads it, from OpenSlide:
white at a level with no finer one below it (OpenSlide's transparent, on
white), an Aperio level's rendered from the finer level; its bytes are never
decoded nor sent. A tile that fails to decode (corrupt, truncated,
another size or another number of components than its TIFF declares: every
tile's frame header is checked, as OpenSlide refuses such a tile) is a
:class:`~histoserve.errors.SlideError` naming the file, level and tile.

For the slide's own JPEG tiles on the wire, :meth:`NativeTiff.tile_bytes`
and :meth:`NativeTiff.jpeg_tables` give a tile's compressed bytes and its
page's tables without decoding anything.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from histoserve.errors import SlideError
from histoserve.limits import MAX_JPEG_TABLES_BYTES, MAX_TIFF_PAGES, MAX_TIFF_TILE_PX
from histoserve.slides.tiff.jpeg_tiles import (
    JpegTileError,
    UnusualSampling,
    decode_tile,
    jpeg_problem,
    tile_stream,
)

_VENDORS = ("aperio", "generic-tiff")
_JPEG, _RGB, _YCBCR = 7, 2, 6
# Slack over a tile's raw size that a JPEG tile's bytes may take (markers, tables).
_BYTES_SLACK = 1 << 20
DEFAULT_CACHE_BYTES = 64 << 20


class NotNative(Exception):
    """The slide is not one the native reader reads exactly as OpenSlide; the message says why."""


class TileCache:
    """Decoded slide tiles, least recently used dropped first, at most ``max_bytes`` in all.

    Thread-safe; shared by a slide's reader threads so a slide tile two
    threads need is decoded once when their reads are close in time.
    """

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES):
        self.max_bytes = int(max_bytes)
        self.bytes = 0
        self.decoded = 0
        self._tiles: OrderedDict[tuple[int, ...], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[int, ...]) -> np.ndarray | None:
        with self._lock:
            tile = self._tiles.get(key)
            if tile is not None:
                self._tiles.move_to_end(key)
            return tile

    def put(self, key: tuple[int, ...], tile: np.ndarray) -> None:
        with self._lock:
            self.decoded += 1
            if key in self._tiles or tile.nbytes > self.max_bytes:
                return
            self._tiles[key] = tile
            self.bytes += tile.nbytes
            while self.bytes > self.max_bytes:
                _, old = self._tiles.popitem(last=False)
                self.bytes -= old.nbytes


@dataclass(frozen=True)
class _Level:
    width: int
    height: int
    tile_w: int
    tile_h: int
    offsets: np.ndarray
    counts: np.ndarray
    tables: bytes | None

    @property
    def columns(self) -> int:
        return -(-self.width // self.tile_w)


class NativeTiff:
    """One open JPEG-tiled TIFF/SVS (see the module docstring); use :meth:`open`."""

    def __init__(self, path: Path, slide: Any, levels: list[_Level], cache: TileCache | None):
        self.path = path
        self._slide = slide
        self._levels = levels
        self.level_dimensions = tuple(slide.level_dimensions)
        self.level_downsamples = tuple(slide.level_downsamples)
        self.properties = slide.properties
        self.cache = cache if cache is not None else TileCache()
        self._fd = os.open(path, os.O_RDONLY)

    @classmethod
    def open(cls, path: Path, cache: TileCache | None = None, slide: Any = None) -> NativeTiff:
        """Open ``path`` natively.

        ``slide``: an OpenSlide handle of ``path`` the caller opened (the slide
        is then opened once, not twice, when it is not native): the reader's on
        success, still the caller's when NotNative is raised.

        Raises:
            NotNative: The slide is not one this reader reads exactly (the reason).
        """
        own = slide is None
        if own:
            import openslide

            try:
                slide = openslide.OpenSlide(str(path))
            except Exception as exc:  # not a format OpenSlide opens: never native
                raise NotNative(f"OpenSlide does not open it ({exc})") from exc
        try:
            return cls(path, slide, _levels(path, slide), cache)
        except BaseException:
            if own:
                slide.close()
            raise

    def read_region(
        self, xy_level0: tuple[int, int], level: int, size: tuple[int, int]
    ) -> np.ndarray:
        """``size`` px at ``level`` from level-0 ``xy``: uint8 ``[h, w, 3]``, OpenSlide's pixels.

        Raises:
            SlideError: A tile cannot be read or decoded.
        """
        downsample = self.level_downsamples[level]
        lx, ly = xy_level0[0] / downsample, xy_level0[1] / downsample
        if lx != int(lx) or ly != int(ly):  # between level pixels: OpenSlide resamples
            return np.asarray(self._slide.read_region(tuple(xy_level0), level, size))
        return self._compose(level, int(lx), int(ly), size, 1)

    def read_reduced(
        self, xy_level0: tuple[int, int], level: int, size: tuple[int, int], factor: int
    ) -> np.ndarray:
        """``size`` px at ``level`` decoded at 1/``factor`` (2, 4, 8): ``[h/f, w/f, 3]``.

        The region starts at the reduced pixel at or before ``xy``.

        Raises:
            SlideError: A tile cannot be read or decoded.
        """
        downsample = self.level_downsamples[level]
        lx = int(xy_level0[0] / downsample) // factor
        ly = int(xy_level0[1] / downsample) // factor
        return self._compose(level, lx, ly, (size[0] // factor, size[1] // factor), factor)

    def tile_bytes(self, level: int, column: int, row: int) -> bytes:
        """The compressed bytes of one TIFF tile as stored (an abbreviated JPEG stream).

        Raises:
            SlideError: The tile lies outside the level, or the file cannot be read.
        """
        lvl = self._levels[level]
        index = row * lvl.columns + column
        if not (0 <= column < lvl.columns and 0 <= index < len(lvl.offsets)):
            raise SlideError(f"slide {self.path}: level {level} has no tile ({column}, {row})")
        offset, count = int(lvl.offsets[index]), int(lvl.counts[index])
        try:
            data = os.pread(self._fd, count, offset)
        except OSError as exc:
            raise SlideError(f"slide {self.path}: cannot read tile bytes: {exc}") from exc
        if len(data) != count:
            raise SlideError(
                f"slide {self.path}: level {level} tile ({column}, {row}) is cut short "
                f"({len(data)} of {count} bytes); copy the slide again"
            )
        return data

    def tile_byte_count(self, level: int, column: int, row: int) -> int:
        """The bytes tile ``(column, row)`` of ``level`` declares (nothing is read)."""
        lvl = self._levels[level]
        return int(lvl.counts[row * lvl.columns + column])

    def jpeg_tables(self, level: int) -> bytes | None:
        """The level's shared ``JPEGTables`` (None: each tile carries its own)."""
        return self._levels[level].tables

    def tile_size(self, level: int) -> tuple[int, int]:
        """The level's TIFF tile ``(w, h)``."""
        lvl = self._levels[level]
        return lvl.tile_w, lvl.tile_h

    def _tile(self, level: int, column: int, row: int, factor: int) -> np.ndarray:
        key = (level, column, row, factor)
        tile = self.cache.get(key)
        if tile is None and self.tile_byte_count(level, column, row) == 0:
            tile = self._missing_tile(level, column, row, factor)
            self.cache.put(key, tile)
        if tile is None:
            lvl = self._levels[level]
            data = self.tile_bytes(level, column, row)
            try:
                stream = tile_stream(lvl.tables, data, lvl.tile_w, lvl.tile_h)
                tile = decode_tile(stream, lvl.tile_w, lvl.tile_h, factor)
            except UnusualSampling:  # valid, but not for TurboJPEG: OpenSlide's pixels
                tile = self._openslide_tile(level, column, row, factor)
            except JpegTileError as exc:
                raise SlideError(
                    f"slide {self.path}: level {level} tile ({column}, {row}) at byte "
                    f"{int(lvl.offsets[row * lvl.columns + column])}: {exc}"
                ) from exc
            self.cache.put(key, tile)
        return tile

    def _missing_tile(self, level: int, column: int, row: int, factor: int) -> np.ndarray:
        """An empty tile (``TileByteCounts`` 0) as OpenSlide reads it, at 1/``factor``.

        At a reduced scale only a tile OpenSlide reads as one colour (white, where
        no finer level renders it) is exact; any other is refused.

        Raises:
            SlideError: Naming the missing tile: OpenSlide's error, or a reduced
                read of one OpenSlide renders from a finer level.
        """
        tile = self._openslide_tile(level, column, row, 1, why="a missing tile (no bytes)")
        if factor == 1:
            return tile
        if (tile == tile[0, 0]).all():
            lvl = self._levels[level]
            return np.full((lvl.tile_h // factor, lvl.tile_w // factor, 3), tile[0, 0], np.uint8)
        raise SlideError(
            f"slide {self.path}: level {level} tile ({column}, {row}) is a missing tile (no "
            "bytes) that OpenSlide renders from a finer level: not readable at a reduced scale "
            "(use --resize bicubic)"
        )

    def _openslide_tile(
        self,
        level: int,
        column: int,
        row: int,
        factor: int,
        why: str = "its unusual chroma sampling",
    ) -> np.ndarray:
        """Slide tile ``(column, row)`` as OpenSlide reads it (RGB, on white; beyond the level:
        white).

        Raises:
            SlideError: At a reduced scale, a level whose tiles start between level-0
                pixels (``why`` the tile needs OpenSlide), or OpenSlide's own error.
        """
        lvl, downsample = self._levels[level], self.level_downsamples[level]
        x, y = column * lvl.tile_w, row * lvl.tile_h
        x0, y0 = round(x * downsample), round(y * downsample)
        where = f"slide {self.path}: level {level} tile ({column}, {row})"
        if factor != 1 or x0 / downsample != x or y0 / downsample != y:
            raise SlideError(f"{where}: {why} is read by OpenSlide only")
        try:
            rgba = np.asarray(self._slide.read_region((x0, y0), level, (lvl.tile_w, lvl.tile_h)))
        except Exception as exc:  # OpenSlide's own error for the tile
            raise SlideError(f"{where}: {exc}") from exc
        return on_white(rgba)

    def _compose(
        self, level: int, lx: int, ly: int, size: tuple[int, int], factor: int
    ) -> np.ndarray:
        """Pixels ``[lx, lx+w) x [ly, ly+h)`` of ``level`` at 1/``factor``, white outside it."""
        lvl = self._levels[level]
        w, h = size
        tw, th = lvl.tile_w // factor, lvl.tile_h // factor
        level_w, level_h = lvl.width // factor, lvl.height // factor
        inside = lx >= 0 and ly >= 0 and lx + w <= level_w and ly + h <= level_h
        out = np.empty((h, w, 3), np.uint8) if inside else np.full((h, w, 3), 255, np.uint8)
        x0, y0 = max(lx, 0), max(ly, 0)
        x1, y1 = min(lx + w, level_w), min(ly + h, level_h)
        for row in range(y0 // th, -(-y1 // th)) if y1 > y0 else ():
            for column in range(x0 // tw, -(-x1 // tw)) if x1 > x0 else ():
                tile = self._tile(level, column, row, factor)
                tx0, ty0 = column * tw, row * th
                ax0, ay0 = max(x0, tx0), max(y0, ty0)
                ax1, ay1 = min(x1, tx0 + tw), min(y1, ty0 + th)
                out[ay0 - ly : ay1 - ly, ax0 - lx : ax1 - lx] = tile[
                    ay0 - ty0 : ay1 - ty0, ax0 - tx0 : ax1 - tx0
                ]
        return out

    def close(self) -> None:
        """Release the descriptor and the OpenSlide handle."""
        with contextlib.suppress(OSError):
            os.close(self._fd)
        with contextlib.suppress(Exception):
            self._slide.close()


def on_white(region: np.ndarray) -> np.ndarray:
    """OpenSlide's un-premultiplied RGBA composited over white, rounded: ``uint8 [h, w, 3]``."""
    if int(region[:, :, 3].min()) == 255:  # opaque (the usual case): no widening needed
        return np.ascontiguousarray(region[:, :, :3])
    rgb = region[:, :, :3].astype(np.uint16)
    alpha = region[:, :, 3:4].astype(np.uint16)
    out = (rgb * alpha + 255 * (255 - alpha) + 127) // 255
    return out.astype(np.uint8)


def _levels(path: Path, slide: Any) -> list[_Level]:
    """Each OpenSlide level's TIFF page, checked readable natively.

    Raises:
        NotNative: Why not.
    """
    vendor = slide.properties.get("openslide.vendor")
    if vendor not in _VENDORS:
        raise NotNative(f"OpenSlide reads it as {vendor or 'an unknown format'}, not a tiled TIFF")
    if any(key.startswith("openslide.bounds-") for key in slide.properties):
        raise NotNative("it has a scanned-area offset (openslide.bounds-*)")
    import tifffile

    try:
        with tifffile.TiffFile(path) as tif:
            listed = list(itertools.islice(tif.pages, MAX_TIFF_PAGES + 1))
            if len(listed) > MAX_TIFF_PAGES:
                raise NotNative(f"it has more than {MAX_TIFF_PAGES:,} TIFF directories")
            pages = [p for p in listed if p.is_tiled]
            levels, used = [], 0
            for width, height in slide.level_dimensions:
                while used < len(pages) and pages[used].shape[:2] != (height, width):
                    used += 1
                if used == len(pages):
                    raise NotNative(f"no tiled TIFF page is OpenSlide's {width}x{height} level")
                levels.append(_level(pages[used], tif.filehandle, path))
                used += 1
            return levels
    except NotNative:
        raise
    except Exception as exc:  # tifffile raises many types on a broken file
        raise NotNative(f"tifffile cannot read its directories ({exc})") from exc


def _level(page: Any, handle: Any, path: Path) -> _Level:
    if page.compression != _JPEG:
        raise NotNative(f"a level is compressed with TIFF scheme {int(page.compression)}, not JPEG")
    if page.photometric not in (_RGB, _YCBCR) or page.samplesperpixel != 3:
        raise NotNative("a level is not three-sample RGB or YCbCr")
    if page.bitspersample != 8 or page.planarconfig != 1 or page.tiledepth != 1:
        raise NotNative("a level is not 8-bit, interleaved, two-dimensional")
    tw, th = int(page.tilewidth), int(page.tilelength)
    if not (16 <= tw <= MAX_TIFF_TILE_PX and 16 <= th <= MAX_TIFF_TILE_PX) or tw % 16 or th % 16:
        raise NotNative(
            f"its TIFF tiles are {tw}x{th} px (a multiple of 16 up to {MAX_TIFF_TILE_PX} expected)"
        )
    counts = np.asarray(page.databytecounts, np.int64)
    offsets = np.asarray(page.dataoffsets, np.int64)
    height, width = (int(v) for v in page.shape[:2])
    expected = -(-width // tw) * -(-height // th)
    if len(offsets) != expected or len(counts) != expected:
        raise NotNative(f"a level lists {len(offsets)} tiles where its size needs {expected}")
    if counts.size and int(counts.max()) > 3 * tw * th + _BYTES_SLACK:
        raise NotNative(f"a tile declares {int(counts.max()):,} bytes, more than a JPEG tile takes")
    tables = page.jpegtables or None
    if tables is not None and len(tables) > MAX_JPEG_TABLES_BYTES:
        raise NotNative(
            f"a level's JPEGTables hold {len(tables):,} bytes, more than the "
            f"{MAX_JPEG_TABLES_BYTES:,} allowed (copied into every tile)"
        )
    present = np.flatnonzero(counts)  # a missing tile has no header to check
    if present.size:
        first = int(present[0])
        handle.seek(int(offsets[first]))
        problem = jpeg_problem(tables, handle.read(int(counts[first])))
        if problem is not None:
            raise NotNative(problem)
    return _Level(width, height, tw, th, offsets, counts, tables)
