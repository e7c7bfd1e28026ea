"""Tissue segmentation (``tissue-seg``): a binary tissue mask per tile.

512x512 tiles, plain ``/255`` (the spec gives no mean/std). The package
returns logits ``[B', 1, H, W]`` or ``[B', H, W]``; packages that pad their
output to a fixed batch (``B' > B``) are trimmed to the real batch. The mask
(``sigmoid > threshold``) is computed on the device and copied back as
``uint8``, a quarter of the float32 bytes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from predictor.families import register_family
from predictor.model import BaseServerModel
from predictor.samples import ModelRequest, ModelResponse


@register_family("segmentation")
class SegmentationServerModel(BaseServerModel):
    """Serves a tissue segmenter: V2 ``mask`` ``UINT8 [N, H, W]``, V1 flattened ``output``."""

    def output_to_host(self, output: torch.Tensor) -> torch.Tensor:
        logits = output.squeeze(1) if output.dim() == 4 else output
        threshold = self.model_spec.mask_threshold
        # sigmoid(x) > t  <=>  x > logit(t): no sigmoid over every pixel.
        cut = math.log(threshold / (1.0 - threshold))
        return (logits > cut).to(torch.uint8).cpu()

    def build_responses(
        self, outputs: Sequence[np.ndarray], requests: Sequence[ModelRequest], mode: str
    ) -> list[ModelResponse]:
        masks = outputs[0]
        return [ModelResponse({"mask": masks[i]}, r.metadata) for i, r in enumerate(requests)]

    def output_names(self, mode: str) -> tuple[str, ...]:
        return ("mask",)

    def output_datatypes(self) -> Mapping[str, str]:
        return {"mask": "UINT8"}

    def output_shapes(self) -> Mapping[str, list[int]]:
        size = self.model_spec.tile_size
        return {"mask": [-1, size, size]}

    def get_metadata(self) -> dict[str, Any]:
        return super().get_metadata() | {"mask_threshold": self.model_spec.mask_threshold}
