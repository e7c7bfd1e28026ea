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

- otherwise ``--tissue``: Otsu on the thumbnail, ``none`` (every tile), or a
  served segmentation model.

``--min-tissue`` applies to every source alike.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from predictor.client.embed.contours import Polygon, mask_polygons, rasterize
from predictor.client.embed.errors import SlideError
from predictor.client.embed.grid import TilePlan
from predictor.client.embed.slides import MppInfo, SlideReader
from predictor.client.embed.tissue import (
    THUMB_MPP,
    fractions_from_mask,
    otsu_mask,
    thumbnail,
    thumbnail_grid,
)

GEOJSON_SUFFIXES = (".geojson", ".json")
IMAGE_SUFFIXES = (".png", ".tif", ".tiff")
EXCLUDE_CLASSES = ("ignore*", "exclude")  # QuPath's "Ignore*" and a plain "Exclude", any case
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
        """The mask's contours (:func:`~predictor.client.embed.contours.mask_polygons`) in level-0 px."""
        scale = self.mask_mpp / level0_mpp
        return [
            [[(x * scale, y * scale) for x, y in ring] for ring in polygon]
            for polygon in mask_polygons(self.mask)
        ]


def mask_file(slide_id: str, manifest_mask: Path | None, masks_dir: Path | None) -> Path | None:
    """The slide's mask file: the manifest's, else ``masks_dir/<slide_id>.<ext>``, else None.

    Raises:
        SlideError: ``--masks`` is given but holds no file for this slide, or
            the manifest's mask does not exist.
    """
    if manifest_mask is not None:
        if not manifest_mask.is_file():
            raise SlideError(f"mask {manifest_mask} (manifest column mask) does not exist")
        return manifest_mask
    if masks_dir is None:
        return None
    for suffix in GEOJSON_SUFFIXES + IMAGE_SUFFIXES:
        path = masks_dir / f"{slide_id}{suffix}"
        if path.is_file():
            return path
    names = ", ".join(f"{slide_id}{s}" for s in GEOJSON_SUFFIXES + IMAGE_SUFFIXES)
    raise SlideError(
        f"--masks {masks_dir}: no mask for slide {slide_id!r} (looked for {names}); "
        "add one, give it in the manifest's mask column, or drop --masks"
    )


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

    Raises:
        SlideError: Unreadable, not GeoJSON/an image, or not the slide's shape.
    """
    suffix = path.suffix.lower()
    if suffix in GEOJSON_SUFFIXES:
        _level, _factor, shape, grid_mpp = thumbnail_grid(reader, mpp, THUMB_MPP)
        include, exclude = read_geojson(path)
        scale = mpp.mpp / grid_mpp  # grid px per level-0 px
        mask = rasterize(_scaled(include, scale), shape)
        if exclude:
            mask &= ~rasterize(_scaled(exclude, scale), shape)
        return mask, grid_mpp
    if suffix in IMAGE_SUFFIXES:
        return _image_mask(path, reader, mpp)
    raise SlideError(
        f"mask {path}: unknown kind {suffix!r}; use GeoJSON ({', '.join(GEOJSON_SUFFIXES)}) "
        f"or a binary image ({', '.join(IMAGE_SUFFIXES)})"
    )


def _scaled(polygons: list[Polygon], scale: float) -> list[Polygon]:
    return [[[(x * scale, y * scale) for x, y in ring] for ring in poly] for poly in polygons]


def _image_mask(path: Path, reader: SlideReader, mpp: MppInfo) -> tuple[np.ndarray, float]:
    from PIL import Image

    try:
        with Image.open(path) as image:
            mask = np.asarray(image.convert("L")) > 0
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise SlideError(f"mask {path}: cannot read it as an image ({exc})") from exc
    width, height = reader.dimensions
    sx, sy = width / mask.shape[1], height / mask.shape[0]
    if abs(sx - sy) > ASPECT_TOLERANCE * max(sx, sy):
        raise SlideError(
            f"mask {path}: {mask.shape[1]}x{mask.shape[0]} px does not have the slide's "
            f"aspect ratio ({width}x{height} at level 0); export it for the whole slide"
        )
    return mask, mpp.mpp * sx


def read_geojson(path: Path) -> tuple[list[Polygon], list[Polygon]]:
    """The polygons of a GeoJSON file (level-0 px): ``(included, excluded)``.

    Raises:
        SlideError: Not JSON, or not GeoJSON of features/geometries.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SlideError(f"mask {path}: cannot read it as GeoJSON ({exc})") from exc
    include: list[Polygon] = []
    exclude: list[Polygon] = []
    try:
        for geometry, properties in _features(data):
            target = exclude if _excluded(properties) else include
            target.extend(_geometry_polygons(geometry))
    except (TypeError, ValueError, KeyError, IndexError) as exc:
        raise SlideError(f"mask {path}: not GeoJSON polygons in level-0 pixels ({exc})") from exc
    return include, exclude


def _features(data: Any) -> Iterator[tuple[dict, dict]]:
    """``(geometry, properties)`` of every feature, whatever the wrapping QuPath chose."""
    if isinstance(data, list):
        for item in data:
            yield from _features(item)
        return
    if not isinstance(data, dict):
        raise ValueError(f"expected a GeoJSON object, got {type(data).__name__}")
    kind = data.get("type")
    if kind == "FeatureCollection":
        yield from _features(data.get("features", []))
    elif kind == "Feature":
        if data.get("geometry") is not None:
            yield data["geometry"], data.get("properties") or {}
    else:
        yield data, {}


def _excluded(properties: dict) -> bool:
    cls = properties.get("classification")
    name = cls.get("name") if isinstance(cls, dict) else cls
    return isinstance(name, str) and name.strip().lower() in EXCLUDE_CLASSES


def _geometry_polygons(geometry: dict) -> list[Polygon]:
    kind = geometry.get("type")
    if kind == "Polygon":
        return [_rings(geometry["coordinates"])]
    if kind == "MultiPolygon":
        return [_rings(poly) for poly in geometry["coordinates"]]
    if kind == "GeometryCollection":
        return [p for g in geometry.get("geometries", []) for p in _geometry_polygons(g)]
    return []  # points and lines (QuPath's point annotations) cover no area


def _rings(coordinates: Any) -> Polygon:
    return [[(float(pt[0]), float(pt[1])) for pt in ring] for ring in coordinates]


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
