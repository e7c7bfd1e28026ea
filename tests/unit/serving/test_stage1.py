"""Stage-1 pool: order kept, decoding spread over threads, the bad tile named."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
import torch

from predictor.codecs.samples import ModelRequest, PreparedSample
from predictor.errors import InvalidInput
from predictor.serving.stage1 import Stage1Pool


def _prepare_recording(threads):
    def prepare(item: ModelRequest) -> PreparedSample:
        threads.add(threading.current_thread().name)
        if item.image_data == b"bad":
            raise InvalidInput("not an image")
        return PreparedSample(tile=torch.tensor([item.index]))

    return prepare


def test_order_is_kept_and_work_is_spread_over_the_pool():
    pool = Stage1Pool(2)
    threads: set[str] = set()
    items = [ModelRequest(i, image_data=b"png") for i in range(9)]
    samples = asyncio.run(pool.prepare(items, "tiles", _prepare_recording(threads)))
    assert [int(s.tile) for s in samples] == list(range(9))
    assert all(name.startswith("histoserve-prep") for name in threads)
    pool.shutdown()


def test_raw_pixels_are_prepared_inline():
    pool = Stage1Pool(2)
    threads: set[str] = set()
    items = [ModelRequest(i, pixels=np.zeros((1, 1, 3), np.uint8)) for i in range(3)]
    asyncio.run(pool.prepare(items, "pixels", _prepare_recording(threads)))
    assert threads == {threading.current_thread().name}
    pool.shutdown()


def test_first_bad_tile_is_named_with_its_input():
    pool = Stage1Pool(2)
    items = [ModelRequest(i, image_data=b"bad" if i == 5 else b"png") for i in range(8)]
    with pytest.raises(InvalidInput, match="input 'tiles' tile 5: not an image"):
        asyncio.run(pool.prepare(items, "tiles", _prepare_recording(set())))
    pool.shutdown()


def test_workers_must_be_positive():
    with pytest.raises(ValueError, match="workers"):
        Stage1Pool(0)
