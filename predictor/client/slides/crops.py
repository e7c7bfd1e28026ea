"""``qc/<id>.<model>.top.jpg``: the tiles a slide head attended to most, as crops.

The heatmap says where; the crops say what. The :data:`TOP_K` tiles of
highest attention (the drawn branch, :func:`~predictor.client.slides.heatmap.drawn_attention`)
are read from the slide the features file names, each at the coarsest level
that still gives :data:`CROP_PX` pixels for its level-0 footprint, and laid
out in one row with their rank, attention percentile and level-0 ``x, y``
(what CLAM users ask of its heatmap script: the coordinates of the top
tiles). Without a readable slide there are no crops (the coordinates are in
the GeoJSON and the result file all the same).
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFont

TOP_K = 8
CROP_PX = 224
_LABEL_PX = 34


def top_tiles(values: np.ndarray, k: int = TOP_K) -> np.ndarray:
    """Indices of the ``k`` highest values, highest first (ties: the earlier row first)."""
    order = np.argsort(-np.asarray(values, np.float64), kind="stable")
    return order[:k]


def read_crop(reader: object, xy: tuple[int, int], patch: int) -> Image.Image:
    """One tile's level-0 footprint, read at the coarsest level still fine enough, as CROP_PX px."""
    downsamples = list(reader.level_downsamples)  # type: ignore[attr-defined]
    fine = [i for i, d in enumerate(downsamples) if patch / d >= CROP_PX] or [0]
    level = max(fine, key=lambda i: downsamples[i])
    size = max(1, round(patch / downsamples[level]))
    region = reader.read_region((int(xy[0]), int(xy[1])), level, (size, size))  # type: ignore[attr-defined]
    return Image.fromarray(np.asarray(region, np.uint8)).resize(
        (CROP_PX, CROP_PX), Image.Resampling.LANCZOS
    )


def contact_sheet(crops: list[Image.Image], labels: list[str], title: str) -> Image.Image:
    """The crops in one row, each with its label under it, a title above."""
    font = ImageFont.load_default(size=14)
    width = max(1, len(crops)) * (CROP_PX + 8) + 8
    out = Image.new("RGB", (width, CROP_PX + _LABEL_PX + 40), (255, 255, 255))
    draw = ImageDraw.Draw(out)
    draw.text((8, 8), title, fill=(0, 0, 0), font=ImageFont.load_default(size=16))
    for i, (crop, label) in enumerate(zip(crops, labels, strict=True)):
        x = 8 + i * (CROP_PX + 8)
        out.paste(crop, (x, 34))
        draw.multiline_text((x, 36 + CROP_PX), label, fill=(0, 0, 0), font=font, spacing=2)
    return out
