"""Never a 200 with NaN: outputs checked finite on the device, inputs checked against the package's range.

A package exported in FP16 or BF16 overflows where FP32 would not (65504 is
FP16's largest finite value), and a model can overflow on inputs far from
its training range; either way its output is NaN or infinity, and nothing
downstream can tell such a row from a real one. So:

* every floating output of a tile batch is checked on the device, one
  ``isfinite(...).all()`` per output and one synchronisation for the batch
  (:func:`non_finite_rows`); only a batch that fails it pays for finding its
  rows, and each such row fails its own request
  (:class:`~predictor.errors.NonFiniteOutput`, 422 / ``FAILED_PRECONDITION``,
  naming the output and the tile) while the batch's other requests get their
  answers;
* a float input the package computes in a narrower dtype is refused in
  stage 1 when a value is beyond that dtype's finite range
  (:func:`input_limit`, :func:`first_beyond`): a 400 naming the input and
  the tile, before the cast could overflow.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from predictor.device.normalizer import to_host
from predictor.errors import NonFiniteOutput

_FP32_MAX = float(np.finfo(np.float32).max)


def input_limit(dtype: torch.dtype) -> float:
    """The largest magnitude a package computing in ``dtype`` holds without overflow."""
    if not dtype.is_floating_point:
        return _FP32_MAX
    return min(float(torch.finfo(dtype).max), _FP32_MAX)


def first_beyond(values: np.ndarray, limit: float) -> tuple[int, float] | None:
    """``(tile, value)`` of the first value whose magnitude is over ``limit``; None if none.

    ``values`` has the tile axis first (``[N, ...]``).
    """
    if limit >= _FP32_MAX and values.dtype.itemsize <= 4:
        return None  # float32 or narrower: nothing finite is beyond it
    over = np.abs(values) > limit
    if not over.any():
        return None
    tile = int(np.argmax(over.reshape(over.shape[0], -1).any(axis=1)))
    return tile, float(values[tile][over[tile]].flat[0])


class FiniteCheck:
    """Whether each row of a batch's floating outputs is finite, queued on the device.

    Made right after the forward, with the device's turn held: one float32
    sum per row and output is queued, and copied to the host without
    blocking (:func:`~predictor.device.normalizer.to_host`), so nothing
    waits for the device here. :meth:`bad_rows` reads the sums once the
    batch's copies are done (the slot settled). NaN and infinity always
    reach a sum: 30-40 times cheaper on the CPU than ``isfinite(...)``
    (0.3 ms against 12 ms for eight 512x512 logit maps); a row whose sum
    overflows on finite values only costs the exact look, which finds nothing.
    """

    def __init__(self, outputs: Sequence[torch.Tensor], names: Sequence[str]) -> None:
        named = [(names[i] if i < len(names) else f"#{i}", out) for i, out in enumerate(outputs)]
        self._floats = [(n, o) for n, o in named if o.is_floating_point() and o.shape[0] > 0]
        self._sums = None
        if self._floats:
            sums = [
                o.reshape(o.shape[0], -1).sum(dim=1, dtype=torch.float32) for _, o in self._floats
            ]
            self._sums = to_host(torch.stack(sums))

    def bad_rows(self) -> dict[int, str]:
        """Row of the batch -> the first output (by name) that is NaN or infinite in it.

        Empty in the usual case (every sum finite); call it only after the
        batch's copies to the host completed.
        """
        if self._sums is None:
            return {}
        sums = self._sums.numpy()
        if bool(np.isfinite(sums).all()):
            return {}
        bad: dict[int, str] = {}
        for (name, out), row_sums in zip(self._floats, sums, strict=True):
            for row in np.flatnonzero(~np.isfinite(row_sums)).tolist():
                if not bool(torch.isfinite(out[row]).all()):  # exact: an overflowed sum is not
                    bad.setdefault(int(row), name)
        return dict(sorted(bad.items()))


def non_finite_rows(outputs: Sequence[torch.Tensor], names: Sequence[str]) -> dict[int, str]:
    """:meth:`FiniteCheck.bad_rows` of ``outputs``, waiting for the device (tests, one-off checks)."""
    check = FiniteCheck(outputs, names)
    if outputs and outputs[0].is_cuda:
        torch.cuda.synchronize(outputs[0].device)
    return check.bad_rows()


def non_finite_error(output: str, tile: int) -> NonFiniteOutput:
    """The error of one tile whose ``output`` came out NaN or infinite."""
    return NonFiniteOutput(
        f"output {output!r} is not finite (NaN or infinity) for tile {tile}: the model "
        "overflowed on this tile (a package exported in FP16 or BF16, or a tile far from what "
        "it was trained on); the same tile fails on every replica"
    )
