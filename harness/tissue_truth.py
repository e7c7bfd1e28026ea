"""Slides whose tissue is known to the pixel: a layout of pale and stained tissue, and its truth.

:func:`pale_layout` places stained boxes, pale ones (``SlideSpec.pale_boxes``,
the H&E tile faded toward white) and a lumen of bare glass
(``SlideSpec.glass_boxes``); :func:`tissue_truth` samples where the tissue
is on any grid, so a tissue detector's mask is measured against it (area
covered, glass counted, the fraction of tiles wholly inside tissue).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from harness.slides import Box, SlideSpec


def tissue_truth(spec: SlideSpec, shape: tuple[int, int], px_level0: float) -> np.ndarray:
    """Where the tissue is, sampled at pixel centres of a ``shape`` grid of ``px_level0`` px.

    Tissue is every box and pale box, less the glass boxes: bool ``[h, w]``.
    """
    h, w = shape
    ys = (np.arange(h) + 0.5) * px_level0
    xs = (np.arange(w) + 0.5) * px_level0

    def inside(boxes: Sequence[Box]) -> np.ndarray:
        out = np.zeros(shape, bool)
        for x, y, bw, bh in boxes:
            out |= ((ys >= y) & (ys < y + bh))[:, None] & ((xs >= x) & (xs < x + bw))[None, :]
        return out

    return inside(spec.boxes + spec.pale_boxes) & ~inside(spec.glass_boxes)


def pale_layout(unit: int) -> dict[str, object]:
    """A slide of pale and stained tissue with a lumen, in multiples of ``unit`` (16 x 12 units).

    Three stained boxes; a large pale region inside the first (bigger than any
    hole a mask may fill) with a lumen of bare glass in it; a pale
    band along the second's top edge; a fragment that is pale all through.
    The lumen is 3 x 3 units (at 112 um a unit, 0.11 mm2: larger than the
    holes a tissue mask fills).
    """
    u = unit
    return {
        "width": 16 * u,
        "height": 12 * u,
        "boxes": (
            (1 * u, 1 * u, 7 * u, 5 * u),
            (10 * u, 1 * u, 5 * u, 4 * u),
            (1 * u, 7 * u, 4 * u, 4 * u),
        ),
        "pale_boxes": (
            (2 * u, 2 * u, 4 * u, 3 * u),
            (10 * u, 1 * u, 5 * u, 2 * u),
            (7 * u, 7 * u, 5 * u, 4 * u),
        ),
        "glass_boxes": ((4 * u, 2 * u, 3 * u, 3 * u),),
    }
