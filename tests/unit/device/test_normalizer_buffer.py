"""The CPU normaliser writes every batch into one reused float32 buffer (no per-batch tensors).

Fresh per-batch tensors (a uint8 NCHW copy and two float32 ones, 1.3 MB a
tile) were faulted in page by page on every batch of 32 in a live server:
~330 minor page faults and ~0.6 ms of the device worker's CPU per request,
the slow regime of docs/performance.md ("gRPC's two regimes: the
cause"). These tests pin the reuse and the guard that keeps an output
aliasing the buffer from being overwritten by the next batch.
"""

from __future__ import annotations

import resource

import numpy as np
import torch

from predictor.device.normalizer import Normalizer, unshared
from predictor.spec import BUILTIN_SPECS

SPEC = BUILTIN_SPECS["h0-mini"]


def _tiles(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return list(rng.integers(0, 256, (n, SPEC.tile_size, SPEC.tile_size, 3), dtype=np.uint8))


def _reference(tiles: list[np.ndarray], normaliser: Normalizer) -> torch.Tensor:
    x = torch.from_numpy(np.stack(tiles)).permute(0, 3, 1, 2).contiguous().to(torch.float32)
    return torch.addcmul(normaliser.shift, x, normaliser.scale)


def test_consecutive_cpu_batches_share_one_float_buffer_and_stay_exact():
    normaliser = Normalizer(SPEC, torch.device("cpu"), torch.float32)
    normaliser.reserve(32)
    full, small = _tiles(32, 0), _tiles(7, 1)
    first = normaliser(full)
    assert torch.equal(first, _reference(full, normaliser))
    second = normaliser(small)  # ``first`` still referenced: a new tensor would get new memory
    assert second.data_ptr() == first.data_ptr()
    assert second.shape == (7, 3, SPEC.tile_size, SPEC.tile_size) and second.is_contiguous()
    assert torch.equal(second, _reference(small, normaliser))


def test_a_batch_larger_than_the_buffer_grows_it_once():
    normaliser = Normalizer(SPEC, torch.device("cpu"), torch.float32)
    normaliser(_tiles(2, 0))
    bigger = _tiles(5, 2)
    grown = normaliser(bigger)
    assert torch.equal(grown, _reference(bigger, normaliser))
    assert normaliser(_tiles(3, 3)).data_ptr() == grown.data_ptr()


def test_another_workers_normaliser_has_its_own_buffer():
    normaliser = Normalizer(SPEC, torch.device("cpu"), torch.float32)
    twin = normaliser.for_another_worker()
    tiles = _tiles(4, 4)
    assert normaliser(tiles).data_ptr() != twin(tiles).data_ptr()


def test_a_low_precision_package_gets_its_dtype_from_the_buffer():
    normaliser = Normalizer(SPEC, torch.device("cpu"), torch.bfloat16)
    tiles = _tiles(3, 5)
    got = normaliser(tiles)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, _reference(tiles, normaliser).to(torch.bfloat16))


def test_full_batches_fault_no_pages_once_the_buffer_exists():
    """~330 faults a tile before (in a live server); a bound of one page per batch here."""
    normaliser = Normalizer(SPEC, torch.device("cpu"), torch.float32)
    normaliser.reserve(32)
    batches = [_tiles(32, 6), _tiles(32, 7)]
    normaliser(batches[0])
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    for i in range(10):
        normaliser(batches[i % 2])
    assert resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before <= 10


def test_unshared_copies_only_outputs_that_alias_an_input():
    normaliser = Normalizer(SPEC, torch.device("cpu"), torch.float32)
    batch = normaliser(_tiles(2, 8))
    view, fresh = batch.flatten(1)[:, :4], batch.mean(dim=(2, 3))
    kept_view, kept_fresh = unshared([view, fresh], [batch])
    assert kept_fresh is fresh
    assert kept_view.untyped_storage().data_ptr() != batch.untyped_storage().data_ptr()
    expected = view.clone()
    normaliser(_tiles(2, 9))  # the next batch overwrites the buffer, not the copy
    assert torch.equal(kept_view, expected) and not torch.equal(view, expected)
