"""The slide's own JPEG tiles as a V2 input: ``jpeg_tiles``, ``jpeg_layout``, ``jpeg_boxes``.

A request carries the slide tiles its model tiles need, each once:

===============  =========  ==========  ============================================
input            datatype   shape       meaning
===============  =========  ==========  ============================================
``jpeg_tiles``   ``BYTES``  ``[S]``     each a complete JPEG (shared tables spliced in)
``jpeg_layout``  ``INT32``  ``[S, 4]``  each slide tile's ``x, y`` in the request's own
                                        level-pixel frame and its valid ``w, h`` (an
                                        edge tile is cut at the level's edge)
``jpeg_boxes``   ``INT32``  ``[N, 4]``  each model tile's ``x, y, w, h`` in that frame,
                                        square (``w = h``: a non-square box is a 400)
===============  =========  ==========  ============================================

A model tile is its box composed from the slide tiles it overlaps (white
where none covers it: beyond the level's edge, as the native reader gives),
then resized to the spec's ``tile_size`` with Pillow and the spec's filter
when the box is larger: the very call the client's ``--resize bicubic``
makes, so the features equal the pixel path's on the same decoded pixels.

Decoding is libjpeg-turbo (``simplejpeg``) with libjpeg's defaults, in the
stage-1 decode pool, box by box: each slide tile is decoded at most once per
request, by the first box that needs it, and released when the last box that
needs it is composed (:class:`JpegTiles`, shared by the request's items and
thread-safe). Bounds, all checked before any decode: tile count and bytes,
layout and box sizes, the declared JPEG size (read from the header), the
valid area inside the decoded tile, and the request's work
(:mod:`predictor.codecs.jpeg_plan`: each box over 1..64 slide tiles, each
slide tile under some box, and ``--max_request_pixels`` on the pixels the
slide tiles declare, the boxes cover and the pastes copy). So a request holds
at most ``max_request_pixels`` decoded pixels whatever ``S`` is. A JPEG
that fails (bad tables, a huge declared size, truncated) is an
:class:`~predictor.errors.InvalidInput` naming ``jpeg_tiles`` and the slide
tile's index: its request is a 400 and no other request of the batch is
touched.

On a CUDA server the decode can move to the device
(:mod:`predictor.device.jpeg`): stage 1 then only checks each needed slide
tile's header (:meth:`JpegRegion.check_for_device`: the bounds above, and a
complete stream, ending in its EOI marker) and hands the region itself on as
the sample's tile; the same ``max_request_pixels`` bounds what the device
holds for one request.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from predictor.codecs.jpeg_plan import (
    JPEG_BOXES,
    JPEG_LAYOUT,
    JPEG_TILES,
    BoxPlan,
    plan_boxes,
)
from predictor.config import LimitsConfig
from predictor.errors import InvalidInput

JPEG_INPUTS: Mapping[str, tuple[str, str]] = {
    JPEG_TILES: ("BYTES", "[S]"),
    JPEG_LAYOUT: ("INT32", "[S, 4]"),
    JPEG_BOXES: ("INT32", "[N, 4]"),
}
"""The jpeg transport's inputs: name to (datatype, shape)."""
MAX_EDGE_PX = 8192
"""Longest edge of a slide tile's valid area or a box."""
_FILTERS = {
    "bicubic": Image.Resampling.BICUBIC,
    "bilinear": Image.Resampling.BILINEAR,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
}


class JpegTiles:
    """One request's slide tiles: each decoded once, by the first box that needs it, and
    released when the last box that needs it is composed.

    Args:
        streams: Each slide tile's complete JPEG.
        layout: ``int64 [S, 4]`` (x, y, valid w, valid h), checked.
        plan: Which slide tiles each box needs (:func:`~predictor.codecs.jpeg_plan.plan_boxes`).
        limits: ``max_image_pixels`` bounds each declared JPEG size,
            ``max_request_pixels`` their sum.
        tile_size: The spec's tile edge.
        interpolation: The spec's resize filter.
    """

    def __init__(
        self,
        streams: Sequence[bytes],
        layout: np.ndarray,
        plan: BoxPlan,
        limits: LimitsConfig,
        tile_size: int,
        interpolation: str,
    ):
        self._streams = list(streams)
        self.layout = layout
        self.plan = plan
        self._limits = limits
        self.tile_size = tile_size
        self._filter = _FILTERS.get(interpolation, Image.Resampling.BICUBIC)
        self._decoded: list[np.ndarray | InvalidInput | None] = [None] * len(self._streams)
        self._headers: list[tuple[int, int] | InvalidInput | None] = [None] * len(self._streams)
        self._locks = [threading.Lock() for _ in self._streams]
        self._valid: list[list[int]] = layout[:, 2:].tolist()
        self._needs = plan.needs.tolist()
        self._composed = [False] * len(plan.overlaps)
        self._needs_lock = threading.Lock()
        self.declared_pixels = 0
        """The pixels the slide tiles' headers declare (set by :meth:`check_declared`)."""

    @property
    def streams(self) -> Sequence[bytes]:
        """Each slide tile's complete JPEG, as sent."""
        return self._streams

    def held(self) -> int:
        """Slide tiles decoded and held now (released once no box needs them)."""
        return sum(isinstance(d, np.ndarray) for d in self._decoded)

    def check_declared(self) -> None:
        """Every slide tile's header read and checked; their declared pixels within the budget.

        Raises:
            InvalidInput: Naming ``jpeg_tiles`` and the slide tile: its header
                (:meth:`header`), or the one whose declared pixels take the
                request's sum over ``max_request_pixels``.
        """
        budget, total = self._limits.max_request_pixels, 0
        for index in range(len(self._streams)):
            width, height = self.header(index)
            total += width * height
            self.declared_pixels = total
            if total > budget:
                raise InvalidInput(
                    f"the slide tiles up to this one declare {total} pixels, more than the "
                    f"limit of {budget} (max_request_pixels) one request decodes: send fewer "
                    "tiles a request",
                    input_name=JPEG_TILES,
                    tile=index,
                )

    def tile(self, index: int) -> np.ndarray:
        """Slide tile ``index`` decoded (``uint8 [h, w, 3]``), kept while a box still needs it.

        Raises:
            InvalidInput: Naming ``jpeg_tiles`` and ``index`` (every asker gets it).
        """
        self.header(index)
        with self._locks[index]:
            done = self._decoded[index]
            if done is None:
                try:
                    done = self._decode(index)
                except InvalidInput as exc:
                    done = exc.at(input_name=JPEG_TILES, tile=index)
                if isinstance(done, InvalidInput) or self._needs[index] > 0:
                    self._decoded[index] = done
        if isinstance(done, InvalidInput):
            raise done
        return done

    def header(self, index: int) -> tuple[int, int]:
        """Slide tile ``index``'s declared ``(width, height)``, checked against the limits.

        Raises:
            InvalidInput: Naming ``jpeg_tiles`` and ``index``: an unreadable
                header, a declared size beyond ``max_image_pixels``, or one
                smaller than the tile's valid area in the layout.
        """
        with self._locks[index]:
            done = self._headers[index]
            if done is None:
                try:
                    done = self._read_header(index)
                except InvalidInput as exc:
                    done = exc.at(input_name=JPEG_TILES, tile=index)
                self._headers[index] = done
        if isinstance(done, InvalidInput):
            raise done
        return done

    def _read_header(self, index: int) -> tuple[int, int]:
        import simplejpeg

        stream = self._streams[index]
        valid_w, valid_h = self._valid[index]
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

    def _decode(self, index: int) -> np.ndarray:
        import simplejpeg

        try:
            pixels = simplejpeg.decode_jpeg(
                self._streams[index], colorspace="RGB", fastdct=False, fastupsample=False
            )
        except ValueError as exc:  # simplejpeg is strict: corrupt or truncated data
            raise InvalidInput(f"corrupt JPEG data ({exc})") from exc
        return pixels

    def region(self, row: int, box: np.ndarray) -> np.ndarray:
        """Box ``row`` (``x, y, w, h``) composed and resized to ``tile_size``: ``uint8 [T, T, 3]``.

        Its slide tiles no other box still needs are released afterwards,
        whether it composed or failed.

        Raises:
            InvalidInput: A slide tile it needs fails to decode.
        """
        x, y, w, h = (int(v) for v in box)
        out = np.full((h, w, 3), 255, np.uint8)
        try:
            for index in self.plan.overlaps[row]:
                tx, ty, tw, th = (int(v) for v in self.layout[index])
                ax0, ay0 = max(x, tx), max(y, ty)
                ax1, ay1 = min(x + w, tx + tw), min(y + h, ty + th)
                tile = self.tile(int(index))
                out[ay0 - y : ay1 - y, ax0 - x : ax1 - x] = tile[
                    ay0 - ty : ay1 - ty, ax0 - tx : ax1 - tx
                ]
                del tile
        finally:
            self._composed_box(row)
        if (w, h) == (self.tile_size, self.tile_size):
            return out
        resized = Image.fromarray(out).resize((self.tile_size, self.tile_size), self._filter)
        return np.asarray(resized)

    def _composed_box(self, row: int) -> None:
        """Counts box ``row`` done (once); slide tiles no box needs any more are dropped."""
        with self._needs_lock:
            if self._composed[row]:
                return
            self._composed[row] = True
            unneeded = []
            for index in self.plan.overlaps[row]:
                self._needs[index] -= 1
                if not self._needs[index]:
                    unneeded.append(int(index))
        for index in unneeded:
            with self._locks[index]:
                if isinstance(self._decoded[index], np.ndarray):
                    self._decoded[index] = None


@dataclass
class JpegRegion:
    """One model tile of a jpeg-transport request: box ``row`` of its request's :class:`JpegTiles`."""

    tiles: JpegTiles
    box: np.ndarray
    row: int

    def pixels(self) -> np.ndarray:
        """The tile's pixels (see :meth:`JpegTiles.region`)."""
        return self.tiles.region(self.row, self.box)

    def overlaps(self) -> tuple[int, ...]:
        """The slide tiles this box takes pixels from."""
        return tuple(int(i) for i in self.tiles.plan.overlaps[self.row])

    def check_for_device(self) -> None:
        """Checks what a device decode needs checked first.

        Each slide tile the box needs must pass :meth:`JpegTiles.header` and
        end in its EOI marker (a truncated stream is refused here, as
        libjpeg-turbo refuses it on the CPU path; nvJPEG may not). The
        request's budget (``max_request_pixels``: what one request holds on
        the device while its boxes are composed) was checked with its inputs.

        Raises:
            InvalidInput: Naming ``jpeg_tiles`` and the slide tile at fault.
        """
        for index in self.overlaps():
            self.tiles.header(index)
            if not bytes(self.tiles.streams[index][-2:]) == b"\xff\xd9":
                raise InvalidInput(
                    "truncated JPEG data (the stream does not end in its EOI marker)",
                    input_name=JPEG_TILES,
                    tile=index,
                )


def decode_pixels(regions: Iterable[JpegRegion | None]) -> int:
    """What decoding a request's regions costs, in pixels: admission's measure of its work.

    The pixels its slide tiles' headers declare (each decoded once) plus the
    pixels of its boxes (each filled, pasted into and resized): the two of
    :mod:`~predictor.codecs.jpeg_plan`'s bounds that scale a request's CPU
    (the pastes are at most the boxes' pixels on a grid). ``None`` (a tile
    that is not a region: raw pixels, an encoded image) costs nothing here:
    its work is its tile, counted as one.
    """
    shared: dict[int, JpegTiles] = {}
    boxes = 0
    for region in regions:
        if region is None:
            continue
        shared.setdefault(id(region.tiles), region.tiles)
        boxes += int(region.box[2]) * int(region.box[3])
    return boxes + sum(tiles.declared_pixels for tiles in shared.values())


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
    Everything is checked here, before any pixel is decoded: the rows, the
    plan (:func:`~predictor.codecs.jpeg_plan.plan_boxes`) and every header
    with the declared pixels' budget (:meth:`JpegTiles.check_declared`).

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
    _check_square(box)
    for row, (w, h) in enumerate(box[:, 2:]):
        if int(w) * int(h) > limits.max_image_pixels:
            raise InvalidInput(
                f"box of {w}x{h} px exceeds the limit of {limits.max_image_pixels} pixels",
                input_name=JPEG_BOXES,
                tile=row,
            )
    tiles = JpegTiles(streams, lay, plan_boxes(lay, box, limits), limits, tile_size, interpolation)
    tiles.check_declared()
    return [JpegRegion(tiles, box[i], i) for i in range(len(box))]


def _check_square(boxes: np.ndarray) -> None:
    """Every box square: a model tile is a square of the slide, resized without distortion.

    A non-square box would be stretched to the tile's square: the feature of a
    distorted tile, which no slide read gives (the client reads squares).
    """
    bad = np.flatnonzero(boxes[:, 2] != boxes[:, 3])
    if len(bad):
        row = int(bad[0])
        w, h = int(boxes[row, 2]), int(boxes[row, 3])
        raise InvalidInput(
            f"box {list(map(int, boxes[row]))} is {w}x{h} px: a box must be square (w = h; "
            "it is resized to the model's square tile, and a non-square one would be stretched)",
            input_name=JPEG_BOXES,
            tile=row,
        )


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
