"""Stage-2 helpers: device normalisation equals the reference; errors classified right."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from predictor.batcher import ErrorKind
from predictor.device import Normalizer, as_forward_error, classify_error, dtype_from_name
from predictor.errors import DeviceLost, ForwardError, InvalidInput
from predictor.spec import BUILTIN_SPECS


def _tiles(n: int, size: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (n, size, size, 3), dtype=np.uint8)


@pytest.mark.parametrize("spec_name", ["h0-mini", "tissue-seg"])
def test_normaliser_matches_reference_preprocessing(spec_name):
    spec = BUILTIN_SPECS[spec_name]
    tiles = _tiles(3, spec.tile_size)
    views = [torch.from_numpy(t).permute(2, 0, 1) for t in tiles]
    got = Normalizer(spec, torch.device("cpu"), torch.float32)(views)
    ref = tiles.astype(np.float32) / 255.0
    if spec.mean is not None:
        ref = (ref - np.array(spec.mean, np.float32)) / np.array(spec.std, np.float32)
    ref = ref.transpose(0, 3, 1, 2)
    assert got.shape == ref.shape and got.is_contiguous() and got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), ref, atol=1e-5, rtol=1e-5)


def test_normaliser_casts_to_package_dtype():
    spec = BUILTIN_SPECS["h0-mini"]
    views = [torch.from_numpy(t).permute(2, 0, 1) for t in _tiles(1, 224)]
    assert Normalizer(spec, torch.device("cpu"), torch.bfloat16)(views).dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"), ErrorKind.OOM),
        (RuntimeError("CUDA error: an illegal memory access was encountered"), ErrorKind.FATAL),
        (RuntimeError("device-side assert triggered"), ErrorKind.FATAL),
        (DeviceLost("gone"), ErrorKind.FATAL),
        (RuntimeError("shape mismatch"), ErrorKind.BATCH),
        (ValueError("boom"), ErrorKind.BATCH),
    ],
)
def test_classify_error(exc, kind):
    assert classify_error(exc) is kind


def test_classify_follows_the_cause_chain():
    try:
        try:
            raise RuntimeError("CUDA out of memory")
        except RuntimeError as inner:
            raise ForwardError("batch failed") from inner
    except ForwardError as outer:
        assert classify_error(outer) is ErrorKind.OOM


def test_as_forward_error_wraps_and_keeps_histoserve_errors():
    wrapped = as_forward_error(RuntimeError("kaput"), 5)
    assert isinstance(wrapped, ForwardError) and not isinstance(wrapped, DeviceLost)
    assert "5 tiles" in str(wrapped) and "kaput" in str(wrapped)
    assert isinstance(as_forward_error(RuntimeError("illegal memory access"), 1), DeviceLost)
    original = InvalidInput("x")
    assert as_forward_error(original, 1) is original


def test_dtype_from_name():
    assert dtype_from_name("fp16") is torch.float16
    assert dtype_from_name("torch.bfloat16") is torch.bfloat16
    with pytest.raises(ValueError, match="fp64"):
        dtype_from_name("fp64")
