"""How a square read larger than the tile becomes the tile: ``--resize``, one named choice.

- ``bicubic`` (default): Pillow's resize with the model spec's filter
  (``bicubic`` for every spec shipped; Pillow antialiases whatever the
  filter when reducing).
- ``area``: box (area) averaging, Pillow's ``Image.reduce`` for an integer
  factor, ``Image.BOX`` otherwise; cheaper, a little sharper.
- ``reduced``: libjpeg-turbo's reduced-scale DCT decode, straight to the
  tile size, for an exact 2x, 4x or 8x step with the native reader
  (:meth:`~histoserve.slides.readers.SlideReader.read_reduced`); the cheapest
  (an 8x8 block is decoded as 4x4, 2x2 or 1x1). Any other slide, or step,
  with ``reduced`` fails when it is planned, never silently resized another way.

A tile read at the model's mpp (no resize) is the same pixels whichever is
chosen. Each output file records the choice (``resize``) and it is part of
the resume hash, so a cohort never mixes them; ``docs/cohorts.md`` gives
their fidelity to ``bicubic`` and their cost.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

RESIZES = ("bicubic", "area", "reduced")
REDUCED_FACTORS = (2, 4, 8)

# Spec interpolation names -> Pillow filters (Pillow antialiases all of them when reducing).
INTERPOLATIONS = {
    "bicubic": Image.Resampling.BICUBIC,
    "bilinear": Image.Resampling.BILINEAR,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
}


def reduced_factor(read_size: int, tile_size: int) -> int | None:
    """The reduced-decode factor taking ``read_size`` px to ``tile_size`` exactly (None: none)."""
    factor, rest = divmod(read_size, tile_size)
    return factor if rest == 0 and factor in REDUCED_FACTORS else None


def resize_square(
    region: np.ndarray, tile_size: int, interpolation: str = "bicubic", resize: str = "bicubic"
) -> np.ndarray:
    """``region`` (uint8 ``[s, s, 3]``) as ``tile_size`` px, by ``resize`` (not ``reduced``).

    ``interpolation``: the spec's filter, used by ``bicubic``.
    """
    if region.shape[0] == tile_size and region.shape[1] == tile_size:
        return region
    image = Image.fromarray(region)
    if resize == "area":
        factor, rest = divmod(region.shape[0], tile_size)
        if rest == 0 and region.shape[1] == region.shape[0]:
            return np.asarray(image.reduce(factor))
        return np.asarray(image.resize((tile_size, tile_size), Image.Resampling.BOX))
    if resize != "bicubic":
        raise ValueError(f"resize {resize!r} is not a Pillow resize")
    return np.asarray(image.resize((tile_size, tile_size), INTERPOLATIONS[interpolation]))
