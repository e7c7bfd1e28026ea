"""Stage-2 helpers: device normalisation equals the reference; errors classified and wrapped right."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from predictor.device.failures import classify_error
from predictor.device.normalizer import Normalizer
from predictor.errors import DeviceLost, ErrorKind, ForwardError, InvalidInput, forward_failure
from predictor.package.dtypes import dtype_from_name
from predictor.spec import BUILTIN_SPECS


def _tiles(n: int, size: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (n, size, size, 3), dtype=np.uint8)


@pytest.mark.parametrize("spec_name", ["h0-mini", "tissue-seg"])
def test_normaliser_matches_reference_preprocessing(spec_name):
    spec = BUILTIN_SPECS[spec_name]
    tiles = _tiles(3, spec.tile_size)
    got = Normalizer(spec, torch.device("cpu"), torch.float32)(list(tiles))
    ref = tiles.astype(np.float32) / 255.0
    if spec.mean is not None:
        ref = (ref - np.array(spec.mean, np.float32)) / np.array(spec.std, np.float32)
    ref = ref.transpose(0, 3, 1, 2)
    assert got.shape == ref.shape and got.is_contiguous() and got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), ref, atol=1e-5, rtol=1e-5)


def test_normaliser_casts_to_package_dtype():
    spec = BUILTIN_SPECS["h0-mini"]
    tiles = list(_tiles(1, 224))
    assert Normalizer(spec, torch.device("cpu"), torch.bfloat16)(tiles).dtype == torch.bfloat16


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


def test_forward_failure_wraps_once_and_keeps_histoserve_errors():
    cause = RuntimeError("kaput")
    wrapped = forward_failure(cause, name="m", n_items=5, fatal=False)
    assert isinstance(wrapped, ForwardError) and not isinstance(wrapped, DeviceLost)
    assert "batch of 5" in str(wrapped) and "kaput" in str(wrapped)
    assert wrapped.__cause__ is cause
    fatal = forward_failure(RuntimeError("illegal memory access"), name="m", n_items=1, fatal=True)
    assert isinstance(fatal, DeviceLost)
    original = InvalidInput("x")
    assert forward_failure(original, name="m", n_items=1, fatal=False) is original
    assert isinstance(
        forward_failure(ForwardError("x"), name="m", n_items=1, fatal=True), DeviceLost
    )


def test_dtype_from_name():
    assert dtype_from_name("fp16") is torch.float16
    assert dtype_from_name("torch.bfloat16") is torch.bfloat16
    assert dtype_from_name("float32") is torch.float32
    with pytest.raises(ValueError, match="fp64"):
        dtype_from_name("fp64")


def test_the_device_layer_builds_a_packages_slot_and_normaliser(embedding_package_dir):
    """A real package loaded on the CPU: its slot's normaliser follows its device and dtype."""
    from harness.packages import package_in
    from predictor.device.slot import build_slot
    from predictor.package.loader import StartupPhases, inspect_package, open_package

    path, phases = package_in(embedding_package_dir), StartupPhases()
    package = open_package(path, torch.device("cpu"), inspect_package(path, phases), phases)
    spec = BUILTIN_SPECS["h0-mini"]
    slot = build_slot(package, spec)
    assert slot.package is package and slot.stream is None
    assert (slot.normalizer.device, slot.normalizer.dtype) == (package.device, package.input_dtype)
    tiles = list(_tiles(2, spec.tile_size))
    want = Normalizer(spec, torch.device("cpu"), package.input_dtype)(tiles)
    torch.testing.assert_close(slot.normalizer(tiles), want, rtol=0, atol=0)
    assert build_slot(package, spec).normalizer is not slot.normalizer  # one per slot
