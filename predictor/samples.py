"""The data that flows between codecs, the model and the batcher.

A codec turns a protocol request into a :class:`DecodedRequest` of
:class:`ModelRequest` items (one per tile). Stage 1 turns each item into a
:class:`PreparedSample`; stage 2 turns a batch of samples into one
:class:`ModelResponse` per sample; a codec encodes those back. None of these
types knows a protocol or a scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass
class ModelRequest:
    """One tile of a client request, decoded from its protocol but not validated.

    Attributes:
        index: Position of the tile in its request (named in errors).
        image_data: Encoded image bytes (PNG/JPEG/TIFF), base64 already removed.
        pixels: Raw RGB tile, ``uint8 [H, W, 3]`` (possibly a view).
        bulk_rna: Raw bulk RNA counts for this tile, ``float32 [G]``.
        metadata: V1 instance fields echoed back in the response.
    """

    index: int
    image_data: bytes | None = None
    pixels: np.ndarray | None = None
    bulk_rna: np.ndarray | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class DecodedRequest:
    """A whole client request after protocol decoding.

    Attributes:
        items: One :class:`ModelRequest` per tile, in request order.
        mode: Requested mode, or ``None`` for the model's default.
        tile_input: Name of the input the tiles came from (``tiles``,
            ``pixels`` or ``image_data``), used in error messages.
        protocol: ``v1`` or ``v2`` (REST and gRPC share ``v2``).
        binary_output: V2 only: return outputs in the binary extension.
        requested_outputs: V2 only: output names the client asked for.
        request_id: Echoed in the V2 response.
    """

    items: list[ModelRequest]
    mode: str | None
    tile_input: str
    protocol: str
    binary_output: bool = False
    requested_outputs: tuple[str, ...] | None = None
    request_id: str | None = None


@dataclass
class PreparedSample:
    """A validated, preprocessed sample ready for batching.

    Attributes:
        tile: ``uint8 [C, H, W]`` tensor; normalisation happens on the device,
            in the batch (4x less to copy than float32).
        extra_tensors: Further model inputs keyed by input name (e.g.
            ``bulk_rna``); empty for embedding backbones.
    """

    tile: torch.Tensor
    extra_tensors: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class ModelResponse:
    """One sample's result.

    Attributes:
        outputs: Output name to this sample's array (``embedding [D]``,
            ``prediction [K]``, ``mask [H, W]``); often views into the batch.
        metadata: Fields echoed back from the request (V1).
    """

    outputs: dict[str, np.ndarray]
    metadata: dict[str, Any] = field(default_factory=dict)
