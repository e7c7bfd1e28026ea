"""How the batcher should treat a failed forward: split it, fail the batch, or give up the device.

The batcher wraps the failure (:func:`predictor.errors.forward_failure`);
nothing here does.
"""

from __future__ import annotations

import torch

from predictor.errors import DeviceLost, ErrorKind

# Messages of CUDA errors after which the context is unusable until restart.
_STICKY_CUDA_ERRORS = (
    "illegal memory access",
    "device-side assert",
    "unspecified launch failure",
    "misaligned address",
    "illegal instruction",
    "uncorrectable ecc",
    "device not ready",
    "cudaerrorlaunchfailure",
)


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def classify_error(exc: BaseException) -> ErrorKind:
    """How the batcher should treat a forward failure: split, fail batch, or give up the device."""
    for err in _chain(exc):
        if isinstance(err, DeviceLost):
            return ErrorKind.FATAL
        if isinstance(err, torch.cuda.OutOfMemoryError):
            return ErrorKind.OOM
        text = str(err).lower()
        if "out of memory" in text:
            return ErrorKind.OOM
        if any(marker in text for marker in _STICKY_CUDA_ERRORS):
            return ErrorKind.FATAL
    return ErrorKind.BATCH
