"""``predictor.device.jpeg``: boxes of slide JPEG tiles composed and resized as one device batch.

Run on the CPU with libjpeg-turbo standing in for nvJPEG (:func:`host_decoder`),
so the composition, the resize and the failure isolation are the code a GPU
runs; only the decoder differs there (``bench.gpu.jpeg`` measures it).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.jpeg_slides import corrupt_scan, two_slide_tiles
from predictor.codecs.jpeg_input import jpeg_regions
from predictor.config import LimitsConfig
from predictor.device.jpeg import Box, DeviceJpeg, SlideTiles, host_decoder

CPU = torch.device("cpu")
SLIDE_TILE = 256


def _streams() -> list[bytes]:
    return two_slide_tiles(SLIDE_TILE)


def _corrupt(stream: bytes) -> bytes:
    return corrupt_scan(stream)


LAYOUT = np.array([[0, 0, SLIDE_TILE, SLIDE_TILE], [SLIDE_TILE, 0, SLIDE_TILE, 200]], np.int64)


def _cpu_and_device(size: int, boxes: list[list[int]], streams: list[bytes] | None = None):
    streams = streams or _streams()
    regions = jpeg_regions(
        streams,
        LAYOUT,
        np.array(boxes, np.int64),
        limits=LimitsConfig(),
        tile_size=size,
        interpolation="bicubic",
    )
    tiles = SlideTiles(streams, LAYOUT)
    device_boxes = [Box(tiles, tuple(int(v) for v in r.box), r.overlaps()) for r in regions]
    batch, failed = DeviceJpeg(host_decoder(CPU), CPU, size, "bicubic")(device_boxes)
    return regions, batch.numpy(), failed


BOXES = [[0, 0, 224, 224], [150, 10, 224, 224], [300, 20, 224, 224]]


def test_at_a_matching_level_the_device_batch_is_the_cpu_path_to_the_bit() -> None:
    regions, batch, failed = _cpu_and_device(224, BOXES)
    assert not failed and batch.shape == (3, 224, 224, 3)
    for row, region in enumerate(regions):
        np.testing.assert_array_equal(batch[row], region.pixels())
    assert (batch[2, 200 - 20 :] == 255).all()  # below the edge tile's valid rows: white


def test_a_larger_box_is_resized_antialiased_close_to_pillows_bicubic() -> None:
    regions, batch, failed = _cpu_and_device(112, BOXES)
    assert not failed and batch.shape == (3, 112, 112, 3)
    for row, region in enumerate(regions):
        diff = np.abs(batch[row].astype(int) - region.pixels().astype(int))
        assert diff.mean() < 1.0 and diff.max() <= 12, (row, diff.mean(), diff.max())


def test_a_corrupt_slide_tile_fails_only_the_boxes_that_need_it() -> None:
    good, bad = _streams()
    broken = _corrupt(bad)
    boxes = [[0, 0, 224, 224], [300, 20, 224, 224], [150, 10, 224, 224]]
    regions, batch, failed = _cpu_and_device(224, boxes, [good, broken])
    assert set(failed) == {1, 2} and {f.index for f in failed.values()} == {1}
    assert "corrupt JPEG data" in failed[1].reason
    np.testing.assert_array_equal(batch[0], regions[0].pixels())


def test_many_same_sized_boxes_resize_in_bounded_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    import predictor.device.jpeg as module

    monkeypatch.setattr(module, "MAX_RESIZE_PIXELS", 224 * 224 * 2)  # two canvases per call
    calls = []
    real = torch.nn.functional.interpolate

    def counted(x, *args, **kwargs):
        calls.append(x.shape[0])
        return real(x, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "interpolate", counted)
    _, batch, failed = _cpu_and_device(112, BOXES * 2)
    assert not failed and batch.shape[0] == 6 and calls == [2, 2, 2]


def test_composed_canvases_wait_for_their_resize_only_up_to_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import predictor.device.jpeg as module

    monkeypatch.setattr(module, "MAX_RESIZE_PIXELS", 224 * 224 + 200 * 200)  # one of each size
    calls = []
    real = torch.nn.functional.interpolate

    def counted(x, *args, **kwargs):
        calls.append(tuple(x.shape))
        return real(x, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "interpolate", counted)
    boxes = [[0, 0, 224, 224], [10, 0, 200, 200], [150, 10, 224, 224], [300, 0, 200, 200]]
    regions, batch, failed = _cpu_and_device(112, boxes)
    assert not failed and len(calls) == 4 and all(c[0] == 1 for c in calls)  # flushed by two
    for row, region in enumerate(regions):
        assert np.abs(batch[row].astype(int) - region.pixels().astype(int)).mean() < 1.0
