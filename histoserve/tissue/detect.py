"""Where the tissue is: a thumbnail mask, and the tissue fraction of every planned tile.

``otsu`` (the default): a thumbnail at a few microns per pixel, the HSV
saturation of each pixel (stained tissue is coloured, glass and background are
grey or white), then a mask that keeps pale tissue as well as stained
(:func:`otsu_mask`), in the steps CLAM's ``segmentTissue`` takes (threshold
the saturation, close, fill holes, drop specks) with two changes measured on
slides whose tissue is known (``docs/cohorts.md``, "Tissue detection and
scale"):

1. two thresholds, not one: pixels above the glass's own saturation plus a
   margin (the wider of ``GLASS_MARGIN`` and ``GLASS_SPREADS`` half widths of
   the glass's peak; ``PALE_FLOOR`` at least: CLAM's TCGA preset thresholds at
   8) are candidate tissue, and a candidate region is kept when it holds a
   ``SEED_PX`` square above the seed threshold (Otsu's, refined, floored at
   ``MIN_SATURATION``, and no more than ``SEED_MARGIN`` above the pale one):
   faint eosin and loose stroma joined to (or holding) stained tissue stay,
   noise on the glass does not;
2. no median blur (seconds per slide at 4 um/px); the closing
   (``CLOSE_UM``, a square) bridges the white gaps between fibres instead.

Holes up to ``MAX_HOLE_UM2`` are filled (a lumen larger than that stays
glass) and specks below ``MIN_OBJECT_UM2`` dropped, with ``scipy.ndimage``.
``none``: every tile inside the bounds counts as tissue. A served
segmentation model produces a mask elsewhere and comes back here through
:func:`fractions_from_mask`.

The thumbnail is built block by block from the coarsest level that is still
at least as fine as asked, so memory stays bounded on slides without a
pyramid, and it has at most ``limits.MAX_THUMB_PIXELS`` pixels: a larger
slide gets a coarser one (:func:`thumbnail_grid`, shared by Otsu, ``none``
and GeoJSON masks). Fractions come from an integral image: one vectorised
lookup per tile, no per-pixel Python loop.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from histoserve.limits import MAX_THUMB_PIXELS
from histoserve.slides.grid import TilePlan
from histoserve.slides.readers import MppInfo, SlideReader

THUMB_MPP = 4.0
# Changes whenever the Otsu mask would keep other tiles: part of the resume hash.
OTSU_VERSION = "otsu-pale-2"
# Saturation (0..255) a seed pixel must pass, whatever Otsu says: a blank
# slide's JPEG noise stays below it.
MIN_SATURATION = 20
# Least threshold of candidate (pale) tissue: CLAM's TCGA preset's fixed one.
PALE_FLOOR = 8
# Candidate tissue is this far above the glass's own saturation (its mode),
# and seeds at most this far above the candidates' threshold.
GLASS_MARGIN = 8
SEED_MARGIN = 12
GLASS_SPREADS = 3  # ...or this many half widths of the glass's peak, when wider
SEED_PX = 3  # a seed is 3 x 3 px above the seed threshold, not one noisy pixel
CLOSE_UM = 36.0  # closing square's edge: bridges the gaps between fibres
# Holes filled: CLAM's TCGA preset keeps holes above 4 reference patches of
# 512 px at 0.25 um/px (4 x 128 um squared); smaller ones are tissue.
MAX_HOLE_UM2 = 65_536.0
MIN_OBJECT_UM2 = 4_000.0  # about a third of a 112 um tile
_BLOCK = 2048  # thumbnail built from blocks of at most this many level px per side
TISSUE_METHODS = ("otsu", "none")


def thumbnail(
    reader: SlideReader, mpp: MppInfo, thumb_mpp: float, max_pixels: int = MAX_THUMB_PIXELS
) -> tuple[np.ndarray, float]:
    """An RGB thumbnail of the whole slide at about ``thumb_mpp``, and its exact mpp.

    Reads the coarsest level whose mpp is at most ``thumb_mpp`` (level 0 when
    all are coarser) and box-reduces it by the integer factor that gets
    closest to ``thumb_mpp`` from below; coarser when that would be more than
    ``max_pixels`` (:func:`thumbnail_grid`). Memory: the thumbnail and one
    block of at most ``_BLOCK`` px a side.

    Returns:
        uint8 ``[h, w, 3]`` and its mpp (level-0 px per thumbnail px x level-0 mpp).
    """
    level, factor, shape, out_mpp = thumbnail_grid(reader, mpp, thumb_mpp, max_pixels)
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
    reader: SlideReader, mpp: MppInfo, thumb_mpp: float, max_pixels: int = MAX_THUMB_PIXELS
) -> tuple[int, int, tuple[int, int], float]:
    """The grid :func:`thumbnail` reads, without reading it: level, factor, ``(h, w)``, mpp.

    At most ``max_pixels`` pixels: when ``thumb_mpp`` would give more, the
    thumbnail is coarser (the level and integer factor of the least mpp that
    fits), never larger.
    """
    width, height = reader.dimensions
    fits = mpp.mpp * (width * height / max_pixels) ** 0.5  # the least mpp within the budget
    thumb_mpp = max(thumb_mpp, fits)
    level_mpps = [mpp.mpp * d for d in reader.level_downsamples]
    fine_enough = [i for i, m in enumerate(level_mpps) if m <= thumb_mpp]
    level = max(fine_enough, key=lambda i: level_mpps[i]) if fine_enough else 0
    factor = max(1, int(thumb_mpp // level_mpps[level]))
    lw, lh = reader.level_dimensions[level]
    while (lw // factor) * (lh // factor) > max_pixels:
        factor += 1
    return level, factor, (lh // factor, lw // factor), level_mpps[level] * factor


def saturation(rgb: np.ndarray) -> np.ndarray:
    """HSV saturation scaled to 0..255 (uint8), vectorised in 16-bit (5 bytes a pixel at peak)."""
    red, green, blue = rgb[..., 0], rgb[..., 1], rgb[..., 2]  # elementwise: faster than axis=2
    high = np.maximum(np.maximum(red, green), blue)
    spread = high - np.minimum(np.minimum(red, green), blue)
    sat = spread.astype(np.uint16)
    sat *= 255
    sat //= np.maximum(high, 1)  # spread is 0 where high is: 0 there
    return sat.astype(np.uint8)


def otsu_threshold(values: np.ndarray) -> int:
    """Otsu's threshold of uint8 ``values``: the t maximising between-class variance of <= t / > t."""
    return _otsu(np.bincount(values.ravel(), minlength=256))


def _otsu(hist: np.ndarray) -> int:
    """Otsu's threshold of a 256-bin histogram (255 when it is empty)."""
    hist = hist.astype(np.float64)
    total = hist.sum()
    if total == 0:
        return 255
    levels = np.arange(len(hist), dtype=np.float64)
    weight0 = np.cumsum(hist)
    weight1 = total - weight0
    mean0 = np.cumsum(hist * levels) / np.maximum(weight0, 1e-12)
    mean1 = ((hist * levels).sum() - np.cumsum(hist * levels)) / np.maximum(weight1, 1e-12)
    between = weight0 * weight1 * (mean0 - mean1) ** 2
    return int(np.argmax(between))


def _mean(hist: np.ndarray, lo: int, hi: int) -> float | None:
    """Mean level of the histogram's bins ``lo..hi`` (None when they are empty)."""
    part = hist[lo : hi + 1].astype(np.float64)
    count = part.sum()
    return None if count == 0 else float((part * np.arange(lo, lo + len(part))).sum() / count)


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
    return _tissue_threshold(np.bincount(sat.ravel(), minlength=256))


def _tissue_threshold(hist: np.ndarray) -> int:
    threshold = _otsu(hist)
    low_mean = _mean(hist, 0, threshold)
    if low_mean is None or low_mean >= MIN_SATURATION:
        return MIN_SATURATION
    low = np.zeros_like(hist)
    low[: threshold + 1] = hist[: threshold + 1]
    inner = _otsu(low)
    upper_mean = _mean(hist, inner + 1, threshold)
    if upper_mean is not None and upper_mean >= 2 * MIN_SATURATION:
        threshold = inner
    return max(threshold, MIN_SATURATION)


def otsu_mask(
    rgb: np.ndarray,
    mpp: float = THUMB_MPP,
    max_hole_um2: float = MAX_HOLE_UM2,
    min_object_um2: float = MIN_OBJECT_UM2,
) -> np.ndarray:
    """Tissue mask of an RGB thumbnail at ``mpp``, pale tissue included (see the module doc).

    Returns:
        bool ``[h, w]``.
    """
    from scipy import ndimage

    sat = saturation(rgb)
    pale, seed = pale_and_seed_thresholds(sat)
    candidate = sat > pale
    edge = 2 * round(CLOSE_UM / mpp / 2) + 1  # odd: the closing is centred
    if edge > 1:
        candidate = ndimage.maximum_filter(candidate, size=edge)
        candidate = ndimage.minimum_filter(candidate, size=edge)
    labels, count = ndimage.label(candidate)
    seeded = np.zeros(count + 1, bool)
    seeded[labels[ndimage.minimum_filter(sat, size=SEED_PX) > seed]] = True
    seeded[0] = False
    del candidate, sat
    mask = seeded[labels]
    del labels
    px_um2 = mpp * mpp
    mask |= _components_below(~mask, max_hole_um2 / px_um2, inner=True)
    mask &= ~_components_below(mask, min_object_um2 / px_um2)
    return mask


def pale_and_seed_thresholds(sat: np.ndarray) -> tuple[int, int]:
    """Saturation above which a pixel may be tissue (pale), and above which it seeds tissue.

    The seed threshold is :func:`tissue_threshold`'s, at most ``SEED_MARGIN``
    above the pale one; the pale one is ``GLASS_MARGIN`` above the glass's
    saturation (the histogram's mode at or below the seed threshold), at
    least ``PALE_FLOOR``, at most the seed threshold.
    """
    hist = np.bincount(sat.ravel(), minlength=256)
    seed = _tissue_threshold(hist)
    glass = int(np.argmax(hist[: seed + 1]))
    above = np.flatnonzero(hist[glass:] < hist[glass] / 2)
    spread = int(above[0]) if above.size else 0  # the glass peak's half width, upper side
    pale = min(seed, max(PALE_FLOOR, glass + max(GLASS_MARGIN, GLASS_SPREADS * spread)))
    return pale, min(seed, max(MIN_SATURATION, pale + SEED_MARGIN))


def _components_below(mask: np.ndarray, max_px: float, inner: bool = False) -> np.ndarray:
    """The connected components of ``mask`` with fewer than ``max_px`` pixels.

    ``inner``: only those that do not touch the image's edge (holes, when
    ``mask`` is the background).
    """
    from scipy import ndimage

    labels, count = ndimage.label(mask)
    if count == 0:
        return np.zeros_like(mask)
    sizes = np.bincount(labels.ravel(), minlength=count + 1)
    small = sizes < max_px
    if inner:
        for edge in (labels[0], labels[-1], labels[:, 0], labels[:, -1]):
            small[edge] = False
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
    counts = np.int32 if h * w < 2**31 else np.int64  # 4 bytes a pixel for every real mask
    integral = np.zeros((h + 1, w + 1), counts)
    integral[1:, 1:] = mask.cumsum(axis=0, dtype=counts)
    np.cumsum(integral[1:, 1:], axis=1, out=integral[1:, 1:])
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
    return (inside.astype(np.float64) / area).astype(np.float32)


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
