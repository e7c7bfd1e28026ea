"""Real whole-slide images for tests and benchmarks, written with ``tifffile``.

The one place slides are generated: unit tests of ``histoserve``, the
integration tests of ``histoserve embed`` and the benchmark all call
:func:`write_slide` (or the shortcuts :func:`aperio_svs` and
:func:`generic_tiff`). A slide is a real tiled, pyramidal TIFF (one tiled page
per level, as OpenSlide expects for Aperio SVS and generic tiled TIFF), JPEG
or deflate compressed, with tissue rectangles of known position made from the
real 240x240 H&E tile shipped by ``wsidicom-data`` (mirrored and repeated) on
a white background. The tissue boxes come back in level-0 pixels, so a test
computes the exact expected tile grid with :func:`expected_coords`. Pale
boxes (``SlideSpec.pale_boxes``) are tissue too, drawn with the same tile
faded toward white (faint eosin, loose stroma: what a saturation threshold
misses), and glass boxes cut bare glass out of the tissue (a lumen, a tear),
so tissue detection is measured against a known area
(:mod:`harness.tissue_truth`).

Tiles are generated on the fly from the box layout (never the whole image in
memory), so a bench slide of 20,000+ tiles costs a few MB of RAM. Every
written file is opened with OpenSlide before it is returned and must report
the dimensions and mpp that were asked for: a generator bug fails loudly here,
not as a confusing test failure elsewhere.
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import numpy as np
from PIL import Image

Box = tuple[int, int, int, int]  # level-0 x, y, width, height

WHITE = 255
# Pale tissue keeps this share of the H&E tile's stain (its distance from white).
PALE_STAIN = 0.4
# Aperio descriptions start with this; OpenSlide's aperio vendor keys on it.
_APERIO_HEAD = "Aperio Image Library v12.0.15 \r\n{w}x{h} [0,0 {w}x{h}] ({t}x{t}) JPEG/RGB Q=90"


@cache
def he_tile() -> np.ndarray:
    """The real 240x240 H&E tile of ``wsidicom-data`` (Apache-2.0), uint8 RGB.

    Located without importing ``wsidicom_data`` (its ``__init__`` imports
    ``wsidicom``, which is slow and not needed here).
    """
    spec = importlib.util.find_spec("wsidicom_data")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("wsidicom-data is not installed: pip install wsidicom-data")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "test_tile.png"
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


@cache
def _texture(pale: bool = False) -> np.ndarray:
    """The H&E tile mirrored into a seamless 480x480 block (``pale``: faded toward white)."""
    tile = he_tile()
    top = np.concatenate([tile, tile[:, ::-1]], axis=1)
    block = np.concatenate([top, top[::-1]], axis=0)
    if not pale:
        return block
    faded = WHITE - np.rint((WHITE - block.astype(np.float64)) * PALE_STAIN)
    return faded.astype(np.uint8)


@dataclass(frozen=True)
class SlideSpec:
    """What to write.

    Attributes:
        width: Level-0 width (px); a multiple of every downsample.
        height: Level-0 height (px); a multiple of every downsample.
        boxes: Tissue rectangles, level-0 ``(x, y, w, h)``; the rest is white.
        mpp: Level-0 microns per pixel, ``(x, y)``; ``None`` writes no mpp at all.
        vendor: ``"aperio"`` (mpp in the ImageDescription, ``.svs``) or
            ``"generic"`` (mpp in the TIFF resolution tags).
        downsamples: Integer downsample of each level, starting with 1.
        compression: ``"jpeg"`` or ``"deflate"``.
        tile: TIFF tile edge (px), a multiple of 16.
        resolution_unit: ``"CENTIMETER"`` or ``"INCH"`` for generic TIFFs.
        pale_boxes: Pale tissue rectangles (the tile at ``PALE_STAIN`` of its
            stain), drawn over ``boxes``; tissue as much as they are.
        glass_boxes: Bare glass drawn over both (holes in the tissue).
        background: RGB of the glass around the tissue.
    """

    width: int
    height: int
    boxes: tuple[Box, ...]
    mpp: tuple[float, float] | None = (0.25, 0.25)
    vendor: str = "aperio"
    downsamples: tuple[int, ...] = (1, 2, 8)
    compression: str = "jpeg"
    tile: int = 256
    resolution_unit: str = "CENTIMETER"
    pale_boxes: tuple[Box, ...] = ()
    glass_boxes: tuple[Box, ...] = ()
    background: tuple[int, int, int] = (WHITE, WHITE, WHITE)

    def __post_init__(self) -> None:
        if self.vendor not in ("aperio", "generic"):
            raise ValueError(f"vendor must be 'aperio' or 'generic', got {self.vendor!r}")
        if self.compression not in ("jpeg", "deflate"):
            raise ValueError(f"compression must be 'jpeg' or 'deflate', got {self.compression!r}")
        if not self.downsamples or self.downsamples[0] != 1:
            raise ValueError(f"downsamples must start with 1, got {self.downsamples!r}")
        for d in self.downsamples:
            if self.width % d or self.height % d:
                raise ValueError(f"{self.width}x{self.height} is not a multiple of downsample {d}")
        if self.vendor == "aperio" and self.mpp is not None and self.mpp[0] != self.mpp[1]:
            raise ValueError(f"Aperio descriptions carry one MPP, got {self.mpp!r}")
        if self.tile % 16:
            raise ValueError(f"tile must be a multiple of 16, got {self.tile}")
        for box in self.boxes + self.pale_boxes + self.glass_boxes:
            x, y, w, h = box
            if x < 0 or y < 0 or w <= 0 or h <= 0 or x + w > self.width or y + h > self.height:
                raise ValueError(f"box {box} is not inside {self.width}x{self.height}")


@dataclass(frozen=True)
class GeneratedSlide:
    """A slide on disk and the facts a test checks against.

    Attributes:
        path: The file.
        spec: How it was written.
        level_dimensions: ``(w, h)`` per level, as OpenSlide reports them.
    """

    path: Path
    spec: SlideSpec
    level_dimensions: tuple[tuple[int, int], ...] = field(default=())

    @property
    def mpp(self) -> float | None:
        """Level-0 mpp (x), or ``None`` for a slide written without one."""
        return None if self.spec.mpp is None else self.spec.mpp[0]

    @property
    def boxes(self) -> tuple[Box, ...]:
        """Tissue boxes, level-0 ``(x, y, w, h)`` (pale ones not included)."""
        return self.spec.boxes

    @property
    def tissue_boxes(self) -> tuple[Box, ...]:
        """Every tissue box, stained and pale, level-0 ``(x, y, w, h)``."""
        return self.spec.boxes + self.spec.pale_boxes


def render_region(
    spec: SlideSpec, x0: int, y0: int, width: int, height: int, downsample: int = 1
) -> np.ndarray:
    """Pixels of ``[x0, x0+width) x [y0, y0+height)`` at ``downsample``: glass plus textured boxes.

    Coordinates are in the level's own pixels. The texture is anchored at each
    box's top-left corner, so a box looks the same wherever it is placed;
    outside the slide is the background. Pale boxes are drawn over the
    others, glass boxes over both. A level other than 0 equals the box-reduced level 0 (PIL
    ``reduce``); it is rendered from a pre-reduced texture when every box edge
    is a multiple of ``downsample``, else from level 0.
    """
    d = downsample
    edges = (v for box in spec.boxes + spec.pale_boxes + spec.glass_boxes for v in box)
    if d > 1 and (_reduced_texture(d) is None or any(v % d for v in edges)):
        full = render_region(spec, x0 * d, y0 * d, width * d, height * d)
        return np.array(Image.fromarray(full).reduce(d))
    out = np.empty((height, width, 3), np.uint8)
    out[:] = spec.background
    for boxes, pale in ((spec.boxes, False), (spec.pale_boxes, True)):
        texture = _reduced_texture(d, pale)
        assert texture is not None
        _paint(out, texture, boxes, x0, y0, d)
    glass = np.empty((1, 1, 3), np.uint8)
    glass[:] = spec.background
    _paint(out, glass, spec.glass_boxes, x0, y0, d)
    return out


def _paint(
    out: np.ndarray, texture: np.ndarray, boxes: Sequence[Box], x0: int, y0: int, d: int
) -> None:
    """Draw ``texture`` into ``out`` (level px from ``x0, y0``) over each of ``boxes`` (level 0)."""
    height, width = out.shape[:2]
    th, tw = texture.shape[:2]
    for bx, by, bw, bh in ((b[0] // d, b[1] // d, b[2] // d, b[3] // d) for b in boxes):
        ix0, ix1 = max(x0, bx), min(x0 + width, bx + bw)
        iy0, iy1 = max(y0, by), min(y0 + height, by + bh)
        if ix0 >= ix1 or iy0 >= iy1:
            continue
        cols = (np.arange(ix0, ix1) - bx) % tw
        rows = (np.arange(iy0, iy1) - by) % th
        out[iy0 - y0 : iy1 - y0, ix0 - x0 : ix1 - x0] = texture[rows[:, None], cols[None, :]]


@cache
def _reduced_texture(downsample: int, pale: bool = False) -> np.ndarray | None:
    """The texture box-reduced by ``downsample`` (None when its period is not a multiple)."""
    texture = _texture(pale)
    if texture.shape[0] % downsample or texture.shape[1] % downsample:
        return None
    if downsample == 1:
        return texture
    return np.asarray(Image.fromarray(texture).reduce(downsample))


def _level_tiles(spec: SlideSpec, downsample: int) -> Iterator[np.ndarray]:
    """The tiles of one level, row by row, each ``tile x tile`` (edge tiles padded white)."""
    t = spec.tile
    lw, lh = spec.width // downsample, spec.height // downsample
    for ty in range(0, lh, t):
        for tx in range(0, lw, t):
            region = render_region(spec, tx, ty, t, t, downsample)
            # Pixels past the level's edge are white (never read by OpenSlide).
            region[min(t, lh - ty) :, :] = WHITE
            region[:, min(t, lw - tx) :] = WHITE
            yield region


def _description(spec: SlideSpec) -> str | None:
    if spec.vendor != "aperio":
        return None
    head = _APERIO_HEAD.format(w=spec.width, h=spec.height, t=spec.tile)
    if spec.mpp is None:
        return head + "|AppMag = 40"
    return head + f"|AppMag = {10 / spec.mpp[0]:g}|MPP = {spec.mpp[0]:g}"


def _resolution_kwargs(spec: SlideSpec, downsample: int) -> dict[str, object]:
    if spec.vendor != "generic" or spec.mpp is None:
        return {}
    per_unit = 1e4 if spec.resolution_unit == "CENTIMETER" else 25400.0
    res = (per_unit / (spec.mpp[0] * downsample), per_unit / (spec.mpp[1] * downsample))
    return {"resolution": res, "resolutionunit": spec.resolution_unit}


def write_slide(path: Path, spec: SlideSpec) -> GeneratedSlide:
    """Write ``spec`` as a tiled pyramidal TIFF at ``path`` and check it with OpenSlide.

    A process builds each slide once: a spec written before (and small enough
    to keep, :data:`KEEP_MAX_BYTES`) is copied byte for byte from a private
    copy, so a test session pays each distinct slide once however many
    modules ask for it, and no test can change another's file.

    Raises:
        RuntimeError: OpenSlide does not open the file or reports other
            dimensions or another mpp than ``spec`` says.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = _KEPT.get(spec) if _hashable(spec) else None
    if kept is not None and kept[0].is_file():
        shutil.copyfile(kept[0], path)
        return GeneratedSlide(path, spec, kept[1])
    dims = _write_new(path, spec)
    if _hashable(spec) and path.stat().st_size <= KEEP_MAX_BYTES:
        private = _kept_dir() / f"{len(_KEPT)}{path.suffix}"
        shutil.copyfile(path, private)
        _KEPT[spec] = (private, dims)
    return GeneratedSlide(path, spec, dims)


KEEP_MAX_BYTES = 64 << 20
"""Slides up to this size are kept for reuse (the benchmark's big ones are not)."""
_KEPT: dict[SlideSpec, tuple[Path, tuple[tuple[int, int], ...]]] = {}


def _hashable(spec: SlideSpec) -> bool:
    try:
        hash(spec)
    except TypeError:  # boxes given as lists
        return False
    return True


@cache
def _kept_dir() -> Path:
    """The process's private folder of written slides, removed at exit."""
    import atexit
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="histoserve-slides-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def _write_new(path: Path, spec: SlideSpec) -> tuple[tuple[int, int], ...]:
    """Write ``spec`` at ``path`` and return the level sizes OpenSlide reads there."""
    import tifffile

    compression = "jpeg" if spec.compression == "jpeg" else "adobe_deflate"
    extra = {"compressionargs": {"level": 90}} if spec.compression == "jpeg" else {}
    with tifffile.TiffWriter(path, bigtiff=spec.width * spec.height > 2**28) as tw:
        for index, d in enumerate(spec.downsamples):
            tw.write(
                _level_tiles(spec, d),
                shape=(spec.height // d, spec.width // d, 3),
                dtype=np.uint8,
                tile=(spec.tile, spec.tile),
                photometric="rgb",
                compression=compression,
                description=_description(spec) if index == 0 else None,
                subfiletype=0 if index == 0 else 1,
                metadata=None,
                **_resolution_kwargs(spec, d),
                **extra,
            )
    return _verify_with_openslide(path, spec)


def _verify_with_openslide(path: Path, spec: SlideSpec) -> tuple[tuple[int, int], ...]:
    import openslide

    with openslide.OpenSlide(str(path)) as slide:
        dims = tuple(tuple(int(v) for v in d) for d in slide.level_dimensions)
        props = dict(slide.properties)
    expected = tuple((spec.width // d, spec.height // d) for d in spec.downsamples)
    if dims != expected:
        raise RuntimeError(f"{path}: OpenSlide reads levels {dims}, expected {expected}")
    got = props.get("openslide.mpp-x"), props.get("openslide.mpp-y")
    want = (None, None) if spec.mpp is None else spec.mpp
    if spec.mpp is None and got != (None, None):
        raise RuntimeError(f"{path}: written without mpp but OpenSlide reads {got}")
    if spec.mpp is not None and not np.allclose([float(v) for v in got], want, rtol=1e-6):
        raise RuntimeError(f"{path}: OpenSlide reads mpp {got}, expected {want}")
    return dims


def aperio_svs(path: Path, *, mpp: float | None = 0.25, **kwargs: object) -> GeneratedSlide:
    """An Aperio-style ``.svs``: JPEG tiles, ``MPP`` in the ImageDescription.

    Default layout (``standard_layout``): 3584x2688 px, levels 1/2/8, two
    tissue boxes aligned to 448 px (a 224 px tile at 0.5 mpp from 0.25 mpp).
    """
    layout = {**standard_layout(448), **kwargs}
    spec = SlideSpec(mpp=None if mpp is None else (mpp, mpp), vendor="aperio", **layout)
    return write_slide(path, spec)


def generic_tiff(
    path: Path, *, mpp: float | tuple[float, float] | None = 0.5, **kwargs: object
) -> GeneratedSlide:
    """A generic tiled TIFF: deflate tiles, mpp in the resolution tags (or none at all).

    Default layout: 3584x2688 px, levels 1/2/8, tissue boxes aligned to 224 px
    (a 224 px tile at 0.5 mpp), i.e. :func:`standard_layout` at half the unit.
    """
    layout = {"compression": "deflate", **standard_layout(224), **kwargs}
    mpp_xy = None if mpp is None else (mpp, mpp) if isinstance(mpp, float | int) else tuple(mpp)
    spec = SlideSpec(mpp=mpp_xy, vendor="generic", **layout)
    return write_slide(path, spec)


def standard_layout(unit: int) -> dict[str, object]:
    """Size and boxes in multiples of ``unit`` (the level-0 tile footprint tests use).

    3584x2688 px; boxes of 3x2 and 2x2 units at (1, 1) and (5, 3) units for
    ``unit=448``; for a smaller unit the same boxes in unit counts, so the
    expected grid stays exact.
    """
    boxes = ((1 * unit, 1 * unit, 3 * unit, 2 * unit), (5 * unit, 3 * unit, 2 * unit, 2 * unit))
    return {"width": 3584, "height": 2688, "boxes": boxes}


def truncated_copy(src: Path, dst: Path, keep_fraction: float = 0.5) -> Path:
    """A copy of ``src`` cut short after ``keep_fraction`` of its bytes (a broken download)."""
    if not 0.0 < keep_fraction < 1.0:
        raise ValueError(f"keep_fraction must be in (0, 1), got {keep_fraction}")
    size = Path(src).stat().st_size
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        fout.write(fin.read(int(size * keep_fraction)))
    return Path(dst)


def copy_slide(src: GeneratedSlide, dst: Path) -> GeneratedSlide:
    """The same slide under another path (another slide id)."""
    shutil.copyfile(src.path, dst)
    return GeneratedSlide(Path(dst), src.spec, src.level_dimensions)


def expected_coords(
    boxes: Sequence[Box],
    patch_size_level0: int,
    bounds: tuple[int, int, int, int],
) -> np.ndarray:
    """The level-0 top-left corners of grid tiles lying wholly inside a box.

    The grid starts at the bounds' origin with step ``patch_size_level0`` and
    holds the tiles wholly inside the bounds; rows are ordered by y then x, as
    ``histoserve embed`` writes them.

    Returns:
        int64 ``[N, 2]`` (x, y).
    """
    bx, by, bw, bh = bounds
    step = patch_size_level0
    xs = bx + step * np.arange(bw // step)
    ys = by + step * np.arange(bh // step)
    gx, gy = np.meshgrid(xs, ys)  # row-major: y outer, x inner
    gx, gy = gx.ravel(), gy.ravel()
    inside = np.zeros(gx.shape, bool)
    for x, y, w, h in boxes:
        inside |= (gx >= x) & (gy >= y) & (gx + step <= x + w) & (gy + step <= y + h)
    return np.stack([gx[inside], gy[inside]], axis=1).astype(np.int64)


def corrupt_tiles_copy(src: Path, dst: Path, tile_indices: Sequence[int]) -> Path:
    """A copy of ``src`` whose level-0 TIFF tiles ``tile_indices`` are overwritten with zeros.

    The file keeps its size and directories (it opens; the truncation check
    passes), but reading a region that touches one of those tiles fails in
    the backend: a corrupt tile region, as a bad sector or a bad scan leaves.
    Tile ``i`` is row-major in the level-0 TIFF tile grid (``spec.tile`` px).
    """
    import tifffile

    shutil.copyfile(src, dst)
    with tifffile.TiffFile(dst) as tif:
        page = tif.pages[0]
        spans = [(int(page.dataoffsets[i]), int(page.databytecounts[i])) for i in tile_indices]
    with open(dst, "r+b") as handle:
        for offset, count in spans:
            handle.seek(offset)
            handle.write(b"\0" * count)
    return Path(dst)


def large_slide(path: Path, tiles_x: int, tiles_y: int, *, mpp: float = 0.5) -> GeneratedSlide:
    """A benchmark slide: ``tiles_x * tiles_y`` 224 px tiles at ``mpp``, all of it tissue.

    Generic tiled TIFF, JPEG, levels 1/2/8/32 (as far as the size allows); the
    whole area is one tissue box, so Otsu keeps every tile. Written tile by
    tile: memory stays small whatever the size (20,000 tiles take about
    30 s on one core and ~0.5 GB of disk).
    """
    width, height = 224 * tiles_x, 224 * tiles_y
    downsamples = tuple(d for d in (1, 2, 8, 32) if width % d == 0 and height % d == 0)
    spec = SlideSpec(
        width=width,
        height=height,
        boxes=((0, 0, width, height),),
        mpp=(mpp, mpp),
        vendor="generic",
        downsamples=downsamples,
        compression="jpeg",
    )
    return write_slide(path, spec)
