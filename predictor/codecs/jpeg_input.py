"""The slide's own JPEG tiles as a V2 input: ``jpeg_tiles``, ``jpeg_layout``, ``jpeg_boxes``.

A request carries the slide tiles its model tiles need, each once:

===============  =========  ==========  ============================================
input            datatype   shape       meaning
===============  =========  ==========  ============================================
``jpeg_tiles``   ``BYTES``  ``[S]``     each a complete JPEG (shared tables spliced in)
``jpeg_layout``  ``INT32``  ``[S, 4]``  each slide tile's ``x, y`` in the request's own
                                        level-pixel frame and its valid ``w, h`` (an
                                        edge tile is cut at the level's edge)
``jpeg_boxes``   ``INT32``  ``[N, 4]``  each model tile's ``x, y, w, h`` in that frame
===============  =========  ==========  ============================================

A model tile is its box composed from the slide tiles it overlaps (white
where none covers it: beyond the level's edge, as the native reader gives),
then resized to the spec's ``tile_size`` with Pillow and the spec's filter
when the box is larger: the very call the client's ``--resize bicubic``
makes, so the features equal the pixel path's on the same decoded pixels.

Decoding is libjpeg-turbo (``simplejpeg``) with libjpeg's defaults, in the
stage-1 decode pool; each slide tile is decoded at most once per request
(:class:`JpegTiles`, shared by the request's items and thread-safe). Bounds:
tile count and bytes, layout and box sizes, the declared JPEG size (read from
the header before decoding), the valid area inside the decoded tile, each
box overlapping some slide tile. A JPEG that fails (bad tables, a huge
declared size, truncated) is an :class:`~predictor.errors.InvalidInput`
naming ``jpeg_tiles`` and the slide tile's index: its request is a 400 and
no other request of the batch is touched.

On a CUDA server the decode can move to the device
(:mod:`predictor.device.jpeg`): stage 1 then only checks each needed slide
tile's header (:meth:`JpegRegion.check_for_device`: the bounds above, and a
complete stream, ending in its EOI marker) and hands the region itself on as
the sample's tile.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from predictor.config import LimitsConfig
from predictor.errors import InvalidInput

JPEG_TILES, JPEG_LAYOUT, JPEG_BOXES = "jpeg_tiles", "jpeg_layout", "jpeg_boxes"
JPEG_INPUTS: Mapping[str, tuple[str, str]] = {
    JPEG_TILES: ("BYTES", "[S]"),
    JPEG_LAYOUT: ("INT32", "[S, 4]"),
    JPEG_BOXES: ("INT32", "[N, 4]"),
}
"""The jpeg transport's inputs: name to (datatype, shape)."""
SLIDE_TILES_PER_TILE = 4
"""Slide tiles a request may carry per model tile (a box across a 2x2 corner)."""
MAX_EDGE_PX = 8192
"""Longest edge of a slide tile's valid area or a box."""
_FILTERS = {
    "bicubic": Image.Resampling.BICUBIC,
    "bilinear": Image.Resampling.BILINEAR,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
}


class JpegTiles:
    """One request's slide tiles: each decoded at most once, by whichever thread needs it first.

    Args:
        streams: Each slide tile's complete JPEG.
        layout: ``int64 [S, 4]`` (x, y, valid w, valid h), checked.
        limits: ``max_image_pixels`` bounds the declared JPEG size.
        tile_size: The spec's tile edge.
        interpolation: The spec's resize filter.
    """

    def __init__(
        self,
        streams: Sequence[bytes],
        layout: np.ndarray,
        limits: LimitsConfig,
        tile_size: int,
        interpolation: str,
    ):
        self._streams = list(streams)
        self.layout = layout
        self._limits = limits
        self.tile_size = tile_size
        self._filter = _FILTERS.get(interpolation, Image.Resampling.BICUBIC)
        self._decoded: list[np.ndarray | InvalidInput | None] = [None] * len(self._streams)
        self._headers: list[tuple[int, int] | InvalidInput | None] = [None] * len(self._streams)
        self._locks = [threading.Lock() for _ in self._streams]
        self._declared: int | None = None

    @property
    def streams(self) -> Sequence[bytes]:
        """Each slide tile's complete JPEG, as sent."""
        return self._streams

    def tile(self, index: int) -> np.ndarray:
        """Slide tile ``index`` decoded (``uint8 [h, w, 3]``).

        Raises:
            InvalidInput: Naming ``jpeg_tiles`` and ``index`` (every asker gets it).
        """
        self.header(index)
        return self._once(self._decoded, index, self._decode)

    def header(self, index: int) -> tuple[int, int]:
        """Slide tile ``index``'s declared ``(width, height)``, checked against the limits.

        Raises:
            InvalidInput: Naming ``jpeg_tiles`` and ``index``: an unreadable
                header, a declared size beyond ``max_image_pixels``, or one
                smaller than the tile's valid area in the layout.
        """
        return self._once(self._headers, index, self._read_header)

    def _once(self, results: list[Any], index: int, compute: Callable[[int], Any]) -> Any:
        """``compute(index)`` at most once per slide tile, by whichever thread asks first.

        Its result, or its :class:`InvalidInput` located at ``jpeg_tiles`` and
        ``index``, is kept in ``results[index]``: every later asker gets the same.
        """
        with self._locks[index]:
            done = results[index]
            if done is None:
                try:
                    done = compute(index)
                except InvalidInput as exc:
                    done = exc.at(input_name=JPEG_TILES, tile=index)
                results[index] = done
        if isinstance(done, InvalidInput):
            raise done
        return done

    def _read_header(self, index: int) -> tuple[int, int]:
        import simplejpeg

        stream = self._streams[index]
        valid_w, valid_h = (int(v) for v in self.layout[index, 2:])
        try:
            height, width, _, _ = simplejpeg.decode_jpeg_header(stream)
        except ValueError as exc:
            raise InvalidInput(f"unreadable JPEG header ({exc})") from exc
        if width * height > self._limits.max_image_pixels:
            raise InvalidInput(
                f"JPEG declares {width}x{height} px, more than the limit of "
                f"{self._limits.max_image_pixels} pixels"
            )
        if width < valid_w or height < valid_h:
            raise InvalidInput(
                f"JPEG is {width}x{height} px, smaller than its layout's {valid_w}x{valid_h}"
            )
        return width, height

    def declared_pixels(self) -> int:
        """Pixels all slide tiles declare (tiles whose header fails count nothing)."""
        if self._declared is None:
            total = 0
            for index in range(len(self._streams)):
                try:
                    width, height = self.header(index)
                except InvalidInput:
                    continue
                total += width * height
            self._declared = total
        return self._declared

    def _decode(self, index: int) -> np.ndarray:
        import simplejpeg

        try:
            pixels = simplejpeg.decode_jpeg(
                self._streams[index], colorspace="RGB", fastdct=False, fastupsample=False
            )
        except ValueError as exc:  # simplejpeg is strict: corrupt or truncated data
            raise InvalidInput(f"corrupt JPEG data ({exc})") from exc
        return pixels

    def region(self, box: np.ndarray) -> np.ndarray:
        """Box ``(x, y, w, h)`` composed and resized to ``tile_size``: ``uint8 [T, T, 3]``.

        Raises:
            InvalidInput: A slide tile it needs fails to decode.
        """
        x, y, w, h = (int(v) for v in box)
        out = np.full((h, w, 3), 255, np.uint8)
        for index in self.overlapping(x, y, w, h):
            tx, ty, tw, th = (int(v) for v in self.layout[index])
            ax0, ay0 = max(x, tx), max(y, ty)
            ax1, ay1 = min(x + w, tx + tw), min(y + h, ty + th)
            tile = self.tile(index)
            out[ay0 - y : ay1 - y, ax0 - x : ax1 - x] = tile[
                ay0 - ty : ay1 - ty, ax0 - tx : ax1 - tx
            ]
        if (w, h) == (self.tile_size, self.tile_size):
            return out
        resized = Image.fromarray(out).resize((self.tile_size, self.tile_size), self._filter)
        return np.asarray(resized)

    def overlapping(self, x: int, y: int, w: int, h: int) -> np.ndarray:
        """Indices of the slide tiles whose valid area overlaps box ``(x, y, w, h)``."""
        lay = self.layout
        hit = (
            (lay[:, 0] < x + w)
            & (lay[:, 0] + lay[:, 2] > x)
            & (lay[:, 1] < y + h)
            & (lay[:, 1] + lay[:, 3] > y)
        )
        return np.flatnonzero(hit)


@dataclass
class JpegRegion:
    """One model tile of a jpeg-transport request: its box in its request's :class:`JpegTiles`."""

    tiles: JpegTiles
    box: np.ndarray

    def pixels(self) -> np.ndarray:
        """The tile's pixels (see :meth:`JpegTiles.region`)."""
        return self.tiles.region(self.box)

    def overlaps(self) -> tuple[int, ...]:
        """The slide tiles this box takes pixels from."""
        x, y, w, h = (int(v) for v in self.box)
        return tuple(int(i) for i in self.tiles.overlapping(x, y, w, h))

    def check_for_device(self, max_request_pixels: int) -> None:
        """Checks what a device decode needs checked first.

        Each slide tile the box needs must pass :meth:`JpegTiles.header` and
        end in its EOI marker (a truncated stream is refused here, as
        libjpeg-turbo refuses it on the CPU path; nvJPEG may not), and the
        request's tiles together may declare at most ``max_request_pixels``
        (what one request holds on the device while its boxes are composed).

        Raises:
            InvalidInput: Naming ``jpeg_tiles`` and the slide tile at fault,
                or the request's declared pixels and the limit.
        """
        for index in self.overlaps():
            self.tiles.header(index)
            if not bytes(self.tiles.streams[index][-2:]) == b"\xff\xd9":
                raise InvalidInput(
                    "truncated JPEG data (the stream does not end in its EOI marker)",
                    input_name=JPEG_TILES,
                    tile=index,
                )
        declared = self.tiles.declared_pixels()
        if declared > max_request_pixels:
            raise InvalidInput(
                f"the request's slide tiles declare {declared} pixels, more than the "
                f"{max_request_pixels} one request decodes on the device with "
                "(--jpeg_decode device): send fewer tiles a request",
                input_name=JPEG_TILES,
            )


def jpeg_regions(
    streams: Sequence[Any],
    layout: np.ndarray,
    boxes: np.ndarray,
    *,
    limits: LimitsConfig,
    tile_size: int,
    interpolation: str,
) -> list[JpegRegion]:
    """Checks the three inputs against each other and the limits; one region per box.

    ``streams`` are already bytes, each checked against ``max_image_bytes``.

    Raises:
        InvalidInput: Naming the input, the row and the reason.
    """
    count = len(streams)
    if layout.shape != (count, 4):
        raise InvalidInput(
            f"shape must be [S, 4] with S = {count} (one row per slide tile), "
            f"got {list(layout.shape)}",
            input_name=JPEG_LAYOUT,
        )
    lay = layout.astype(np.int64)
    box = boxes.astype(np.int64)
    _check_rows(lay, JPEG_LAYOUT, "slide tile")
    _check_rows(box, JPEG_BOXES, "box")
    for row, (w, h) in enumerate(box[:, 2:]):
        if int(w) * int(h) > limits.max_image_pixels:
            raise InvalidInput(
                f"box of {w}x{h} px exceeds the limit of {limits.max_image_pixels} pixels",
                input_name=JPEG_BOXES,
                tile=row,
            )
    tiles = JpegTiles(streams, lay, limits, tile_size, interpolation)
    for row, (x, y, w, h) in enumerate(box):
        if not len(tiles.overlapping(int(x), int(y), int(w), int(h))):
            raise InvalidInput(
                f"box ({x}, {y}, {w}, {h}) overlaps no slide tile of jpeg_layout",
                input_name=JPEG_BOXES,
                tile=row,
            )
    return [JpegRegion(tiles, box[i]) for i in range(len(box))]


def _check_rows(rows: np.ndarray, name: str, what: str) -> None:
    """``x, y`` within ``[0, 2**30)`` and ``w, h`` within ``[1, MAX_EDGE_PX]`` per row."""
    origin_bad = (rows[:, :2] < 0) | (rows[:, :2] >= 1 << 30)
    size_bad = (rows[:, 2:] < 1) | (rows[:, 2:] > MAX_EDGE_PX)
    bad = np.flatnonzero(origin_bad.any(axis=1) | size_bad.any(axis=1))
    if len(bad):
        row = int(bad[0])
        raise InvalidInput(
            f"{what} row {list(map(int, rows[row]))}: x, y must be in [0, 2^30) and "
            f"w, h in [1, {MAX_EDGE_PX}]",
            input_name=name,
            tile=row,
        )
