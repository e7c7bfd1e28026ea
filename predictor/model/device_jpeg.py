"""Where a served model decodes the jpeg transport's tiles: stage 1 on the CPU, or the batch's device.

:class:`JpegDecodePlace` is decided once per served model from
``--jpeg_decode`` and the devices it serves on. With the device chosen,
stage 1 only checks a region (:meth:`~predictor.codecs.jpeg_input.JpegRegion.check_for_device`)
and hands it on as the sample's tile; stage 2 then swaps every such tile for
its pixels decoded on the worker's device (:meth:`JpegDecodePlace.on_device`)
before the batch is normalised. Every request on a server where nvJPEG
cannot run decodes in stage 1; on one where it runs, a request too large
for the device is refused rather than decoded elsewhere than its answer
says (:meth:`~predictor.model.served_package.ServedPackage.answer_parameters`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

import numpy as np
import torch

from predictor.codecs.jpeg_input import JPEG_TILES, JpegRegion
from predictor.codecs.samples import PreparedSample, tile_hwc
from predictor.device.jpeg import (
    DEVICE_FILTERS,
    Box,
    Decoder,
    DeviceJpeg,
    SlideTiles,
    nvjpeg_decoder,
)
from predictor.errors import InvalidInput

logger = logging.getLogger(__name__)


class JpegDecodePlace:
    """Where jpeg-transport tiles decode, and the per-device decoders when on the device.

    Args:
        setting: ``--jpeg_decode``: ``cpu`` or ``device``.
        device: The model's first device (``cpu``, ``cuda:N``).
        tile_size: The spec's tile edge.
        interpolation: The spec's resize filter.
        decoder: Builds a device's decoder (nvJPEG by default; the tests pass
            :func:`~predictor.device.jpeg.host_decoder` to run the device
            path on the CPU).
    """

    def __init__(
        self,
        setting: str,
        device: torch.device,
        tile_size: int,
        interpolation: str,
        decoder: Callable[[torch.device], Decoder | None] | None = None,
    ) -> None:
        self._tile_size = tile_size
        self._interpolation = interpolation
        self._make = decoder or nvjpeg_decoder
        self._decoders: dict[torch.device, DeviceJpeg] = {}
        self._lock = threading.Lock()
        self.on_device_enabled = self._decide(setting, device, interpolation)

    def _decide(self, setting: str, device: torch.device, interpolation: str) -> bool:
        if setting == "cpu":
            return False
        if interpolation not in DEVICE_FILTERS:
            logger.info("JPEG tiles decode on the CPU: the spec's %r filter", interpolation)
            return False
        if self._make is nvjpeg_decoder and device.type != "cuda":
            return False
        decode = self._make(device)
        if decode is None:
            return False
        self._decoders[device] = DeviceJpeg(decode, device, self._tile_size, interpolation)
        logger.info("JPEG tiles decode on %s (--jpeg_decode %s)", device, setting)
        return True

    def defer(self, region: JpegRegion) -> bool:
        """Stage 1: whether ``region`` waits for the device (checked), else decode it now.

        On the device means on the device for every request: one too large
        for it is refused (a 400 naming the limit), never decoded on the CPU
        while its answer says ``device``.

        Raises:
            InvalidInput: A slide tile the region needs fails its checks.
        """
        if not self.on_device_enabled:
            return False
        region.check_for_device()
        return True

    def on_device(
        self, samples: Sequence[PreparedSample], device: torch.device
    ) -> tuple[list[PreparedSample], dict[int, InvalidInput]]:
        """Stage 2: each deferred region swapped for its tile on ``device``; failures by row.

        A failed row keeps a white tile so the batch runs whole; its caller
        answers that row with the error.
        """
        rows = [row for row, s in enumerate(samples) if isinstance(s.tile, JpegRegion)]
        if not rows:
            return list(samples), {}
        slide: dict[int, SlideTiles] = {}
        boxes = []
        for row in rows:
            region: JpegRegion = samples[row].tile  # type: ignore[assignment]
            tiles = region.tiles
            owner = slide.setdefault(id(tiles), SlideTiles(tiles.streams, tiles.layout))
            x, y, w, h = (int(v) for v in region.box)
            boxes.append(Box(owner, (x, y, w, h), region.overlaps()))
        batch, failed = self._decoder(device)(boxes)
        out = list(samples)
        errors: dict[int, InvalidInput] = {}
        for k, row in enumerate(rows):
            out[row] = PreparedSample(tile=batch[k], extra_tensors=samples[row].extra_tensors)
            if k in failed:
                errors[row] = InvalidInput(
                    failed[k].reason, input_name=JPEG_TILES, tile=failed[k].index
                )
        return out, errors

    def _decoder(self, device: torch.device) -> DeviceJpeg:
        with self._lock:
            found = self._decoders.get(device)
            if found is None:
                decode = self._make(device)
                if decode is None:  # another GPU of the same machine: nvJPEG ran on the first
                    raise RuntimeError(f"nvJPEG is unavailable on {device}")
                found = DeviceJpeg(decode, device, self._tile_size, self._interpolation)
                self._decoders[device] = found
        return found


def device_batch(tiles: Sequence[object], size: int, device: torch.device) -> torch.Tensor | None:
    """``uint8 [N, T, T, 3]`` on ``device`` when any tile already lives there, else ``None``.

    A batch of decoded-on-device tiles may mix with host tiles (a pixels
    request batched with a jpeg one): the host ones are copied over.
    """
    if not any(isinstance(t, torch.Tensor) and t.device.type != "cpu" for t in tiles):
        return None
    parts = []
    for tile in tiles:
        if isinstance(tile, torch.Tensor) and tile.device.type != "cpu":
            parts.append(tile)
        else:
            host = torch.from_numpy(np.ascontiguousarray(tile_hwc(tile, size)))  # type: ignore[arg-type]
            parts.append(host.to(device))
    return torch.stack(parts)
