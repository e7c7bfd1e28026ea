"""The jpeg transport's work bounded before it starts (issue 45, the server's cases).

Real JPEGs (libjpeg-turbo through ``simplejpeg``), the codec's own entry
(:func:`~predictor.codecs.jpeg_input.jpeg_regions`), the default limits
unless a test says otherwise. "Before any decode" is checked by counting the
calls to ``simplejpeg.decode_jpeg``.
"""

from __future__ import annotations

import functools
import io

import numpy as np
import pytest
import simplejpeg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from predictor.codecs.jpeg_input import jpeg_regions
from predictor.codecs.jpeg_plan import MAX_SLIDE_TILES_PER_BOX, check_slide_tile_count
from predictor.config import LimitsConfig
from predictor.errors import InvalidInput

BUDGET = LimitsConfig().max_request_pixels


@functools.cache
def _jpeg(width: int, height: int, seed: int = 0) -> bytes:
    """A valid JPEG of ``width x height`` (flat and Huffman-optimised: 4096 px is 100 kB)."""
    colour = np.random.default_rng(seed).integers(0, 255, 3, np.uint8)
    out = io.BytesIO()
    Image.new("RGB", (width, height), tuple(int(c) for c in colour)).save(
        out, "JPEG", quality=90, optimize=True
    )
    return out.getvalue()


def _regions(streams, layout, boxes, limits: LimitsConfig | None = None, tile_size: int = 224):
    return jpeg_regions(
        streams,
        np.array(layout, np.int64).reshape(-1, 4),
        np.array(boxes, np.int64).reshape(-1, 4),
        limits=limits or LimitsConfig(),
        tile_size=tile_size,
        interpolation="bicubic",
    )


@pytest.fixture
def decodes(monkeypatch) -> list[int]:
    """Every ``simplejpeg.decode_jpeg`` call's stream length, in order."""
    calls: list[int] = []
    real = simplejpeg.decode_jpeg

    def counting(data, *args, **kwargs):
        calls.append(len(data))
        return real(data, *args, **kwargs)

    monkeypatch.setattr(simplejpeg, "decode_jpeg", counting)
    return calls


def _refused(decodes: list[int], *args, **kwargs) -> InvalidInput:
    with pytest.raises(InvalidInput) as caught:
        _regions(*args, **kwargs)
    assert decodes == [], "refused after decoding"
    return caught.value


def test_sixteen_small_jpegs_declaring_4096_px_under_one_box_are_refused_before_decoding(
    decodes,
) -> None:
    """Issue 45, case 1: a 1.6 MB request asking for 16 x 48 MiB of decoded pixels."""
    streams = [_jpeg(4096, 4096, seed) for seed in range(16)]
    assert sum(map(len, streams)) < 2_000_000
    error = _refused(decodes, streams, [[0, 0, 224, 224]] * 16, [[0, 0, 224, 224]])
    assert (error.input_name, error.tile) == ("jpeg_tiles", 4)  # 4 x 4096^2 is the budget
    assert f"{5 * 4096 * 4096} pixels" in error.reason
    assert f"limit of {BUDGET} (max_request_pixels)" in error.reason


def test_sixteen_stacked_tiles_under_256_boxes_are_refused_before_decoding(decodes) -> None:
    """Issue 45, case 2: every box overlaps all 16 slide tiles (work N x S)."""
    streams = [_jpeg(2048, 2048, seed) for seed in range(16)]  # 16 x 2048^2 fits the budget
    boxes = [[0, 0, 2048, 2048]] * 256
    error = _refused(decodes, streams, [[0, 0, 2048, 2048]] * 16, boxes)
    assert (error.input_name, error.tile) == ("jpeg_boxes", 16)  # 16 boxes of 2048^2 cover it
    assert "cover" in error.reason and "max_request_pixels" in error.reason
    error = _refused(decodes, streams, [[0, 0, 2048, 2048]] * 16, boxes[:4])
    assert (error.input_name, error.tile) == ("jpeg_boxes", 1)  # pastes 16 x 2048^2 a box
    assert "paste" in error.reason and "stacked" in error.reason


def test_a_box_over_more_slide_tiles_than_the_bound_is_refused(decodes) -> None:
    side = 9  # 81 disjoint 16 px tiles under one 144 px box
    layout = [[16 * (i % side), 16 * (i // side), 16, 16] for i in range(side * side)]
    error = _refused(decodes, [_jpeg(16, 16)] * len(layout), layout, [[0, 0, 144, 144]])
    assert (error.input_name, error.tile) == ("jpeg_boxes", 0)
    assert (
        f"overlaps 81 slide tiles of 'jpeg_tiles', more than the limit of {MAX_SLIDE_TILES_PER_BOX}"
        in error.reason
    )


def test_a_slide_tile_under_no_box_is_refused_naming_it(decodes) -> None:
    layout = [[0, 0, 256, 256], [256, 0, 256, 256], [4096, 4096, 256, 256]]
    error = _refused(decodes, [_jpeg(256, 256)] * 3, layout, [[100, 0, 224, 224]] * 2)
    assert (error.input_name, error.tile) == ("jpeg_tiles", 2)
    assert "lies under no box" in error.reason


def test_more_slide_tiles_than_the_boxes_may_need_is_refused_from_the_shapes() -> None:
    limits = LimitsConfig()
    check_slide_tile_count(MAX_SLIDE_TILES_PER_BOX, 1, limits)
    with pytest.raises(InvalidInput) as caught:
        check_slide_tile_count(MAX_SLIDE_TILES_PER_BOX + 1, 1, limits)
    assert caught.value.input_name == "jpeg_tiles"
    assert f"expected 1..{MAX_SLIDE_TILES_PER_BOX}" in caught.value.reason
    with pytest.raises(InvalidInput) as caught:  # the per-request cap still holds
        check_slide_tile_count(4 * 1024 + 1, 1024, limits)
    assert f"expected 1..{4 * 1024}" in caught.value.reason


def test_a_box_read_larger_than_a_slide_tile_may_carry_more_than_four_a_box() -> None:
    """The client reads 448 px over 256 px slide tiles (slide A): one box, 3 x 3 of them."""
    layout = [[256 * (i % 3), 256 * (i // 3), 256, 256] for i in range(9)]
    (region,) = _regions([_jpeg(256, 256, i) for i in range(9)], layout, [[100, 100, 448, 448]])
    assert region.overlaps() == tuple(range(9)) and region.pixels().shape == (224, 224, 3)


def test_each_slide_tile_is_decoded_once_and_released_when_no_box_needs_it(decodes) -> None:
    streams = [_jpeg(256, 256, i) for i in range(4)]  # distinct lengths name the tile decoded
    layout = [[256 * i, 0, 256, 256] for i in range(4)]
    boxes = [[0, 0, 224, 224], [200, 0, 224, 224], [400, 0, 224, 224], [700, 0, 224, 224]]
    regions = _regions(streams, layout, boxes)
    tiles = regions[0].tiles
    held = []
    for region in regions:
        region.pixels()
        held.append(tiles.held())
    assert sorted(decodes) == sorted(map(len, streams))  # each once
    # tile 0 held for box 1, then tile 1 for box 2, then tile 2 for box 3; then none
    assert held == [1, 1, 1, 0]
    again = regions[1].pixels()  # asked again: decoded again, not kept
    np.testing.assert_array_equal(again, regions[1].pixels())
    assert tiles.held() == 0


def test_a_request_at_the_budget_is_served_and_holds_at_most_what_its_boxes_still_need(
    decodes,
) -> None:
    """The largest allowed shape: slide tiles on a grid declaring exactly the budget."""
    limits = LimitsConfig(max_request_pixels=16 * 256 * 256)
    layout = [[256 * (i % 4), 256 * (i // 4), 256, 256] for i in range(16)]
    boxes = [[256 * (i % 4), 256 * (i // 4), 256, 256] for i in range(16)]
    regions = _regions([_jpeg(256, 256, i) for i in range(16)], layout, boxes, limits)
    peak = 0
    for region in regions:
        assert region.pixels().shape == (224, 224, 3)
        peak = max(peak, regions[0].tiles.held())
    assert len(decodes) == 16 and peak == 0  # each box its own slide tile, released at once
    with pytest.raises(InvalidInput) as caught:
        _regions([_jpeg(256, 256, i) for i in range(16)], layout, boxes,
                 LimitsConfig(max_request_pixels=16 * 256 * 256 - 1))  # fmt: skip
    assert caught.value.input_name == "jpeg_boxes"  # one pixel less: its boxes cover too much


_rect = st.tuples(st.integers(0, 96), st.integers(0, 96), st.integers(1, 40), st.integers(1, 40))
_square = st.tuples(st.integers(0, 96), st.integers(0, 96), st.integers(1, 40)).map(
    lambda r: (*r, r[2])
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layout=st.lists(_rect, min_size=1, max_size=10),
    boxes=st.lists(st.one_of(_square, _rect), min_size=1, max_size=6),
    budget=st.integers(400, 30_000),
)
def test_a_request_is_refused_exactly_when_a_bound_is_broken_and_composes_as_sent(
    layout, boxes, budget
) -> None:
    """Against a brute-force reading of the rules: no false refusal, no missed one; what
    passes composes each box as the tiles pasted in order over white, each decoded once."""
    streams = [_jpeg(40, 40, i) for i in range(len(layout))]  # declares 1,600 px each
    overlaps = [
        [i for i, (tx, ty, tw, th) in enumerate(layout)
         if tx < bx + bw and bx < tx + tw and ty < by + bh and by < ty + th]
        for bx, by, bw, bh in boxes
    ]  # fmt: skip
    pasted = sum(
        (min(bx + bw, layout[i][0] + layout[i][2]) - max(bx, layout[i][0]))
        * (min(by + bh, layout[i][1] + layout[i][3]) - max(by, layout[i][1]))
        for (bx, by, bw, bh), tiles in zip(boxes, overlaps, strict=True)
        for i in tiles
    )
    broken = (
        any(w != h for _, _, w, h in boxes)  # a box is square (issue 53)
        or sum(w * h for _, _, w, h in boxes) > budget
        or any(not 0 < len(o) <= MAX_SLIDE_TILES_PER_BOX for o in overlaps)
        or set(range(len(layout))) - {i for o in overlaps for i in o}
        or pasted > budget
        or 1600 * len(layout) > budget
    )
    limits = LimitsConfig(max_request_pixels=budget)
    calls: list[int] = []
    real = simplejpeg.decode_jpeg
    try:
        simplejpeg.decode_jpeg = lambda data, *a, **k: calls.append(id(data)) or real(data, *a, **k)
        try:
            regions = _regions(streams, layout, boxes, limits, tile_size=16)
        except InvalidInput as exc:
            assert broken, exc
            assert exc.input_name in ("jpeg_tiles", "jpeg_boxes") and exc.tile is not None
            assert not calls
            return
        assert not broken
        for region, (bx, by, bw, bh), tiles in zip(regions, boxes, overlaps, strict=True):
            assert region.overlaps() == tuple(tiles)
            want = np.full((bh, bw, 3), 255, np.uint8)
            for i in tiles:
                tx, ty, tw, th = layout[i]
                decoded = real(streams[i], colorspace="RGB", fastdct=False, fastupsample=False)
                x0, y0 = max(bx, tx), max(by, ty)
                x1, y1 = min(bx + bw, tx + tw), min(by + bh, ty + th)
                want[y0 - by : y1 - by, x0 - bx : x1 - bx] = decoded[
                    y0 - ty : y1 - ty, x0 - tx : x1 - tx
                ]
            if (bw, bh) != (16, 16):
                want = np.asarray(Image.fromarray(want).resize((16, 16), Image.Resampling.BICUBIC))
            np.testing.assert_array_equal(region.pixels(), want)
        assert len(calls) == len(set(calls)) == len(layout)  # each slide tile decoded once
        assert regions[0].tiles.held() == 0
    finally:
        simplejpeg.decode_jpeg = real


def test_the_plan_in_blocks_of_boxes_is_the_plan_at_once(monkeypatch) -> None:
    """A server with a larger ``--max_tiles_per_request`` never tests N x S pairs at once."""
    import predictor.codecs.jpeg_plan as plan

    layout = np.array([[16 * (i % 8), 16 * (i // 8), 16, 16] for i in range(64)], np.int64)
    boxes = np.array([[8 * (i % 14), 8 * (i // 14), 24, 24] for i in range(196)], np.int64)
    whole = plan.plan_boxes(layout, boxes, LimitsConfig())
    monkeypatch.setattr(plan, "MATRIX_CELLS", 3 * len(layout))  # blocks of three boxes
    blocks = plan.plan_boxes(layout, boxes, LimitsConfig())
    assert len(whole.overlaps) == len(blocks.overlaps) == len(boxes)
    for a, b in zip(whole.overlaps, blocks.overlaps, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(whole.needs, blocks.needs)
    boxes[100] = [0, 0, 128, 128]  # 64 slide tiles: at the bound; one more row over it
    plan.plan_boxes(layout, boxes, LimitsConfig())
    with pytest.raises(InvalidInput) as caught:
        plan.plan_boxes(np.concatenate([layout, [[0, 0, 8, 8]]]), boxes, LimitsConfig())
    assert (caught.value.input_name, caught.value.tile) == ("jpeg_boxes", 100)
