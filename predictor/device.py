"""Device-side helpers for stage 2: staging, normalisation, error classification.

Tiles stay ``uint8 [H, W, 3]`` until they reach the device; the permute to
CHW and normalisation (``(x/255 - mean) / std``) run there, fused into one
multiply-add, on the whole batch. On CUDA, batches are staged in a reused
pinned buffer and copied with ``non_blocking`` so the copy overlaps the
launch. :func:`classify_error` tells the batcher how to treat a failure; the
batcher wraps it (:func:`predictor.errors.forward_failure`), nothing here does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from predictor.errors import DeviceLost, ErrorKind
from predictor.spec import ModelSpec

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


class Normalizer:
    """Host ``uint8 [H, W, 3]`` tiles to one normalised ``[B, C, H, W]`` batch on the device.

    Tiles arrive HWC (their one layout from decode on, see
    :mod:`predictor.samples`): stacking them is a plain memory copy, the
    batch crosses to the device as ``uint8``, and the permute to CHW happens
    there, fused with the normalisation.
    """

    def __init__(self, spec: ModelSpec, device: torch.device, dtype: torch.dtype):
        mean = torch.tensor(spec.mean or (0.0, 0.0, 0.0), dtype=torch.float32)
        std = torch.tensor(spec.std or (1.0, 1.0, 1.0), dtype=torch.float32)
        # x/255 - mean) / std  ==  x * scale + shift
        self.scale = (1.0 / (255.0 * std)).view(1, 3, 1, 1).to(device)
        self.shift = (-mean / std).view(1, 3, 1, 1).to(device)
        self.device = device
        self.dtype = dtype
        self._pinned: torch.Tensor | None = None

    def stage(self, tiles_hwc: Sequence[np.ndarray]) -> torch.Tensor:
        """Stacks per-tile ``uint8 [H, W, 3]`` arrays into one device batch, still uint8."""
        shape = (len(tiles_hwc), *tiles_hwc[0].shape)
        if self.device.type != "cuda":
            return torch.from_numpy(np.stack(tiles_hwc))
        if (
            self._pinned is None
            or self._pinned.shape[0] < shape[0]
            or self._pinned.shape[1:] != shape[1:]
        ):
            self._pinned = torch.empty(shape, dtype=torch.uint8, pin_memory=True)
        host = self._pinned[: shape[0]]
        np.stack(tiles_hwc, out=host.numpy())
        return host.to(self.device, non_blocking=True)

    def normalise(self, batch_hwc: torch.Tensor) -> torch.Tensor:
        """Normalised, contiguous ``[B, C, H, W]`` in the package's input dtype."""
        x = batch_hwc.permute(0, 3, 1, 2).contiguous().to(torch.float32)
        x = torch.addcmul(self.shift, x, self.scale)
        return x if self.dtype == torch.float32 else x.to(self.dtype)

    def __call__(self, tiles_hwc: Sequence[np.ndarray]) -> torch.Tensor:
        return self.normalise(self.stage(tiles_hwc))


def synchronize(device: torch.device) -> None:
    """Waits for queued device work so errors surface inside the batch's try."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


@dataclass(frozen=True)
class DeviceSlot:
    """A further device's loaded package and normaliser (``--device auto``, several GPUs).

    Each GPU after the first gets one; its worker thread binds it before a
    forward, so that worker's batches use that device's package and buffers.
    """

    package: Any  # a predictor.package.loader.LoadedPackage
    normalizer: Normalizer


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
