"""Tissue from a served segmentation model (``--tissue MODEL``).

The slide's thumbnail is made at the segmentation model's own mpp (8 um/px
for ``tissue-seg``), cut into the model's tiles (512x512; the edge padded with
white, which is background), sent over V2 like any other request, and the
``mask`` answers (``UINT8 [N, T, T]``, 1 = tissue) are stitched back into one
mask of the thumbnail's size. The tissue fraction of each planned tile then
comes from that mask exactly as for Otsu
(:func:`~histoserve.tissue.detect.fractions_from_mask`), so both methods share
one definition of "fraction". Every answer must be one ``mask`` of the model's
datatype and shape per tile sent
(:meth:`~histoserve.remote.answers.AnswerCheck.for_tissue`), else it is a
failed attempt retried elsewhere: a short answer is never broadcast over the
batch's tiles.
"""

from __future__ import annotations

import numpy as np

from histoserve.remote.client import HistoserveClient
from histoserve.remote.served_model import ServerInfo
from histoserve.slides.readers import MppInfo, SlideReader
from histoserve.tissue.detect import thumbnail

WHITE = 255
# Mask tiles per request: 8 x 512 x 512 x 3 bytes is 6 MB.
MASK_BATCH = 8


def to_tiles(image: np.ndarray, size: int) -> tuple[np.ndarray, tuple[int, int]]:
    """``image [H, W, 3]`` padded with white to whole tiles: ``(tiles [n, size, size, 3], (rows, cols))``."""
    h, w = image.shape[:2]
    rows, cols = -(-h // size), -(-w // size)
    padded = np.full((rows * size, cols * size, 3), WHITE, np.uint8)
    padded[:h, :w] = image
    tiles = padded.reshape(rows, size, cols, size, 3).transpose(0, 2, 1, 3, 4)
    return np.ascontiguousarray(tiles.reshape(rows * cols, size, size, 3)), (rows, cols)


def from_tiles(masks: np.ndarray, grid: tuple[int, int], height: int, width: int) -> np.ndarray:
    """Stitches ``masks [n, size, size]`` (row-major tiles) back and crops to ``height x width``."""
    rows, cols = grid
    size = masks.shape[-1]
    whole = masks.reshape(rows, cols, size, size).transpose(0, 2, 1, 3)
    return whole.reshape(rows * size, cols * size)[:height, :width]


def model_tissue_mask(
    reader: SlideReader, mpp: MppInfo, client: HistoserveClient, seg: ServerInfo
) -> tuple[np.ndarray, float]:
    """The served model's tissue mask of the whole slide (bool ``[h, w]``) and its mpp.

    Raises:
        RequestFailed: The segmentation server refused a request or retries ran out.
    """
    if seg.mpp is None:
        raise ValueError(f"tissue model {seg.model!r}: its mpp is unknown")
    image, image_mpp = thumbnail(reader, mpp, seg.mpp)
    tiles, grid = to_tiles(image, seg.tile_size)
    masks = np.empty((len(tiles), seg.tile_size, seg.tile_size), np.uint8)
    for start in range(0, len(tiles), MASK_BATCH):
        batch = tiles[start : start + MASK_BATCH]
        answer = client.infer({"pixels": batch})  # checked: one mask per tile, or retried
        masks[start : start + len(batch)] = answer["mask"]
    return from_tiles(masks, grid, image.shape[0], image.shape[1]) > 0, image_mpp
