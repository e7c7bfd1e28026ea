"""Where the tissue is: a thumbnail mask, and the tissue fraction of every planned tile.

``otsu`` (the default): a thumbnail at a few microns per pixel, the HSV
saturation of each pixel (stained tissue is coloured, glass and background are
grey or white), Otsu's threshold on it (never below a floor, so a blank slide
does not split its JPEG noise in two), then holes smaller than about one tile
filled and specks smaller than a third of one removed, both with
``scipy.ndimage``. ``none``: every tile inside the bounds counts as tissue.
A served segmentation model produces a mask elsewhere and comes back here
through :func:`fractions_from_mask`.

The thumbnail is built block by block from the coarsest level that is still
at least as fine as asked, so memory stays bounded on slides without a
pyramid. Fractions come from an integral image: one vectorised lookup per
tile, no per-pixel Python loop.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from predictor.client.embed.grid import TilePlan
from predictor.client.embed.slides import MppInfo, SlideReader

THUMB_MPP = 4.0
# Saturation (0..255) below which a pixel is never tissue, whatever Otsu says.
MIN_SATURATION = 20
MAX_HOLE_UM2 = 12_544.0  # one 224 px tile at 0.5 um/px
MIN_OBJECT_UM2 = 4_000.0  # about a third of one
_BLOCK = 2048  # thumbnail built from blocks of at most this many level px per side
TISSUE_METHODS = ("otsu", "none")


def thumbnail(reader: SlideReader, mpp: MppInfo, thumb_mpp: float) -> tuple[np.ndarray, float]:
    """An RGB thumbnail of the whole slide at about ``thumb_mpp``, and its exact mpp.

    Reads the coarsest level whose mpp is at most ``thumb_mpp`` (level 0 when
    all are coarser) and box-reduces it by the integer factor that gets
    closest to ``thumb_mpp`` from below.

    Returns:
        uint8 ``[h, w, 3]`` and its mpp (level-0 px per thumbnail px x level-0 mpp).
    """
    level, factor, shape, out_mpp = thumbnail_grid(reader, mpp, thumb_mpp)
    downsample = reader.level_downsamples[level]
    out = np.empty((*shape, 3), np.uint8)
    block = max(factor, (_BLOCK // factor) * factor)
    for y in range(0, out.shape[0] * factor, block):
        for x in range(0, out.shape[1] * factor, block):
            w = min(block, out.shape[1] * factor - x)
            h = min(block, out.shape[0] * factor - y)
            xy0 = (round(x * downsample), round(y * downsample))
            region = reader.read_region(xy0, level, (w, h))
            small = np.asarray(Image.fromarray(region).reduce(factor))
            out[y // factor : (y + h) // factor, x // factor : (x + w) // factor] = small
    return out, out_mpp


def thumbnail_grid(
    reader: SlideReader, mpp: MppInfo, thumb_mpp: float
) -> tuple[int, int, tuple[int, int], float]:
    """The grid :func:`thumbnail` reads, without reading it: level, factor, ``(h, w)``, mpp."""
    level_mpps = [mpp.mpp * d for d in reader.level_downsamples]
    fine_enough = [i for i, m in enumerate(level_mpps) if m <= thumb_mpp]
    level = max(fine_enough, key=lambda i: level_mpps[i]) if fine_enough else 0
    factor = max(1, int(thumb_mpp // level_mpps[level]))
    lw, lh = reader.level_dimensions[level]
    return level, factor, (lh // factor, lw // factor), level_mpps[level] * factor


def saturation(rgb: np.ndarray) -> np.ndarray:
    """HSV saturation scaled to 0..255 (uint8), vectorised."""
    rgb = rgb.astype(np.int32)
    high = rgb.max(axis=2)
    low = rgb.min(axis=2)
    sat = np.where(high > 0, (high - low) * 255 // np.maximum(high, 1), 0)
    return sat.astype(np.uint8)


def otsu_threshold(values: np.ndarray) -> int:
    """Otsu's threshold of uint8 ``values``: the t maximising between-class variance of <= t / > t."""
    hist = np.bincount(values.ravel(), minlength=256).astype(np.float64)
    total = hist.sum()
    if total == 0:
        return 255
    levels = np.arange(256, dtype=np.float64)
    weight0 = np.cumsum(hist)
    weight1 = total - weight0
    mean0 = np.cumsum(hist * levels) / np.maximum(weight0, 1e-12)
    mean1 = ((hist * levels).sum() - np.cumsum(hist * levels)) / np.maximum(weight1, 1e-12)
    between = weight0 * weight1 * (mean0 - mean1) ** 2
    return int(np.argmax(between))


def tissue_threshold(sat: np.ndarray) -> int:
    """Saturation above which a pixel is tissue: Otsu's, refined, floored at ``MIN_SATURATION``.

    Otsu splits any histogram in two, which goes wrong in two common cases:

    - no background in view (a field full of tissue): the lower class is
      itself coloured (mean at or above the floor) and Otsu would split pink
      from purple; the floor is used instead;
    - glass, pale eosin and dark haematoxylin together (three modes): Otsu
      may put the pale tissue with the glass; so the lower class is split once
      more, and when its upper part is clearly coloured (mean at least twice
      the floor) that second threshold is used.
    """
    threshold = otsu_threshold(sat)
    low = sat[sat <= threshold]
    if low.size == 0 or float(low.mean()) >= MIN_SATURATION:
        return MIN_SATURATION
    inner = otsu_threshold(low)
    upper = low[low > inner]
    if upper.size and float(upper.mean()) >= 2 * MIN_SATURATION:
        threshold = inner
    return max(threshold, MIN_SATURATION)


def otsu_mask(
    rgb: np.ndarray,
    mpp: float = THUMB_MPP,
    max_hole_um2: float = MAX_HOLE_UM2,
    min_object_um2: float = MIN_OBJECT_UM2,
) -> np.ndarray:
    """Tissue mask of an RGB thumbnail at ``mpp``: saturation > Otsu, small holes and specks removed.

    Returns:
        bool ``[h, w]``.
    """
    from scipy import ndimage

    sat = saturation(rgb)
    mask = sat > tissue_threshold(sat)
    px_um2 = mpp * mpp
    holes = ndimage.binary_fill_holes(mask) & ~mask
    mask |= _components_below(holes, max_hole_um2 / px_um2)
    mask &= ~_components_below(mask, min_object_um2 / px_um2)
    return mask


def _components_below(mask: np.ndarray, max_px: float) -> np.ndarray:
    """The connected components of ``mask`` with fewer than ``max_px`` pixels."""
    from scipy import ndimage

    labels, count = ndimage.label(mask)
    if count == 0:
        return np.zeros_like(mask)
    sizes = np.bincount(labels.ravel(), minlength=count + 1)
    small = sizes < max_px
    small[0] = False
    return small[labels]


def fractions_from_mask(mask: np.ndarray, mask_mpp: float, plan: TilePlan) -> np.ndarray:
    """Tissue fraction of each ``plan.coords`` tile from a mask covering the slide from (0, 0).

    A tile's footprint is mapped to mask pixels by rounding its edges; mask
    pixels past the mask's edge count as background.

    Returns:
        float32 ``[N]`` in [0, 1].
    """
    mask = np.asarray(mask, dtype=bool)
    h, w = mask.shape
    integral = np.zeros((h + 1, w + 1), np.int64)
    integral[1:, 1:] = mask.cumsum(axis=0, dtype=np.int64).cumsum(axis=1)
    scale = plan.level0_mpp / mask_mpp  # mask px per level-0 px
    coords = np.asarray(plan.coords, dtype=np.float64).reshape(-1, 2)
    x0 = np.rint(coords[:, 0] * scale).astype(np.int64)
    y0 = np.rint(coords[:, 1] * scale).astype(np.int64)
    x1 = np.rint((coords[:, 0] + plan.patch_size_level0) * scale).astype(np.int64)
    y1 = np.rint((coords[:, 1] + plan.patch_size_level0) * scale).astype(np.int64)
    x1 = np.maximum(x1, x0 + 1)
    y1 = np.maximum(y1, y0 + 1)
    area = (x1 - x0) * (y1 - y0)
    cx0, cx1 = np.clip(x0, 0, w), np.clip(x1, 0, w)
    cy0, cy1 = np.clip(y0, 0, h), np.clip(y1, 0, h)
    inside = integral[cy1, cx1] - integral[cy0, cx1] - integral[cy1, cx0] + integral[cy0, cx0]
    return (inside / area).astype(np.float32)


def tissue_fractions(
    reader: SlideReader, plan: TilePlan, method: str, thumb_mpp: float = THUMB_MPP
) -> np.ndarray:
    """Tissue fraction of every tile of ``plan`` by ``method`` (``otsu`` or ``none``).

    Raises:
        ValueError: An unknown method (served models go through :func:`fractions_from_mask`).
        SlideError: The thumbnail cannot be read.
    """
    if method == "none":
        return np.ones(len(plan.coords), np.float32)
    if method != "otsu":
        raise ValueError(f"tissue method must be one of {TISSUE_METHODS}, got {method!r}")
    mpp = MppInfo(plan.level0_mpp, plan.mpp_source)
    rgb, rgb_mpp = thumbnail(reader, mpp, thumb_mpp)
    return fractions_from_mask(otsu_mask(rgb, rgb_mpp), rgb_mpp, plan)
