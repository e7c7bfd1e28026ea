"""Hostile mask files and slides for tests: each one a real file, with the reason it must fail.

The one place they are written: the unit tests of the mask and slide readers
and the outside-in tests of ``histoserve embed`` (``tests/integration/
test_embed_hostile_inputs.py``) use the same files and expect the same
reasons. Each entry is a :class:`Hostile`: the file, and a regular
expression the failure message must match (it quotes the limit or says what
is wrong). Every file is small on disk: a mask over the byte limit is a
sparse file, a decompression bomb is a 1-bit PNG, a slide of 2^20 x 2^20 px is
:func:`sparse_tiff` (well under a megabyte).

Masks are made for a slide of :data:`MASK_SLIDE` px (the 4:3 of the
generated slides), so the image ones pass the aspect check and fail on what
they are meant to.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from histoserve.limits import (
    MAX_MASK_BYTES,
    MAX_MASK_NESTING,
    MAX_MASK_PIXELS,
    MAX_MASK_VERTICES,
    MAX_SLIDE_PIXELS,
)

MASK_SLIDE = (3584, 2688)
BOMB_SIZE = (15_000, 11_250)  # a 28 KB PNG of 169 Mpx (4:3)
_UNREADABLE_IMAGE = r"cannot read it as an image \(.+\); save it again as an 8-bit PNG or TIFF"


@dataclass(frozen=True)
class Hostile:
    """A hostile input and what its failure message must say (a regular expression)."""

    path: Path
    reason: str


def sparse_tiff(path: Path, width: int, height: int, *, mpp: float = 0.5, tile: int = 4096) -> Path:
    """A small TIFF that claims ``width x height`` px at ``mpp``: every tile is one white tile.

    A hand-written classic TIFF (one level, deflate, RGB, resolution tags in
    cm) whose tile offsets all point at the same compressed tile, so a file
    of well under a megabyte says it is 2^20 px a side: what a broken or
    hostile writer can hand a reader. OpenSlide opens it as a generic TIFF.
    """
    tiles = -(-width // tile) * -(-height // tile)
    data = zlib.compress(np.full((tile, tile, 3), 255, np.uint8).tobytes(), 6)
    per_cm = round(1e4 / mpp)
    arrays = [
        struct.pack("<3H", 8, 8, 8),
        struct.pack("<2I", per_cm, 1) * 2,
        struct.pack(f"<{tiles}I", *([8] * tiles)),
        struct.pack(f"<{tiles}I", *([len(data)] * tiles)),
    ]
    at = [8 + len(data)]
    for blob in arrays[:-1]:
        at.append(at[-1] + len(blob))
    bits, res, offsets, counts = at
    entries = [
        (256, 4, 1, width), (257, 4, 1, height), (258, 3, 3, bits), (259, 3, 1, 8),
        (262, 3, 1, 2), (277, 3, 1, 3), (282, 5, 1, res), (283, 5, 1, res + 8),
        (284, 3, 1, 1), (296, 3, 1, 3), (322, 4, 1, tile), (323, 4, 1, tile),
        (324, 4, tiles, offsets), (325, 4, tiles, counts),
    ]  # fmt: skip
    ifd = at[-1] + len(arrays[-1])
    body = struct.pack("<H", len(entries)) + b"".join(
        struct.pack("<HHII", tag, kind, count, value) for tag, kind, count, value in entries
    )
    Path(path).write_bytes(
        b"II*\0" + struct.pack("<I", ifd) + data + b"".join(arrays) + body + b"\0\0\0\0"
    )
    return Path(path)


def _polygon(*points: object) -> dict[str, object]:
    return {"type": "Polygon", "coordinates": [[[0, 0], *points, [0, 0]]]}


def _json(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data))  # NaN and Infinity as Python writes them
    return path


def _vertices(path: Path, count: int) -> Path:
    """A Polygon of ``count`` vertices (a zig-zag), written as text without building it."""
    ring = ",".join(f"[{i % 1000},{(i * 7) % 1000}]" for i in range(count))
    path.write_text('{"type":"Polygon","coordinates":[[' + ring + "]]}")
    return path


def _sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as handle:
        handle.truncate(size)  # a hole: no disk used
    return path


def _bomb(path: Path) -> Path:
    Image.new("1", BOMB_SIZE).save(path, optimize=True)  # 1 bit a pixel in memory
    return path


def _truncated_png(path: Path) -> Path:
    rng = np.random.default_rng(3)
    Image.fromarray(rng.integers(0, 2, (MASK_SLIDE[1] // 16, MASK_SLIDE[0] // 16), np.uint8)).save(
        path
    )
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    return path


def hostile_masks(folder: Path) -> dict[str, Hostile]:
    """Write every hostile mask file into ``folder``: ``{name: Hostile}``.

    The names are the files' stems, usable as slide ids with ``--masks folder``.
    """
    folder.mkdir(parents=True, exist_ok=True)
    deep = folder / "deep.geojson"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    bad_feature = {"type": "FeatureCollection", "features": ["x"]}
    return {
        "deep": Hostile(deep, rf"nested 100000 deep, more than the {MAX_MASK_NESTING}"),
        "not_a_feature": Hostile(
            _json(folder / "not_a_feature.geojson", bad_feature),
            r'\$\.features\[0\]: the string "x", not a GeoJSON object',
        ),
        "nan": Hostile(
            _json(folder / "nan.geojson", _polygon([float("nan"), 5], [5, 5])),
            r"\$\.coordinates\[0\]\[1\]\[0\]: nan is not a level-0 pixel position",
        ),
        "inf": Hostile(
            _json(folder / "inf.geojson", _polygon([5, 0], [5, float("inf")])),
            r"\$\.coordinates\[0\]\[2\]\[1\]: inf is not a level-0 pixel position",
        ),
        "huge": Hostile(
            _json(folder / "huge.geojson", _polygon([1e300, 0], [5, 5])),
            r"1e\+300 is not a level-0 pixel position",
        ),
        "too_many_bytes": Hostile(
            _sparse(folder / "too_many_bytes.geojson", MAX_MASK_BYTES + 1),
            rf"{MAX_MASK_BYTES + 1:,} bytes, more than the {MAX_MASK_BYTES:,}",
        ),
        "too_many_vertices": Hostile(
            _vertices(folder / "too_many_vertices.geojson", MAX_MASK_VERTICES + 1),
            rf"more than {MAX_MASK_VERTICES:,} vertices in the file, the limit",
        ),
        "bomb": Hostile(
            _bomb(folder / "bomb.png"),
            rf"15000x11250 px \(168,750,000\) is more than the {MAX_MASK_PIXELS:,} px",
        ),
        "truncated": Hostile(_truncated_png(folder / "truncated.png"), _UNREADABLE_IMAGE),
        "not_an_image": Hostile(_sparse(folder / "not_an_image.png", 100), _UNREADABLE_IMAGE),
    }


def hostile_slides(folder: Path) -> dict[str, Hostile]:
    """Write every hostile slide into ``folder``: ``{name: Hostile}`` (each well under 1 MB)."""
    folder.mkdir(parents=True, exist_ok=True)
    side = 1 << 20
    return {
        "wider_than_glass": Hostile(
            sparse_tiff(folder / "wider_than_glass.tiff", side, side, mpp=0.5),
            r"1048576x1048576 px at 0.5 um/px .*524 x 524 mm: larger than any glass slide",
        ),
        "too_many_pixels": Hostile(
            sparse_tiff(folder / "too_many_pixels.tiff", side, side, mpp=0.1),
            rf"more than the {MAX_SLIDE_PIXELS:,} px of any real scan",
        ),
    }
