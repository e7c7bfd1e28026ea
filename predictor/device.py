"""Device-side helpers for stage 2: staging, normalisation, error classes.

Tiles stay ``uint8`` until they reach the device; normalisation
(``(x/255 - mean) / std``) runs there, fused into one multiply-add, on the
whole batch. On CUDA, batches are staged in a reused pinned buffer and copied
with ``non_blocking`` so the copy overlaps the launch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from predictor.batcher import ErrorKind
from predictor.errors import DeviceLost, ForwardError, HistoserveError
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

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class Normalizer:
    """``uint8 [B, H, W, C]`` on the host to normalised ``[B, C, H, W]`` on the device."""

    def __init__(self, spec: ModelSpec, device: torch.device, dtype: torch.dtype):
        mean = torch.tensor(spec.mean or (0.0, 0.0, 0.0), dtype=torch.float32)
        std = torch.tensor(spec.std or (1.0, 1.0, 1.0), dtype=torch.float32)
        # x/255 - mean) / std  ==  x * scale + shift
        self.scale = (1.0 / (255.0 * std)).view(1, 3, 1, 1).to(device)
        self.shift = (-mean / std).view(1, 3, 1, 1).to(device)
        self.device = device
        self.dtype = dtype
        self._pinned: torch.Tensor | None = None

    def stage(self, tiles_chw: Sequence[torch.Tensor]) -> torch.Tensor:
        """Stacks per-tile ``uint8 [C, H, W]`` views into one device batch, still uint8."""
        hwc = [t.permute(1, 2, 0) for t in tiles_chw]
        if self.device.type != "cuda":
            return torch.stack(hwc)
        shape = (len(hwc), *hwc[0].shape)
        if (
            self._pinned is None
            or self._pinned.shape[0] < shape[0]
            or self._pinned.shape[1:] != shape[1:]
        ):
            self._pinned = torch.empty(shape, dtype=torch.uint8, pin_memory=True)
        host = self._pinned[: shape[0]]
        torch.stack(hwc, out=host)
        return host.to(self.device, non_blocking=True)

    def normalise(self, batch_hwc: torch.Tensor) -> torch.Tensor:
        """Normalised, contiguous ``[B, C, H, W]`` in the package's input dtype."""
        x = batch_hwc.permute(0, 3, 1, 2).contiguous().to(torch.float32)
        x = torch.addcmul(self.shift, x, self.scale)
        return x if self.dtype == torch.float32 else x.to(self.dtype)

    def __call__(self, tiles_chw: Sequence[torch.Tensor]) -> torch.Tensor:
        return self.normalise(self.stage(tiles_chw))


def dtype_from_name(name: str) -> torch.dtype:
    """``fp32``/``fp16``/``bf16`` (or a torch dtype string) to a torch dtype."""
    if name in _DTYPES:
        return _DTYPES[name]
    key = name.removeprefix("torch.")
    for label, dtype in (
        ("float32", torch.float32),
        ("float16", torch.float16),
        ("bfloat16", torch.bfloat16),
    ):
        if key == label:
            return dtype
    raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(_DTYPES)}")


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


def as_forward_error(exc: BaseException, n_tiles: int) -> HistoserveError:
    """Wraps a stage-2 exception into the error the batch's requests get."""
    if isinstance(exc, HistoserveError):
        return exc
    kind = classify_error(exc)
    cls = DeviceLost if kind is ErrorKind.FATAL else ForwardError
    return cls(f"forward failed for a batch of {n_tiles} tiles: {type(exc).__name__}: {exc}")
