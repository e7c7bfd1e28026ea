"""The jpeg transport's work, bounded before any decode: which slide tiles each box needs.

A ``jpeg_tiles`` request costs the server three things, each proportional to
pixels: decoding its slide tiles (the pixels their headers declare, held
until no box needs them), filling and resizing its boxes (the pixels they
cover) and pasting slide tiles into boxes (the pixels of each overlap). Each
is bounded by ``--max_request_pixels`` (:class:`~predictor.config.LimitsConfig`)
before any of it starts; the first two here, from the layout and the boxes
alone, the declared one by :meth:`~predictor.codecs.jpeg_input.JpegTiles.check_declared`
from the headers. With slide tiles on a grid, as the client sends them, the
pasted pixels are at most the covered ones; slide tiles stacked on one
another in ``jpeg_layout`` are what makes them more.

The slide tiles themselves: each must lie under some box (a request carries
only what its boxes need), and one box may overlap at most
:data:`MAX_SLIDE_TILES_PER_BOX` of them. Together with
:data:`SLIDE_TILES_PER_TILE` a request, that bounds ``S`` by ``N`` before the
bytes are read (:func:`check_slide_tile_count`).

Every refusal is an :class:`~predictor.errors.InvalidInput` naming the input
and row at fault and the limit: a 400, which names ``jpeg_tiles`` so the
client reads that batch again as pixels (the same features).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from predictor.config import LimitsConfig
from predictor.errors import InvalidInput

JPEG_TILES, JPEG_LAYOUT, JPEG_BOXES = "jpeg_tiles", "jpeg_layout", "jpeg_boxes"
SLIDE_TILES_PER_TILE = 4
"""Slide tiles a request may carry per model tile, over ``max_tiles_per_request``
(a box no larger than a slide tile overlaps at most 4: a 2x2 corner)."""
MAX_SLIDE_TILES_PER_BOX = 64
"""Slide tiles one box may overlap. The client's box is the square it reads at
the level nearest the model's mpp: the model tile itself (at most 2x2 slide
tiles), or up to a pyramid step larger, resized; 448 px over 240-256 px tiles
is 3x3, 896 px (a 4x step under a 224 px model tile) 5x5, and 64 (8x8) covers
a box of 7 slide tiles' edge (1,680 px over 240 px tiles). A larger read is
refused and the client sends that batch as pixels."""


MATRIX_CELLS = 1 << 22
"""(box, slide tile) pairs tested at once: 4 MiB of ``bool``, the whole of a request at
the default limits (1,024 boxes x 4,096 slide tiles); a server with a larger
``--max_tiles_per_request`` tests its boxes in blocks, never ``N x S`` at once."""


@dataclass(frozen=True, eq=False)
class BoxPlan:
    """Which slide tiles each box needs, and how many boxes need each slide tile.

    Attributes:
        overlaps: Per box (``jpeg_boxes`` row), the ascending indices of the
            slide tiles whose valid area it overlaps; never empty.
        needs: ``int64 [S]``: per slide tile, the boxes that overlap it; never 0.
    """

    overlaps: tuple[np.ndarray, ...]
    needs: np.ndarray


def check_slide_tile_count(count: int, boxes: int, limits: LimitsConfig) -> None:
    """``S`` within what ``N`` boxes may need, checked from the shapes before any bytes are read.

    Raises:
        InvalidInput: Naming ``jpeg_tiles``, the count and the limit.
    """
    per_request = SLIDE_TILES_PER_TILE * limits.max_tiles_per_request
    cap = min(MAX_SLIDE_TILES_PER_BOX * boxes, per_request)
    if not 0 < count <= cap:
        raise InvalidInput(
            f"{count} slide tiles for {boxes} boxes; expected 1..{cap} (at most "
            f"{MAX_SLIDE_TILES_PER_BOX} a box and {per_request} a request)",
            input_name=JPEG_TILES,
        )


def plan_boxes(layout: np.ndarray, boxes: np.ndarray, limits: LimitsConfig) -> BoxPlan:
    """Each box's slide tiles, checked against every bound the geometry alone decides.

    Args:
        layout: ``int64 [S, 4]`` rows ``x, y, valid w, valid h``, each checked.
        boxes: ``int64 [N, 4]`` rows ``x, y, w, h``, each checked.
        limits: ``max_request_pixels``.

    Raises:
        InvalidInput: The boxes cover more than ``max_request_pixels``; a box
            overlaps no slide tile, or more than :data:`MAX_SLIDE_TILES_PER_BOX`;
            a slide tile lies under no box; the boxes paste more than
            ``max_request_pixels`` from their slide tiles. Each names the row.
    """
    budget = limits.max_request_pixels
    _check_running_sum(
        boxes[:, 2] * boxes[:, 3],
        budget,
        "the boxes up to this one cover {total} pixels, more than the limit of {budget} "
        "(max_request_pixels) one request composes from its 'jpeg_tiles'",
    )
    per_box = np.zeros(len(boxes), np.int64)
    needs = np.zeros(len(layout), np.int64)
    pairs: list[np.ndarray] = []
    step = max(1, MATRIX_CELLS // len(layout))
    for start in range(0, len(boxes), step):
        hit = _overlap_matrix(layout, boxes[start : start + step])
        counts = hit.sum(axis=1)
        _check_box_counts(counts, boxes, start)
        per_box[start : start + len(counts)] = counts
        needs += hit.sum(axis=0)
        pairs.append(np.flatnonzero(hit) + start * len(layout))  # by box, then slide tile
    for index in np.flatnonzero(needs == 0)[:1]:
        raise InvalidInput(
            f"slide tile {list(map(int, layout[index]))} of jpeg_layout lies under no box of "
            "jpeg_boxes (a request carries only the slide tiles its boxes need)",
            input_name=JPEG_TILES,
            tile=int(index),
        )
    rows, tiles = np.divmod(np.concatenate(pairs), len(layout))
    _check_running_sum(
        np.bincount(rows, weights=_overlap_area(layout[tiles], boxes[rows]), minlength=len(boxes)),
        budget,
        "the boxes up to this one paste {total} pixels from their slide tiles of 'jpeg_tiles' "
        "(stacked in jpeg_layout), more than the limit of {budget} (max_request_pixels)",
    )
    return BoxPlan(tuple(np.split(tiles, np.cumsum(per_box)[:-1])), needs)


def _check_box_counts(counts: np.ndarray, boxes: np.ndarray, start: int) -> None:
    """InvalidInput at the first box (of those from row ``start``) over no slide tile or too many."""
    for offset in np.flatnonzero((counts == 0) | (counts > MAX_SLIDE_TILES_PER_BOX))[:1]:
        row = start + int(offset)
        box, count = list(map(int, boxes[row])), int(counts[offset])
        why = (
            "overlaps no slide tile of jpeg_layout"
            if count == 0
            else f"overlaps {count} slide tiles of 'jpeg_tiles', more than the limit of "
            f"{MAX_SLIDE_TILES_PER_BOX} a box"
        )
        raise InvalidInput(f"box {box} {why}", input_name=JPEG_BOXES, tile=row)


def _overlap_matrix(layout: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """``bool [N, S]``: box ``n`` overlaps slide tile ``s``'s valid area.

    In ``int32`` (rows are checked: every edge is below ``2**30 + 8192``).
    """
    tiles = np.concatenate([layout[:, :2], layout[:, :2] + layout[:, 2:]], axis=1)
    spans = np.concatenate([boxes[:, :2], boxes[:, :2] + boxes[:, 2:]], axis=1)
    t0x, t0y, t1x, t1y = tiles.astype(np.int32).T[:, None, :]
    b0x, b0y, b1x, b1y = spans.astype(np.int32).T[:, :, None]
    hit = t0x < b1x
    hit &= t1x > b0x
    hit &= t0y < b1y
    hit &= t1y > b0y
    return hit


def _overlap_area(tiles: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Pixels of each (slide tile, box) pair's overlap, row by row (both overlap)."""
    width = np.minimum(tiles[:, 0] + tiles[:, 2], boxes[:, 0] + boxes[:, 2])
    height = np.minimum(tiles[:, 1] + tiles[:, 3], boxes[:, 1] + boxes[:, 3])
    width -= np.maximum(tiles[:, 0], boxes[:, 0])
    height -= np.maximum(tiles[:, 1], boxes[:, 1])
    return (width * height).astype(np.float64)


def _check_running_sum(per_box: np.ndarray, budget: int, reason: str) -> None:
    """InvalidInput at the first ``jpeg_boxes`` row where the running sum passes ``budget``."""
    totals = np.cumsum(per_box)
    over = np.flatnonzero(totals > budget)
    if len(over):
        row = int(over[0])
        raise InvalidInput(
            reason.format(total=int(totals[row]), budget=budget), input_name=JPEG_BOXES, tile=row
        )
