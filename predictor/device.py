"""Device-side helpers for stage 2: staging, normalisation, error classification.

Tiles stay ``uint8 [H, W, 3]`` until they reach the device; the permute to
CHW and normalisation (``(x/255 - mean) / std``) run there, fused into one
multiply-add, on the whole batch. Batches are staged in a reused host
buffer (pinned on CUDA) and copied with ``non_blocking`` so the copy
overlaps the launch. Each device worker has its own :class:`Normalizer` (so
its own buffer) and, on CUDA with several workers, its own
:class:`WorkerStream`, so one worker's copy and forward overlap another's
compute. :func:`classify_error` tells the batcher how to treat a failure; the
batcher wraps it (:func:`predictor.errors.forward_failure`), nothing here does.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

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
    :mod:`predictor.samples`): stacking them is one memory copy into a
    reused host buffer (pinned on CUDA), the batch crosses to the device as
    ``uint8``, and the permute to CHW happens there, fused with the
    normalisation. The buffer is reused by the next batch, so one normaliser
    serves one worker at a time: every device worker gets its own
    (:meth:`for_another_worker`).
    """

    def __init__(self, spec: ModelSpec, device: torch.device, dtype: torch.dtype):
        mean = torch.tensor(spec.mean or (0.0, 0.0, 0.0), dtype=torch.float32)
        std = torch.tensor(spec.std or (1.0, 1.0, 1.0), dtype=torch.float32)
        # x/255 - mean) / std  ==  x * scale + shift
        self.scale = (1.0 / (255.0 * std)).view(1, 3, 1, 1).to(device)
        self.shift = (-mean / std).view(1, 3, 1, 1).to(device)
        self.device = device
        self.dtype = dtype
        self._host: torch.Tensor | None = None

    @property
    def host_buffer(self) -> torch.Tensor | None:
        """The staging buffer the last batch was stacked into (``None`` before the first)."""
        return self._host

    def for_another_worker(self) -> Normalizer:
        """A normaliser for another worker: same constants (copied), its own staging buffer."""
        twin = object.__new__(Normalizer)
        twin.scale, twin.shift = self.scale.clone(), self.shift.clone()
        twin.device, twin.dtype, twin._host = self.device, self.dtype, None
        return twin

    def stage(self, tiles_hwc: Sequence[np.ndarray]) -> torch.Tensor:
        """Stacks per-tile ``uint8 [H, W, 3]`` arrays into one device batch, still uint8.

        On the CPU the result is a view of the staging buffer: the caller
        must consume it (:meth:`normalise` copies) before the next ``stage``.
        On CUDA the copy is queued on the current stream, which the worker
        synchronises before the buffer is written again.
        """
        shape = (len(tiles_hwc), *tiles_hwc[0].shape)
        if (
            self._host is None
            or self._host.shape[0] < shape[0]
            or self._host.shape[1:] != shape[1:]
        ):
            pinned = self.device.type == "cuda"
            self._host = torch.empty(shape, dtype=torch.uint8, pin_memory=pinned)
        host = self._host[: shape[0]]
        np.stack(tiles_hwc, out=host.numpy())
        if self.device.type != "cuda":
            return host
        return host.to(self.device, non_blocking=True)

    def normalise(self, batch_hwc: torch.Tensor) -> torch.Tensor:
        """Normalised, contiguous ``[B, C, H, W]`` in the package's input dtype (a new tensor)."""
        x = batch_hwc.permute(0, 3, 1, 2).contiguous().to(torch.float32)
        x = torch.addcmul(self.shift, x, self.scale)
        return x if self.dtype == torch.float32 else x.to(self.dtype)

    def __call__(self, tiles_hwc: Sequence[np.ndarray]) -> torch.Tensor:
        return self.normalise(self.stage(tiles_hwc))


def synchronize(device: torch.device) -> None:
    """Waits for the calling thread's current stream on ``device``.

    Only that stream, not the whole device: with several workers on one GPU
    each worker's thread runs on its own stream (:class:`WorkerStream`), and
    a device-wide wait would hold this worker until the others' forwards end.
    Errors of the device (sticky or not) still surface here, inside the
    batch's ``try``.
    """
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


class StreamLike(Protocol):
    """What a device worker needs of its stream (:class:`WorkerStream`, or a test's fake)."""

    def active(self) -> AbstractContextManager[Any]:
        """A context in which the calling thread's work on the device goes to this stream."""

    def synchronize(self) -> None:
        """Blocks until everything queued on this stream has finished."""


class WorkerStream:
    """One device worker's own CUDA stream.

    The AOTInductor loader (``AOTIModelContainerRunnerCuda::run_impl``) runs
    on the current stream of the current device when handed no stream, and
    the normaliser's copy and kernels use the current stream too, so entering
    :meth:`active` around a worker's forward puts its copy, normalisation and
    forward on this stream (and on its device: ``torch.cuda.device`` as well,
    so a worker of ``cuda:1`` never launches on ``cuda:0``'s current stream).

    Torch's pooled streams do not wait for the default stream, so creating
    one first waits for the device: the weights and the normaliser's
    constants, written on the default stream at start-up, are complete
    before this stream reads them.
    """

    def __init__(self, device: torch.device) -> None:
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"a worker stream needs a CUDA device, got {device}")
        torch.cuda.synchronize(device)
        self.device = device
        self.stream = torch.cuda.Stream(device=device)

    @contextmanager
    def active(self) -> Iterator[torch.cuda.Stream]:
        """The stream (and its device) current for the calling thread inside the block."""
        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            yield self.stream

    def synchronize(self) -> None:
        """Blocks the calling thread (GIL released) until this stream's work is done."""
        self.stream.synchronize()


def worker_stream(device: torch.device) -> StreamLike | None:
    """A new stream for one worker on ``device``; ``None`` off CUDA (no streams there)."""
    return WorkerStream(device) if torch.device(device).type == "cuda" else None


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


@dataclass(frozen=True)
class DeviceSlot:
    """What one device worker runs with: a device's package, its own normaliser and stream.

    With several workers (several GPUs under ``--device auto``, or
    ``--instances_per_device`` above 1) each worker gets a slot, bound by its
    thread around each forward (:mod:`predictor.device_workers`). Workers of
    one device share the package (its container holds one model copy per
    instance and hands each concurrent run its own); nothing else mutable is
    shared. ``stream`` is ``None`` off CUDA and for the lone worker (which
    runs on the default stream).
    """

    package: Any  # a predictor.package.loader.LoadedPackage
    normalizer: Normalizer
    stream: StreamLike | None = None


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
