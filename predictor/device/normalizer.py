"""Stage 2 on the device: host uint8 HWC tiles to one normalised batch, and the wait for it.

Tiles stay ``uint8 [H, W, 3]`` until they reach the device; the permute to
CHW and normalisation (``(x/255 - mean) / std``) run there, fused into one
multiply-add, on the whole batch. Batches are staged in a reused host
buffer (pinned on CUDA) and copied with ``non_blocking`` so the copy
overlaps the launch. Each device worker has its own :class:`Normalizer`
(so its own buffer).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from predictor.spec import ModelSpec


class Normalizer:
    """Host ``uint8 [H, W, 3]`` tiles to one normalised ``[B, C, H, W]`` batch on the device.

    Tiles arrive HWC (their one layout from decode on, see
    :mod:`predictor.codecs.samples`): stacking them is one memory copy into a
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
        # The CPU path's per-channel multiply-add: a Python float and a 0-d tensor each.
        self._planes = [
            (float(a), b.clone()) for a, b in zip(1.0 / (255.0 * std), -mean / std, strict=True)
        ]
        self.device = device
        self.dtype = dtype
        self._host: torch.Tensor | None = None
        self._out: torch.Tensor | None = None  # CPU only: the reused float32 batch
        self._capacity = 0  # tiles the staging buffer is sized for when first allocated
        self.handoff: Callable[[torch.Tensor], None] | None = None
        """Called with each staged batch before it is normalised (a pipelined lane's turn)."""

    @property
    def host_buffer(self) -> torch.Tensor | None:
        """The staging buffer the last batch was stacked into (``None`` before the first)."""
        return self._host

    def for_another_worker(self) -> Normalizer:
        """A normaliser for another worker: same constants (copied), its own staging buffer."""
        twin = object.__new__(Normalizer)
        twin.scale, twin.shift = self.scale.clone(), self.shift.clone()
        twin.device, twin.dtype, twin._host, twin._out = self.device, self.dtype, None, None
        twin._capacity, twin._planes = self._capacity, self._planes  # read only: shared
        twin.handoff = None
        return twin

    def reserve(self, max_batch: int) -> None:
        """Sizes the staging buffer, when it is first allocated, for ``max_batch`` tiles.

        Pinned host memory is slow to allocate (``cudaHostAlloc`` maps and
        locks pages) and is never handed back to the OS while the process
        lives, so a buffer that grows batch by batch pays the allocation
        again at each new size and keeps every old one cached: sized once
        for the largest batch, it is allocated once.
        """
        self._capacity = max(self._capacity, max_batch)

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
            rows = max(shape[0], self._capacity)
            self._host = torch.empty((rows, *shape[1:]), dtype=torch.uint8, pin_memory=pinned)
        host = self._host[: shape[0]]
        np.stack(tiles_hwc, out=host.numpy())
        if self.device.type != "cuda":
            return host
        return host.to(self.device, non_blocking=True)

    def normalise(self, batch_hwc: torch.Tensor) -> torch.Tensor:
        """Normalised, contiguous ``[B, C, H, W]`` in the package's input dtype.

        On the CPU the float32 result lives in a reused buffer (valid until
        this normaliser's next call; a float32 package gets a view of it):
        fresh 19 MB tensors per batch of 32 were faulted in page by page
        each batch (docs/performance.md, "gRPC's two regimes: the cause").
        On CUDA, a new tensor.
        """
        if self.device.type == "cuda":
            x = batch_hwc.permute(0, 3, 1, 2).contiguous().to(torch.float32)
            x = torch.addcmul(self.shift, x, self.scale)
        else:
            x = self._float_out(batch_hwc.shape)
            self._normalise_cpu(batch_hwc, x)
        return x if self.dtype == torch.float32 else x.to(self.dtype)

    def _normalise_cpu(self, batch_hwc: torch.Tensor, out: torch.Tensor) -> None:
        """``out[:, c] = x[..., c] * scale[c] + shift[c]``, one channel at a time.

        A contiguous ``[B, H, W]`` plane per channel makes both passes (the
        strided uint8 -> float32 copy, then one multiply-add with scalars)
        vectorise: 1.7x faster than one permuted copy and a broadcast
        ``addcmul`` over ``[B, C, H, W]``, with the same bits.
        """
        for c, (scale, shift) in enumerate(self._planes):
            plane = out[:, c]
            plane.copy_(batch_hwc[..., c])
            torch.add(shift, plane, alpha=scale, out=plane)

    def _float_out(self, shape_bhwc: torch.Size) -> torch.Tensor:
        """The reused CPU float32 ``[B, C, H, W]`` buffer for a batch of this shape."""
        rows, height, width, channels = shape_bhwc
        chw = (channels, height, width)
        if self._out is None or self._out.shape[0] < rows or self._out.shape[1:] != chw:
            self._out = torch.empty((max(rows, self._capacity), *chw), dtype=torch.float32)
        return self._out[:rows]

    def __call__(self, tiles_hwc: Sequence[np.ndarray]) -> torch.Tensor:
        """Stages, hands over (:attr:`handoff`, when set), then normalises one batch."""
        staged = self.stage(tiles_hwc)
        if self.handoff is not None:
            self.handoff(staged)
        return self.normalise(staged)


def unshared(outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``outputs``, each one that shares memory with an input replaced by a copy.

    A CPU batch lives in the normaliser's reused buffer (:meth:`Normalizer.normalise`),
    so an output that is a view of it (a package returning ``x.flatten(1)``)
    would be overwritten by the next batch while its answers are encoded.
    """
    held = {t.untyped_storage().data_ptr() for t in inputs}
    return [o.clone() if o.untyped_storage().data_ptr() in held else o for o in outputs]


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
