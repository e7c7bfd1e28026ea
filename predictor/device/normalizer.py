"""Stage 2 on the device: host uint8 HWC tiles to one normalised batch, and the wait for it.

Tiles stay ``uint8 [H, W, 3]`` until they reach the device; the permute to
CHW and normalisation (``(x/255 - mean) / std``) run there as one fused
multiply-add into a reused buffer, on the whole batch. Batches are staged in
a reused host buffer (pinned on CUDA) and copied with ``non_blocking`` so
the copy overlaps the launch; the buffer is rewritten only once that copy's
event has completed. Each device worker has its own :class:`Normalizer`
(so its own buffers). Outputs come back the same way (:func:`to_host`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import torch

from predictor.device.streams import CurrentStream
from predictor.spec import ModelSpec


class Fence(Protocol):
    """Where a staging copy's event is recorded and waited for (a lane's copy stream, or a fake)."""

    def record(self) -> Any:
        """An event marking the work queued so far (the staging copy just queued)."""

    def wait_host(self, event: Any) -> None:
        """Blocks the calling thread until ``event`` has completed."""


class Normalizer:
    """Host ``uint8 [H, W, 3]`` tiles to one normalised ``[B, C, H, W]`` batch on the device.

    Tiles arrive HWC (their one layout from decode on, see
    :mod:`predictor.codecs.samples`): stacking them is one memory copy into a
    reused host buffer (pinned on CUDA), the batch crosses to the device as
    ``uint8``, and the permute to CHW happens there, fused with the
    normalisation. The buffer is reused by the next batch, so one normaliser
    serves one worker at a time: every device worker gets its own
    (:meth:`for_another_worker`).

    On CUDA every staging copy records an event on :attr:`fence` (the
    calling thread's current stream: a lane's copy stream in a pipeline)
    and the buffer is not written again before that event has
    completed, however often one batch stages (an out-of-memory retry, a
    family staging twice). ``scale`` and ``shift`` are made once, on the
    loading thread's stream before any worker stream exists (a
    :class:`~predictor.device.streams.WorkerStream` waits for the device
    when it is created), and only read after: every worker's normaliser
    shares them.
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
        self._out: torch.Tensor | None = None  # the reused normalised batch (float32 on the CPU)
        self._copied: Any = None  # the last staging copy's event, until waited for
        self._capacity = 0  # tiles the staging buffer is sized for when first allocated
        self.fence: Fence | None = CurrentStream(device) if device.type == "cuda" else None
        """Where each staging copy's event is recorded (``None``: no asynchronous copy)."""
        self.handoff: Callable[[torch.Tensor, Any], None] | None = None
        """Called with each staged batch and its copy's event before it is normalised
        (a pipelined lane's turn)."""

    @property
    def host_buffer(self) -> torch.Tensor | None:
        """The staging buffer the last batch was stacked into (``None`` before the first)."""
        return self._host

    def for_another_worker(self) -> Normalizer:
        """A normaliser for another worker: the same (read-only) constants, its own buffers."""
        twin = object.__new__(Normalizer)
        twin.scale, twin.shift, twin._planes = self.scale, self.shift, self._planes
        twin.device, twin.dtype, twin._host, twin._out = self.device, self.dtype, None, None
        twin._copied, twin._capacity, twin.handoff = None, self._capacity, None
        twin.fence = CurrentStream(self.device) if self.device.type == "cuda" else None
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
        On CUDA the copy is queued on the current stream and its event
        recorded on :attr:`fence`; the next ``stage`` waits for that event
        before it writes the buffer.
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
        if self._copied is not None:  # the last copy out of this buffer must have finished
            self.fence.wait_host(self._copied)  # type: ignore[union-attr]
            self._copied = None
        np.stack(tiles_hwc, out=host.numpy())
        staged = host if self.device.type != "cuda" else host.to(self.device, non_blocking=True)
        if self.fence is not None:
            self._copied = self.fence.record()
        return staged

    def normalise(self, batch_hwc: torch.Tensor) -> torch.Tensor:
        """Normalised, contiguous ``[B, C, H, W]`` in the package's input dtype.

        On the CPU the float32 result lives in a reused buffer (valid until
        this normaliser's next call; a float32 package gets a view of it):
        fresh 19 MB tensors per batch of 32 were faulted in page by page
        each batch (docs/performance.md, "gRPC's two regimes: the cause").
        On CUDA, one fused kernel (:func:`fused_normalise`) into a reused
        buffer of the package's dtype, valid until the next call on the same
        stream (the worker's next batch is queued behind this one's forward).
        """
        if self.device.type == "cuda":
            out = self._reused_out(batch_hwc.shape, self.dtype)
            return fused_normalise(batch_hwc, self.scale, self.shift, out)
        x = self._reused_out(batch_hwc.shape, torch.float32)
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

    def _reused_out(self, shape_bhwc: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        """The reused ``[B, C, H, W]`` buffer (on the device) for a batch of this shape."""
        rows, height, width, channels = shape_bhwc
        chw = (channels, height, width)
        out = self._out
        if out is None or out.shape[0] < rows or out.shape[1:] != chw or out.dtype != dtype:
            if out is not None and out.is_cuda:  # freed only once this stream is past it
                out.record_stream(torch.cuda.current_stream(self.device))
            size = (max(rows, self._capacity), *chw)
            out = self._out = torch.empty(size, dtype=dtype, device=self.device)
        return out[:rows]

    def __call__(self, tiles_hwc: Sequence[np.ndarray]) -> torch.Tensor:
        """Stages, hands over (:attr:`handoff`, when set), then normalises one batch."""
        staged = self.stage(tiles_hwc)
        if self.handoff is not None:
            self.handoff(staged, self._copied)
        return self.normalise(staged)


def fused_normalise(
    batch_hwc: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """``out = batch.permute(0, 3, 1, 2) * scale + shift``: one kernel, no temporaries.

    The uint8 ``[B, H, W, 3]`` batch is read through its permuted view and
    promoted in the kernel; the float32 result is cast to ``out``'s dtype as
    it is written (the same bits as normalising in float32, then casting).
    """
    return torch.addcmul(shift, batch_hwc.permute(0, 3, 1, 2), scale, out=out)


def to_host(output: torch.Tensor) -> torch.Tensor:
    """``output`` on the host: on CUDA a non-blocking copy into pinned memory, queued only.

    The copy runs on the current stream; wait for it (the lane's release,
    or :func:`synchronize`) before reading the result. The pinned block
    comes from torch's caching host allocator, which reuses it only once
    the copy's event has completed and the tensor (and every answer viewing
    it) is gone, so answers being encoded are never overwritten by the
    lane's next batch, as a fixed per-lane buffer would be. Off CUDA,
    ``output.cpu()`` (the tensor itself on the CPU).
    """
    if not output.is_cuda:
        return output.cpu()
    host = torch.empty(output.shape, dtype=output.dtype, pin_memory=True)
    return host.copy_(output, non_blocking=True)


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
