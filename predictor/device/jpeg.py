"""JPEG decode on the device: a batch's slide tiles decoded with nvJPEG, composed and resized there.

The jpeg transport (:mod:`predictor.codecs.jpeg_input`) sends a request's
slide tiles once and a box per model tile. On a CUDA server those tiles need
not cross the host decode pool: :class:`DeviceJpeg` decodes each request's
tiles in one batched call (``torchvision.io.decode_jpeg(device="cuda")``,
nvJPEG), pastes each box onto a white canvas (white where no slide tile
covers it, as the CPU path and the native reader give), resizes a box larger
than the model tile with an antialiased filter, and hands back the batch as
``uint8 [N, T, T, 3]`` on the device, where the normaliser takes it as it
takes staged host tiles. The host sees only compressed bytes.

Its pixels are not libjpeg-turbo's: nvJPEG's IDCT and chroma upsampling
differ by a grey level or so, and torch's antialiased bicubic is not
Pillow's to the bit. ``bench.gpu.jpeg`` measures the difference on features;
a server that must give the pixel path's features bit for bit decodes on the
CPU (``--jpeg_decode cpu``).

A slide tile nvJPEG cannot decode fails only the model tiles that need it:
a failing batched call is decoded again one stream at a time to find it.
Memory is bounded by the caller: a request reaches the device only when its
slide tiles' declared pixels fit ``--max_request_pixels``
(:mod:`predictor.codecs.jpeg_plan`, checked for every request), and one
request's tiles are decoded at a time.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

logger = logging.getLogger(__name__)

Decoder = Callable[[Sequence[bytes]], list[torch.Tensor]]
"""Complete JPEG streams to ``uint8 [3, H, W]`` RGB tensors on the device, one per stream."""

MAX_RESIZE_PIXELS = 32 * 1024 * 1024
"""Canvas pixels resized in one call (each held as float32 while it is resized), and
the most composed canvases wait for their resize: a batch of boxes as large as
``max_image_pixels`` never holds them all on the device at once."""
DEVICE_FILTERS = {"bicubic": "bicubic", "bilinear": "bilinear"}
"""Spec filters the device resizes with (antialiased); any other keeps the CPU decode."""


@dataclass(frozen=True, eq=False)
class SlideTiles:
    """One request's slide tiles: its JPEG streams and their layout (``x, y, valid w, valid h``)."""

    streams: Sequence[bytes]
    layout: np.ndarray


@dataclass(frozen=True)
class Box:
    """One model tile: its request's tiles, its box ``(x, y, w, h)`` and the slide tiles it overlaps."""

    tiles: SlideTiles
    box: tuple[int, int, int, int]
    overlaps: tuple[int, ...]


@dataclass(frozen=True)
class TileFailure:
    """A slide tile that did not decode: which one of its request, and why."""

    index: int
    reason: str


def nvjpeg_decoder(device: torch.device) -> Decoder | None:
    """torchvision's batched nvJPEG decode on ``device``; ``None`` where it cannot run.

    ``None`` on a CPU device, without torchvision, or with a torchvision
    built without nvJPEG; the reason is logged once.
    """
    if device.type != "cuda":
        return None
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
    except Exception as exc:  # ImportError, or a torchvision built for another torch
        logger.info("JPEG tiles decode on the CPU: torchvision's nvJPEG is unavailable (%s)", exc)
        return None

    def decode(streams: Sequence[bytes]) -> list[torch.Tensor]:
        data = [torch.frombuffer(bytearray(s), dtype=torch.uint8) for s in streams]
        return list(decode_jpeg(data, mode=ImageReadMode.RGB, device=device))

    return decode


def host_decoder(device: torch.device) -> Decoder:
    """libjpeg-turbo on the host, copied to ``device``: the same composition without nvJPEG.

    What the tests and the GPU check's dry run use on a CPU machine, and the
    reference the device decode is compared with.
    """
    import simplejpeg

    def decode(streams: Sequence[bytes]) -> list[torch.Tensor]:
        out = []
        for stream in streams:
            rgb = simplejpeg.decode_jpeg(
                stream, colorspace="RGB", fastdct=False, fastupsample=False
            )
            out.append(torch.from_numpy(rgb).permute(2, 0, 1).to(device))
        return out

    return decode


class DeviceJpeg:
    """Boxes of slide JPEG tiles to one ``uint8 [N, T, T, 3]`` batch on the device.

    Args:
        decode: The decoder (:func:`nvjpeg_decoder`, or :func:`host_decoder`).
        device: Where the batch is built.
        tile_size: The model tile's edge ``T``.
        interpolation: A key of :data:`DEVICE_FILTERS`.
    """

    def __init__(self, decode: Decoder, device: torch.device, tile_size: int, interpolation: str):
        self._decode = decode
        self.device = device
        self.tile_size = tile_size
        self._mode = DEVICE_FILTERS[interpolation]

    def __call__(self, boxes: Sequence[Box]) -> tuple[torch.Tensor, dict[int, TileFailure]]:
        """The batch, and for each row whose slide tile failed to decode, that failure.

        A failed row's pixels are left white; its caller answers it with the
        failure and nothing else of the batch is touched.
        """
        size = self.tile_size
        out = torch.full((len(boxes), size, size, 3), 255, dtype=torch.uint8, device=self.device)
        failed: dict[int, TileFailure] = {}
        to_resize: dict[tuple[int, int], list[tuple[int, torch.Tensor]]] = defaultdict(list)
        pending_px = 0
        for tiles, rows in _by_request(boxes).items():
            needed = sorted({i for row in rows for i in boxes[row].overlaps})
            decoded, bad = self._decode_isolating(tiles, needed)
            for row in rows:
                box = boxes[row]
                failure = next((bad[i] for i in box.overlaps if i in bad), None)
                if failure is not None:
                    failed[row] = failure
                    continue
                canvas = _compose(box, decoded, self.device)
                if canvas.shape[1:] == (size, size):
                    out[row] = canvas.permute(1, 2, 0)
                    continue
                to_resize[tuple(canvas.shape[1:])].append((row, canvas))
                pending_px += canvas.shape[1] * canvas.shape[2]
                if pending_px >= MAX_RESIZE_PIXELS:  # large boxes are never all held at once
                    self._flush(out, to_resize)
                    pending_px = 0
        self._flush(out, to_resize)
        return out, failed

    def _flush(
        self, out: torch.Tensor, to_resize: dict[tuple[int, int], list[tuple[int, torch.Tensor]]]
    ) -> None:
        for group in to_resize.values():
            self._resize_into(out, group)
        to_resize.clear()

    def _decode_isolating(
        self, tiles: SlideTiles, needed: list[int]
    ) -> tuple[dict[int, torch.Tensor], dict[int, TileFailure]]:
        """``needed`` decoded in one call; when it fails, one by one, to name the tile at fault."""
        streams = [tiles.streams[i] for i in needed]
        try:
            return dict(zip(needed, self._decode(streams), strict=True)), {}
        except Exception:  # nvJPEG raises RuntimeError; find which stream it was
            pass
        decoded: dict[int, torch.Tensor] = {}
        bad: dict[int, TileFailure] = {}
        for index, stream in zip(needed, streams, strict=True):
            try:
                (decoded[index],) = self._decode([stream])
            except Exception as exc:
                bad[index] = TileFailure(index, f"corrupt JPEG data ({_first_line(exc)})")
        for index, image in decoded.items():
            valid_w, valid_h = (int(v) for v in tiles.layout[index, 2:])
            if image.shape[1] < valid_h or image.shape[2] < valid_w:
                bad[index] = TileFailure(index, "decoded JPEG is smaller than its layout")
        return decoded, bad

    def _resize_into(self, out: torch.Tensor, group: list[tuple[int, torch.Tensor]]) -> None:
        """Same-sized canvases resized together, :data:`MAX_RESIZE_PIXELS` at a time."""
        size = self.tile_size
        height, width = group[0][1].shape[1:]
        per_call = max(1, MAX_RESIZE_PIXELS // (height * width))
        for start in range(0, len(group), per_call):
            part = group[start : start + per_call]
            x = torch.stack([canvas for _, canvas in part]).float()
            y = torch.nn.functional.interpolate(
                x, size=(size, size), mode=self._mode, antialias=True, align_corners=False
            )
            y = y.round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1)
            rows = torch.tensor([row for row, _ in part], device=self.device)
            out.index_copy_(0, rows, y)


def _by_request(boxes: Sequence[Box]) -> dict[SlideTiles, list[int]]:
    """Row indices grouped by their request's tiles (compared by identity), in first-seen order."""
    groups: dict[SlideTiles, list[int]] = {}
    for row, box in enumerate(boxes):
        groups.setdefault(box.tiles, []).append(row)
    return groups


def _compose(box: Box, decoded: dict[int, torch.Tensor], device: torch.device) -> torch.Tensor:
    """The box as ``uint8 [3, h, w]``: white, with each overlapping slide tile's valid part pasted."""
    x, y, w, h = box.box
    canvas = torch.full((3, h, w), 255, dtype=torch.uint8, device=device)
    layout = box.tiles.layout
    for index in box.overlaps:
        tx, ty, tw, th = (int(v) for v in layout[index])
        ax0, ay0 = max(x, tx), max(y, ty)
        ax1, ay1 = min(x + w, tx + tw), min(y + h, ty + th)
        if ax0 >= ax1 or ay0 >= ay1:
            continue
        canvas[:, ay0 - y : ay1 - y, ax0 - x : ax1 - x] = decoded[index][
            :, ay0 - ty : ay1 - ty, ax0 - tx : ax1 - tx
        ]
    return canvas


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]
