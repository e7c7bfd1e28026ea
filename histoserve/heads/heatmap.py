"""``qc/<id>.<model>.heatmap.jpg``: where in the tissue a slide head looked.

What the picture is, in order:

1. attention ranked to percentiles over the slide's tiles (:func:`percentiles`,
   ties share their mean rank): a head's raw attention is spiky (a few tiles
   hold most of it, and it sums to 1 over 10,000 tiles or 100), ranks show
   the whole order the same way on every slide; with one attention branch
   per class the predicted class's branch is drawn;
2. each tile's percentile spread over its area on a grid at display scale
   and divided by how many tiles cover each pixel, so overlapping tiles
   are averaged (:func:`tile_average`, two cumulative sums: no loop per tile);
3. coloured with viridis (perceptually uniform, readable in grey and by most
   colour-blind readers) and blended over the slide's thumbnail; a blank
   canvas of the tiles' level-0 extent when the slide cannot be read
   (``aggregate`` over features alone);
4. a title bar with the slide, the model and the prediction (every class's
   value, the top one first), and a colour bar from the lowest to the highest
   percentile, with the raw attention at both ends: ranks spread any range
   over the whole colour map, so a nearly flat attention (highest and lowest
   within :data:`FLAT_SPREAD` of each other) is said in the title bar
   (:func:`range_note`), never left to look like a confident map.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont

DISPLAY_PX = 1200
ALPHA = 0.55  # over a thumbnail: the tissue shows through
ALPHA_BLANK = 0.92  # over a blank canvas: colours as on the colour bar
TEXT_PX = 18
BAR_W = 26
FLAT_SPREAD = 0.05
"""Attention whose highest and lowest differ by at most this share of the larger is nearly flat."""
# viridis (matplotlib's, van der Walt & Smith), 17 stops; interpolated to 256.
_VIRIDIS_STOPS = (
    (68, 1, 84), (72, 26, 108), (71, 47, 125), (65, 68, 135), (57, 86, 140), (49, 104, 142),
    (42, 120, 142), (35, 136, 142), (31, 152, 139), (34, 168, 132), (53, 183, 121),
    (84, 197, 104), (122, 209, 81), (165, 219, 54), (210, 226, 27), (253, 231, 37),
    (253, 231, 37),
)  # fmt: skip


def viridis() -> np.ndarray:
    """uint8 ``[256, 3]``: the viridis colour map."""
    stops = np.asarray(_VIRIDIS_STOPS[:-1], np.float64)
    at = np.linspace(0, len(stops) - 1, 256)
    lut = np.stack([np.interp(at, np.arange(len(stops)), stops[:, c]) for c in range(3)], 1)
    return np.round(lut).astype(np.uint8)


def percentiles(values: np.ndarray) -> np.ndarray:
    """float32 ``[N]`` in [0, 1]: each value's rank among ``values`` (ties: their mean rank)."""
    values = np.asarray(values, np.float64).reshape(-1)
    if len(values) < 2:
        return np.ones(len(values), np.float32)
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    first = np.cumsum(counts) - counts  # rank of each unique value's first occurrence
    mean_rank = first + (counts - 1) / 2.0
    return (mean_rank[inverse] / (len(values) - 1)).astype(np.float32)


def drawn_attention(attention: np.ndarray, prediction: np.ndarray | None) -> tuple[np.ndarray, int]:
    """The attention column drawn (the predicted class's for ``[N, C]``) and its class (-1: one)."""
    attention = np.asarray(attention, np.float64)
    if attention.ndim == 1:
        return attention, -1
    k = int(np.argmax(prediction)) if prediction is not None and len(prediction) else 0
    k = min(k, attention.shape[1] - 1)
    return attention[:, k], k


def range_note(attention: np.ndarray) -> tuple[str, str, str]:
    """The raw attention's lowest and highest as text, and a warning when it is nearly flat (else "")."""
    values = np.asarray(attention, np.float64).reshape(-1)
    if not len(values):
        return "", "", ""
    low, high = float(values.min()), float(values.max())
    spread = high - low
    if len(values) == 1 or spread > FLAT_SPREAD * max(abs(low), abs(high)):
        return f"{low:.3g}", f"{high:.3g}", ""
    share = spread / max(abs(low), abs(high), 1e-30)
    warning = (
        f"attention nearly flat: {low:.4g} to {high:.4g} ({share:.1%} apart); "
        "the colours rank tiles that the model barely tells apart"
    )
    return f"{low:.4g}", f"{high:.4g}", warning


def tile_average(
    values: np.ndarray, boxes: np.ndarray, shape: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """Per pixel of a ``shape`` grid: the mean of the values of the tiles covering it, and the count.

    ``boxes``: int ``[N, 4]`` ``(x0, y0, x1, y1)`` in grid pixels, ends exclusive.
    """
    h, w = shape
    boxes = np.asarray(boxes, np.int64).reshape(-1, 4)
    x0, x1 = np.clip(boxes[:, 0], 0, w), np.clip(boxes[:, 2], 0, w)
    y0, y1 = np.clip(boxes[:, 1], 0, h), np.clip(boxes[:, 3], 0, h)
    total = np.zeros((h + 1, w + 1), np.float64)
    count = np.zeros((h + 1, w + 1), np.float64)
    v = np.asarray(values, np.float64)
    for grid, weight in ((total, v), (count, np.ones_like(v))):
        np.add.at(grid, (y0, x0), weight)
        np.add.at(grid, (y0, x1), -weight)
        np.add.at(grid, (y1, x0), -weight)
        np.add.at(grid, (y1, x1), weight)
    total = total.cumsum(0).cumsum(1)[:h, :w]
    count = np.rint(count.cumsum(0).cumsum(1)[:h, :w])
    mean = np.divide(total, count, out=np.zeros_like(total), where=count > 0)
    return mean, count


def display_boxes(coords: np.ndarray, patch: int, scale: float) -> np.ndarray:
    """Level-0 tiles as ``(x0, y0, x1, y1)`` display pixels (``scale``: display px per level-0 px)."""
    c = np.asarray(coords, np.float64).reshape(-1, 2)
    x0, y0 = np.floor(c[:, 0] * scale), np.floor(c[:, 1] * scale)
    x1 = np.maximum(np.ceil((c[:, 0] + patch) * scale), x0 + 1)
    y1 = np.maximum(np.ceil((c[:, 1] + patch) * scale), y0 + 1)
    return np.stack([x0, y0, x1, y1], 1).astype(np.int64)


def render_heatmap(
    background: np.ndarray | None,
    extent: tuple[int, int],
    coords: np.ndarray,
    patch: int,
    attention: np.ndarray,
    title: str,
    prediction_text: str,
    level0_mpp: float | None = None,
) -> Image.Image:
    """The heatmap picture (see the module docstring), with a scale bar when ``level0_mpp`` is known.

    Args:
        background: RGB thumbnail of the whole level-0 ``extent``, or None (blank canvas).
        extent: Level-0 ``(width, height)`` the canvas shows.
        coords: Level-0 top-left ``(x, y)`` of each tile; ``patch``: its level-0 edge.
        attention: ``[N]``, one value per tile (already the drawn column).
    """
    width, height = max(1, int(extent[0])), max(1, int(extent[1]))
    scale = DISPLAY_PX / max(width, height)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    if background is not None:
        base = Image.fromarray(np.asarray(background, np.uint8)).resize(
            size, Image.Resampling.LANCZOS
        )
    else:
        base = Image.new("RGB", size, (236, 236, 236))
    mean, count = tile_average(
        percentiles(attention), display_boxes(coords, patch, scale), size[::-1]
    )
    colours = viridis()[np.clip(np.rint(mean * 255), 0, 255).astype(np.uint8)]
    canvas = np.asarray(base, np.float64)
    covered = (count > 0)[..., None]
    alpha = ALPHA if background is not None else ALPHA_BLANK
    blended = np.where(covered, (1 - alpha) * canvas + alpha * colours, canvas * 0.9 + 25)
    picture = Image.fromarray(np.clip(blended, 0, 255).astype(np.uint8))
    if level0_mpp and level0_mpp > 0:
        _scale_bar(picture, level0_mpp / scale)
    return _framed(picture, title, prediction_text, range_note(attention))


def _scale_bar(picture: Image.Image, um_per_px: float) -> None:
    """A bar of a round length (0.1 mm to 10 mm), about a sixth of the width, bottom left."""
    want_um = picture.width * um_per_px / 6
    length_um = min((100, 200, 500, 1000, 2000, 5000, 10000), key=lambda u: abs(u - want_um))
    px = max(1, round(length_um / um_per_px))
    x0, y1 = 12, picture.height - 12
    draw = ImageDraw.Draw(picture)
    font = ImageFont.load_default(size=TEXT_PX - 4)
    draw.rectangle([x0 - 4, y1 - 30, x0 + px + 4, y1 + 4], fill=(255, 255, 255))
    draw.rectangle([x0, y1 - 6, x0 + px, y1], fill=(0, 0, 0))
    label = f"{length_um / 1000:g} mm"
    draw.text((x0, y1 - 26), label, fill=(0, 0, 0), font=font)


def _framed(
    picture: Image.Image, title: str, prediction_text: str, raw: tuple[str, str, str]
) -> Image.Image:
    """``picture`` with a title bar above and a colour bar to the right (``raw``: range_note)."""
    font = ImageFont.load_default(size=TEXT_PX)
    small = ImageFont.load_default(size=TEXT_PX - 4)
    lines = [title, *_wrap(prediction_text, font, max(picture.width, 640) + 90)]
    warned = len(lines)
    if raw[2]:
        lines += _wrap(raw[2].replace("; ", ", "), font, max(picture.width, 640) + 90)
    bar_h = len(lines) * (TEXT_PX + 6) + 10
    width = max(picture.width, 640) + 100
    out = Image.new("RGB", (width, picture.height + bar_h), (255, 255, 255))
    out.paste(picture, (0, bar_h))
    draw = ImageDraw.Draw(out)
    draw.multiline_text((8, 6), "\n".join(lines[:warned]), fill=(0, 0, 0), font=font, spacing=6)
    if raw[2]:
        y = 6 + warned * (TEXT_PX + 6)
        draw.multiline_text(
            (8, y), "\n".join(lines[warned:]), fill=(190, 0, 0), font=font, spacing=6
        )
    x0, y0 = width - 90, bar_h + 24
    y1 = bar_h + max(60, min(picture.height - 24, 420))
    ramp = viridis()[np.linspace(255, 0, max(2, y1 - y0)).astype(np.uint8)]
    strip = np.repeat(ramp[:, None, :], BAR_W, axis=1)
    out.paste(Image.fromarray(strip), (x0, y0))
    draw.rectangle([x0, y0, x0 + BAR_W, y1], outline=(0, 0, 0))
    draw.text((x0 - 4, y0 - 20), "attention", fill=(0, 0, 0), font=small)
    draw.text((x0 + BAR_W + 4, y0 - 6), "100%", fill=(0, 0, 0), font=small)
    draw.text((x0 + BAR_W + 4, (y0 + y1) // 2 - 6), "50%", fill=(0, 0, 0), font=small)
    draw.text((x0 + BAR_W + 4, y1 - 8), "0%", fill=(0, 0, 0), font=small)
    draw.text((x0 - 4, y1 + 6), "percentile", fill=(0, 0, 0), font=small)
    if raw[0]:
        draw.text((x0 - 4, y1 + 24), f"raw {raw[0]}", fill=(0, 0, 0), font=small)
        draw.text((x0 - 4, y0 - 38), f"raw {raw[1]}", fill=(0, 0, 0), font=small)
    return out


def _wrap(text: str, font: ImageFont.FreeTypeFont, width: int) -> list[str]:
    """``text`` broken at ``, `` where a line would be wider than ``width``."""
    lines = [""]
    for part in text.split(", "):
        joined = f"{lines[-1]}, {part}" if lines[-1] else part
        if lines[-1] and font.getlength(joined) > width - 16:
            lines.append(part)
        else:
            lines[-1] = joined
    return lines


def prediction_text(prediction: np.ndarray | None, classes: Sequence[str], drawn: int) -> str:
    """``"prediction: tumour 0.91, normal 0.09"`` (top first) and which attention branch is drawn."""
    if prediction is None or not len(prediction):
        return "no prediction"
    values = np.asarray(prediction, np.float64).reshape(-1)
    names = [classes[i] if i < len(classes) else f"class_{i}" for i in range(len(values))]
    order = np.argsort(-values, kind="stable")
    shown = ", ".join(f"{names[i]} {values[i]:.3g}" for i in order[:8])
    more = f", +{len(values) - 8} more" if len(values) > 8 else ""
    branch = f" | attention of {names[drawn]}" if drawn >= 0 else ""
    return f"prediction: {shown}{more}{branch}"
