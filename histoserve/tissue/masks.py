"""Where a slide's tissue is: found by a method, or given in as a mask file.

:func:`find_tissue` gives a :class:`TissueMap` for every slide: the mask the
tiles are kept by, its mpp, and the tissue fraction of every planned tile.
The mask comes, in this order, from

- a mask file (the manifest's ``mask`` column, else ``--masks DIR``
  ``/<slide_id>.geojson|.json|.png|.tif|.tiff``):

  - GeoJSON as QuPath exports it (a FeatureCollection, a list of Features,
    one Feature or a bare geometry), Polygons and MultiPolygons in level-0
    pixels, holes respected. Features classified ``Ignore*`` or ``Exclude``
    are cut out of the others (pen marks, folds). It is rasterised on the
    grid of the tissue thumbnail (``tissue.THUMB_MPP``), so the run's own
    ``qc/<id>.geojson`` given back reproduces its tissue fractions exactly;
  - a binary image covering the whole slide at any resolution (non-zero is
    tissue; its width and height must have the slide's aspect ratio);

  both bounded before the work they cause (:mod:`~histoserve.limits`:
  bytes, JSON nesting, vertices, rasterising work, decoded pixels), a bad
  file failing its slide with a message that names it and what is wrong
  (:mod:`~histoserve.tissue.mask_geojson` for GeoJSON);

- otherwise ``--tissue``: Otsu on the thumbnail, ``none`` (every tile), or a
  served segmentation model.

``--min-tissue`` applies to every source alike.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from histoserve.errors import SlideError
from histoserve.limits import (
    MAX_CONTOUR_EDGES,
    MAX_MASK_BYTES,
    MAX_MASK_CROSSINGS,
    MAX_MASK_PIXELS,
)
from histoserve.slides.grid import TilePlan
from histoserve.slides.readers import MppInfo, SlideReader
from histoserve.tissue.contours import (
    Polygon,
    boundary_edge_count,
    coarsened,
    crossing_count,
    mask_polygons,
    rasterize,
)
from histoserve.tissue.detect import (
    THUMB_MPP,
    fractions_from_mask,
    otsu_mask,
    thumbnail,
    thumbnail_grid,
)
from histoserve.tissue.mask_geojson import read_bounded, read_geojson

GEOJSON_SUFFIXES = (".geojson", ".json")
IMAGE_SUFFIXES = (".png", ".tif", ".tiff")
ASPECT_TOLERANCE = 0.02
# A served model's whole-slide mask: (reader, mpp) -> (bool mask, its mpp).
ModelMask = Callable[[SlideReader, MppInfo], tuple[np.ndarray, float]]


@dataclass(frozen=True)
class TissueMap:
    """A slide's tissue as the tiles were kept by it.

    Attributes:
        mask: bool ``[h, w]`` from level-0 ``(0, 0)``.
        mask_mpp: Microns per mask pixel.
        source: ``otsu``, ``none``, the served model's name, or ``mask`` (a file).
        fractions: float32 tissue fraction of every ``plan.coords`` tile.
        thumb: An RGB thumbnail when one was read for the mask, else None.
        thumb_mpp: Its mpp (0.0 without one).
    """

    mask: np.ndarray
    mask_mpp: float
    source: str
    fractions: np.ndarray
    thumb: np.ndarray | None = None
    thumb_mpp: float = 0.0

    @property
    def area_mm2(self) -> float:
        """Tissue area of the mask in mm²."""
        return float(self.mask.sum()) * (self.mask_mpp / 1000.0) ** 2

    def polygons_level0(self, level0_mpp: float) -> list[Polygon]:
        """The mask's contours (:func:`~histoserve.tissue.contours.mask_polygons`) in level-0 px.

        A mask with more than ``limits.MAX_CONTOUR_EDGES`` boundary sides (noise,
        a served model's speckle) is traced on a grid coarsened by powers of two
        until it has fewer, so QC stays bounded; its contours then only outline
        the mask (the exact round trip holds for every other mask).
        """
        mask, factor = self.mask, 1
        while boundary_edge_count(mask) > MAX_CONTOUR_EDGES:
            factor *= 2
            mask = coarsened(self.mask, factor)
        scale = self.mask_mpp * factor / level0_mpp
        return [
            [[(x * scale, y * scale) for x, y in ring] for ring in polygon]
            for polygon in mask_polygons(mask)
        ]


def mask_file(slide_id: str, manifest_mask: Path | None, masks_dir: Path | None) -> Path | None:
    """The slide's mask file: the manifest's, else ``masks_dir/<slide_id>.<ext>``, else None.

    Raises:
        SlideError: ``--masks`` is given but holds no file for this slide, the
            manifest's mask does not exist, or the file is larger than
            ``limits.MAX_MASK_BYTES``.
    """
    if manifest_mask is not None:
        if not manifest_mask.is_file():
            raise SlideError(f"mask {manifest_mask} (manifest column mask) does not exist")
        return _not_too_large(manifest_mask)
    if masks_dir is None:
        return None
    for suffix in GEOJSON_SUFFIXES + IMAGE_SUFFIXES:
        path = masks_dir / f"{slide_id}{suffix}"
        if path.is_file():
            return _not_too_large(path)
    names = ", ".join(f"{slide_id}{s}" for s in GEOJSON_SUFFIXES + IMAGE_SUFFIXES)
    raise SlideError(
        f"--masks {masks_dir}: no mask for slide {slide_id!r} (looked for {names}); "
        "add one, give it in the manifest's mask column, or drop --masks"
    )


def _not_too_large(path: Path) -> Path:
    """``path``, refused when it has more than ``MAX_MASK_BYTES`` (before anything hashes it)."""
    size = path.stat().st_size
    if size > MAX_MASK_BYTES:
        raise SlideError(
            f"mask {path}: {size:,} bytes, more than the {MAX_MASK_BYTES:,} a mask may have; "
            "export it at a lower resolution or with simpler outlines"
        )
    return path


def find_tissue(
    reader: SlideReader,
    mpp: MppInfo,
    plan: TilePlan,
    method: str,
    mask_path: Path | None = None,
    model_mask: ModelMask | None = None,
) -> TissueMap:
    """The slide's tissue from ``mask_path`` if given, else by ``method``.

    Args:
        method: ``otsu`` or ``none``; anything else needs ``model_mask``.
        model_mask: ``(reader, mpp) -> (mask, mask_mpp)`` for a served model.

    Raises:
        SlideError: The mask file is unreadable or not a mask of this slide.
        ValueError: A served model's name as ``method`` without ``model_mask``.
    """
    if mask_path is not None:
        mask, mask_mpp = read_mask(mask_path, reader, mpp)
        return TissueMap(mask, mask_mpp, "mask", fractions_from_mask(mask, mask_mpp, plan))
    if method == "none":
        _level, _factor, shape, grid_mpp = thumbnail_grid(reader, mpp, THUMB_MPP)
        ones = np.ones(len(plan.coords), np.float32)
        return TissueMap(np.ones(shape, bool), grid_mpp, "none", ones)
    if method == "otsu":
        rgb, rgb_mpp = thumbnail(reader, mpp, THUMB_MPP)
        mask = otsu_mask(rgb, rgb_mpp)
        fractions = fractions_from_mask(mask, rgb_mpp, plan)
        return TissueMap(mask, rgb_mpp, "otsu", fractions, rgb, rgb_mpp)
    if model_mask is None:
        raise ValueError(f"tissue method {method!r}: a served model needs model_mask")
    mask, mask_mpp = model_mask(reader, mpp)
    return TissueMap(mask, mask_mpp, method, fractions_from_mask(mask, mask_mpp, plan))


def read_mask(path: Path, reader: SlideReader, mpp: MppInfo) -> tuple[np.ndarray, float]:
    """A mask file as a bool mask from level-0 ``(0, 0)`` and its mpp.

    Every size is bounded before the work it causes (``limits.MAX_MASK_*``):
    bytes before reading, nesting before parsing, vertices while parsing,
    rasterising work before rasterising, an image's pixels from its header
    before decoding.

    Raises:
        SlideError: Unreadable, not GeoJSON/an image, over a limit, or not the
            slide's shape; the message names the file and what is wrong.
    """
    suffix = path.suffix.lower()
    if suffix in GEOJSON_SUFFIXES:
        return _geojson_mask(path, reader, mpp)
    if suffix in IMAGE_SUFFIXES:
        return _image_mask(path, reader, mpp)
    raise SlideError(
        f"mask {path}: unknown kind {suffix!r}; use GeoJSON ({', '.join(GEOJSON_SUFFIXES)}) "
        f"or a binary image ({', '.join(IMAGE_SUFFIXES)})"
    )


def _geojson_mask(path: Path, reader: SlideReader, mpp: MppInfo) -> tuple[np.ndarray, float]:
    _level, _factor, shape, grid_mpp = thumbnail_grid(reader, mpp, THUMB_MPP)
    include, exclude = read_geojson(path)
    scale = mpp.mpp / grid_mpp  # grid px per level-0 px
    include, exclude = _scaled(include, scale), _scaled(exclude, scale)
    work = crossing_count(include, shape[0]) + crossing_count(exclude, shape[0])
    if work > MAX_MASK_CROSSINGS:
        raise SlideError(
            f"mask {path}: its outlines cross the {shape[1]}x{shape[0]} px tissue grid's rows "
            f"{work:,} times, more than the limit of {MAX_MASK_CROSSINGS:,} (zig-zag or "
            "self-crossing outlines); simplify them (QuPath: Objects > Annotations > "
            "Simplify shape) or give a binary image mask"
        )
    mask = rasterize(include, shape)
    if exclude:
        mask &= ~rasterize(exclude, shape)
    return mask, grid_mpp


def _scaled(polygons: list[list[np.ndarray]], scale: float) -> list[list[np.ndarray]]:
    return [[ring * scale for ring in polygon] for polygon in polygons]


def _image_mask(path: Path, reader: SlideReader, mpp: MppInfo) -> tuple[np.ndarray, float]:
    import warnings

    from PIL import Image

    # Pillow warns from 89 Mpx; every image that large is refused below with a
    # clearer message, so the warning (a class name on stderr) says nothing more.
    warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)
    raw = read_bounded(path, MAX_MASK_BYTES, "image")
    try:
        with Image.open(io.BytesIO(raw)) as image:
            _check_image_size(path, image.size, reader.dimensions)
            mask = np.asarray(image.convert("L")) > 0
    except SlideError:
        raise
    except Image.DecompressionBombError as exc:
        raise SlideError(
            f"mask {path}: more than the {MAX_MASK_PIXELS:,} px an image mask may have "
            f"({_reason(exc)}); export it at a lower resolution (4-16 um/px is plenty)"
        ) from exc
    except Exception as exc:  # Pillow raises many types for a broken or odd file
        raise SlideError(
            f"mask {path}: cannot read it as an image ({_reason(exc)}); save it again as an "
            "8-bit PNG or TIFF, non-zero where the tissue is"
        ) from exc
    return mask, mpp.mpp * reader.dimensions[0] / mask.shape[1]


def _check_image_size(path: Path, size: tuple[int, int], slide: tuple[int, int]) -> None:
    """Refuse an image mask by its header: empty, too many pixels, or not the slide's shape."""
    (w, h), (width, height) = size, slide
    if w < 1 or h < 1:
        raise SlideError(f"mask {path}: the image is {w}x{h} px, empty")
    if w * h > MAX_MASK_PIXELS:
        raise SlideError(
            f"mask {path}: {w}x{h} px ({w * h:,}) is more than the {MAX_MASK_PIXELS:,} px an "
            "image mask may have; export it at a lower resolution (4-16 um/px is plenty)"
        )
    sx, sy = width / w, height / h
    if abs(sx - sy) > ASPECT_TOLERANCE * max(sx, sy):
        raise SlideError(
            f"mask {path}: {w}x{h} px does not have the slide's aspect ratio "
            f"({width}x{height} at level 0); export it for the whole slide"
        )


def _reason(exc: BaseException) -> str:
    """A third-party error's own words, without its class name (a user reads them)."""
    return str(exc).strip() or "the file is damaged or in an unsupported variant"


def feature_collection(polygons: list[Polygon], name: str = "Tissue") -> dict[str, Any]:
    """QuPath's GeoJSON form: one annotation Feature per polygon, classified ``name``."""
    features = []
    for polygon in polygons:
        rings = [[[_number(x), _number(y)] for x, y in ring] for ring in polygon]
        features.append(
            {
                "type": "Feature",
                "geometry": {"type": "Polygon", "coordinates": rings},
                "properties": {
                    "objectType": "annotation",
                    "classification": {"name": name, "color": [0, 170, 0]},
                },
            }
        )
    return {"type": "FeatureCollection", "features": features}


def _number(value: float) -> float | int:
    rounded = round(value, 3)
    return int(rounded) if rounded == int(rounded) else rounded
