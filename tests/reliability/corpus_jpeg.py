"""The jpeg transport's hostile requests (issue 45): valid JPEGs asking for unbounded work.

Each is a ``(jpeg_tiles, jpeg_layout, jpeg_boxes)`` triple of valid inputs
that the limited server (:data:`~tests.reliability.load.LIMITED_FLAGS`:
1 Mpx an image, 16 tiles a request, ``--max_request_pixels`` 4 Mpx) must
refuse before decoding, scaled from the issue's figures to those limits: the
same request to the default limits is the issue's. Sent over REST binary
(:data:`JPEG_CASES`, rows of the REST corpus) and gRPC
(``test_bad_input_grpc.py``), each with the words its 400 must carry.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from PIL import Image

from histoserve.wire import length_prefixed
from tests.reliability.corpus import HttpCase, binary
from tests.reliability.load import MAX_REQUEST_PIXELS

Triple = tuple[list[bytes], np.ndarray, np.ndarray]


@functools.cache
def flat_jpeg(edge: int, shade: int = 0) -> bytes:
    """A valid ``edge`` px square JPEG of one colour: 1024 px is about 7 kB."""
    out = io.BytesIO()
    Image.new("RGB", (edge, edge), (180 + shade % 60, 120, 190)).save(
        out, "JPEG", quality=90, optimize=True
    )
    return out.getvalue()


def _rows(rows: list[list[int]]) -> np.ndarray:
    return np.asarray(rows, np.int32).reshape(-1, 4)


def stacked_declared() -> Triple:
    """16 JPEGs each as large as the server allows, stacked under one model tile's box."""
    streams = [flat_jpeg(1024, i) for i in range(16)]
    return streams, _rows([[0, 0, 224, 224]] * 16), _rows([[0, 0, 224, 224]])


def stacked_under_boxes() -> Triple:
    """16 stacked slide tiles (their decode fits the budget) under 16 boxes overlapping all."""
    streams = [flat_jpeg(512, i) for i in range(16)]
    return streams, _rows([[0, 0, 512, 512]] * 16), _rows([[0, 0, 512, 512]] * 16)


def more_than_four_a_box() -> Triple:
    """S = 64 for N = 1: the box needs 4 of them."""
    layout = [[128 * (i % 8), 128 * (i // 8), 128, 128] for i in range(64)]
    return [flat_jpeg(128, i) for i in range(64)], _rows(layout), _rows([[0, 0, 224, 224]])


def unreferenced() -> Triple:
    """Two boxes over two slide tiles, and a third slide tile far from both."""
    layout = [[0, 0, 256, 256], [256, 0, 256, 256], [4096, 4096, 256, 256]]
    boxes = [[0, 0, 224, 224], [200, 0, 224, 224]]
    return [flat_jpeg(256, i) for i in range(3)], _rows(layout), _rows(boxes)


def boxes_cover() -> Triple:
    """16 boxes as large as an image may be, over one small slide tile."""
    return [flat_jpeg(256)], _rows([[0, 0, 256, 256]]), _rows([[0, 0, 1024, 1024]] * 16)


NON_SQUARE = ((448, 224), (300, 200), (512, 16), (224, 256), (1, 224))
"""Issue 53, case 6: boxes that were stretched to the tile's square (answered 200)."""


def non_square(width: int, height: int) -> Callable[[], Triple]:
    """A square box, then a ``width`` x ``height`` one, over one 512 px slide tile."""

    def build() -> Triple:
        boxes = [[0, 0, 224, 224], [0, 0, width, height]]
        return [flat_jpeg(512)], _rows([[0, 0, 512, 512]]), _rows(boxes)

    return build


@dataclass(frozen=True)
class JpegCase:
    """One hostile jpeg-transport request and the words its 400 must carry."""

    name: str
    build: Callable[[], Triple]
    words: tuple[str, ...]


LIMIT = f"limit of {MAX_REQUEST_PIXELS} (max_request_pixels)"
CASES = [
    JpegCase("jpeg-stacked-declared", stacked_declared, ("'jpeg_tiles'", "tile 4", LIMIT)),
    JpegCase(
        "jpeg-stacked-under-boxes",
        stacked_under_boxes,
        ("'jpeg_boxes'", "tile 1", "paste", "'jpeg_tiles'", LIMIT),
    ),
    JpegCase(
        "jpeg-more-than-four-a-box",
        more_than_four_a_box,
        ("'jpeg_tiles'", "tile 2", "under no box"),
    ),
    JpegCase("jpeg-unreferenced-tile", unreferenced, ("'jpeg_tiles'", "tile 2", "under no box")),
    JpegCase(
        "jpeg-boxes-cover", boxes_cover, ("'jpeg_boxes'", "tile 4", "cover", "'jpeg_tiles'", LIMIT)
    ),
    *(
        JpegCase(
            f"jpeg-box-{w}x{h}",
            non_square(w, h),
            ("'jpeg_boxes'", "tile 1", f"is {w}x{h} px", "must be square"),
        )
        for w, h in NON_SQUARE
    ),
]


def rest_body(build: Callable[[], Triple]) -> tuple[bytes, dict]:
    """The triple as a V2 binary body."""
    streams, layout, boxes = build()
    return binary(
        [
            ("jpeg_boxes", "INT32", list(boxes.shape), boxes.tobytes()),
            ("jpeg_layout", "INT32", list(layout.shape), layout.tobytes()),
            ("jpeg_tiles", "BYTES", [len(streams)], length_prefixed(streams)),
        ],
        parameters={"mode": "embedding"},
    )


JPEG_CASES = [
    HttpCase(f"bin-{c.name}", "v2", functools.partial(rest_body, c.build), c.words) for c in CASES
]
"""The REST corpus's rows: each case over V2 binary."""
