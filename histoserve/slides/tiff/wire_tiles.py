"""``--transport``: a batch as the slide's own JPEG tiles, for a server that decodes them.

A batch of model tiles read at a matching level (or resized with the spec's
filter, ``--resize bicubic``) needs only the slide tiles its boxes overlap.
:func:`jpeg_batch` gathers them once each (compressed bytes, the page's
shared tables spliced in: :func:`~histoserve.slides.tiff.jpeg_tiles.tile_stream`)
with each one's place and valid size (an edge tile is cut at the level's edge)
in the batch's own level-pixel frame, and each model tile's box in that
frame: the server's ``jpeg_tiles``, ``jpeg_layout`` and ``jpeg_boxes``
inputs (``docs/cohorts.md``). Nothing is decoded here.

:func:`jpeg_problem` says why a slide's tiles cannot go this way (None:
they can): not read natively, a resize other than the spec's filter, a
server that does not offer it, or a grid that does not start on level pixels.

Where the server decodes them decides what the features are: on the CPU
(libjpeg-turbo) they equal the pixel path's bit for bit, on the device
(nvJPEG) they differ slightly. So each jpeg transport names one decode
(:data:`DECODED_ON`): ``jpeg`` (and ``auto``) only with a server that decodes
on the CPU, ``jpeg-device`` only with one that says it decodes on the device;
:func:`choose_transport` holds a slide to that, and every answer to a jpeg
request must name the same decode
(:meth:`~histoserve.remote.answers.AnswerCheck.decoded_by`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from histoserve.errors import RequestFailed, ServerRefused, SlideError
from histoserve.limits import MAX_JPEG_BYTES_PER_TILE, MAX_JPEG_REQUEST_BYTES
from histoserve.slides.tiff.jpeg_tiles import JpegTileError, tile_stream

if TYPE_CHECKING:
    from histoserve.slides.tiff.native import NativeTiff

TRANSPORTS = ("auto", "pixels", "jpeg", "jpeg-device")
"""``--transport``: jpeg where it applies (auto), never, always (a slide it cannot take fails),
or always to a server that decodes on the device (its features differ slightly)."""
DECODED_ON = {"jpeg": "cpu", "jpeg-device": "device"}
"""Where the server must decode each jpeg transport's tiles: its config's and answers'
``jpeg_decode``."""


class JpegTooLarge(SlideError):
    """A batch whose slide tiles would make a request over the jpeg transport's byte limits
    (known from the tiles' declared byte counts, before any is read): send it as pixels."""


@dataclass
class JpegBatch:
    """One request's worth: slide tile streams, their layout, one box per model tile.

    ``coords`` are the model tiles' level-0 x, y; ``ok`` their row mask, all
    true, which a sender that falls back to pixels updates (bad tiles found).
    """

    streams: list[bytes]
    layout: np.ndarray
    boxes: np.ndarray
    coords: np.ndarray
    ok: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.ok = np.ones(len(self.boxes), bool)

    def __len__(self) -> int:
        return len(self.boxes)

    @property
    def nbytes(self) -> int:
        """Bytes of tile data the batch carries."""
        return sum(len(s) for s in self.streams)

    def inputs(self) -> dict[str, np.ndarray]:
        """The V2 inputs, ``jpeg_boxes`` first (its rows are the request's tiles)."""
        streams = np.empty(len(self.streams), dtype=np.object_)
        streams[:] = self.streams
        return {"jpeg_boxes": self.boxes, "jpeg_layout": self.layout, "jpeg_tiles": streams}


def jpeg_problem(
    native: NativeTiff | None,
    level: int,
    resize: str | None,
    transports: Sequence[str],
    coords: np.ndarray,
) -> str | None:
    """Why this slide's tiles cannot cross as JPEG tiles (None: they can).

    ``native``: the slide's native reader (None: read by OpenSlide);
    ``level``: the level read; ``resize``: how a read square becomes the tile
    (None: it is the tile; the server resizes ``bicubic`` only).
    """
    if "jpeg" not in transports:
        return "the server does not take JPEG tiles"
    if native is None:
        return "the slide is not read natively (--reader)"
    if resize not in (None, "bicubic"):
        return f"it is resized with --resize {resize} (the server resizes with the spec's filter)"
    level_xy = np.asarray(coords, np.float64) / native.level_downsamples[level]
    if not np.array_equal(level_xy, np.floor(level_xy)):
        return "its tile grid does not start on pixels of the level read"
    return None


def jpeg_batch(native: NativeTiff, level: int, size: int, coords: np.ndarray) -> JpegBatch:
    """The ``size`` px squares at ``level`` from ``coords`` (level-0 x, y rows) as slide JPEG tiles.

    The request's bytes are bounded before a tile is read: at most
    :data:`~histoserve.limits.MAX_JPEG_BYTES_PER_TILE` per model tile and
    :data:`~histoserve.limits.MAX_JPEG_REQUEST_BYTES` in all, counted from the
    tiles' declared byte counts and the tables each stream carries. Each
    tile's JPEG frame is checked against the TIFF's declaration
    (:func:`~histoserve.slides.tiff.jpeg_tiles.check_frame`), as the native
    reader checks it, so a tile OpenSlide refuses is never sent.

    See the module. Raises:
        JpegTooLarge: The request would be over those limits (send pixels).
        SlideError: A tile's bytes cannot be read, it has none (a missing tile: the
            batch goes as pixels, read as OpenSlide reads it), or its JPEG headers are
            malformed or not the TIFF's.
    """
    downsample = native.level_downsamples[level]
    level_w, level_h = native.level_dimensions[level]
    tw, th = native.tile_size(level)
    origins = (np.asarray(coords, np.int64).reshape(-1, 2) / downsample).astype(np.int64)
    wanted: dict[tuple[int, int], int] = {}
    for lx, ly in origins:
        for row in range(ly // th, min(-(-(ly + size) // th), -(-level_h // th))):
            for column in range(lx // tw, min(-(-(lx + size) // tw), -(-level_w // tw))):
                wanted.setdefault((column, row), len(wanted))
    cells = np.array(list(wanted), np.int64).reshape(-1, 2)
    frame_x, frame_y = int(cells[:, 0].min()) * tw, int(cells[:, 1].min()) * th
    tables = native.jpeg_tables(level)
    _check_request_bytes(native, level, cells, len(tables or b""), len(origins))
    streams, layout = [], np.empty((len(cells), 4), np.int32)
    for i, (column, row) in enumerate(cells):
        x, y = int(column) * tw, int(row) * th
        if native.tile_byte_count(level, int(column), int(row)) == 0:
            raise SlideError(
                f"slide {native.path}: level {level} tile ({column}, {row}) is a missing tile "
                "(no bytes; read as OpenSlide reads it): sent as pixels"
            )
        try:
            data = native.tile_bytes(level, int(column), int(row))
            streams.append(tile_stream(tables, data, tw, th))
        except JpegTileError as exc:
            raise SlideError(
                f"slide {native.path}: level {level} tile ({column}, {row}): {exc}"
            ) from exc
        layout[i] = (x - frame_x, y - frame_y, min(tw, level_w - x), min(th, level_h - y))
    boxes = np.empty((len(origins), 4), np.int32)
    boxes[:, 0] = origins[:, 0] - frame_x
    boxes[:, 1] = origins[:, 1] - frame_y
    boxes[:, 2:] = size
    return JpegBatch(streams, layout, boxes, np.asarray(coords))


def _check_request_bytes(
    native: NativeTiff, level: int, cells: np.ndarray, tables_bytes: int, n_tiles: int
) -> None:
    """Raise :class:`JpegTooLarge` when the streams for ``cells`` would pass the limits."""
    declared = sum(native.tile_byte_count(level, int(c), int(r)) for c, r in cells)
    declared += len(cells) * (tables_bytes + 32)  # each stream: SOI, the YCbCr marker, the tables
    limit = min(MAX_JPEG_REQUEST_BYTES, n_tiles * MAX_JPEG_BYTES_PER_TILE)
    if declared > limit:
        raise JpegTooLarge(
            f"slide {native.path}: {n_tiles} tiles as JPEG would carry {declared:,} bytes, more "
            f"than the {limit:,} allowed ({MAX_JPEG_BYTES_PER_TILE:,} a tile, at most "
            f"{MAX_JPEG_REQUEST_BYTES:,} a request): sent as pixels"
        )


def choose_transport(requested: str, where: str, problem: str | None, decode: str) -> str:
    """``pixels``, ``jpeg`` or ``jpeg-device`` for slide ``where``, by ``--transport``.

    ``problem``: :func:`jpeg_problem`'s answer for the slide. ``decode``: where
    the server says it decodes JPEG tiles (its config's ``jpeg_decode``: ``cpu``,
    ``device``; ``""``: it does not say, as over gRPC, taken as ``cpu`` and left
    to the answer check). ``auto`` takes ``jpeg`` where the slide can and the
    server decodes on the CPU, else ``pixels``: never device-decoded features
    unless ``jpeg-device`` asks for them.

    Raises:
        SlideError: ``jpeg`` or ``jpeg-device`` asked for a slide whose tiles cannot
            take it, or of a server that decodes elsewhere (where, and the flag to use).
    """
    if requested == "pixels":
        return "pixels"
    transport = "jpeg-device" if requested == "jpeg-device" else "jpeg"
    mismatch = _decode_mismatch(transport, decode)
    if requested == "auto":
        return "jpeg" if problem is None and mismatch is None else "pixels"
    if mismatch is not None:
        raise SlideError(f"slide {where}: --transport {requested}: {mismatch}")
    if problem is not None:
        raise SlideError(f"slide {where}: --transport {requested}: {problem}; use --transport auto")
    return transport


SIZE_REFUSALS = frozenset({"HTTP 413", "gRPC RESOURCE_EXHAUSTED"})
"""How a server refuses a request for its size (the gRPC one only when not retried:
over the server's receive bound, see :mod:`histoserve.remote.grpc_transport`)."""


def pixels_may_help(exc: RequestFailed) -> bool:
    """Whether a refused jpeg request may go through as pixels: the server could not
    decode a slide tile (its 400 names ``jpeg_tiles``) or refused its size."""
    cause = exc.__cause__
    if not isinstance(cause, ServerRefused):
        return False
    return cause.status in SIZE_REFUSALS or "'jpeg_tiles'" in str(exc)


def _decode_mismatch(transport: str, decode: str) -> str | None:
    """Why the server's decode is not the one ``transport`` takes features from (None: it is)."""
    if (decode or "cpu") == DECODED_ON[transport]:
        return None
    said = (
        f"jpeg_decode {decode!r}"
        if decode
        else "no jpeg_decode (an older server, or gRPC metadata only)"
    )
    if transport == "jpeg-device":
        return (
            f"the server does not say it decodes JPEG tiles on the device (its config: {said}); "
            "use --transport jpeg or auto with a server that decodes on the CPU, or "
            "--transport jpeg-device with one started with --jpeg_decode device"
        )
    return (
        f"the server does not decode JPEG tiles on the CPU (its config: {said}; device-decoded "
        "tiles give features that differ slightly from the pixel path's): use --transport "
        "jpeg-device to take device-decoded features, or --transport auto or pixels for the "
        "pixel path's"
    )
