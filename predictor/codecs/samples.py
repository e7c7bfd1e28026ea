"""The data that flows between codecs, the model and the batcher.

A codec turns a protocol request into a :class:`DecodedRequest` of
:class:`ModelRequest` items (one per tile). Stage 1 turns each item into a
:class:`PreparedSample`; stage 2 turns a batch of samples into one
:class:`ModelResponse` per sample; the same codec encodes those back. None of
these types knows a protocol or a scheduler, and what a protocol must echo
back (V1 instance fields) stays in the codec's own request type, never in a
batch item. Nothing here imports torch: a codec must stay light.

A tile has one layout from decode to device: ``uint8 [H, W, 3]`` (HWC), the
layout PIL decodes to and the V2 ``pixels`` tensor arrives in, so stage 1
never copies or permutes it (raw pixels stay views of the request body). The
batch is stacked on the host as contiguous HWC (a plain memory copy, into
pinned memory on CUDA) and crosses to the device as ``uint8``, a quarter of
the float32 bytes; the one HWC -> CHW permute is fused into normalisation on
the device (:class:`predictor.device.Normalizer`).

A model written to the seed's API may hand over a tile as ``(C, H, W)``
instead (the seed's layout, a numpy array or a host tensor);
:func:`tile_hwc` is the one place that layout meets this one, as a view.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from predictor.errors import InvalidInput

if TYPE_CHECKING:
    import torch

    from predictor.codecs.jpeg_input import JpegRegion

Pixels = Union[np.ndarray, "torch.Tensor"]
"""A tile's pixels or a further input: a numpy array, or a host tensor (never imported here)."""


@dataclass
class ModelRequest:
    """One item of a client request (a tile, or a slide), decoded from its protocol but not validated.

    A tile item carries its tile in one of ``image_data``, ``pixels`` or
    ``jpeg``; what else a family's requests carry is that family's, in
    ``family_input``, decoded by the codec the family chose and read by its
    own ``prepare_sample``.

    Attributes:
        index: Position of the item in its request (named in errors).
        image_data: Encoded image bytes (PNG/JPEG/TIFF), base64 already removed.
        pixels: Raw RGB tile, ``uint8 [H, W, 3]`` (possibly a view).
        jpeg: The tile as a box of the request's slide JPEG tiles
            (:class:`~predictor.codecs.jpeg_input.JpegRegion`), decoded in stage 1.
        family_input: The family's own input for this item, or None: the
            multimodal family's raw bulk RNA counts (``float32 [G]``), the
            slide family's whole slide
            (:class:`~predictor.codecs.v2_slide.SlideInput`).
        tiles: Tiles this item stands for, what queue bounds count: a slide's
            ``N`` (its codec says), else 1.
    """

    index: int
    image_data: bytes | None = None
    pixels: np.ndarray | None = None
    jpeg: JpegRegion | None = None
    family_input: Any = None
    tiles: int = 1

    @property
    def has_tile(self) -> bool:
        """Whether it carries a tile (a slide's item carries its features instead)."""
        return self.pixels is not None or self.image_data is not None or self.jpeg is not None


@dataclass
class DecodedRequest:
    """A whole client request after protocol decoding.

    Codecs subclass it for what only they need to answer (V1 echo fields, V2
    output choices); the model reads only these fields.

    Attributes:
        items: One :class:`ModelRequest` per tile, in request order.
        mode: Requested mode, or ``None`` for the model's default.
        tile_input: Name of the input the tiles came from (``tiles``,
            ``pixels`` or ``image_data``), used in error messages.
        requested_outputs: Output names the request asks for, in its order, or
            None for the mode's outputs (V2 ``outputs``; V1 names none). Named
            outputs without a mode decide the mode.
        priority: The class of service asked for (V2 ``priority``: 1 the
            most urgent), or None (or 0) for the server's default.
        timeout_us: How long the request may wait for the device, in
            microseconds (V2 ``timeout``, tritonclient's), or None (or 0): no bound.
    """

    items: list[ModelRequest]
    mode: str | None
    tile_input: str
    requested_outputs: tuple[str, ...] | None = None
    priority: int | None = None
    timeout_us: int | None = None


@dataclass
class PreparedSample:
    """A validated, preprocessed sample ready for batching: the batcher's item.

    The seed's ``PreparedSample(tile, extra_tensors)``.

    Attributes:
        tile: The tile's ``uint8`` pixels: ``[H, W, 3]`` (HWC, the fast
            layout, see the module docstring) or ``[3, H, W]`` (the seed's
            CHW); a numpy array or a host tensor. Normalisation happens on
            the device, in the batch.
        extra_tensors: Further model inputs keyed by input name (the
            multimodal family's ``bulk_rna`` ``float32 [G]``); empty for
            embedding backbones.
    """

    tile: Pixels
    extra_tensors: dict[str, Pixels] = field(default_factory=dict)


@dataclass
class ModelResponse:
    """One sample's result.

    Attributes:
        outputs: Output name to this sample's array (``embedding [D]``,
            ``prediction [K]``, ``mask [H, W]``); often views into the batch.
    """

    outputs: dict[str, np.ndarray]


def tile_hwc(tile: Pixels, size: int) -> np.ndarray:
    """``tile`` as ``uint8 [size, size, 3]``: itself when HWC, a transposed view when CHW.

    No copy either way: the batch is stacked into one host buffer
    afterwards, which copies either layout once. Accepts numpy arrays and
    host tensors (anything ``np.asarray`` reads).

    Raises:
        InvalidInput: Neither layout at ``size``, or not ``uint8``.
    """
    array = tile if isinstance(tile, np.ndarray) else np.asarray(tile)
    if array.dtype == np.uint8:
        if array.shape == (size, size, 3):
            return array
        if array.shape == (3, size, size):
            return array.transpose(1, 2, 0)
    raise InvalidInput(
        f"expected a {size}x{size} RGB uint8 tile as (H, W, 3) or (3, H, W), "
        f"got shape {tuple(array.shape)} {array.dtype}"
    )
