"""Zeiss CZI slides through ``pylibCZIrw`` (libCZI: JPEG-XR, zstd and uncompressed subblocks).

:class:`CziHandle` gives a CZI the OpenSlide-like surface :class:`~histoserve.slides.readers.SlideReader`
wraps: ``level_dimensions``, ``level_downsamples``, ``properties``,
``read_region`` (RGB, level-0 coordinates relative to the image's bounding
box) and ``close``.

- Level 0 is the full-resolution plane (``C=0, T=0, Z=0``, all scenes), read
  exactly as stored. Brightfield CZIs are ``Bgr24``: channels are flipped to
  RGB; gaps between scenes and subblocks are white.
- Coarser levels are libCZI's zoomed reads at 8x, 64x, ... (nearest
  neighbour, from the file's pyramid subblocks when it has them). The tissue
  thumbnail uses them; tiles at the usual scales (0.25-1 um/px from a
  0.25-0.5 um/px scan) never match them and are read at level 0 and resized
  like any other slide.
- ``czi.mpp-x``/``czi.mpp-y`` come from the document's ``Scaling/Items/Distance``
  (metres per pixel, as ZEN writes them).

``pylibCZIrw`` is imported when a ``.czi`` is opened, not with this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

_LEVEL_STEP = 8  # downsample between zoomed levels
_SMALLEST = 512  # no level narrower than this (px), beyond level 0
_PLANE = {"C": 0, "T": 0, "Z": 0}
_WHITE = (1.0, 1.0, 1.0)


def czi_scaling_um(metadata: Mapping[str, Any]) -> dict[str, float]:
    """``{"X": um, "Y": um}`` per pixel from CZI metadata (empty when absent or zero)."""
    try:
        items = metadata["ImageDocument"]["Metadata"]["Scaling"]["Items"]["Distance"]
    except (KeyError, TypeError):
        return {}
    items = items if isinstance(items, list) else [items]
    out = {}
    for item in items:
        try:
            value = float(item.get("Value", 0)) * 1e6
        except (TypeError, ValueError, AttributeError):
            continue
        if value > 0 and item.get("@Id") in ("X", "Y"):
            out[item["@Id"]] = value
    return out


class CziHandle:
    """An open CZI with OpenSlide's reading surface (see the module docstring).

    Raises (from :meth:`open`): whatever ``pylibCZIrw`` raises for a file it
    cannot open; :class:`~histoserve.slides.readers.SlideReader` wraps it.
    """

    def __init__(self, reader: Any, path: Path):
        self._reader, self.path = reader, path
        box = reader.total_bounding_rectangle
        self._x0, self._y0 = int(box.x), int(box.y)
        width, height = int(box.w), int(box.h)
        downsamples = [1]
        while min(width, height) // (downsamples[-1] * _LEVEL_STEP) >= _SMALLEST:
            downsamples.append(downsamples[-1] * _LEVEL_STEP)
        self.level_downsamples = tuple(float(d) for d in downsamples)
        self.level_dimensions = tuple((width // d, height // d) for d in downsamples)
        self.properties = self._properties(reader)

    @classmethod
    def open(cls, path: Path) -> CziHandle:
        """Opens ``path`` with ``pylibCZIrw``."""
        from pylibCZIrw import czi

        reader = czi.CziReader(str(path))
        try:
            return cls(reader, Path(path))
        except Exception:
            reader.close()
            raise

    @staticmethod
    def _properties(reader: Any) -> dict[str, str]:
        props = {"openslide.vendor": "zeiss-czi"}
        for axis, um in czi_scaling_um(reader.metadata).items():
            props[f"czi.mpp-{axis.lower()}"] = repr(um)
        types = reader.pixel_types
        props["czi.pixel-type"] = str(types.get(0, "")) if isinstance(types, dict) else ""
        return props

    def read_region(self, xy: tuple[int, int], level: int, size: tuple[int, int]) -> np.ndarray:
        """``size`` px at ``level`` from level-0 ``xy``: uint8 ``[h, w, 3]`` RGB."""
        d = int(self.level_downsamples[level])
        w, h = int(size[0]), int(size[1])
        roi = (self._x0 + int(xy[0]), self._y0 + int(xy[1]), w * d, h * d)
        zoom = None if d == 1 else 1.0 / d
        pixels = self._reader.read(
            roi=roi, plane=_PLANE, zoom=zoom, pixel_type="Bgr24", background_pixel=_WHITE
        )
        rgb = np.ascontiguousarray(pixels[:, :, 2::-1])
        if rgb.shape[:2] != (h, w):  # zoomed reads may round a pixel either way
            from PIL import Image

            rgb = np.asarray(Image.fromarray(rgb).resize((w, h), Image.Resampling.NEAREST))
        return rgb

    def close(self) -> None:
        """Closes the file."""
        self._reader.close()
