"""``predictor.codecs.jpeg_input``: the jpeg transport's bounds, checked before any decode."""

from __future__ import annotations

import numpy as np
import pytest
import simplejpeg

from predictor.codecs.jpeg_input import jpeg_regions
from predictor.config import LimitsConfig
from predictor.errors import InvalidInput

LIMITS = LimitsConfig(max_image_pixels=512 * 512)


def _stream(width: int = 64, height: int = 64) -> bytes:
    pixels = np.random.default_rng(0).integers(0, 255, (height, width, 3), np.uint8)
    return simplejpeg.encode_jpeg(pixels, quality=90, colorspace="RGB")


def _regions(layout: list[list[int]], boxes: list[list[int]], streams: list[bytes] | None = None):
    streams = streams if streams is not None else [_stream()] * len(layout)
    return jpeg_regions(
        streams,
        np.array(layout, np.int32).reshape(-1, 4),
        np.array(boxes, np.int32).reshape(-1, 4),
        limits=LIMITS,
        tile_size=32,
        interpolation="bicubic",
    )


@pytest.mark.parametrize(
    ("layout", "boxes", "named", "words"),
    [
        ([[0, 0, 64, 64]] * 2, [[0, 0, 32, 32]], "jpeg_layout", "one row per slide tile"),
        ([[0, 0, 0, 64]], [[0, 0, 32, 32]], "jpeg_layout", "w, h in [1,"),
        ([[-1, 0, 64, 64]], [[0, 0, 32, 32]], "jpeg_layout", "x, y must be in"),
        ([[0, 0, 64, 64]], [[0, 0, 600, 600]], "jpeg_boxes", "exceeds the limit"),
        (
            [[0, 0, 64, 64]],
            [[0, 0, 32, 32], [64, 0, 32, 32]],
            "jpeg_boxes",
            "overlaps no slide tile",
        ),
    ],
)
def test_bounds_are_a_400_naming_the_input(layout, boxes, named, words) -> None:
    streams = [_stream()]
    with pytest.raises(InvalidInput) as caught:
        _regions(layout, boxes, streams)
    assert caught.value.input_name == named and words in caught.value.reason


def test_a_box_composes_white_beyond_the_valid_area_and_resizes_to_the_tile() -> None:
    (region,) = _regions([[0, 0, 64, 40]], [[0, 0, 64, 64]])
    assert region.pixels().shape == (32, 32, 3)
    (crop,) = _regions([[0, 0, 64, 40]], [[16, 32, 32, 32]])
    assert (crop.pixels()[8:] == 255).all() and not (crop.pixels()[:8] == 255).all()


def test_a_declared_size_over_the_limit_is_refused_with_the_inputs() -> None:
    with pytest.raises(InvalidInput) as caught:
        _regions([[0, 0, 64, 64]], [[0, 0, 32, 32]], [_stream(1024, 512)])
    assert (caught.value.input_name, caught.value.tile) == ("jpeg_tiles", 0)
    assert "more than the limit" in caught.value.reason


def test_a_bad_header_is_refused_with_the_inputs_naming_its_slide_tile() -> None:
    with pytest.raises(InvalidInput) as caught:
        _regions(
            [[0, 0, 64, 64]] * 2, [[0, 0, 32, 32], [16, 16, 32, 32]], [_stream(), b"\xff\xd8x"]
        )
    assert (caught.value.input_name, caught.value.tile) == ("jpeg_tiles", 1)
    assert "unreadable JPEG header" in caught.value.reason


def test_a_truncated_stream_is_named_for_every_box_that_needs_it_on_the_device() -> None:
    whole = _stream()
    regions = _regions([[0, 0, 64, 64]], [[0, 0, 32, 32], [16, 16, 32, 32]], [whole[:-40]])
    for region in regions:
        with pytest.raises(InvalidInput) as caught:
            region.check_for_device()
        assert (caught.value.input_name, caught.value.tile) == ("jpeg_tiles", 0)
        assert "EOI" in caught.value.reason
