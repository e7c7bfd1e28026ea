"""A non-finite row fails its own request only: one batch of two requests, on real packages.

:func:`harness.factories.blank_overflow_model` packages overflow to infinity
on a blank tile and nowhere else. One batch holds request A's tiles (its
tile 1 blank) and request B's: ``forward_batch`` gives A's tile 1 a
:class:`~predictor.errors.NonFiniteOutput` naming the output and the tile,
and every other sample its rows, equal to the package's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.factories import BLANK_OVERFLOW_TARGET
from harness.packages import module_package
from harness.reference import Reference, normalise_reference
from harness.tiles import random_tiles
from predictor.codecs.samples import ModelRequest, ModelResponse
from predictor.errors import NonFiniteOutput
from predictor.families import server_model
from predictor.model.finite import first_beyond, input_limit, non_finite_rows
from predictor.spec import BUILTIN_SPECS


def _model(spec_name: str):
    path = module_package(spec_name, BLANK_OVERFLOW_TARGET)
    spec = BUILTIN_SPECS[spec_name]
    model = server_model(spec, path.name, device="cpu", model_root=path.parent)
    model.load()
    return model, path


def _batch(model, tiles_a: np.ndarray, tiles_b: np.ndarray):
    requests = [ModelRequest(i, pixels=t) for i, t in enumerate(tiles_a)]
    requests += [ModelRequest(i, pixels=t) for i, t in enumerate(tiles_b)]
    samples = [model.prepare_sample(r) for r in requests]
    return model.forward_batch(samples, requests, mode=model.model_spec.default_mode)


@pytest.mark.parametrize(
    ("spec_name", "output"), [("h0-mini", "embedding"), ("tissue-seg", "mask")]
)
def test_a_blank_tile_fails_its_own_sample_and_the_batch_keeps_its_rows(
    spec_name: str, output: str
) -> None:
    model, path = _model(spec_name)
    size = model.model_spec.tile_size
    tiles_a, tiles_b = random_tiles(3, size=size, seed=1), random_tiles(2, size=size, seed=2)
    tiles_a[1] = 255
    responses = _batch(model, tiles_a, tiles_b)
    assert len(responses) == 5
    error = responses[1]
    assert isinstance(error, NonFiniteOutput)
    name = model.family.package_outputs(model.model_spec)[0]
    assert f"output {name!r} is not finite (NaN or infinity) for tile 1" in str(error)
    good = np.concatenate([tiles_a[[0, 2]], tiles_b])
    spec = model.model_spec
    norm = (None, None) if spec.mean is None else (np.float32(spec.mean), np.float32(spec.std))
    (want,) = Reference(path)(normalise_reference(good, *norm))
    got = [r for i, r in enumerate(responses) if i != 1]
    assert all(isinstance(r, ModelResponse) for r in got)
    rows = np.stack([r.outputs[output] for r in got])
    if output == "mask":
        want = (want.squeeze(1) > 0).astype(np.uint8)
        np.testing.assert_array_equal(rows, want)
    else:
        np.testing.assert_allclose(rows, want, rtol=1e-5, atol=1e-6)


def test_non_finite_rows_names_the_first_output_of_each_bad_row() -> None:
    embedding = torch.zeros(4, 3)
    prediction = torch.zeros(4, 2)
    assert non_finite_rows([embedding, prediction], ("embedding", "prediction")) == {}
    embedding[2, 1] = float("inf")
    prediction[2, 0] = prediction[0, 1] = float("nan")
    mask = torch.zeros(4, 2, dtype=torch.uint8)  # not a float: never checked
    bad = non_finite_rows([embedding, prediction, mask], ("embedding", "prediction"))
    assert bad == {2: "embedding", 0: "prediction"}


def test_input_limits_are_the_package_dtype_s() -> None:
    assert input_limit(torch.float16) == 65504.0
    assert input_limit(torch.bfloat16) == float(torch.finfo(torch.bfloat16).max)
    rows = np.array([[1.0, 2.0], [3.0, -7e4]], np.float32)
    assert first_beyond(rows, input_limit(torch.float16)) == (1, -7e4)
    assert first_beyond(rows, input_limit(torch.float32)) is None


def test_finite_values_whose_sum_overflows_are_not_a_failure() -> None:
    """The fast check is a sum: one that overflows on finite values falls back to the exact look."""
    big = torch.full((3, 4), 3e38)
    assert not bool(torch.isfinite(big.sum()))
    assert non_finite_rows([big], ("embedding",)) == {}
    half = torch.full((3, 4), 60000.0, dtype=torch.float16)  # finite; summed in float32
    assert non_finite_rows([half], ("embedding",)) == {}
    half[1, 2] = float("inf")
    assert non_finite_rows([half], ("embedding",)) == {1: "embedding"}
