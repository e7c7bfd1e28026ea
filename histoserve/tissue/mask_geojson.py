"""Read a GeoJSON mask (QuPath's export) into polygons, bounded and checked, or say what is wrong.

A mask file is user input: it may be huge, deeply nested, or not GeoJSON at
all. :func:`read_geojson` reads at most ``limits.MAX_MASK_BYTES``, measures
the JSON nesting before parsing (Python's parser recurses and gives up near
1000 levels), walks the structure it allows (a FeatureCollection, a list of
Features, one Feature or a bare geometry; Polygons, MultiPolygons and
GeometryCollections; other geometries cover no area) and converts every ring
to a float64 ``[k, 2]`` array, counting vertices against
``limits.MAX_MASK_VERTICES`` and refusing coordinates that are not finite or
are beyond ``limits.MAX_MASK_COORDINATE``. Anything else is a
:class:`~histoserve.errors.SlideError` naming the file, where in
it (``features[3].geometry.coordinates[0][12]``) and what is wrong, never a
Python exception's name.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from histoserve.errors import SlideError
from histoserve.limits import (
    MAX_MASK_BYTES,
    MAX_MASK_COORDINATE,
    MAX_MASK_JSON_VALUES,
    MAX_MASK_NESTING,
    MAX_MASK_VERTICES,
)

EXCLUDE_CLASSES = ("ignore*", "exclude")  # QuPath's "Ignore*" and a plain "Exclude", any case
Rings = list[np.ndarray]  # one polygon: outer ring, then holes, each float64 [k, 2]
_NO_AREA = ("Point", "MultiPoint", "LineString", "MultiLineString")
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_DEPTH_BLOCK = 1 << 22  # bytes scanned at once for the nesting depth
_FIX = "export it again (QuPath: File > Export objects as GeoJSON) or give a binary image mask"


def read_bounded(path: Path, max_bytes: int, kind: str) -> bytes:
    """The bytes of mask ``path``, refused unread when larger than ``max_bytes``.

    Raises:
        SlideError: Unreadable, or too large.
    """
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise SlideError(
                f"mask {path}: {size:,} bytes, more than the {max_bytes:,} a {kind} mask may "
                "have; export it at a lower resolution or with simpler outlines"
            )
        with open(path, "rb") as handle:
            raw = handle.read(size + 1)  # +1: a file grown since stat shows here
            if len(raw) > size:
                raw += handle.read(max_bytes + 1 - len(raw))
    except OSError as exc:
        raise SlideError(f"mask {path}: cannot read it ({exc.strerror or exc})") from exc
    if len(raw) > max_bytes:  # grew since stat
        raise SlideError(f"mask {path}: more than the {max_bytes:,} bytes a {kind} mask may have")
    return raw


def json_shape(raw: bytes) -> tuple[int, int]:
    """``(depth, values)`` of JSON ``raw``: its deepest nesting and an upper bound on its values.

    Strings are skipped, so brackets and commas inside them do not count. The
    values are bounded by commas plus containers plus one: what ``json.loads``
    would build, known before it builds anything. Bounded memory.
    """
    bare = np.frombuffer(_STRING.sub(b'""', raw), np.uint8)
    deepest = level = 0
    values = 1
    for start in range(0, len(bare), _DEPTH_BLOCK):
        block = bare[start : start + _DEPTH_BLOCK]
        opens = (block == ord("[")).astype(np.int8) + (block == ord("{"))
        step = opens - (block == ord("]")).astype(np.int8) - (block == ord("}"))
        values += int(np.count_nonzero(opens)) + int(np.count_nonzero(block == ord(",")))
        levels = level + np.cumsum(step, dtype=np.int64)
        if len(levels):
            deepest, level = max(deepest, int(levels.max())), int(levels[-1])
    return deepest, values


def read_geojson(path: Path) -> tuple[list[Rings], list[Rings]]:
    """The polygons of a GeoJSON file (level-0 px): ``(included, excluded)``.

    Features classified ``Ignore*`` or ``Exclude`` are the excluded ones. Each
    polygon is ``[outer, *holes]``, each ring a float64 ``[k, 2]`` array.

    Raises:
        SlideError: Too large, too deep, too many vertices, not JSON, or not
            GeoJSON polygons with finite coordinates (the message says where).
    """
    path = Path(path)
    raw = read_bounded(path, MAX_MASK_BYTES, "GeoJSON")
    depth, values = json_shape(raw)
    if depth > MAX_MASK_NESTING:
        raise SlideError(
            f"mask {path}: JSON nested {depth} deep, more than the {MAX_MASK_NESTING} GeoJSON "
            f"needs; {_FIX}"
        )
    if values > MAX_MASK_JSON_VALUES:
        raise SlideError(
            f"mask {path}: about {values:,} JSON values, more than the {MAX_MASK_JSON_VALUES:,} "
            f"a mask of {MAX_MASK_VERTICES:,} vertices needs; simplify the outlines or {_FIX}"
        )
    try:
        data = json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise SlideError(f"mask {path}: not UTF-8 text at byte {exc.start}; {_FIX}") from exc
    except json.JSONDecodeError as exc:
        raise SlideError(
            f"mask {path}: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); {_FIX}"
        ) from exc
    walk = _Walk(path)
    walk.top(data)
    return walk.include, walk.exclude


class _Walk:
    """One pass over parsed GeoJSON, collecting polygons and failing with a located reason."""

    def __init__(self, path: Path):
        self.path = path
        self.include: list[Rings] = []
        self.exclude: list[Rings] = []
        self.vertices = 0

    def fail(self, where: str, what: str) -> NoReturn:
        raise SlideError(f"mask {self.path}: {where}: {what}; {_FIX}")

    def top(self, data: Any) -> None:
        if isinstance(data, list):  # QuPath's "features only" export
            for i, item in enumerate(data):
                self.feature(item, f"$[{i}]")
            return
        if _kind(data) == "FeatureCollection":
            features = data.get("features", [])
            if not isinstance(features, list):
                self.fail("$.features", f"{_name(features)}, not a list of Features")
            for i, item in enumerate(features):
                self.feature(item, f"$.features[{i}]")
            return
        self.feature(data, "$")

    def feature(self, data: Any, where: str) -> None:
        if not isinstance(data, dict):
            self.fail(where, f"{_name(data)}, not a GeoJSON object")
        if _kind(data) != "Feature":
            self.geometry(data, where, self.include)
            return
        properties = data.get("properties") or {}
        if not isinstance(properties, dict):
            self.fail(f"{where}.properties", f"{_name(properties)}, not an object")
        if data.get("geometry") is not None:
            target = self.exclude if _excluded(properties) else self.include
            self.geometry(data["geometry"], f"{where}.geometry", target)

    def geometry(self, data: Any, where: str, target: list[Rings]) -> None:
        if not isinstance(data, dict):
            self.fail(where, f"{_name(data)}, not a GeoJSON geometry")
        kind = _kind(data)
        if kind == "GeometryCollection":
            parts = data.get("geometries", [])
            if not isinstance(parts, list):
                self.fail(f"{where}.geometries", f"{_name(parts)}, not a list")
            for i, part in enumerate(parts):
                self.geometry(part, f"{where}.geometries[{i}]", target)
        elif kind == "Polygon":
            target.append(self.polygon(data.get("coordinates"), f"{where}.coordinates"))
        elif kind == "MultiPolygon":
            polygons = _list(self, data.get("coordinates"), f"{where}.coordinates", "polygons")
            for i, rings in enumerate(polygons):
                target.append(self.polygon(rings, f"{where}.coordinates[{i}]"))
        elif kind is None:
            self.fail(where, 'an object without a GeoJSON "type"')
        elif kind not in _NO_AREA:  # points and lines (QuPath's point annotations): no area
            self.fail(f"{where}.type", f"{_name(kind)}, not a GeoJSON geometry type")

    def polygon(self, rings: Any, where: str) -> Rings:
        return [
            self.ring(r, f"{where}[{i}]") for i, r in enumerate(_list(self, rings, where, "rings"))
        ]

    def ring(self, ring: Any, where: str) -> np.ndarray:
        positions = _list(self, ring, where, "positions")
        self.vertices += len(positions)
        if self.vertices > MAX_MASK_VERTICES:
            self.fail(
                where,
                f"more than {MAX_MASK_VERTICES:,} vertices in the file, the limit; simplify the "
                "outlines (QuPath: Objects > Annotations > Simplify shape)",
            )
        points = _fast_points(positions)
        if points is not None and np.all(np.abs(points) <= MAX_MASK_COORDINATE):
            return points
        points = np.empty((len(positions), 2))
        for i, position in enumerate(positions):
            if not (isinstance(position, list) and len(position) >= 2):
                self.fail(f"{where}[{i}]", f"{_name(position)}, not an [x, y] position")
            for axis in (0, 1):
                points[i, axis] = self.number(position[axis], f"{where}[{i}][{axis}]")
        return points

    def number(self, value: Any, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(where, f"{_name(value)}, not a number")
        number = float(value)
        if not abs(number) <= MAX_MASK_COORDINATE:  # NaN fails too
            self.fail(
                where,
                f"{value!r} is not a level-0 pixel position (finite, within "
                f"+-{MAX_MASK_COORDINATE:g})",
            )
        return number


def _fast_points(positions: list) -> np.ndarray | None:
    """``positions`` as float64 ``[k, 2]`` when they are all lists of >= 2 numbers, else None."""
    try:
        array = np.asarray(positions)
    except (ValueError, TypeError, OverflowError):  # ragged or odd: the slow path says where
        return None
    if array.ndim != 2 or array.shape[1] < 2 or array.dtype.kind not in "iuf":
        return None
    return np.ascontiguousarray(array[:, :2], dtype=np.float64)


def _list(walk: _Walk, value: Any, where: str, of: str) -> list:
    if not isinstance(value, list):
        walk.fail(where, f"{_name(value)}, not a list of {of}")
    return value


def _kind(data: Any) -> Any:
    return data.get("type") if isinstance(data, dict) else None


def _name(value: Any) -> str:
    """A JSON value as a reader would call it: 'the string "x"', 'a number', 'null'."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        shown = value if len(value) <= 20 else value[:20] + "..."
        return f"the string {json.dumps(shown)}"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return "an object"


def _excluded(properties: dict) -> bool:
    cls = properties.get("classification")
    name = cls.get("name") if isinstance(cls, dict) else cls
    return isinstance(name, str) and name.strip().lower() in EXCLUDE_CLASSES
